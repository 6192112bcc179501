package ddbleasegocron_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/ddbleasegocron"
	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func fastOpts(owner string) func(*ddblease.Options) {
	return func(o *ddblease.Options) {
		o.Owner = owner
		o.LeaseDuration, o.HeartbeatInterval, o.RetryInterval = 1500*time.Millisecond, 400*time.Millisecond, 100*time.Millisecond
		o.CallTimeout, o.MaxClockSkew = 300*time.Millisecond, 300*time.Millisecond
	}
}

func TestCronSchedule(t *testing.T) {
	s, err := ddbleasegocron.CronSchedule("CRON_TZ=America/New_York 30 2 * * *", false, time.UTC)
	require.NoError(t, err)
	ny, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	assert.Equal(t, time.Date(2026, 11, 30, 2, 30, 0, 0, ny).UTC(), s.Next(time.Date(2026, 11, 30, 0, 0, 0, 0, ny)).UTC())
	s, err = ddbleasegocron.CronSchedule("*/10 * * * * *", true, nil)
	require.NoError(t, err)
	assert.Equal(t, 10*time.Second, s.Next(s.Next(time.Now())).Sub(s.Next(time.Now())))
	_, err = ddbleasegocron.CronSchedule("not a crontab", false, time.UTC)
	assert.ErrorIs(t, err, ddblease.ErrInvalid)
	_, err = ddbleasegocron.AlignedStart(0, time.Now())
	assert.ErrorIs(t, err, ddblease.ErrInvalid)
}

func TestElector(t *testing.T) {
	table := srv.NewTable(t)
	a, err := ddbleasegocron.NewElector(srv.Client(nil), table, "elect", fastOpts("a"))
	require.NoError(t, err)
	b, err := ddbleasegocron.NewElector(srv.Client(nil), table, "elect", fastOpts("b"))
	require.NoError(t, err)
	assert.ErrorIs(t, a.IsLeader(context.Background()), ddbleasegocron.ErrNotStarted)
	assert.ErrorIs(t, a.Wait(), ddbleasegocron.ErrNotStarted)

	ctxA, stopA := context.WithCancel(context.Background())
	defer stopA()
	require.NoError(t, a.Start(ctxA))
	assert.ErrorIs(t, a.Start(ctxA), ddblease.ErrInvalid, "Start twice")
	waitUntil(t, func() bool { return a.IsLeader(context.Background()) == nil })
	fence, err := a.Fence()
	require.NoError(t, err)
	assert.Equal(t, a.Lease().State().Fence, fence)

	ctxB, stopB := context.WithCancel(context.Background())
	defer stopB()
	require.NoError(t, b.Start(ctxB))
	// The standby names the holder once it has seen it.
	waitUntil(t, func() bool {
		err := b.IsLeader(context.Background())
		return err != nil && errors.Is(err, ddblease.ErrNotLeader) && strings.Contains(err.Error(), `led by "a"`)
	})

	// a shuts down: it resigns, b leads at once, and a's Wait is clean.
	stopA()
	require.NoError(t, a.Wait())
	assert.ErrorIs(t, a.IsLeader(context.Background()), ddbleasegocron.ErrStopped)
	waitUntil(t, func() bool { return b.IsLeader(context.Background()) == nil })
	fb, err := b.Fence()
	require.NoError(t, err)
	assert.Greater(t, fb, fence)
	stopB()
	require.NoError(t, b.Wait())
}

func TestElectorCampaignError(t *testing.T) {
	e, err := ddbleasegocron.NewElector(srv.Client(nil), "no-such-table", "elect", fastOpts("a"))
	require.NoError(t, err)
	require.NoError(t, e.Start(context.Background()))
	err = e.Wait()
	require.Error(t, err, "a missing table stops the campaign")
	assert.Equal(t, err, e.Err())
	assert.ErrorIs(t, e.IsLeader(context.Background()), ddbleasegocron.ErrStopped)
	assert.ErrorIs(t, e.IsLeader(context.Background()), err)
}

