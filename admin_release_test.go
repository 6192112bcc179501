package ddblease_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// leaderProbe runs a lease's Run with a function that keeps its leader
// context where a test can look at it.
type leaderProbe struct {
	l       *ddblease.Lease
	ctx     atomic.Pointer[context.Context]
	started chan int64
	mu      sync.Mutex
	cause   error
	// onStart, if set, is called as fn starts, before started is sent.
	onStart func(fence int64)
}

func newLeaderProbe(l *ddblease.Lease) *leaderProbe {
	return &leaderProbe{l: l, started: make(chan int64, 4)}
}

func (p *leaderProbe) fn(ctx context.Context, fence int64) error {
	p.ctx.Store(&ctx)
	if p.onStart != nil {
		p.onStart(fence)
	}
	p.started <- fence
	<-ctx.Done()
	p.mu.Lock()
	if p.cause == nil {
		p.cause = context.Cause(ctx)
	}
	p.mu.Unlock()
	return nil
}

// leads reports whether the replica believes it leads, as a user sees it:
// IsLeader, or a leader context that has not ended.
func (p *leaderProbe) leads() bool {
	if p.l.IsLeader() {
		return true
	}
	c := p.ctx.Load()
	return c != nil && (*c).Err() == nil
}

func (p *leaderProbe) lostCause() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cause
}

// releaseTimings give the holder a heartbeat interval long enough that a
// holder deposed right after a renewal keeps believing it leads for a
// while, unless something stops it.
func releaseTimings(o *ddblease.Options) {
	o.LeaseDuration = 4 * time.Second
	o.HeartbeatInterval = 1500 * time.Millisecond
	o.CallTimeout = time.Second
}

