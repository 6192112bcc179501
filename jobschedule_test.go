package ddblease_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEvery(t *testing.T) {
	t.Parallel()
	utc := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		require.NoError(t, err)
		return v
	}
	plus5 := time.FixedZone("+05", 5*3600)
	for _, c := range []struct {
		d        time.Duration
		in, want time.Time
	}{
		{time.Hour, utc("2026-11-30T02:30:00Z"), utc("2026-11-30T03:00:00Z")},
		{time.Hour, utc("2026-11-30T03:00:00Z"), utc("2026-11-30T04:00:00Z")}, // strictly after
		{24 * time.Hour, time.Date(2026, 11, 30, 2, 0, 0, 0, plus5), utc("2026-11-30T00:00:00Z")},
		{7 * 24 * time.Hour, utc("2026-11-30T12:00:00Z"), utc("2026-12-03T00:00:00Z")}, // epoch was a Thursday
		{time.Hour, utc("1969-12-31T23:30:00Z"), utc("1970-01-01T00:00:00Z")},
		{time.Hour, utc("1969-12-31T23:00:00Z"), utc("1970-01-01T00:00:00Z")},
		{time.Hour, utc("1969-12-31T22:59:59.999999999Z"), utc("1969-12-31T23:00:00Z")},
		{100 * time.Millisecond, utc("2026-11-30T02:00:00.05Z"), utc("2026-11-30T02:00:00.1Z")},
		{3 * time.Second, utc("1970-01-01T00:00:01Z"), utc("1970-01-01T00:00:03Z")},
		{time.Hour, time.Date(9999, 12, 31, 23, 30, 0, 0, time.UTC), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		{time.Hour, time.Date(1, 1, 1, 0, 30, 0, 0, time.UTC), time.Date(1, 1, 1, 1, 0, 0, 0, time.UTC)},
	} {
		got := ddblease.Every(c.d).Next(c.in)
		assert.True(t, c.want.Equal(got), "Every(%v).Next(%v) = %v, want %v", c.d, c.in, got, c.want)
		assert.Equal(t, time.UTC, got.Location())
	}
	now := time.Now()
	next := ddblease.Every(time.Second).Next(now)
	assert.Equal(t, next, next.Round(0), "no monotonic reading")
	assert.True(t, next.After(now))
	assert.Equal(t, 0, next.Nanosecond())
}

// The catch-up rule, on a schedule whose slots are all in the past: only
// the most recent one inside the window runs; older ones inside the window
// are read back (missed ones counted since the latest run, orphans
// abandoned). Outside the window, the tenure reads the latest run when it
// begins, and marks it abandoned if an older tenure left it running;
// nothing else there is touched.
func TestCatchUpRule(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		window time.Duration
		fired  bool
	}{
		{"default window", 0, true},
		{"window of 3m", 3 * time.Minute, true},
		{"window of 30s", 30 * time.Second, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			// The slots are placed from when the subtest runs, not from
			// when it was queued: a parallel subtest may wait a while.
			now := time.Now().UTC()
			at := func(d time.Duration) time.Time { return now.Add(d).Truncate(time.Second) }
			s1, s2, s3, s4, s5, s6, s7 := at(-20*time.Minute), at(-10*time.Minute), at(-8*time.Minute), at(-6*time.Minute),
				at(-4*time.Minute), at(-2*time.Minute), at(-time.Minute)
			sched := listSlots(s1, s2, s3, s4, s5, s6, s7)
			ctx := withTimeout(t, 20*time.Second)
			table, db := tableAndClient(t)
			// An earlier tenure ran s3 and died running s5.
			old := newLease(t, db, table, "report", fast("old"))
			_, err := old.TryAcquire(ctx)
			require.NoError(t, err)
			run, err := old.Claim(ctx, s3)
			require.NoError(t, err)
			require.NoError(t, run.Finish(ctx, nil))
			_, err = old.Claim(ctx, s5)
			require.NoError(t, err)
			require.NoError(t, old.Resign(ctx))

			l := newLease(t, db, table, "report", fast("new"))
			var mu sync.Mutex
			var fired []*ddblease.JobRun
			// The schedule ends after s7, so RunSchedule returns.
			err = l.RunSchedule(ctx, sched, func(_ context.Context, run *ddblease.JobRun) error {
				mu.Lock()
				defer mu.Unlock()
				fired = append(fired, run)
				return nil
			}, func(o *ddblease.JobOptions) { o.CatchUpWindow = c.window })
			require.NoError(t, err)

			runs, err := l.ListRuns(ctx, sched, s1, s7)
			require.NoError(t, err)
			by := runsBySlot(runs)
			for _, s := range []time.Time{s1, s2, s4, s6} {
				assert.NotContains(t, by, s, "slot %v never runs", s)
			}
			assert.Equal(t, ddblease.RunSucceeded, by[s3].Status)
			// The orphan at s5: swept by the catch-up inside the window,
			// read when the tenure began outside it.
			assert.Equal(t, ddblease.RunAbandoned, by[s5].Status)
			assert.Equal(t, int64(2), by[s5].AbandonedBy)
			if !c.fired {
				assert.Empty(t, fired)
				assert.NotContains(t, by, s7)
				return
			}
			require.Len(t, fired, 1)
			assert.Equal(t, s7, fired[0].Slot())
			assert.Equal(t, int64(2), fired[0].Fence())
			// Missed since the latest run (s5): s6. s2 and s4 were
			// skipped by the catch-ups that fired s3 and s5.
			missed, known := fired[0].Missed()
			assert.True(t, known)
			assert.Equal(t, 1, missed)
			assert.Equal(t, ddblease.RunSucceeded, by[s7].Status)
			assert.Equal(t, 1, by[s7].Missed)
			assert.False(t, by[s7].MissedUnknown)
			assert.Equal(t, "new", by[s7].Owner)
		})
	}
}

