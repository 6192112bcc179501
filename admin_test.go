package ddblease_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newAdmin(t *testing.T, db ddblease.AdminAPI, table string) *ddblease.Admin {
	t.Helper()
	a, err := ddblease.NewAdmin(db, table, func(o *ddblease.AdminOptions) { o.Operator = "ops@test" })
	require.NoError(t, err)
	return a
}

// eventually polls cond every 20ms until it holds or 15s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestAdminValidation(t *testing.T) {
	t.Parallel()
	db := srv.Client(nil)
	_, err := ddblease.NewAdmin(nil, "leases")
	assert.ErrorIs(t, err, ddblease.ErrInvalid)
	_, err = ddblease.NewAdmin(db, "x")
	assert.ErrorIs(t, err, ddblease.ErrInvalid)
	_, err = ddblease.NewAdmin(db, "leases", func(o *ddblease.AdminOptions) { o.CallTimeout = -1 })
	assert.ErrorIs(t, err, ddblease.ErrInvalid)
	_, err = ddblease.NewAdmin(db, "leases", func(o *ddblease.AdminOptions) { o.Operator = "a\x00b" })
	assert.ErrorIs(t, err, ddblease.ErrInvalid)

	ctx := withTimeout(t, 20*time.Second)
	table := srv.NewTable(t)
	a := newAdmin(t, db, table)
	_, err = a.Job(ctx, "")
	assert.ErrorIs(t, err, ddblease.ErrInvalid)
	for name, call := range map[string]func() error{
		"Job":           func() error { _, err := a.Job(ctx, "nope"); return err },
		"ForceRelease":  func() error { _, err := a.ForceRelease(ctx, "nope", 0); return err },
		"RequestResign": func() error { _, err := a.RequestResign(ctx, "nope", 0); return err },
		"Pause":         func() error { _, err := a.Pause(ctx, "nope"); return err },
		"Resume":        func() error { _, err := a.Resume(ctx, "nope", false); return err },
		"Trigger":       func() error { _, err := a.Trigger(ctx, "nope"); return err },
	} {
		assert.ErrorIs(t, call(), ddblease.ErrUnknownJob, name)
	}
	_, err = a.ForceRelease(ctx, "nope", -1)
	assert.ErrorIs(t, err, ddblease.ErrInvalid)
	_, _, err = a.TriggerRun(ctx, ddblease.Trigger{Job: "j", ID: "xyz"})
	assert.ErrorIs(t, err, ddblease.ErrInvalid)
	// No admin write may create the item of an unknown job.
	_, ok := getRawOK(t, db, table, "lease#nope")
	assert.False(t, ok)
}

func getRawOK(t *testing.T, db *dynamodb.Client, table, pk string) (map[string]types.AttributeValue, bool) {
	t.Helper()
	out, err := db.GetItem(context.Background(), &dynamodb.GetItemInput{
		TableName: aws.String(table), Key: key(pk), ConsistentRead: aws.Bool(true)})
	require.NoError(t, err)
	return out.Item, len(out.Item) > 0
}

