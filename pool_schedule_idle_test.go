package ddblease_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// once fires one slot, at, and then none for a day.
func once(at time.Time) ddblease.Schedule {
	far := at.Add(24 * time.Hour)
	return ddblease.ScheduleFunc(func(t time.Time) time.Time {
		switch {
		case t.Before(at):
			return at
		case t.Before(far):
			return far
		}
		return time.Time{}
	})
}

// The context a pool's RunSchedule gives fn is the tenure's leader
// context: it stays live after fn returns, through the steps that follow
// (an operator's pause and resume), for as long as the tenure lasts, and
// ends when the tenure does, with a cause wrapping ErrLost.
func TestPoolRunScheduleLeaderContextLastsTheTenure(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	jobs := poolJobs(2)
	ctxs := make(chan context.Context, 10)
	p := newPool(t, db, table, jobs, fast("a"))
	stop := async(ctx, func(ctx context.Context) error {
		return p.RunSchedule(ctx, ddblease.AllJobs(once(time.Now().Add(time.Second))), func(ctx context.Context, job string, run *ddblease.JobRun) error {
			if job == jobs[0] {
				ctxs <- ctx
			}
			return nil
		})
	})
	defer func() { require.NoError(t, stop()) }()
	leader := receive(t, (<-chan context.Context)(ctxs), "the run of "+jobs[0])
	fence := p.Lease(jobs[0]).State().Fence
	admin := newAdmin(t, db, table)
	_, err := admin.Pause(ctx, jobs[0])
	require.NoError(t, err)
	_, err = admin.Resume(ctx, jobs[0], false)
	require.NoError(t, err)
	for range 8 { // the pause and resume reach the holder at its session's renewals
		time.Sleep(250 * time.Millisecond)
		require.True(t, p.Lease(jobs[0]).IsLeader())
		require.NoError(t, leader.Err(), "the leader context of a tenure that goes on")
	}
	released := time.Now()
	_, err = admin.ForceRelease(ctx, jobs[0], fence)
	require.NoError(t, err)
	select {
	case <-leader.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the leader context outlived its tenure")
	}
	assert.ErrorIs(t, context.Cause(leader), ddblease.ErrLost)
	assert.Less(t, time.Since(released), 1500*time.Millisecond, "ended at the session's next renewal")
	assert.True(t, p.Lease(jobs[1]).IsLeader(), "the other job is untouched")
}

// A held job between its slots hears its operator: a resign request moves
// it to the other replica, and so does a forced release; a hand-over to a
// replica that joins moves its share, each in a few heartbeats.
func TestPoolRunScheduleIdleJobsHearTheOperator(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	jobs := poolJobs(4)
	// No slot due: with Every(time.Hour), the hour's slot fires when it is
	// less than CatchUpWindow old.
	sched := ddblease.AllJobs(once(time.Now().Add(time.Hour)))
	var mu sync.Mutex
	var ran []string
	fn := func(_ context.Context, job string, _ *ddblease.JobRun) error {
		mu.Lock()
		defer mu.Unlock()
		ran = append(ran, job)
		return nil
	}
	a := newPool(t, db, table, jobs, fast("a"))
	b := newPool(t, db, table, jobs, fast("b"))
	stopA := async(ctx, func(ctx context.Context) error { return a.RunSchedule(ctx, sched, fn) })
	eventually(t, "a leads every job", func() bool { return len(leaders(a, jobs)) == 4 })
	stopB := async(ctx, func(ctx context.Context) error { return b.RunSchedule(ctx, sched, fn) })
	defer func() { assert.NoError(t, stopB()) }()
	defer func() { assert.NoError(t, stopA()) }()
	eventually(t, "two jobs each", func() bool { return len(leaders(a, jobs)) == 2 && len(leaders(b, jobs)) == 2 })
	mine := leaders(a, jobs)
	admin := newAdmin(t, db, table)

	resigned := mine[0]
	_, err := admin.RequestResign(ctx, resigned, a.Lease(resigned).State().Fence)
	require.NoError(t, err)
	eventually(t, "b leads "+resigned, func() bool { return b.Lease(resigned).IsLeader() })
	assert.False(t, a.Lease(resigned).IsLeader())

	released := mine[1]
	fence := a.Lease(released).State().Fence
	_, err = admin.ForceRelease(ctx, released, fence)
	require.NoError(t, err)
	eventually(t, "b leads "+released, func() bool { return b.Lease(released).IsLeader() })
	assert.Equal(t, fence+2, b.Lease(released).State().Fence, "released (+1), then taken (+1)")
	assert.False(t, a.Lease(released).IsLeader())

	eventually(t, "two jobs each again", func() bool { return len(leaders(a, jobs)) == 2 && len(leaders(b, jobs)) == 2 })
	mu.Lock()
	defer mu.Unlock()
	assert.Empty(t, ran, "no slot fell due")
	if t.Failed() {
		t.Log(errors.Join(a.CheckHealth(0), b.CheckHealth(0)))
	}
}