// The requests a firing costs: one claim and one finish per slot, and one
// BatchGetItem for each catch-up (when the replica starts leading, and
// when a firing ran past the next slot). Not parallel: it counts on a
// machine that fires each slot on time.
func TestRunScheduleRequestsPerTick(t *testing.T) {
	caps := srv.Caps(t)
	ctx := withTimeout(t, 20*time.Second)
	table := srv.NewTable(t)
	counter := &opsByItem{}
	// A long lease, so that a loaded machine does not end the tenure midway.
	l := newLease(t, srv.Client(counter.wrap), table, "tick", fast("a"), slowLease)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fired := make(chan time.Time, 100)
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		done <- l.RunSchedule(rctx, ddblease.Every(100*time.Millisecond), func(_ context.Context, run *ddblease.JobRun) error {
			fired <- run.Slot()
			return nil
		})
	}()
	var first, last time.Time
	for i := 0; i < 8; i++ {
		select {
		case s := <-fired:
			if i == 0 {
				first = s
			}
			last = s
		case <-ctx.Done():
			t.Fatal("slots not fired")
		}
	}
	cancel()
	require.NoError(t, <-done)
	elapsed := time.Since(start)
	c := counter.snapshot()
	for len(fired) > 0 {
		last = <-fired
	}
	runs, err := l.ListRuns(ctx, ddblease.Every(100*time.Millisecond), first, last)
	require.NoError(t, err)
	n := len(runs)
	require.GreaterOrEqual(t, n, 8)
	for _, r := range runs {
		assert.Equal(t, ddblease.RunSucceeded, r.Status)
	}
	// With transactions a slot costs its claim and its finish: the claim
	// checks the fence and the pause itself. Without, a consistent read of
	// the lease item precedes each claim. Either way the operator controls
	// are read once, when the tenure begins.
	if caps.Transactions {
		assert.Equal(t, n, c["TransactWriteItems"], "one claim per slot")
		assert.Equal(t, n, c["UpdateItem jobrun"], "one finish per slot")
		assert.Equal(t, 1, c["GetItem lease"], "no read of the lease item per slot")
	} else {
		assert.Equal(t, 1, c["TransactWriteItems"], "one probe for transactions")
		assert.Equal(t, 2*n, c["UpdateItem jobrun"], "one claim and one finish per slot")
		assert.Equal(t, 1+n, c["GetItem lease"], "one read of the lease item per slot")
	}
	// No catch-up read when the job's first tenure began (no one led
	// before it), and one each time a firing ran late past the next slot
	// (a loaded machine), which shows as a gap between runs.
	gaps := 0
	for i := 1; i < n; i++ {
		if runs[i].Slot.Sub(runs[i-1].Slot) > 100*time.Millisecond {
			gaps++
		}
	}
	assert.Equal(t, gaps, c["BatchGetItem"], "catch-up reads")
	assert.Zero(t, c["GetItem jobrun"])
	t.Logf("%s: %d slots fired in %v; requests %v (lease: %d UpdateItem for acquire, heartbeats every %v and resign)",
		srv.Name, n, elapsed.Round(time.Millisecond), c, c["UpdateItem lease"], l.Options().HeartbeatInterval)
}