// ForceRelease raises the fence in one write: the holder's next heartbeat
// is refused and its leader context ends with ErrLost, its guarded writes
// are refused at once, a standby leads with a fence higher still, and the
// released replica does not take the lease straight back.
func TestForceRelease(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table := srv.NewTable(t)
	db := srv.Client(nil)
	admin := newAdmin(t, db, table)
	a := newLease(t, db, table, "billing", fast("a"))
	logA := newTenureLog()
	stopA := runAsync(ctx, a, logA.fn)
	defer func() { assert.NoError(t, stopA()) }()
	f1 := receive(t, logA.started, "a leads")
	b := newLease(t, db, table, "billing", fast("b"))
	logB := newTenureLog()
	stopB := runAsync(ctx, b, logB.fn)
	defer func() { assert.NoError(t, stopB()) }()

	_, err := admin.ForceRelease(ctx, "billing", f1+5)
	var held *ddblease.HeldError
	require.ErrorAs(t, err, &held, "a fence that is not the current one is refused")
	assert.Equal(t, f1, held.Fence)

	rec, err := admin.ForceRelease(ctx, "billing", f1)
	require.NoError(t, err)
	assert.Equal(t, f1+1, rec.Fence)
	assert.True(t, rec.ExpiresAt.IsZero())
	assert.Equal(t, f1, rec.Control.ReleasedFence)
	assert.Equal(t, "ops@test", rec.Control.ReleasedBy)

	g, err := ddblease.NewGuard(db, table, "billing")
	require.NoError(t, err)
	assert.ErrorIs(t, g.Check(ctx, f1), ddblease.ErrStaleFence, "the old fence is refused from the release on")

	fb := receive(t, logB.started, "b leads")
	assert.Equal(t, f1+2, fb)
	eventually(t, "a's leader context ends", func() bool { return logA.cause(0) != nil })
	assert.ErrorIs(t, logA.cause(0), ddblease.ErrLost)
	require.NoError(t, g.Check(ctx, fb))

	st, err := admin.Job(ctx, "billing")
	require.NoError(t, err)
	assert.Equal(t, "b", st.Lease.Owner)
	assert.Equal(t, f1, st.Lease.Control.ReleasedFence, "the release stays recorded")
	assert.False(t, st.Free(time.Now(), time.Second))
	select {
	case f := <-logA.started:
		t.Fatalf("the released replica led again (fence %d) while b held the lease", f)
	default:
	}
}

// A resign request is honoured at the leader's next heartbeat: the leader
// context ends with ErrResignRequested, the lease is resigned, a standby
// leads, and the resigned replica keeps campaigning without taking it
// back. A lone replica takes it back after a lease duration.
func TestRequestResign(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table := srv.NewTable(t)
	db := srv.Client(nil)
	admin := newAdmin(t, db, table)
	a := newLease(t, db, table, "sweep", fast("a"))
	logA := newTenureLog()
	stopA := runAsync(ctx, a, logA.fn)
	defer func() { assert.NoError(t, stopA()) }()
	f1 := receive(t, logA.started, "a leads")

	// Alone: a hands the lease over, finds no taker, and leads again.
	rec, err := admin.RequestResign(ctx, "sweep", 0)
	require.NoError(t, err)
	assert.Equal(t, f1, rec.Control.ResignFence)
	assert.Equal(t, "ops@test", rec.Control.ResignBy)
	asked := time.Now()
	f2 := receive(t, logA.started, "a leads again")
	assert.Equal(t, f1+1, f2)
	assert.ErrorIs(t, logA.cause(0), ddblease.ErrResignRequested)
	assert.GreaterOrEqual(t, time.Since(asked), a.Options().LeaseDuration-a.Options().HeartbeatInterval,
		"a lone replica waits about a lease duration before taking the lease back")

	// With a standby: the standby leads, and a does not take it back.
	b := newLease(t, db, table, "sweep", fast("b"))
	logB := newTenureLog()
	stopB := runAsync(ctx, b, logB.fn)
	defer func() { assert.NoError(t, stopB()) }()
	_, err = admin.RequestResign(ctx, "sweep", f2)
	require.NoError(t, err)
	fb := receive(t, logB.started, "b leads")
	assert.Equal(t, f2+1, fb)
	eventually(t, "a's second tenure ends", func() bool { return logA.cause(1) != nil })
	assert.ErrorIs(t, logA.cause(1), ddblease.ErrResignRequested)
	st, err := admin.Job(ctx, "sweep")
	require.NoError(t, err)
	assert.Equal(t, "b", st.Lease.Owner)
	assert.Zero(t, b.State().Fence-fb)
	assert.True(t, b.IsLeader())
	assert.False(t, b.ResignRequested(), "a request concerns only the tenure it names")

	// A request naming a tenure that is over is refused.
	_, err = admin.RequestResign(ctx, "sweep", f2)
	assert.ErrorIs(t, err, ddblease.ErrHeld)
	require.NoError(t, b.Resign(ctx))
	_, err = admin.RequestResign(ctx, "sweep", 0)
	if !errors.Is(err, ddblease.ErrNotHeld) {
		// a took the lease over in the meantime: also a live lease.
		require.NoError(t, err)
	}
}

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

