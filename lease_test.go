package ddblease_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAcquireHeldResign(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 10*time.Second)
	table, db := tableAndClient(t)
	a := newLease(t, db, table, "nightly", fast("a"))
	b := newLease(t, db, table, "nightly", fast("b"))

	fa, err := a.TryAcquire(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(1), fa)
	assert.True(t, a.IsLeader())

	_, err = b.TryAcquire(ctx)
	require.ErrorIs(t, err, ddblease.ErrHeld)
	var held *ddblease.HeldError
	require.ErrorAs(t, err, &held)
	assert.Equal(t, "a", held.Owner)
	assert.Equal(t, int64(1), held.Fence)
	assert.Contains(t, err.Error(), `held by "a"`)
	assert.False(t, b.IsLeader())

	require.NoError(t, a.Resign(ctx))
	assert.False(t, a.IsLeader())
	assert.ErrorIs(t, a.Resign(ctx), ddblease.ErrNotLeader)

	fb, err := b.TryAcquire(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(2), fb)

	rec, err := b.Holder(ctx)
	require.NoError(t, err)
	assert.Equal(t, "b", rec.Owner)
	assert.Equal(t, int64(2), rec.Fence)
	assert.Equal(t, 2*time.Second, rec.Duration)
	st := b.State()
	assert.True(t, st.Leader)
	assert.Equal(t, int64(2), st.Fence)
	assert.Equal(t, "b", st.Owner)
	assert.False(t, st.Deadline.IsZero())
}

func TestTryAcquireWhileLeaderRenews(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 10*time.Second)
	table := srv.NewTable(t)
	faults := ddbtest.NewFaults(nil)
	a := newLease(t, srv.Client(faults.Wrap), table, "job", fast("a"))
	f1, err := a.TryAcquire(ctx)
	require.NoError(t, err)
	f2, err := a.TryAcquire(ctx)
	require.NoError(t, err)
	assert.Equal(t, f1, f2, "a second TryAcquire by the leader keeps its tenure")
	assert.Equal(t, 2+listing, faults.Count("UpdateItem"))
}

// The holder stops heartbeating: a polling standby takes over after expiry
// with the next fence, and the old holder can neither renew nor resign.
func TestStandbyTakesOverExpiredLease(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 10*time.Second)
	table, db := tableAndClient(t)
	a := newLease(t, db, table, "job", fast("a"))
	b := newLease(t, db, table, "job", fast("b"))

	_, err := a.TryAcquire(ctx)
	require.NoError(t, err)
	deadline := a.State().Deadline
	rec, err := a.Holder(ctx)
	require.NoError(t, err)

	fb, err := b.Acquire(ctx)
	require.NoError(t, err)
	took := time.Now()
	assert.Equal(t, int64(2), fb)
	assert.True(t, took.After(deadline), "standby led at %v, before the old holder's deadline %v", took, deadline)
	assert.True(t, took.After(rec.ExpiresAt), "standby led before the recorded expiry")
	assert.False(t, a.IsLeader())

	before := rawLease(t, db, table, "job")
	require.ErrorIs(t, a.Heartbeat(ctx), ddblease.ErrLost)
	assert.Equal(t, before, rawLease(t, db, table, "job"))
	rec, err = b.Holder(ctx)
	require.NoError(t, err)
	assert.Equal(t, "b", rec.Owner)
	assert.Equal(t, int64(2), rec.Fence)
}

// A second process given the leader's Owner (a constant in the service's
// config, say) is a standby like any other: it polls with reads, not a
// refused write every RetryInterval, never leads while the leader renews,
// and says what is wrong once it sees the lease renewed under its Owner by
// a writer it does not know. It leads when the leader resigns.
func TestStandbyWithTheLeadersOwnerPollsWithReadsAndWarns(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table, db := tableAndClient(t)
	a := newLease(t, db, table, "job", fast("billing-service"))
	stopA := runAsync(ctx, a, func(ctx context.Context, _ int64) error { <-ctx.Done(); return nil })
	eventually(t, "a leads", a.IsLeader)

	var be eventLog
	logs := newLogCapture()
	b := newLease(t, db, table, "job", fast("billing-service"), be.option, func(o *ddblease.Options) { o.Logger = slog.New(logs) })
	var ledWhileA atomic.Bool
	stopB := runAsync(ctx, b, func(ctx context.Context, fence int64) error {
		ledWhileA.Store(a.IsLeader())
		<-ctx.Done()
		return nil
	})
	defer func() { assert.NoError(t, stopB()) }()
	time.Sleep(2 * time.Second) // four of a's heartbeats, some forty of b's polls
	writes, reads := 0, 0
	for _, e := range be.all() {
		switch {
		case e.Kind == ddblease.EventCall && e.Op == "UpdateItem":
			writes++
		case e.Kind == ddblease.EventCall && e.Op == "GetItem":
			reads++
		}
	}
	assert.LessOrEqual(t, writes, 1, "b's writes while a leads: at most its first attempt, before it saw the item")
	assert.Greater(t, reads, 10, "b's polls")
	assert.True(t, a.IsLeader())
	assert.False(t, b.IsLeader())
	var warned []string
	for _, r := range logs.all() {
		if r.level == slog.LevelWarn && strings.Contains(r.msg, "Owner must differ between contenders") {
			warned = append(warned, r.line())
		}
	}
	assert.Len(t, warned, 1, "one warning in two seconds: %v", lines(logs.all()))

	require.NoError(t, stopA())
	eventually(t, "b leads once a resigned", b.IsLeader)
	assert.False(t, ledWhileA.Load(), "b led while a did")
	assert.Equal(t, int64(2), b.State().Fence)
}

