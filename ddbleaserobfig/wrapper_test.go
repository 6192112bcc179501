package ddbleaserobfig_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/ddbleaserobfig"
	"github.com/robfig/cron/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func fast(owner string, now func() time.Time) func(*ddblease.Options) {
	return func(o *ddblease.Options) {
		o.Owner, o.Logger, o.Now = owner, quiet, now
		o.LeaseDuration, o.HeartbeatInterval, o.RetryInterval = 1500*time.Millisecond, 400*time.Millisecond, 100*time.Millisecond
		o.CallTimeout, o.MaxClockSkew, o.DrainTimeout = 300*time.Millisecond, 300*time.Millisecond, 2*time.Second
	}
}

func TestWrapperInput(t *testing.T) {
	_, err := ddbleaserobfig.New(nil, "t")
	assert.ErrorIs(t, err, ddblease.ErrInvalid)
	w, err := ddbleaserobfig.New(srv.Client(nil), "table")
	require.NoError(t, err)
	fn := func(context.Context, *ddblease.JobRun) error { return nil }
	every := cron.Every(time.Minute)
	_, err = w.Job("a", nil, fn)
	assert.ErrorIs(t, err, ddblease.ErrInvalid)
	_, err = w.Job("a", every, nil)
	assert.ErrorIs(t, err, ddblease.ErrInvalid)
	_, err = w.Job("", every, fn)
	assert.ErrorIs(t, err, ddblease.ErrInvalid)
	_, err = w.Job("a", every, fn, ddbleaserobfig.JobOptions{Tolerance: -time.Second})
	assert.ErrorIs(t, err, ddblease.ErrInvalid)
	assert.ErrorIs(t, w.Wait(), ddbleaserobfig.ErrNotStarted)
	assert.ErrorIs(t, w.Start(context.Background()), ddblease.ErrInvalid, "no job")
	_, err = w.Job("a", every, fn)
	require.NoError(t, err)
	_, err = w.Job("a", every, fn)
	assert.ErrorIs(t, err, ddblease.ErrInvalid, "twice")
}

// TestWrapperFiring calls a wrapped job's Run as robfig's cron would, with
// the clock 100ms past a slot: on a standby it does nothing; on the leader
// it claims the slot, runs fn, and records fn's error; a second firing of
// the same slot is skipped; shutdown waits for a running firing.
func TestWrapperFiring(t *testing.T) {
	table := srv.NewTable(t)
	hour := time.Now().Truncate(time.Hour).Add(time.Hour)
	realStart := time.Now()
	now := func() time.Time { return time.Now().Add(hour.Add(100 * time.Millisecond).Sub(realStart)) }
	sched, err := cron.ParseStandard("0 * * * *")
	require.NoError(t, err)

	calls := make(chan *ddblease.JobRun, 10)
	fail := errors.New("upstream refused")
	mk := func(owner string) (*ddbleaserobfig.Wrapper, cron.Job) {
		w, err := ddbleaserobfig.New(srv.Client(nil), table, fast(owner, now))
		require.NoError(t, err)
		j, err := w.Job("hourly", sched, func(ctx context.Context, run *ddblease.JobRun) error {
			calls <- run
			return fail
		})
		require.NoError(t, err)
		return w, j
	}
	wa, ja := mk("a")
	wb, jb := mk("b")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, wa.Start(ctx))
	waitUntil(t, func() bool { return wa.Lease("hourly").IsLeader() })
	require.NoError(t, wb.Start(ctx))

	jb.Run() // standby: skipped
	ja.Run() // leader: runs
	ja.Run() // the same slot again: skipped
	require.Len(t, calls, 1)
	run := <-calls
	assert.Equal(t, hour.UTC(), run.Slot())
	runs, err := wa.Lease("hourly").ListRuns(ctx, sched, hour, hour)
	require.NoError(t, err)
	require.Len(t, runs, 1)
	assert.Equal(t, ddblease.RunFailed, runs[0].Status)
	assert.Equal(t, "upstream refused", runs[0].Error)
	assert.Equal(t, "a", runs[0].Owner)

	cancel()
	assert.NoError(t, wa.Wait())
	assert.NoError(t, wb.Wait())
}

