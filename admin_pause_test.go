package ddblease_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// slotLog records the runs RunSchedule fires.
type slotLog struct {
	mu   sync.Mutex
	runs []ddblease.RunRecord // slot, fence, owner and trigger of each call
	ch   chan struct{}
}

func newSlotLog() *slotLog { return &slotLog{ch: make(chan struct{}, 1000)} }

func (s *slotLog) fn(_ context.Context, run *ddblease.JobRun) error {
	s.mu.Lock()
	s.runs = append(s.runs, ddblease.RunRecord{Slot: run.Slot(), Fence: run.Fence(), Owner: run.Owner(), Trigger: run.Trigger()})
	s.mu.Unlock()
	s.ch <- struct{}{}
	return nil
}

func (s *slotLog) all() []ddblease.RunRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.runs)
}

func runsWith(t *testing.T, admin *ddblease.Admin, job string, st ddblease.RunStatus, after time.Time) []ddblease.RunRecord {
	t.Helper()
	runs, err := admin.Runs(context.Background(), job, ddblease.RunRange{From: after})
	require.NoError(t, err)
	var out []ddblease.RunRecord
	for _, r := range runs {
		if r.Status == st {
			out = append(out, r)
		}
	}
	return out
}

// Pause stops the firing of slots, which are recorded as skipped by the
// pause and not run on resume; resume with catch-up runs the latest of
// them, once. The leader keeps the lease throughout.
func TestPauseResume(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	admin := newAdmin(t, db, table)
	var skippedEvents atomic.Int32
	l := newLease(t, db, table, "tick", fast("a"), func(o *ddblease.Options) {
		o.Observer = func(e ddblease.Event) {
			if e.Kind == ddblease.EventRunFinished && e.Status == ddblease.RunSkippedByPause {
				skippedEvents.Add(1)
			}
		}
	})
	log := newSlotLog()
	const period = 250 * time.Millisecond
	stop := runScheduleAsync(ctx, l, ddblease.Every(period), log.fn)
	defer func() { assert.NoError(t, stop()) }()
	receive(t, log.ch, "a first run")
	fence := l.State().Fence

	rec, err := admin.Pause(ctx, "tick")
	require.NoError(t, err)
	paused := time.Now()
	assert.True(t, rec.Control.Paused)
	assert.Equal(t, "ops@test", rec.Control.PausedBy)
	eventually(t, "two slots skipped by the pause", func() bool {
		return len(runsWith(t, admin, "tick", ddblease.RunSkippedByPause, time.Time{})) >= 2
	})
	again, err := admin.Pause(ctx, "tick")
	require.NoError(t, err)
	assert.Equal(t, rec.Control.PausedAt, again.Control.PausedAt, "pausing a paused job changes nothing")
	for _, r := range log.all() {
		assert.True(t, r.Slot.Before(paused), "slot %v fired after the pause", r.Slot)
	}
	assert.True(t, l.IsLeader(), "the leader keeps the lease while paused")
	assert.Equal(t, fence, l.State().Fence)

	rec, err = admin.Resume(ctx, "tick", false)
	require.NoError(t, err)
	resumed := time.Now()
	assert.False(t, rec.Control.Paused)
	assert.False(t, rec.Control.CatchUpPending)
	eventually(t, "a run after the resumption", func() bool {
		return slices.ContainsFunc(log.all(), func(r ddblease.RunRecord) bool { return r.Slot.After(resumed) })
	})
	skipped := runsWith(t, admin, "tick", ddblease.RunSkippedByPause, time.Time{})
	require.NotEmpty(t, skipped)
	for _, s := range skipped {
		assert.True(t, s.Slot.After(paused.Add(-period)) && s.Slot.Before(resumed), "slot %v skipped outside the pause", s.Slot)
		assert.False(t, slices.ContainsFunc(log.all(), func(r ddblease.RunRecord) bool { return r.Slot.Equal(s.Slot) }),
			"slot %v skipped by the pause ran", s.Slot)
		assert.Equal(t, fence, s.Fence)
		assert.False(t, s.FinishedAt.IsZero())
	}
	_, err = admin.Resume(ctx, "tick", false)
	assert.ErrorIs(t, err, ddblease.ErrInvalid, "resuming a job that is not paused")
	assert.EqualValues(t, len(skipped), skippedEvents.Load(), "each skip is reported to the observer")

	// Pause again, then resume with a catch-up: the latest slot skipped by
	// this pause runs, once, and the others stay skipped.
	_, err = admin.Pause(ctx, "tick")
	require.NoError(t, err)
	paused2 := time.Now()
	eventually(t, "two more slots skipped", func() bool {
		return len(runsWith(t, admin, "tick", ddblease.RunSkippedByPause, paused2)) >= 2
	})
	rec, err = admin.Resume(ctx, "tick", true)
	require.NoError(t, err)
	assert.True(t, rec.Control.CatchUpPending)
	eventually(t, "the catch-up request handled", func() bool {
		st, err := admin.Job(ctx, "tick")
		return err == nil && !st.Lease.Control.CatchUpPending
	})
	var caught []ddblease.RunRecord
	for _, r := range runsWith(t, admin, "tick", ddblease.RunSucceeded, paused2) {
		if r.Claims == 2 {
			caught = append(caught, r)
		}
	}
	require.Len(t, caught, 1, "one slot skipped by the pause is run again")
	last := runsWith(t, admin, "tick", ddblease.RunSkippedByPause, paused2)
	for _, s := range last {
		assert.True(t, s.Slot.Before(caught[0].Slot), "the latest skipped slot is the one run")
	}
	n := 0
	for _, r := range log.all() {
		if r.Slot.Equal(caught[0].Slot) {
			n++
		}
	}
	assert.Equal(t, 1, n)
}