func TestLocker(t *testing.T) {
	table := srv.NewTable(t)
	every := ddblease.Every(time.Hour)
	// The lease's clock reads 200ms past an hour: the firing of the hour.
	hour := time.Now().Truncate(time.Hour).Add(time.Hour)
	realStart := time.Now()
	now := func() time.Time { return time.Now().Add(hour.Add(200 * time.Millisecond).Sub(realStart)) }
	lk, err := ddbleasegocron.NewLocker(srv.Client(nil), table, fastOpts("a"), func(o *ddblease.Options) { o.Now = now })
	require.NoError(t, err)
	assert.ErrorIs(t, lk.Add("job", ddbleasegocron.Job{}), ddblease.ErrInvalid, "no schedule")
	require.NoError(t, lk.Add("job", ddbleasegocron.Job{Schedule: every}))
	assert.ErrorIs(t, lk.Add("job", ddbleasegocron.Job{Schedule: every}), ddblease.ErrInvalid, "twice")
	halfPast := hour.Add(30 * time.Minute)
	once := ddblease.ScheduleFunc(func(t time.Time) time.Time {
		if t.Before(halfPast) {
			return halfPast
		}
		return time.Time{}
	})
	require.NoError(t, lk.Add("drift", ddbleasegocron.Job{Schedule: once, Tolerance: time.Second}))
	_, err = lk.Lock(context.Background(), "job")
	assert.ErrorIs(t, err, ddbleasegocron.ErrNotStarted)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, lk.Start(ctx))
	_, err = lk.Lock(ctx, "unknown")
	assert.ErrorIs(t, err, ddblease.ErrInvalid)
	waitUntil(t, func() bool {
		return lk.Elector("job").Lease().IsLeader() && lk.Elector("drift").Lease().IsLeader()
	})

	lock, err := lk.Lock(ctx, "job")
	require.NoError(t, err)
	run, ok := lk.Run("job")
	require.True(t, ok)
	assert.Equal(t, hour.UTC(), run.Slot())
	_, err = lk.Lock(ctx, "job")
	assert.ErrorIs(t, err, ddblease.ErrSlotTaken, "the same slot again")
	lk.RecordError(uuid.New(), "job", errors.New("disk full"))
	require.NoError(t, lock.Unlock(ctx))
	_, ok = lk.Run("job")
	assert.False(t, ok)

	// A firing far from any slot: nothing is claimed.
	_, err = lk.Lock(ctx, "drift")
	assert.ErrorIs(t, err, ddbleasegocron.ErrNoSlot)

	runs, err := lk.Elector("job").Lease().ListRuns(ctx, every, hour, hour)
	require.NoError(t, err)
	require.Len(t, runs, 1)
	assert.Equal(t, ddblease.RunFailed, runs[0].Status)
	assert.Equal(t, "disk full", runs[0].Error)

	cancel()
	require.NoError(t, lk.Wait())
}

