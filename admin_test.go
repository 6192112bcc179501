package ddblease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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

// ForceRelease raises the fence in one write: the holder's next heartbeat
// is refused and its leader context ends with ErrLost, its guarded writes
// are refused at once, a standby leads with a fence higher still once the
// holder's recorded expiry has passed, and the released replica does not
// take the lease straight back.
func TestForceRelease(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table, db := tableAndClient(t)
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
	assert.False(t, rec.ExpiresAt.IsZero(), "the holder's recorded expiry is kept")
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
	table, db := tableAndClient(t)
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

// Jobs lists every job of the table; Runs lists one job's runs, and not
// those of a job whose name extends it.
func TestJobsAndRuns(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table, db := tableAndClient(t)
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

	runs, err := admin.Runs(ctx, "a", ddblease.RunRange{})
	require.NoError(t, err)
	require.Len(t, runs, 2)
	assert.Equal(t, "a", runs[0].Job)
	assert.True(t, runs[0].Slot.Equal(slot))
	assert.Equal(t, ddblease.RunFailed, runs[1].Status)
	runs, err = admin.Runs(ctx, "a", ddblease.RunRange{From: slot.Add(time.Minute)})
	require.NoError(t, err)
	require.Len(t, runs, 1)
	runs, err = admin.Runs(ctx, "a", ddblease.RunRange{To: slot})
	require.NoError(t, err)
	require.Len(t, runs, 1, "To is included")
	assert.True(t, runs[0].Slot.Equal(slot))
	runs, err = admin.Runs(ctx, "a", ddblease.RunRange{Newest: true, Limit: 1})
	require.NoError(t, err)
	require.Len(t, runs, 1)
	assert.Equal(t, ddblease.RunFailed, runs[0].Status, "the latest run")
	runs, err = admin.Runs(ctx, "a", ddblease.RunRange{From: slot.Add(2 * time.Hour)})
	require.NoError(t, err)
	assert.Empty(t, runs)
	_, err = admin.Runs(ctx, "a", ddblease.RunRange{From: slot, To: slot.Add(-time.Second)})
	assert.ErrorIs(t, err, ddblease.ErrInvalid)

	// A malformed lease item of a listed job is reported, the others
	// listed.
	putRaw(t, db, table, item("pk", "directory", "sk", "job#bad"))
	putRaw(t, db, table, withKey("lease#bad", map[string]types.AttributeValue{"owner": sAttr("x"),
		"fence": nAttr("1"), "expiresAt": nAttr("0"), "rv": sAttr("v"), "paused": sAttr("yes")}))
	jobs, err = admin.Jobs(ctx)
	assert.ErrorIs(t, err, ddblease.ErrMalformedItem)
	assert.Len(t, jobs, 3)
}

// Every Admin call on a missing table names the table and says it is not
// found, with the SDK's error kept in the chain.
func TestAdminMissingTable(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table := "ddblease-missing-" + ddbtest.RandomID()
	a := newAdmin(t, srv.Client(nil), table)
	for name, call := range map[string]func() error{
		"Job":           func() error { _, err := a.Job(ctx, "billing"); return err },
		"Jobs":          func() error { _, err := a.Jobs(ctx); return err },
		"Runs":          func() error { _, err := a.Runs(ctx, "billing", ddblease.RunRange{}); return err },
		"ForceRelease":  func() error { _, err := a.ForceRelease(ctx, "billing", 3); return err },
		"RequestResign": func() error { _, err := a.RequestResign(ctx, "billing", 0); return err },
		"Pause":         func() error { _, err := a.Pause(ctx, "billing"); return err },
		"Resume":        func() error { _, err := a.Resume(ctx, "billing", false); return err },
		"Trigger":       func() error { _, err := a.Trigger(ctx, "billing"); return err },
		"TriggerRun": func() error {
			_, _, err := a.TriggerRun(ctx, ddblease.Trigger{Job: "billing", ID: "0123456789abcdef", At: time.Now()})
			return err
		},
	} {
		err := call()
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), `table "`+table+`" not found`, name)
		var nf *types.ResourceNotFoundException
		assert.ErrorAs(t, err, &nf, name)
	}
}