// A stale holder whose local deadline has not passed yet (its clock is far
// behind, so the standby saw its lease as expired) is refused by the table.
func TestStaleHolderRefusedByTable(t *testing.T) {
	t.Parallel()
	for _, op := range []string{"heartbeat", "resign"} {
		t.Run(op, func(t *testing.T) {
			t.Parallel()
			ctx := withTimeout(t, 10*time.Second)
			table, db := tableAndClient(t)
			a := newLease(t, db, table, "job", fast("a"), offset(-time.Hour))
			b := newLease(t, db, table, "job", fast("b"))
			_, err := a.TryAcquire(ctx)
			require.NoError(t, err)
			fb, err := b.TryAcquire(ctx)
			require.NoError(t, err)
			assert.Equal(t, int64(2), fb)
			require.True(t, a.IsLeader(), "a's own deadline has not passed")

			before := rawLease(t, db, table, "job")
			if op == "heartbeat" {
				err = a.Heartbeat(ctx)
			} else {
				err = a.Resign(ctx)
			}
			require.ErrorIs(t, err, ddblease.ErrLost)
			assert.Contains(t, err.Error(), `"b"`)
			assert.False(t, a.IsLeader())
			assert.Equal(t, before, rawLease(t, db, table, "job"), "a stale %s changed the item", op)
		})
	}
}

// A standby whose clock is ahead by less than MaxClockSkew does not take
// over a live lease.
func TestSkewWithinBoundNoTakeover(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table, db := tableAndClient(t)
	a := newLease(t, db, table, "job", fast("a"))
	b := newLease(t, db, table, "job", fast("b"), offset(90*time.Millisecond))

	leading := make(chan struct{})
	runCtx, stop := context.WithCancel(ctx)
	var runErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		runErr = a.Run(runCtx, func(ctx context.Context, _ int64) error {
			close(leading)
			<-ctx.Done()
			return ctx.Err()
		})
	})
	<-leading
	wait, cancel := context.WithTimeout(ctx, 3*time.Second) // 2.5 leases
	_, err := b.Acquire(wait)
	cancel()
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.False(t, b.IsLeader())
	assert.True(t, a.IsLeader())
	stop()
	wg.Wait()
	assert.NoError(t, runErr)
}

// With clocks far apart, the wall-clock path is useless; a standby that
// takes over by watching the renewal version still does so only after the
// old holder's own deadline has passed.
func TestSkewBeyondBoundObservationPath(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{time.Hour, 10 * time.Second} {
		t.Run(skew.String(), func(t *testing.T) {
			t.Parallel()
			ctx := withTimeout(t, 10*time.Second)
			table, db := tableAndClient(t)
			a := newLease(t, db, table, "job", fast("a"), offset(skew))
			b := newLease(t, db, table, "job", fast("b"))
			_, err := a.TryAcquire(ctx)
			require.NoError(t, err)
			// a is paused from now on; b's clock says a's lease expires in
			// skew + lease, but b watches the item instead.
			var aLeader atomic.Bool
			aLeader.Store(true)
			stopWatch := make(chan struct{})
			var wg sync.WaitGroup
			var overlap atomic.Bool
			wg.Go(func() {
				for {
					select {
					case <-stopWatch:
						return
					default:
					}
					if a.IsLeader() && b.IsLeader() {
						overlap.Store(true)
					}
					time.Sleep(time.Millisecond)
				}
			})
			fence, err := b.Acquire(ctx)
			require.NoError(t, err)
			assert.Equal(t, int64(2), fence)
			assert.False(t, a.IsLeader(), "b took over while a still believed it led")
			close(stopWatch)
			wg.Wait()
			assert.False(t, overlap.Load(), "two leaders at once")
		})
	}
}

// Eight contenders over many rounds: never two holders at once, and fences
// strictly increasing with no gaps.
func TestContention(t *testing.T) {
	t.Parallel()
	const contenders, rounds = 8, 40
	ctx := withTimeout(t, 60*time.Second)
	table := srv.NewTable(t)
	var (
		holder  atomic.Int32
		mu      sync.Mutex
		fences  []int64
		doubles atomic.Int32
		wg      sync.WaitGroup
	)
	for i := 1; i <= contenders; i++ {
		l := newLease(t, srv.Client(nil), table, "job", fast(string(rune('a'+i-1))))
		wg.Go(func() {
			for {
				mu.Lock()
				done := len(fences) >= rounds
				mu.Unlock()
				if done {
					return
				}
				fence, err := l.Acquire(ctx)
				if !assert.NoError(t, err) {
					return
				}
				if !holder.CompareAndSwap(0, int32(i)) {
					doubles.Add(1)
				}
				mu.Lock()
				fences = append(fences, fence)
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
				holder.Store(0)
				assert.NoError(t, l.Resign(ctx))
			}
		})
	}
	wg.Wait()
	assert.Zero(t, doubles.Load(), "two holders at once")
	for i, f := range fences {
		assert.Equal(t, int64(i+1), f, "fences %v", fences)
	}
}
