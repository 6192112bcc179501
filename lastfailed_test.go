package ddblease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A failed run is recorded in the lease item as the job's last failure
// (Record.LastFailedRun), which Admin.Run reads by key: a later success
// does not clear it, a failure of an older slot does not replace a newer
// one, the write leaves the lease protocol's version alone, and the next
// holder's acquisition keeps it.
func TestLastFailedRun(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table, db := tableAndClient(t)
	admin := newAdmin(t, db, table)
	l := newLease(t, db, table, "billing", fast("a"), slowLease)
	_, err := l.TryAcquire(ctx)
	require.NoError(t, err)
	base := time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC)
	slot := func(i int) time.Time { return base.Add(time.Duration(i) * time.Minute) }
	finish := func(i int, runErr error) {
		t.Helper()
		run, err := l.Claim(ctx, slot(i))
		require.NoError(t, err)
		require.NoError(t, run.Finish(ctx, runErr))
	}
	lastFailed := func() string {
		t.Helper()
		s, err := admin.Job(ctx, "billing")
		require.NoError(t, err)
		return s.Lease.LastFailedRun
	}

	finish(0, nil)
	assert.Empty(t, lastFailed(), "no run failed yet")

	rvBefore := rawLease(t, db, table, "billing")["rv"]
	finish(1, errors.New("boom at 1"))
	assert.Equal(t, "2026-11-30T02:01:00Z", lastFailed())
	assert.Equal(t, rvBefore, rawLease(t, db, table, "billing")["rv"], "the renewal version is the holder's")
	rec, ok, err := admin.Run(ctx, "billing", lastFailed())
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, ddblease.RunFailed, rec.Status)
	assert.Equal(t, "boom at 1", rec.Error)
	assert.Equal(t, slot(1), rec.Slot)

	finish(2, nil)
	assert.Equal(t, "2026-11-30T02:01:00Z", lastFailed(), "a later success does not clear the last failure")

	finish(5, errors.New("boom at 5"))
	assert.Equal(t, "2026-11-30T02:05:00Z", lastFailed())
	finish(3, errors.New("boom at 3")) // an older slot, finished later
	assert.Equal(t, "2026-11-30T02:05:00Z", lastFailed(), "an older failure does not replace a newer one")

	// The heartbeat and the next holder's acquisition keep it.
	err = l.Heartbeat(ctx)
	require.NoError(t, err)
	require.NoError(t, l.Resign(ctx))
	b := newLease(t, db, table, "billing", fast("b"), slowLease)
	_, err = b.TryAcquire(ctx)
	require.NoError(t, err)
	s, err := admin.Job(ctx, "billing")
	require.NoError(t, err)
	assert.Equal(t, "b", s.Lease.Owner)
	assert.Equal(t, "2026-11-30T02:05:00Z", s.Lease.LastFailedRun, "kept across acquisitions")
	jobs, err := admin.Jobs(ctx)
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	assert.Equal(t, "2026-11-30T02:05:00Z", jobs[0].Lease.LastFailedRun, "Admin.Jobs decodes it too")
}

// Admin.Run reads one run by id: a slot, or a triggered run's RunID; a
// run not in the table is not ok; an id that is none is ErrInvalid,
// before any request.
func TestAdminRun(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table, faults, db := tableWithFaults(t)
	admin := newAdmin(t, db, table)
	l := newLease(t, db, table, "billing", fast("a"), slowLease)
	_, err := l.TryAcquire(ctx)
	require.NoError(t, err)
	at := time.Date(2026, 11, 30, 2, 0, 0, 500_000_000, time.UTC)
	run, err := l.Claim(ctx, at)
	require.NoError(t, err)
	require.NoError(t, run.Finish(ctx, nil))

	rec, ok, err := admin.Run(ctx, "billing", "2026-11-30T02:00:00.5Z")
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, ddblease.RunSucceeded, rec.Status)
	assert.Equal(t, at, rec.Slot)

	_, ok, err = admin.Run(ctx, "billing", "2026-11-30T03:00:00Z")
	require.NoError(t, err)
	assert.False(t, ok, "no run in that slot")
	_, ok, err = admin.Run(ctx, "billing", "2026-11-30T02:00:00.5Z#trigger-00000000000000aa")
	require.NoError(t, err)
	assert.False(t, ok, "no triggered run of that id")

	before := total(faults.Counts())
	for _, id := range []string{"", "yesterday", "2026-11-30T02:00:00Z#trigger-xyz", "2026-11-30T02:00:00Z#trigger-"} {
		_, _, err := admin.Run(ctx, "billing", id)
		require.ErrorIs(t, err, ddblease.ErrInvalid, "%q", id)
		assert.Contains(t, err.Error(), "is not a run id", "%q", id)
	}
	_, _, err = admin.Run(ctx, "", "2026-11-30T02:00:00Z")
	require.ErrorIs(t, err, ddblease.ErrInvalid)
	assert.Equal(t, before, total(faults.Counts()), "refused before any request")
}

// A lastFailed attribute that is not a run's sort key (written by hand, or
// by a later version) is left out: it never makes the lease item
// unreadable, to the replicas or to an operator.
func TestLastFailedMalformedIsIgnored(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table, db := tableAndClient(t)
	admin := newAdmin(t, db, table)
	l := newLease(t, db, table, "billing", fast("a"), slowLease)
	_, err := l.TryAcquire(ctx)
	require.NoError(t, err)
	for _, v := range []types.AttributeValue{sAttr("not a key"), nAttr("12"), sAttr("run#2026-11-30T02:00:00Z")} {
		item := rawLease(t, db, table, "billing")
		item["lastFailed"] = v
		putRaw(t, db, table, item)
		s, err := admin.Job(ctx, "billing")
		require.NoError(t, err, "%v", v)
		assert.Empty(t, s.Lease.LastFailedRun)
		err = l.Heartbeat(ctx)
		require.NoError(t, err, "the holder still renews")
	}
}
