package ddbleaserobfig_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
	_ "time/tzdata" // the New York zone, wherever the tests run

	"github.com/ddblease/ddblease"
	"github.com/robfig/cron/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// phase runs sched with RunSchedule on two replicas (their own handles and
// SDK clients, clocks 100ms apart) whose clocks read at when they start,
// until want slots have fired, then for another second to see that nothing
// else does. It returns the slots fired, with the replica of each.
func phase(t *testing.T, table string, sched ddblease.Schedule, at time.Time, want int) map[time.Time][]string {
	t.Helper()
	realStart := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	fired := map[time.Time][]string{}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(fired)
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, off := range []time.Duration{0, 100 * time.Millisecond} {
		name := []string{"a", "b"}[i] + at.Format("150405")
		l, err := ddblease.New(srv.Client(nil), table, "dst", func(o *ddblease.Options) {
			o.Owner = name
			o.LeaseDuration, o.HeartbeatInterval, o.RetryInterval = 1500*time.Millisecond, 400*time.Millisecond, 150*time.Millisecond
			o.CallTimeout, o.MaxClockSkew, o.Logger = 300*time.Millisecond, 400*time.Millisecond, quiet
			o.Now = func() time.Time { return time.Now().Add(at.Sub(realStart) + off) }
		})
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = l.RunSchedule(ctx, sched, func(ctx context.Context, run *ddblease.JobRun) error {
				mu.Lock()
				defer mu.Unlock()
				fired[run.Slot()] = append(fired[run.Slot()], name)
				return nil
			})
		}()
	}
	deadline := time.Now().Add(30 * time.Second)
	for count() < want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(time.Second)
	cancel()
	wg.Wait()
	for _, err := range errs {
		assert.NoError(t, err)
	}
	mu.Lock()
	defer mu.Unlock()
	return fired
}

func keys(m map[time.Time][]string) []time.Time {
	var k []time.Time
	for s := range m {
		k = append(k, s)
	}
	slices.SortFunc(k, func(a, b time.Time) int { return a.Compare(b) })
	return k
}

// TestRobfigScheduleDrivesRunSchedule passes robfig's parsed schedules
// to RunSchedule as they are, with the replicas' clocks put just before a
// daylight-saving transition in New York.
//
// Spring forward (2026-03-08, 02:00 EST becomes 03:00 EDT): a spec that
// names 02:00 and 03:00 local fires at 03:00 EDT only; 02:00 does not
// exist that day and is skipped, not moved.
//
// Fall back (2026-11-01, 02:00 EDT becomes 01:00 EST): a spec that names
// 01:30 local fires twice, at 01:30 EDT and 01:30 EST, an hour apart:
// ddblease's slots are instants (kept in UTC), so these are two slots and
// each runs once.
func TestRobfigScheduleDrivesRunSchedule(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)

	t.Run("spring forward", func(t *testing.T) {
		sched, err := cron.ParseStandard("CRON_TZ=America/New_York 0 2,3 * * *")
		require.NoError(t, err)
		table := srv.NewTable(t)
		before := time.Date(2026, 3, 8, 1, 59, 58, 0, ny) // 06:59:58Z
		fired := phase(t, table, sched, before, 1)
		want := time.Date(2026, 3, 8, 3, 0, 0, 0, ny).UTC() // 07:00:00Z, two seconds later
		assert.Equal(t, []time.Time{want}, keys(fired))
		assert.Len(t, fired[want], 1, "one replica ran it")

		l, err := ddblease.New(srv.Client(nil), table, "dst")
		require.NoError(t, err)
		runs, err := l.ListRuns(context.Background(), sched, before.Add(-24*time.Hour), want.Add(time.Hour))
		require.NoError(t, err)
		require.Len(t, runs, 1)
		assert.Equal(t, want, runs[0].Slot)
		assert.Equal(t, ddblease.RunSucceeded, runs[0].Status)
		// The slots robfig gives around the transition: 02:00 on the 7th
		// (EST), 03:00 on the 7th, then 03:00 EDT on the 8th; no 02:00.
		assert.Equal(t, time.Date(2026, 3, 8, 3, 0, 0, 0, ny), sched.Next(time.Date(2026, 3, 7, 3, 0, 0, 0, ny)).In(ny))
		// A spec naming only a time in the gap skips the day.
		gapOnly, err := cron.ParseStandard("CRON_TZ=America/New_York 30 2 * * *")
		require.NoError(t, err)
		assert.Equal(t, time.Date(2026, 3, 9, 2, 30, 0, 0, ny), gapOnly.Next(time.Date(2026, 3, 7, 12, 0, 0, 0, ny)).In(ny))
	})

	t.Run("fall back", func(t *testing.T) {
		sched, err := cron.ParseStandard("CRON_TZ=America/New_York 30 1 * * *")
		require.NoError(t, err)
		table := srv.NewTable(t)
		first := time.Date(2026, 11, 1, 5, 30, 0, 0, time.UTC)  // 01:30 EDT
		second := time.Date(2026, 11, 1, 6, 30, 0, 0, time.UTC) // 01:30 EST
		assert.Equal(t, first, sched.Next(first.Add(-time.Hour)).UTC())
		assert.Equal(t, second, sched.Next(first).UTC())

		// The replicas just before each 01:30; the second time, an hour on.
		fired := phase(t, table, sched, first.Add(-2*time.Second), 1)
		assert.Equal(t, []time.Time{first}, keys(fired))
		fired2 := phase(t, table, sched, second.Add(-2*time.Second), 1)
		assert.Equal(t, []time.Time{second}, keys(fired2))
		assert.Len(t, fired[first], 1)
		assert.Len(t, fired2[second], 1)

		l, err := ddblease.New(srv.Client(nil), table, "dst")
		require.NoError(t, err)
		runs, err := l.ListRuns(context.Background(), sched, first.Add(-time.Hour), second.Add(time.Hour))
		require.NoError(t, err)
		var slots []time.Time
		for _, r := range runs {
			slots = append(slots, r.Slot)
			assert.Equal(t, ddblease.RunSucceeded, r.Status)
		}
		assert.Equal(t, []time.Time{first, second}, slots, "01:30 ran twice that night, once per instant")
	})

	t.Run("every", func(t *testing.T) {
		// @every's slots are anchored at the time given to Next: RunSchedule
		// fires every 2s (on whole seconds) from the slot after its
		// catch-up floor, and two replicas whose floors differ by a second
		// disagree on the slots.
		sched, err := cron.ParseStandard("@every 2s")
		require.NoError(t, err)
		table := srv.NewTable(t)
		at := time.Date(2026, 11, 1, 5, 0, 0, 300_000_000, time.UTC)
		fired := phase(t, table, sched, at, 2)
		slots := keys(fired)
		require.GreaterOrEqual(t, len(slots), 2)
		for i, s := range slots {
			assert.Zero(t, s.Nanosecond(), "whole seconds")
			if i > 0 {
				assert.Equal(t, 2*time.Second, s.Sub(slots[i-1]))
			}
			assert.Len(t, fired[s], 1)
		}
		a, b := sched.Next(at), sched.Next(at.Add(time.Second))
		assert.Equal(t, time.Second, b.Sub(a), "anchors a second apart give slots a second apart")
	})
}