func runScheduleAsync(ctx context.Context, l *ddblease.Lease, sched ddblease.Schedule, fn func(context.Context, *ddblease.JobRun) error) (stop func() error) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.RunSchedule(ctx, sched, fn) }()
	return func() error {
		cancel()
		return <-done
	}
}

func runsWith(t *testing.T, admin *ddblease.Admin, job string, st ddblease.RunStatus, after time.Time) []ddblease.RunRecord {
	t.Helper()
	runs, err := admin.Runs(context.Background(), job, after)
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
	table := srv.NewTable(t)
	db := srv.Client(nil)
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

// A trigger runs the job once, as an extra run with its own id, claimed
// with the leader's fence; WaitRun reports how it ended. Triggers run
// while the job is paused too.
func TestTrigger(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table := srv.NewTable(t)
	db := srv.Client(nil)
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
	stop := runScheduleAsync(ctx, l, ddblease.Every(24*time.Hour), fn)
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

	all, err := admin.Runs(ctx, "report", time.Time{})
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
	stop := runScheduleAsync(ctx, a, ddblease.Every(24*time.Hour), log.fn)
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

// Jobs lists every job of the table; Runs lists one job's runs, and not
// those of a job whose name extends it.
func TestJobsAndRuns(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table := srv.NewTable(t)
	db := srv.Client(nil)
	admin := newAdmin(t, db, table)
	jobs, err := admin.Jobs(ctx)
	require.NoError(t, err)
	assert.Empty(t, jobs)
	slot := time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC)
	for _, job := range []string{"b", "a", "a#x"} {
		l := newLease(t, db, table, job, fast("o-"+job))
		_, err := l.TryAcquire(ctx)
		require.NoError(t, err)
		run, err := l.Claim(ctx, slot)
		require.NoError(t, err)
		require.NoError(t, run.Finish(ctx, nil))
		run, err = l.Claim(ctx, slot.Add(time.Hour))
		require.NoError(t, err)
		require.NoError(t, run.Finish(ctx, errors.New("boom")))
	}
	jobs, err = admin.Jobs(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 3)
	assert.Equal(t, []string{"a", "a#x", "b"}, []string{jobs[0].Job, jobs[1].Job, jobs[2].Job})
	assert.Equal(t, "o-a", jobs[0].Lease.Owner)
	assert.Equal(t, int64(1), jobs[0].Lease.Fence)

	runs, err := admin.Runs(ctx, "a", time.Time{})
	require.NoError(t, err)
	require.Len(t, runs, 2)
	assert.Equal(t, "a", runs[0].Job)
	assert.True(t, runs[0].Slot.Equal(slot))
	assert.Equal(t, ddblease.RunFailed, runs[1].Status)
	runs, err = admin.Runs(ctx, "a", slot.Add(time.Minute))
	require.NoError(t, err)
	require.Len(t, runs, 1)

	// A malformed lease item is reported, the others listed.
	putRaw(t, db, table, map[string]types.AttributeValue{"pk": sAttr("lease#bad"), "owner": sAttr("x"),
		"fence": nAttr("1"), "expiresAt": nAttr("0"), "rv": sAttr("v"), "paused": sAttr("yes")})
	jobs, err = admin.Jobs(ctx)
	assert.ErrorIs(t, err, ddblease.ErrMalformedItem)
	assert.Len(t, jobs, 3)
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