// Pause under faults: the leader's reads of the lease item fail now and
// then, and its writes lose their answers. No slot that falls due after
// the pause was written runs; slots are recorded as skipped-by-pause, and
// after the resumption the schedule goes on without running them.
func TestPauseUnderFaults(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table := srv.NewTable(t)
	faults := ddbtest.NewFaults(nil)
	admin := newAdmin(t, srv.Client(nil), table)
	l := newLease(t, srv.Client(faults.Wrap), table, "tock", fast("a"))
	log := newSlotLog()
	stop := runScheduleAsync(ctx, l, ddblease.Every(250*time.Millisecond), log.fn)
	defer func() { assert.NoError(t, stop()) }()
	receive(t, log.ch, "a first run")
	var mu sync.Mutex
	n := 0
	faults.Set(func(op string) ddbtest.Action {
		mu.Lock()
		defer mu.Unlock()
		n++
		switch {
		case op == "GetItem" && n%3 == 0:
			return ddbtest.ServerError
		case (op == "UpdateItem" || op == "TransactWriteItems") && n%4 == 0:
			return ddbtest.DropResponse
		}
		return ddbtest.Pass
	})

	_, err := admin.Pause(ctx, "tock")
	require.NoError(t, err)
	paused := time.Now()
	eventually(t, "slots skipped by the pause", func() bool {
		return len(runsWith(t, admin, "tock", ddblease.RunSkippedByPause, paused)) >= 3
	})
	for _, r := range log.all() {
		assert.True(t, r.Slot.Before(paused), "slot %v fired after the pause", r.Slot)
	}
	_, err = admin.Resume(ctx, "tock", false)
	require.NoError(t, err)
	resumed := time.Now()
	eventually(t, "runs after the resumption", func() bool {
		return slices.ContainsFunc(log.all(), func(r ddblease.RunRecord) bool { return r.Slot.After(resumed) })
	})
	for _, s := range runsWith(t, admin, "tock", ddblease.RunSkippedByPause, time.Time{}) {
		assert.False(t, slices.ContainsFunc(log.all(), func(r ddblease.RunRecord) bool { return r.Slot.Equal(s.Slot) }),
			"slot %v skipped by the pause ran", s.Slot)
	}
}

// A resumption's catch-up claims again a run recorded skipped by the
// pause: while it runs, its item has no finish time, and once it is done
// it finished after it started, on a server that ignores REMOVE too
// (minidyn v0.8.2 ignored a top-level REMOVE, and the run kept the finish
// time of its skip: the command printed it as having taken -6s).
func TestCatchUpRunHasNoFinishTimeWhileRunning(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table := srv.NewTable(t)
	admin := newAdmin(t, srv.Client(nil), table)
	l := newLease(t, srv.Client(ddbtest.IgnoreRemove), table, "tack", fast("a"))
	type seen struct {
		slot time.Time
		rec  ddblease.RunRecord
	}
	running := make(chan seen, 1000)
	stop := runScheduleAsync(ctx, l, ddblease.Every(250*time.Millisecond), func(ctx context.Context, run *ddblease.JobRun) error {
		runs, err := admin.Runs(ctx, "tack", ddblease.RunRange{From: run.Slot().Add(-time.Millisecond)})
		if err != nil {
			return err
		}
		for _, r := range runs {
			if r.Slot.Equal(run.Slot()) && r.Trigger == "" {
				running <- seen{run.Slot(), r}
			}
		}
		return nil
	})
	defer func() { assert.NoError(t, stop()) }()
	receive(t, running, "a first run")

	_, err := admin.Pause(ctx, "tack")
	require.NoError(t, err)
	paused := time.Now()
	eventually(t, "a slot skipped by the pause", func() bool {
		return len(runsWith(t, admin, "tack", ddblease.RunSkippedByPause, paused)) >= 1
	})
	_, err = admin.Resume(ctx, "tack", true)
	require.NoError(t, err)
	var caught ddblease.RunRecord
	eventually(t, "the catch-up's run", func() bool {
		for _, r := range runsWith(t, admin, "tack", ddblease.RunSucceeded, paused) {
			if r.Claims == 2 {
				caught = r
				return true
			}
		}
		return false
	})
	assert.True(t, caught.FinishedAt.After(caught.StartedAt) || caught.FinishedAt.Equal(caught.StartedAt),
		"the caught-up run finished at %v, before it started at %v", caught.FinishedAt, caught.StartedAt)
	found := false
	for len(running) > 0 {
		s := <-running
		if !s.slot.Equal(caught.Slot) {
			continue
		}
		found = true
		assert.Equal(t, ddblease.RunRunning, s.rec.Status)
		assert.True(t, s.rec.FinishedAt.IsZero(), "the run, still running, has finish time %v (started %v)",
			s.rec.FinishedAt, s.rec.StartedAt)
	}
	assert.True(t, found, "fn never ran the caught-up slot %v", caught.Slot)
}
