package ddbleaserobfig_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	ddbleaserobfig "github.com/ddblease/ddblease/robfigcron"
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

// TestWrapperDrain: when the Wrapper's context ends, a running firing has
// its context cancelled and is waited for before the lease is resigned.
func TestWrapperDrain(t *testing.T) {
	table := srv.NewTable(t)
	w, err := ddbleaserobfig.New(srv.Client(nil), table, fast("a", nil))
	require.NoError(t, err)
	started, returned := make(chan struct{}), make(chan time.Time, 1)
	j, err := w.Job("drain", cron.Every(time.Second), func(ctx context.Context, run *ddblease.JobRun) error {
		close(started)
		<-ctx.Done()
		time.Sleep(200 * time.Millisecond) // cleaning up
		returned <- time.Now()
		return ctx.Err()
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, w.Start(ctx))
	waitUntil(t, func() bool { return w.Lease("drain").IsLeader() })
	done := make(chan struct{})
	go func() { j.Run(); close(done) }()
	<-started
	cancel()
	require.NoError(t, w.Wait())
	select {
	case <-returned:
	default:
		t.Fatal("Wait returned before the running firing")
	}
	<-done
	rec, err := w.Lease("drain").Holder(context.Background())
	require.NoError(t, err)
	assert.True(t, rec.ExpiresAt.Before(time.Now()), "resigned after the drain")
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