// A forced release keeps one leader at a time: the raised fence refuses
// the old holder's guarded writes at once, but the standby leads only
// once the old holder's tenure is over by its own clock, and never while
// the old holder's IsLeader or leader context still says it leads. The
// old holder's loss cause says an operator released it.
func TestForceReleaseKeepsOneLeader(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	admin := newAdmin(t, db, table)
	renewed := make(chan struct{}, 16)
	a := newLease(t, db, table, "billing", fast("a"), releaseTimings, func(o *ddblease.Options) {
		o.Observer = func(e ddblease.Event) {
			if e.Kind == ddblease.EventRenewed {
				select {
				case renewed <- struct{}{}:
				default:
				}
			}
		}
	})
	pa := newLeaderProbe(a)
	stopA := runAsync(ctx, a, pa.fn)
	defer func() { assert.NoError(t, stopA()) }()
	f1 := receive(t, pa.started, "a leads")

	b := newLease(t, db, table, "billing", fast("b"), releaseTimings)
	pb := newLeaderProbe(b)
	var overlap atomic.Bool
	pb.onStart = func(int64) {
		if pa.leads() {
			overlap.Store(true)
		}
	}
	stopB := runAsync(ctx, b, pb.fn)
	defer func() { assert.NoError(t, stopB()) }()

	// Sample both replicas until b leads: b first, then a, so that a
	// sample that finds both leading shows an instant of two leaders.
	sampled := make(chan int)
	go func() {
		n := 0
		for {
			bLeads := pb.leads()
			if bLeads && pa.leads() {
				overlap.Store(true)
			}
			n++
			if bLeads {
				sampled <- n
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()

	// Release right after a renewal, so that a's next heartbeat, where it
	// would learn of the release, is a whole HeartbeatInterval away.
	for len(renewed) > 0 {
		<-renewed
	}
	receive(t, renewed, "a renews")
	before, err := admin.Job(ctx, "billing")
	require.NoError(t, err)
	rec, err := admin.ForceRelease(ctx, "billing", f1)
	require.NoError(t, err)
	assert.Equal(t, f1+1, rec.Fence)
	assert.Equal(t, before.Lease.ExpiresAt, rec.ExpiresAt, "the holder's recorded expiry is kept")
	assert.True(t, ddblease.JobStatus{Job: "billing", Lease: rec}.Released())

	// The old fence is refused at once, while a still believes it leads.
	g, err := ddblease.NewGuard(db, table, "billing")
	require.NoError(t, err)
	assert.ErrorIs(t, g.Check(ctx, f1), ddblease.ErrStaleFence, "Check refuses the released fence")
	if srv.Caps(t).Transactions {
		err := g.TransactWrite(ctx, f1, []types.TransactWriteItem{{Put: &types.Put{
			TableName: &table, Item: sink("invoice-1"),
		}}})
		assert.ErrorIs(t, err, ddblease.ErrStaleFence, "TransactWrite refuses the released fence")
	}

	fb := receive(t, pb.started, "b leads")
	n := receive(t, sampled, "the sampler")
	assert.Equal(t, f1+2, fb)
	assert.False(t, overlap.Load(), "b led while a still believed it led (%d samples)", n)
	assert.Greater(t, n, 1, "the sampler saw the release period")

	cause := pa.lostCause()
	require.Error(t, cause, "a's leader context ended")
	assert.ErrorIs(t, cause, ddblease.ErrLost)
	assert.Contains(t, cause.Error(), `released by force by operator "ops@test"`)
	assert.Contains(t, cause.Error(), "the fence is now 2")
	assert.NotContains(t, cause.Error(), "now held by")
	_, ok := getRawOK(t, db, table, "invoice-1")
	assert.False(t, ok, "the stale transaction wrote nothing")
}

// With HolderDead, the operator states that the holder is gone: the
// expiry is zeroed with the fence raised, and a standby leads at once,
// long before the holder's recorded expiry. The raised fence still
// refuses the holder's claims and guarded writes.
func TestForceReleaseHolderDead(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	admin := newAdmin(t, db, table)
	// a's lease lasts 20s and it renews every 5s: without the flag, b
	// would wait for a's recorded expiry.
	a := newLease(t, db, table, "billing", fast("a"), slowLease)
	pa := newLeaderProbe(a)
	stopA := runAsync(ctx, a, pa.fn)
	defer func() { assert.NoError(t, stopA()) }()
	f1 := receive(t, pa.started, "a leads")
	b := newLease(t, db, table, "billing", fast("b"))
	pb := newLeaderProbe(b)
	var startedAt atomic.Pointer[time.Time]
	pb.onStart = func(int64) { now := time.Now(); startedAt.Store(&now) }
	stopB := runAsync(ctx, b, pb.fn)
	defer func() { assert.NoError(t, stopB()) }()

	before, err := admin.Job(ctx, "billing")
	require.NoError(t, err)
	require.False(t, before.Lease.ExpiresAt.IsZero())
	rec, err := admin.ForceRelease(ctx, "billing", f1, func(o *ddblease.ReleaseOptions) { o.HolderDead = true })
	require.NoError(t, err)
	assert.Equal(t, f1+1, rec.Fence)
	assert.True(t, rec.ExpiresAt.IsZero(), "the expiry is zeroed")

	fb := receive(t, pb.started, "b leads")
	assert.Equal(t, f1+2, fb)
	assert.True(t, startedAt.Load().Before(before.Lease.ExpiresAt), "b leads before the released holder's recorded expiry")

	g, err := ddblease.NewGuard(db, table, "billing")
	require.NoError(t, err)
	assert.ErrorIs(t, g.Check(ctx, f1), ddblease.ErrStaleFence)
	if srv.Caps(t).Transactions && a.IsLeader() {
		// a has not heard yet: its claim is refused and ends its tenure.
		_, err := a.Claim(ctx, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		assert.ErrorIs(t, err, ddblease.ErrLost, "the released holder's claim is refused")
	}
	eventually(t, "a's leader context ends", func() bool { return pa.lostCause() != nil })
	assert.ErrorIs(t, pa.lostCause(), ddblease.ErrLost)
	assert.Contains(t, pa.lostCause().Error(), `released by force by operator "ops@test"`)
	assert.Contains(t, pa.lostCause().Error(), `held by "b"`)
}

// A resign request keeps one leader at a time too: the holder ends its
// tenure before the write that frees the lease, so the standby never
// leads while the holder's IsLeader or leader context says it leads.
func TestRequestResignKeepsOneLeader(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	admin := newAdmin(t, db, table)
	a := newLease(t, db, table, "billing", fast("a"), releaseTimings)
	pa := newLeaderProbe(a)
	stopA := runAsync(ctx, a, pa.fn)
	defer func() { assert.NoError(t, stopA()) }()
	f1 := receive(t, pa.started, "a leads")
	b := newLease(t, db, table, "billing", fast("b"), releaseTimings)
	pb := newLeaderProbe(b)
	var overlap atomic.Bool
	pb.onStart = func(int64) {
		if pa.leads() {
			overlap.Store(true)
		}
	}
	stopB := runAsync(ctx, b, pb.fn)
	defer func() { assert.NoError(t, stopB()) }()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			bLeads := pb.leads()
			if bLeads && pa.leads() {
				overlap.Store(true)
			}
			if bLeads {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	_, err := admin.RequestResign(ctx, "billing", f1)
	require.NoError(t, err)
	assert.Equal(t, f1+1, receive(t, pb.started, "b leads"))
	<-done
	assert.False(t, overlap.Load(), "b led while a still believed it led")
	assert.ErrorIs(t, pa.lostCause(), ddblease.ErrResignRequested)
}

// A forced release keeps one leader at a time also when the released
// holder, cut off from the table right after the release, believes it
// leads until its local deadline, with a clock behind the standby's by
// almost MaxClockSkew: the holder's recorded expiry, by its slow clock, is
// kept, and the standby waits for it plus MaxClockSkew by its own.
func TestForceReleaseSlowHolderClock(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, faults, dbA := tableWithFaults(t)
	db := srv.Client(nil)
	admin := newAdmin(t, db, table)
	const behind = 140 * time.Millisecond // fast's MaxClockSkew is 150ms
	renewed := make(chan struct{}, 16)
	a := newLease(t, dbA, table, "billing", fast("a"), releaseTimings, func(o *ddblease.Options) {
		o.Now = func() time.Time { return time.Now().Add(-behind) }
		o.Observer = func(e ddblease.Event) {
			if e.Kind == ddblease.EventRenewed {
				select {
				case renewed <- struct{}{}:
				default:
				}
			}
		}
	})
	pa := newLeaderProbe(a)
	stopA := runAsync(ctx, a, pa.fn)
	defer func() { _ = stopA() }() // cut off, a's campaign ends with its failed attempts
	f1 := receive(t, pa.started, "a leads")

	b := newLease(t, db, table, "billing", fast("b"), releaseTimings)
	pb := newLeaderProbe(b)
	var overlap atomic.Bool
	pb.onStart = func(int64) {
		if pa.leads() {
			overlap.Store(true)
		}
	}
	stopB := runAsync(ctx, b, pb.fn)
	defer func() { assert.NoError(t, stopB()) }()
	sampled := make(chan int)
	go func() {
		n := 0
		for {
			bLeads := pb.leads()
			if bLeads && pa.leads() {
				overlap.Store(true)
			}
			n++
			if bLeads {
				sampled <- n
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	for len(renewed) > 0 {
		<-renewed
	}
	receive(t, renewed, "a renews")
	_, err := admin.ForceRelease(ctx, "billing", f1)
	require.NoError(t, err)
	// a is cut off from the table from now on: it learns nothing, and
	// believes it leads until its local deadline.
	faults.Set(func(string) ddbtest.Action { return ddbtest.Reset })
	assert.Equal(t, f1+2, receive(t, pb.started, "b leads"))
	n := receive(t, sampled, "the sampler")
	assert.False(t, overlap.Load(), "b led while a still believed it led (%d samples)", n)
}

// A holder released by force leaves the lease to the others for a
// LeaseDuration, measured by the runtime's clock: a wall clock that was
// stepped ahead when the release came, and steps back during the yield,
// does not stretch it. The clock here carries no monotonic reading, as a
// wall clock stepped by NTP is seen by the table's expiries.
func TestForceReleaseYieldIsNotStretchedByAWallStep(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table := srv.NewTable(t)
	db := srv.Client(nil)
	admin := newAdmin(t, db, table)
	var step atomic.Int64
	a := newLease(t, db, table, "billing", fast("a"), func(o *ddblease.Options) {
		o.Now = func() time.Time { return time.Now().Round(0).Add(time.Duration(step.Load())) }
	})
	pa := newLeaderProbe(a)
	stopA := runAsync(ctx, a, pa.fn)
	defer func() { assert.NoError(t, stopA()) }()
	f1 := receive(t, pa.started, "a leads")
	// The wall clock steps 30 s ahead: by it, the tenure's deadline has
	// passed, and a takes its own lease again with the next fence.
	step.Store(int64(30 * time.Second))
	f2 := receive(t, pa.started, "a leads again after the step")
	require.Greater(t, f2, f1)
	_, err := admin.ForceRelease(ctx, "billing", f2)
	require.NoError(t, err)
	eventually(t, "a deposed", func() bool { return !pa.leads() })
	time.Sleep(200 * time.Millisecond) // a yields from now on
	step.Store(0)
	// The yield is fast's LeaseDuration, 2 s; stretched by the step, it
	// would be 32 s, past receive's 15 s.
	f3 := receive(t, pa.started, "a leads once its yield is over")
	assert.Greater(t, f3, f2)
}