// drainingObserver returns an option whose Observer closes the returned
// channel when the lease starts draining.
func drainingObserver() (func(*ddblease.Options), <-chan struct{}) {
	ch := make(chan struct{})
	var once sync.Once
	return func(o *ddblease.Options) {
		o.Observer = func(ev ddblease.Event) {
			if ev.Kind == ddblease.EventDraining {
				once.Do(func() { close(ch) })
			}
		}
	}, ch
}

// TestWrapperDrain: when the Wrapper's context ends, a running firing keeps
// its context, completes its work and is recorded succeeded, and only then
// is the lease resigned.
func TestWrapperDrain(t *testing.T) {
	table := srv.NewTable(t)
	observe, draining := drainingObserver()
	w, err := ddbleaserobfig.New(srv.Client(nil), table, fast("a", nil), observe)
	require.NoError(t, err)
	started, returned := make(chan *ddblease.JobRun, 1), make(chan struct{})
	var ctxErr error
	j, err := w.Job("drain", cron.Every(time.Second), func(ctx context.Context, run *ddblease.JobRun) error {
		started <- run
		<-draining                         // the shutdown lands mid-run
		time.Sleep(200 * time.Millisecond) // the run's work
		ctxErr = context.Cause(ctx)
		close(returned)
		return ctx.Err()
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, w.Start(ctx))
	waitUntil(t, func() bool { return w.Lease("drain").IsLeader() })
	done := make(chan struct{})
	go func() { j.Run(); close(done) }()
	run := <-started
	cancel()
	require.NoError(t, w.Wait())
	select {
	case <-returned:
	default:
		t.Fatal("Wait returned before the running firing")
	}
	<-done
	assert.NoError(t, ctxErr, "the run's context lives through the drain")
	rec, err := w.Lease("drain").Holder(context.Background())
	require.NoError(t, err)
	assert.True(t, rec.ExpiresAt.Before(time.Now()), "resigned after the drain")
	runs, err := w.Lease("drain").ListRuns(context.Background(), ddblease.Every(time.Second), run.Slot(), run.Slot())
	require.NoError(t, err)
	require.Len(t, runs, 1)
	assert.Equal(t, ddblease.RunSucceeded, runs[0].Status, runs[0].Error)
}

// TestWrapperDrainTimeout: a firing still running DrainTimeout after the
// Wrapper's context ended has its context cancelled, with a cause wrapping
// ErrDrainTimeout, and Wait says so.
func TestWrapperDrainTimeout(t *testing.T) {
	table := srv.NewTable(t)
	w, err := ddbleaserobfig.New(srv.Client(nil), table, fast("a", nil), func(o *ddblease.Options) { o.DrainTimeout = 300 * time.Millisecond })
	require.NoError(t, err)
	started := make(chan struct{})
	var cause error
	j, err := w.Job("slow", cron.Every(time.Second), func(ctx context.Context, run *ddblease.JobRun) error {
		close(started)
		<-ctx.Done()
		cause = context.Cause(ctx)
		return ctx.Err()
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, w.Start(ctx))
	waitUntil(t, func() bool { return w.Lease("slow").IsLeader() })
	done := make(chan struct{})
	go func() { j.Run(); close(done) }()
	<-started
	cancel()
	assert.ErrorIs(t, w.Wait(), ddblease.ErrDrainTimeout)
	<-done
	assert.ErrorIs(t, cause, ddblease.ErrDrainTimeout)
}

// TestWrapperLoss: a firing's context ends the moment its tenure is lost,
// with a cause wrapping ErrLost.
func TestWrapperLoss(t *testing.T) {
	table := srv.NewTable(t)
	w, err := ddbleaserobfig.New(srv.Client(nil), table, fast("a", nil))
	require.NoError(t, err)
	started := make(chan struct{})
	var cause error
	j, err := w.Job("lost", cron.Every(time.Second), func(ctx context.Context, run *ddblease.JobRun) error {
		close(started)
		<-ctx.Done()
		cause = context.Cause(ctx)
		return ctx.Err()
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	require.NoError(t, w.Start(ctx))
	l := w.Lease("lost")
	waitUntil(t, func() bool { return l.IsLeader() })
	done := make(chan struct{})
	go func() { j.Run(); close(done) }()
	<-started
	require.NoError(t, l.Resign(context.Background())) // the tenure ends
	<-done
	assert.ErrorIs(t, cause, ddblease.ErrLost)
	cancel()
	assert.NoError(t, w.Wait())
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
