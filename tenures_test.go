package ddblease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A run that joined a tenure keeps its context through the shutdown's
// drain, and the lease is resigned only once the run is done: a standby
// takes over after that, not before. No run joins a draining tenure.
func TestTenuresDrainRunsBeforeTheResignation(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table, db := tableAndClient(t)
	a := newLease(t, db, table, "job", fast("a"))
	ts, err := ddblease.NewTenures(a)
	require.NoError(t, err)
	stop := runAsync(ctx, a, ts.Lead)
	run := joined(t, ts)
	assert.Equal(t, a.State().Fence, run.Fence())

	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	eventually(t, "the tenure drains", func() bool {
		other, err := ts.Join()
		if err == nil {
			other.Done() // joined before the drain began
		}
		return errors.Is(err, ddblease.ErrNotLeader)
	})
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, run.Context().Err(), "the run's context lives through the drain")
	assert.True(t, a.IsLeader(), "the lease is held while the run drains")
	b := newLease(t, db, table, "job", fast("b"))
	_, err = b.TryAcquire(ctx)
	require.ErrorIs(t, err, ddblease.ErrHeld)

	run.Done()
	require.NoError(t, receive(t, (<-chan error)(stopped), "Run's return"))
	require.ErrorIs(t, context.Cause(run.Context()), ddblease.ErrLost, "the runs' context ends with the tenure")
	fence, err := b.TryAcquire(ctx)
	require.NoError(t, err, "resigned: a standby takes over at once")
	assert.Equal(t, run.Fence()+1, fence)
}

// A run still running DrainTimeout after the drain began has its context
// cancelled, and Run returns ErrDrainTimeout.
func TestTenuresDrainTimeout(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table, db := tableAndClient(t)
	a := newLease(t, db, table, "job", fast("a"), func(o *ddblease.Options) { o.DrainTimeout = 500 * time.Millisecond })
	ts, err := ddblease.NewTenures(a)
	require.NoError(t, err)
	stop := runAsync(ctx, a, ts.Lead)
	run := joined(t, ts)
	go func() {
		<-run.Context().Done()
		run.Done()
	}()
	err = stop()
	require.ErrorIs(t, err, ddblease.ErrDrainTimeout)
	require.ErrorIs(t, context.Cause(run.Context()), ddblease.ErrDrainTimeout)
}

// A tenure taken by force ends its runs' context at once, with a cause
// wrapping ErrLost; without a tenure, Join says so.
func TestTenuresLossEndsTheRuns(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table, db := tableAndClient(t)
	_, err := ddblease.NewTenures(nil)
	require.ErrorIs(t, err, ddblease.ErrInvalid)
	a := newLease(t, db, table, "job", fast("a"))
	ts, err := ddblease.NewTenures(a)
	require.NoError(t, err)
	_, err = ts.Join()
	require.ErrorIs(t, err, ddblease.ErrNotLeader)
	stop := runAsync(ctx, a, ts.Lead)
	run := joined(t, ts)
	_, err = newAdmin(t, db, table).ForceRelease(ctx, "job", run.Fence())
	require.NoError(t, err)
	select {
	case <-run.Context().Done():
	case <-ctx.Done():
		t.Fatal("the run's context outlived the tenure")
	}
	require.ErrorIs(t, context.Cause(run.Context()), ddblease.ErrLost)
	run.Done()
	require.NoError(t, stop())
}

// A tenure lost while its runs drain ends their context then, not at the
// DrainTimeout.
func TestTenuresLossDuringTheDrain(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table, db := tableAndClient(t)
	a := newLease(t, db, table, "job", fast("a"), func(o *ddblease.Options) { o.DrainTimeout = time.Minute })
	ts, err := ddblease.NewTenures(a)
	require.NoError(t, err)
	stop := runAsync(ctx, a, ts.Lead)
	run := joined(t, ts)
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	eventually(t, "the tenure drains", func() bool {
		other, err := ts.Join()
		if err == nil {
			other.Done()
		}
		return errors.Is(err, ddblease.ErrNotLeader)
	})
	_, err = newAdmin(t, db, table).ForceRelease(ctx, "job", run.Fence())
	require.NoError(t, err)
	select {
	case <-run.Context().Done():
	case <-ctx.Done():
		t.Fatal("the run's context outlived the tenure")
	}
	require.ErrorIs(t, context.Cause(run.Context()), ddblease.ErrLost)
	run.Done()
	<-stopped
}

// joined joins the tenure of ts once its Lead has published one (a Join
// at the instant the lease leads waits a RetryInterval at most).
func joined(t *testing.T, ts *ddblease.Tenures) *ddblease.Tenure {
	t.Helper()
	var run *ddblease.Tenure
	eventually(t, "a tenure to join", func() bool {
		var err error
		run, err = ts.Join()
		return err == nil
	})
	return run
}