// TestLockerNotLeader: a replica that does not lead a job cannot lock it,
// and gocron skips the firing.
func TestLockerNotLeader(t *testing.T) {
	table := srv.NewTable(t)
	a, err := ddbleasegocron.NewLocker(srv.Client(nil), table, fastOpts("a"))
	require.NoError(t, err)
	b, err := ddbleasegocron.NewLocker(srv.Client(nil), table, fastOpts("b"))
	require.NoError(t, err)
	for _, l := range []*ddbleasegocron.Locker{a, b} {
		require.NoError(t, l.Add("job", ddbleasegocron.Job{Schedule: ddblease.Every(time.Second)}))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, a.Start(ctx))
	waitUntil(t, func() bool { return a.Elector("job").Lease().IsLeader() })
	require.NoError(t, b.Start(ctx))
	var _ gocron.Locker = b
	waitUntil(t, func() bool {
		_, err := b.Lock(ctx, "job")
		return errors.Is(err, ddblease.ErrNotLeader) && strings.Contains(err.Error(), `led by "a"`)
	})
	cancel()
	assert.NoError(t, a.Wait())
	assert.NoError(t, b.Wait())
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition never held")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestLockerDurationJob runs a real gocron DurationJob started with
// AlignedStart, so that its firings fall on ddblease.Every's slots, and
// checks that the runs were claimed for those slots and that a failing
// run's error, seen by the AfterJobRunsWithError listener, is recorded.
func TestLockerDurationJob(t *testing.T) {
	table := srv.NewTable(t)
	lk, err := ddbleasegocron.NewLocker(srv.Client(nil), table, fastOpts("a"))
	require.NoError(t, err)
	every := ddblease.Every(time.Second)
	require.NoError(t, lk.Add("tick", ddbleasegocron.Job{Schedule: every}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, lk.Start(ctx))
	waitUntil(t, func() bool { return lk.Elector("tick").Lease().IsLeader() })

	start, err := ddbleasegocron.AlignedStart(time.Second, time.Now())
	require.NoError(t, err)
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(lk))
	require.NoError(t, err)
	slots := make(chan time.Time, 10)
	_, err = s.NewJob(gocron.DurationJob(time.Second), gocron.NewTask(func() error {
		run, ok := lk.Run("tick")
		if !ok {
			return errors.New("no run in flight")
		}
		slots <- run.Slot()
		if len(slots) == 1 {
			return errors.New("first run fails")
		}
		return nil
	}), gocron.WithName("tick"), start,
		gocron.WithEventListeners(gocron.AfterJobRunsWithError(lk.RecordError)))
	require.NoError(t, err)
	s.Start()
	waitUntil(t, func() bool { return len(slots) >= 3 })
	require.NoError(t, s.Shutdown())
	cancel()
	require.NoError(t, lk.Wait())

	close(slots)
	var got []time.Time
	for s := range slots {
		got = append(got, s)
	}
	for i, s := range got {
		assert.Zero(t, s.Nanosecond(), "slot %s is a multiple of the period", s)
		if i > 0 {
			assert.Equal(t, time.Second, s.Sub(got[i-1]), "consecutive slots")
		}
	}
	runs, err := lk.Elector("tick").Lease().ListRuns(context.Background(), every, got[0], got[len(got)-1])
	require.NoError(t, err)
	require.Len(t, runs, len(got))
	assert.Equal(t, ddblease.RunFailed, runs[0].Status)
	assert.Equal(t, "first run fails", runs[0].Error)
	for _, r := range runs[1:] {
		assert.Equal(t, ddblease.RunSucceeded, r.Status, "slot %s", r.Slot)
	}
}

// TestLockerBurst locks firings of the burst "0,1 * * * * *" (seconds 0
// and 1 of every minute) by a lease clock set to each firing's time: a
// firing 600ms after second 0, nearer second 1 than second 0, matches no
// slot (ErrNoSlot) instead of claiming second 1, whose own firing then
// claims it.
func TestLockerBurst(t *testing.T) {
	table := srv.NewTable(t)
	minute := time.Now().Truncate(time.Minute).Add(time.Hour)
	var off atomic.Int64 // lease clock - system clock
	setClock := func(at time.Time) { off.Store(int64(time.Until(at))) }
	setClock(minute.Add(-2 * time.Second))
	lk, err := ddbleasegocron.NewLocker(srv.Client(nil), table, fastOpts("a"), func(o *ddblease.Options) {
		o.Now = func() time.Time { return time.Now().Add(time.Duration(off.Load())) }
		// The clock jumps forward below: a long lease keeps the tenure.
		o.LeaseDuration, o.HeartbeatInterval = 20*time.Second, 2*time.Second
	})
	require.NoError(t, err)
	sched, err := ddbleasegocron.CronSchedule("0,1 * * * * *", true, time.UTC)
	require.NoError(t, err)
	require.NoError(t, lk.Add("burst", ddbleasegocron.Job{Schedule: sched}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, lk.Start(ctx))
	waitUntil(t, func() bool { return lk.Elector("burst").Lease().IsLeader() })

	lockAt := func(at time.Time) (time.Time, error) {
		setClock(at)
		lock, err := lk.Lock(ctx, "burst")
		if err != nil {
			return time.Time{}, err
		}
		run, ok := lk.Run("burst")
		require.True(t, ok)
		require.NoError(t, lock.Unlock(ctx))
		return run.Slot(), nil
	}
	// The lease clock keeps running while Lock is called: 100ms late
	// leaves 150ms of the tolerance to a loaded machine.
	slot, err := lockAt(minute.Add(100 * time.Millisecond))
	require.NoError(t, err, "second 0, 100ms late")
	assert.Equal(t, minute.UTC(), slot)
	// Second 0 fired again, 600ms late (a retried firing, a replica
	// whose timer is late): nearer second 1, but not near enough.
	_, err = lockAt(minute.Add(600 * time.Millisecond))
	assert.ErrorIs(t, err, ddbleasegocron.ErrNoSlot, "second 0, 600ms late")
	assert.ErrorIs(t, err, ddblease.ErrNoSlot)
	slot, err = lockAt(minute.Add(1050 * time.Millisecond))
	require.NoError(t, err, "second 1, 50ms late")
	assert.Equal(t, minute.Add(time.Second).UTC(), slot)

	runs, err := lk.Elector("burst").Lease().ListRuns(ctx, sched, minute, minute.Add(time.Second))
	require.NoError(t, err)
	var got []time.Time
	for _, r := range runs {
		got = append(got, r.Slot)
		assert.Equal(t, ddblease.RunSucceeded, r.Status, "slot %s", r.Slot)
	}
	assert.Equal(t, []time.Time{minute.UTC(), minute.Add(time.Second).UTC()}, got)
	cancel()
	require.NoError(t, lk.Wait())
}

// TestLockerTask runs a real gocron DurationJob made with Locker.Task: fn
// gets the run its firing claimed, and its error is recorded in the run
// without an AfterJobRunsWithError listener. A Task that runs without a
// run of its job in flight returns an error and does not call fn; a nil
// fn is refused by NewJob.
func TestLockerTask(t *testing.T) {
	table := srv.NewTable(t)
	lk, err := ddbleasegocron.NewLocker(srv.Client(nil), table, fastOpts("a"))
	require.NoError(t, err)
	every := ddblease.Every(time.Second)
	require.NoError(t, lk.Add("tick", ddbleasegocron.Job{Schedule: every}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, lk.Start(ctx))
	waitUntil(t, func() bool { return lk.Elector("tick").Lease().IsLeader() })

	start, err := ddbleasegocron.AlignedStart(time.Second, time.Now())
	require.NoError(t, err)
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(lk))
	require.NoError(t, err)
	_, err = s.NewJob(gocron.DurationJob(time.Second), lk.Task("tick", nil), gocron.WithName("tick"))
	assert.Error(t, err, "a nil fn")
	slots := make(chan time.Time, 10)
	_, err = s.NewJob(gocron.DurationJob(time.Second), lk.Task("tick", func(ctx context.Context, run *ddblease.JobRun) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		slots <- run.Slot()
		if len(slots) == 1 {
			return errors.New("first run fails")
		}
		return nil
	}), gocron.WithName("tick"), start)
	require.NoError(t, err)
	unlocked := make(chan error, 10)
	called := false
	_, err = s.NewJob(gocron.DurationJob(time.Second), lk.Task("tick", func(context.Context, *ddblease.JobRun) error {
		called = true
		return nil
	}), gocron.WithName("unlocked"), gocron.WithDisabledDistributedJobLocker(true), start,
		gocron.WithEventListeners(gocron.AfterJobRunsWithError(func(_ uuid.UUID, _ string, err error) { unlocked <- err })))
	require.NoError(t, err)
	s.Start()
	waitUntil(t, func() bool { return len(slots) >= 2 && len(unlocked) >= 1 })
	require.NoError(t, s.Shutdown())
	cancel()
	require.NoError(t, lk.Wait())
	assert.ErrorIs(t, <-unlocked, ddblease.ErrInvalid, "a Task with no run in flight")
	assert.False(t, called)

	close(slots)
	var got []time.Time
	for s := range slots {
		got = append(got, s)
	}
	runs, err := lk.Elector("tick").Lease().ListRuns(context.Background(), every, got[0], got[len(got)-1])
	require.NoError(t, err)
	require.Len(t, runs, len(got))
	assert.Equal(t, ddblease.RunFailed, runs[0].Status)
	assert.Equal(t, "first run fails", runs[0].Error)
	for _, r := range runs[1:] {
		assert.Equal(t, ddblease.RunSucceeded, r.Status, "slot %s", r.Slot)
	}
}
