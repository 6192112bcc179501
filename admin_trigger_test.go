package ddblease_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A trigger runs the job once, as an extra run with its own id, claimed
// with the leader's fence; WaitRun reports how it ended. Triggers run
// while the job is paused too.
func TestTrigger(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	admin := newAdmin(t, db, table)
	l := newLease(t, db, table, "report", fast("a"))
	log := newSlotLog()
	failNext := make(chan struct{}, 1)
	fn := func(ctx context.Context, run *ddblease.JobRun) error {
		_ = log.fn(ctx, run)
		select {
		case <-failNext:
			return errors.New("report failed")
		default:
			return nil
		}
	}
	stop := runScheduleAsync(ctx, l, farSchedule, fn)
	defer func() { assert.NoError(t, stop()) }()
	eventually(t, "a leads", l.IsLeader)

	tr, err := admin.Trigger(ctx, "report")
	require.NoError(t, err)
	assert.Len(t, tr.ID, 16)
	run, err := admin.WaitRun(ctx, tr, 20*time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, ddblease.RunSucceeded, run.Status)
	assert.Equal(t, tr.ID, run.Trigger)
	assert.Equal(t, "a", run.Owner)
	assert.Equal(t, l.State().Fence, run.Fence)
	assert.True(t, tr.At.Equal(run.Slot))
	runs := log.all()
	require.Len(t, runs, 1)
	assert.Equal(t, tr.ID, runs[0].Trigger)
	// One right after the other: the leader, waiting for its next slot,
	// is woken for each.
	for range 2 {
		tr, err := admin.Trigger(ctx, "report")
		require.NoError(t, err)
		run, err := admin.WaitRun(ctx, tr, 20*time.Millisecond)
		require.NoError(t, err)
		assert.Equal(t, ddblease.RunSucceeded, run.Status)
	}

	// While paused, and failing.
	_, err = admin.Pause(ctx, "report")
	require.NoError(t, err)
	failNext <- struct{}{}
	tr2, err := admin.Trigger(ctx, "report")
	require.NoError(t, err)
	run, err = admin.WaitRun(ctx, tr2, 20*time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, ddblease.RunFailed, run.Status)
	assert.Equal(t, "report failed", run.Error)
	eventually(t, "the requests cleared", func() bool {
		st, err := admin.Job(ctx, "report")
		return err == nil && st.Lease.Control.Triggers == 0
	})
	assert.Len(t, log.all(), 4, "each trigger ran once")

	all, err := admin.Runs(ctx, "report", ddblease.RunRange{})
	require.NoError(t, err)
	require.Len(t, all, 4)
	assert.Equal(t, tr.ID, all[0].Trigger)
	assert.Equal(t, tr2.ID, all[3].Trigger)
}

// Triggers and resign requests under faults: responses of the leader's
// writes are lost (the SDK retries, the write may have landed) and reads
// fail now and then. Each trigger still runs exactly once, and the resign
// request still hands the lease over.
func TestControlsUnderFaults(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 90*time.Second)
	table := srv.NewTable(t)
	faults := ddbtest.NewFaults(nil)
	dbA := srv.Client(faults.Wrap)
	db := srv.Client(nil)
	admin := newAdmin(t, db, table)
	a := newLease(t, dbA, table, "flaky", fast("a"))
	log := newSlotLog()
	stop := runScheduleAsync(ctx, a, farSchedule, log.fn)
	defer func() { assert.NoError(t, stop()) }()
	eventually(t, "a leads", a.IsLeader)

	var mu sync.Mutex
	n := 0
	faults.Set(func(op string) ddbtest.Action {
		mu.Lock()
		defer mu.Unlock()
		n++
		switch {
		case (op == "UpdateItem" || op == "TransactWriteItems") && n%3 == 0:
			return ddbtest.DropResponse
		case op == "GetItem" && n%5 == 0:
			return ddbtest.ServerError
		}
		return ddbtest.Pass
	})
	var trs []ddblease.Trigger
	for range 4 {
		tr, err := admin.Trigger(ctx, "flaky")
		require.NoError(t, err)
		trs = append(trs, tr)
	}
	for _, tr := range trs {
		run, err := admin.WaitRun(ctx, tr, 20*time.Millisecond)
		require.NoError(t, err)
		assert.Equal(t, ddblease.RunSucceeded, run.Status)
		assert.Equal(t, 1, run.Claims)
	}
	eventually(t, "the requests cleared", func() bool {
		st, err := admin.Job(ctx, "flaky")
		return err == nil && st.Lease.Control.Triggers == 0
	})
	byTrigger := map[string]int{}
	for _, r := range log.all() {
		byTrigger[r.Trigger]++
	}
	for _, tr := range trs {
		assert.Equal(t, 1, byTrigger[tr.ID], "trigger %s ran once", tr.ID)
	}

	b := newLease(t, db, table, "flaky", fast("b"))
	logB := newTenureLog()
	stopB := runAsync(ctx, b, logB.fn)
	defer func() { assert.NoError(t, stopB()) }()
	fa := a.State().Fence
	_, err := admin.RequestResign(ctx, "flaky", fa)
	require.NoError(t, err)
	fb := receive(t, logB.started, "b leads")
	assert.Greater(t, fb, fa)
	assert.ErrorIs(t, srvGuardCheck(ctx, t, table, fa), ddblease.ErrStaleFence)
}

func srvGuardCheck(ctx context.Context, t *testing.T, table string, fence int64) error {
	g, err := ddblease.NewGuard(srv.Client(nil), table, "flaky")
	require.NoError(t, err)
	return g.Check(ctx, fence)
}