// RunSchedule fires each slot of a schedule once across the replicas that
// run it. Here the schedule has a single slot, a minute ago: the catch-up
// rule fires it at once, and RunSchedule returns because the schedule has
// no further slot. A service would pass ddblease.Every(24*time.Hour), or a
// parsed cron expression, and a context cancelled by SIGTERM.
func ExampleLease_RunSchedule() {
	ctx := context.Background()
	db := srv.Client(nil) // a *dynamodb.Client
	table := "example-" + ddbtest.RandomID()
	if err := ddblease.CreateTable(ctx, db, table); err != nil {
		fmt.Println(err)
		return
	}
	lease, err := ddblease.New(db, table, "nightly-billing", func(o *ddblease.Options) {
		o.Owner = "replica-1"
		o.Logger = slog.New(slog.DiscardHandler)
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	slot := time.Now().Add(-time.Minute).Truncate(time.Second)
	sched := ddblease.ScheduleFunc(func(t time.Time) time.Time {
		if t.Before(slot) {
			return slot
		}
		return time.Time{} // no further slot
	})
	err = lease.RunSchedule(ctx, sched, func(ctx context.Context, run *ddblease.JobRun) error {
		fmt.Println("running the slot of a minute ago:", run.Slot().Equal(slot), "fence", run.Fence())
		return nil // recorded as succeeded
	})
	fmt.Println("RunSchedule returned", err)

	runs, err := lease.ListRuns(ctx, sched, slot, slot)
	if err != nil || len(runs) != 1 {
		fmt.Println(runs, err)
		return
	}
	fmt.Println(runs[0].Status, "by", runs[0].Owner, "with fence", runs[0].Fence)
	// Output:
	// running the slot of a minute ago: true fence 1
	// RunSchedule returned <nil>
	// succeeded by replica-1 with fence 1
}

// On shutdown RunSchedule drains the firing in progress, records what fn
// returned, and resigns.
func TestRunScheduleDrainsOnShutdown(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		fnErr  bool // fn returns its context's error instead of finishing
		status ddblease.RunStatus
	}{
		{"fn finishes its batch", false, ddblease.RunSucceeded},
		{"fn gives up", true, ddblease.RunFailed},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := withTimeout(t, 20*time.Second)
			table := srv.NewTable(t)
			l := newLease(t, srv.Client(nil), table, "drain", fast("a"))
			slot := time.Now().Add(-time.Second).Truncate(time.Second)
			rctx, sigterm := context.WithCancel(ctx)
			err := l.RunSchedule(rctx, oneSlot(slot), func(ctx context.Context, run *ddblease.JobRun) error {
				sigterm()
				<-ctx.Done()
				if c.fnErr {
					return ctx.Err()
				}
				time.Sleep(20 * time.Millisecond) // the rest of the batch
				return nil
			})
			require.NoError(t, err)
			runs, err := l.ListRuns(ctx, oneSlot(slot), slot, slot)
			require.NoError(t, err)
			require.Len(t, runs, 1)
			assert.Equal(t, c.status, runs[0].Status)
			if c.fnErr {
				assert.Contains(t, runs[0].Error, "shutting down")
			}
			// Resigned: the tenure is over and the item says so, even though
			// Run cancelled a drain heartbeat that the server may apply
			// after the resignation (refused since b4402c7).
			assert.False(t, l.IsLeader())
			rec, err := l.Holder(ctx)
			require.NoError(t, err)
			assert.Equal(t, "a", rec.Owner)
			assert.True(t, rec.ExpiresAt.IsZero(), "resigned: %+v", rec)
		})
	}
}
