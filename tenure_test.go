package ddblease_test

// Leadership as a user sees it: the leader context handed to fn, IsLeader,
// and what Run returns. Each test is the regression test of a defect where
// the library's own idea of its tenure and what a user observed disagreed.

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hang is a transport that, once its filter says so, holds a request until
// the request's context ends (a black-holed connection).
type hang struct {
	base   http.RoundTripper
	filter atomic.Pointer[func(op string) bool]
}

func (h *hang) set(f func(op string) bool) { h.filter.Store(&f) }

func (h *hang) RoundTrip(r *http.Request) (*http.Response, error) {
	if f := h.filter.Load(); f != nil && (*f)(ddbtest.Op(r)) {
		if r.Body != nil {
			_ = r.Body.Close()
		}
		<-r.Context().Done()
		return nil, r.Context().Err()
	}
	return h.base.RoundTrip(r)
}

// leaderView records, from inside fn, what a user sees of one handle's
// leadership: the leader context of its current tenure.
type leaderView struct {
	mu     sync.Mutex
	ctx    context.Context
	fence  int64
	starts chan int64
}

func newLeaderView() *leaderView { return &leaderView{starts: make(chan int64, 16)} }

// fn leads until its context ends.
func (v *leaderView) fn(ctx context.Context, fence int64) error {
	v.mu.Lock()
	v.ctx, v.fence = ctx, fence
	v.mu.Unlock()
	v.starts <- fence
	<-ctx.Done()
	return nil
}

// live reports whether the last leader context handed to fn is still live.
func (v *leaderView) live() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.ctx != nil && v.ctx.Err() == nil
}

// takeover records what a user of a saw when b began to lead: whether a's
// last leader context was still live, and whether a.IsLeader() was true.
type takeover struct {
	aLive, aLeader atomic.Bool
	started        chan int64
}

// runTakingOver runs b, which takes the lease over from a (whose tenures
// av records), until stop.
func runTakingOver(ctx context.Context, b, a *ddblease.Lease, av *leaderView) (tk *takeover, stop func() error) {
	tk = &takeover{started: make(chan int64, 1)}
	stop = runAsync(ctx, b, func(ctx context.Context, fence int64) error {
		tk.aLive.Store(av.live())
		tk.aLeader.Store(a.IsLeader())
		tk.started <- fence
		<-ctx.Done()
		return nil
	})
	return tk, stop
}

// Defect 1: a heartbeat whose write and read-back hang cannot keep the
// leader context alive past the local deadline. A standby with the same
// clock takes over after the lease's expiry; at that moment the old
// leader's context must be over and its IsLeader false.
func TestBeliefEndsAtDeadlineWhileCallsHang(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table := srv.NewTable(t)
	h := &hang{}
	opts := func(owner string) func(*ddblease.Options) {
		return func(o *ddblease.Options) {
			o.Owner, o.Logger = owner, quiet
			o.LeaseDuration, o.HeartbeatInterval, o.CallTimeout = 2*time.Second, 900*time.Millisecond, 850*time.Millisecond
			o.MaxClockSkew, o.RetryInterval = 100*time.Millisecond, 50*time.Millisecond
		}
	}
	a := newLease(t, srv.Client(func(rt http.RoundTripper) http.RoundTripper { h.base = rt; return h }), table, "job", opts("a"))
	b := newLease(t, srv.Client(nil), table, "job", opts("b"))
	av := newLeaderView()
	stopA := runAsync(ctx, a, av.fn)
	receive(t, av.starts, "a leads")
	h.set(func(op string) bool { return op == "UpdateItem" || op == "GetItem" })

	tk, stopB := runTakingOver(ctx, b, a, av)
	assert.Equal(t, int64(2), receive(t, tk.started, "b takes over"))
	assert.False(t, tk.aLive.Load(), "a's leader context was live when b began to lead")
	assert.False(t, tk.aLeader.Load(), "a.IsLeader() was true when b began to lead")
	h.set(func(string) bool { return false })
	assert.NoError(t, stopB())
	_ = stopA()
}

// Defect 3: Resign while Run leads ends the leader context before the
// lease is given up; Run goes on campaigning without taking the lease
// straight back, and reports the loss.
func TestResignWhileRunLeads(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table, db := tableAndClient(t)
	var events eventLog
	a := newLease(t, db, table, "job", fast("a"), events.option)
	b := newLease(t, db, table, "job", fast("b"))
	av := newLeaderView()
	stopA := runAsync(ctx, a, av.fn)
	require.Equal(t, int64(1), receive(t, av.starts, "a leads"))

	tk, stopB := runTakingOver(ctx, b, a, av)
	require.NoError(t, a.Resign(ctx))
	assert.Equal(t, int64(2), receive(t, tk.started, "b takes over"))
	assert.False(t, tk.aLive.Load(), "a's leader context was live when b began to lead")
	assert.False(t, tk.aLeader.Load())
	cause := func() error { av.mu.Lock(); defer av.mu.Unlock(); return context.Cause(av.ctx) }()
	assert.ErrorIs(t, cause, ddblease.ErrLost)
	lost := events.find(ddblease.EventLost)
	require.NotNil(t, lost)
	assert.Equal(t, ddblease.LossResignedElsewhere, lost.Reason)
	// a is still campaigning: when b gives up, a leads again.
	require.NoError(t, stopB())
	assert.Equal(t, int64(3), receive(t, av.starts, "a leads again"))
	assert.NoError(t, stopA())
}

// Defect 4: one campaign per handle.
func TestOneCampaignPerHandle(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table := srv.NewTable(t)
	a := newLease(t, srv.Client(nil), table, "job", fast("a"))
	av := newLeaderView()
	stop := runAsync(ctx, a, av.fn)
	receive(t, av.starts, "a leads")
	err := a.Run(ctx, func(context.Context, int64) error {
		t.Error("a second Run on the same handle called fn")
		return nil
	})
	assert.ErrorIs(t, err, ddblease.ErrInvalid)
	assert.ErrorContains(t, err, "another Run or RunSchedule is active")
	err = a.RunSchedule(ctx, ddblease.Every(time.Second), func(context.Context, *ddblease.JobRun) error {
		t.Error("RunSchedule beside Run called fn")
		return nil
	})
	assert.ErrorIs(t, err, ddblease.ErrInvalid)
	require.NoError(t, stop())
	// Once Run has returned, the handle may campaign again.
	stop = runAsync(ctx, a, av.fn)
	receive(t, av.starts, "a leads again")
	require.NoError(t, stop())
}

// Defect 5: many writes in doubt do not make the holder forget the version
// it last confirmed, and so do not lock it out of its own lease.
func TestManyWritesInDoubt(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table := srv.NewTable(t)
	faults := ddbtest.NewFaults(nil)
	a := newLease(t, srv.Client(faults.Wrap), table, "job", func(o *ddblease.Options) {
		fast("a")(o)
		o.LeaseDuration, o.HeartbeatInterval, o.CallTimeout = 20*time.Second, 5*time.Second, 2*time.Second
	})
	fence, err := a.TryAcquire(ctx)
	require.NoError(t, err)
	faults.Set(func(op string) ddbtest.Action {
		if op == "UpdateItem" {
			return ddbtest.Reset
		}
		return ddbtest.ServerError // the read-backs fail too: every write stays in doubt
	})
	for i := 0; i < 60; i++ {
		err := a.Heartbeat(ctx)
		require.Error(t, err)
		require.NotErrorIs(t, err, ddblease.ErrLost)
	}
	faults.Set(every("UpdateItem", ddbtest.Throttle))
	for i := 0; i < 60; i++ {
		require.Error(t, a.Heartbeat(ctx))
	}
	faults.Set(nil)
	require.NoError(t, a.Heartbeat(ctx), "the holder renews its own lease once the network is back")
	got, err := a.TryAcquire(ctx)
	require.NoError(t, err)
	assert.Equal(t, fence, got)
	require.NoError(t, a.Resign(ctx))
}

// Defect 12: ResignOnSignal handles one signal; later ones are not
// swallowed.
func TestResignOnSignalHandlesOne(t *testing.T) {
	ctx := withTimeout(t, 20*time.Second)
	table := srv.NewTable(t)
	a := newLease(t, srv.Client(nil), table, "job", fast("a"))
	mine := make(chan os.Signal, 4)
	signal.Notify(mine, syscall.SIGUSR1)
	defer signal.Stop(mine)
	stop := a.ResignOnSignal(syscall.SIGUSR1)
	defer func() { _ = stop() }()
	_, err := a.TryAcquire(ctx)
	require.NoError(t, err)
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGUSR1))
	receive(t, mine, "the first signal")
	for a.IsLeader() {
		select {
		case <-ctx.Done():
			t.Fatal("the first signal did not resign")
		case <-time.After(5 * time.Millisecond):
		}
	}
	assert.NoError(t, stop())
	fence, err := a.TryAcquire(ctx)
	require.NoError(t, err)
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGUSR1))
	receive(t, mine, "the second signal")
	require.NoError(t, a.Heartbeat(ctx), "the second signal did not resign again")
	assert.Equal(t, fence, a.State().Fence)
	require.NoError(t, a.Resign(ctx))
}

// Defect 10: a panic in fn ends the tenure, resigns, records the run as
// failed, and reaches the caller as a *PanicError; the handle can be used
// again.
func TestPanicInFn(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table := srv.NewTable(t)
	a := newLease(t, srv.Client(nil), table, "job", fast("a"))
	var fnCtx context.Context
	recovered := func(run func()) (p any) {
		defer func() { p = recover() }()
		run()
		return nil
	}
	p := recovered(func() {
		_ = a.Run(ctx, func(ctx context.Context, fence int64) error {
			fnCtx = ctx
			panic("boom")
		})
	})
	var pe *ddblease.PanicError
	require.ErrorAs(t, p.(error), &pe)
	assert.Equal(t, "boom", pe.Value)
	assert.Contains(t, string(pe.Stack), "tenure_test.go")
	assert.False(t, a.IsLeader())
	assert.ErrorIs(t, context.Cause(fnCtx), ddblease.ErrLost)
	rec, err := a.Holder(ctx)
	require.NoError(t, err)
	assert.True(t, rec.ExpiresAt.IsZero(), "resigned")

	// RunSchedule: the run is recorded as failed with the panic; a
	// supervisor that recovers and calls again gets a new tenure.
	sched := ddblease.Every(100 * time.Millisecond)
	var slot time.Time
	p = recovered(func() {
		_ = a.RunSchedule(ctx, sched, func(ctx context.Context, run *ddblease.JobRun) error {
			slot = run.Slot()
			panic(fmt.Errorf("wrapped: %w", os.ErrClosed))
		})
	})
	require.ErrorAs(t, p.(error), &pe)
	assert.ErrorIs(t, pe, os.ErrClosed)
	runs, err := a.ListRuns(ctx, sched, slot, slot)
	require.NoError(t, err)
	require.Len(t, runs, 1)
	assert.Equal(t, ddblease.RunFailed, runs[0].Status)
	assert.Contains(t, runs[0].Error, "wrapped: file already closed")
	assert.Contains(t, runs[0].Error, "tenure_test.go", "the stack is recorded")

	fired := make(chan int64, 1)
	rctx, cancel := context.WithCancel(ctx)
	err = a.RunSchedule(rctx, sched, func(ctx context.Context, run *ddblease.JobRun) error {
		fired <- run.Fence()
		cancel()
		return nil
	})
	assert.NoError(t, err)
	assert.Equal(t, int64(3), <-fired)
}

// A standby whose clock is ahead by less than MaxClockSkew, but by more
// than the holder's safety margin, takes over only once the holder's own
// deadline has passed: the takeover by expiry waits for MaxClockSkew.
func TestTakeoverWaitsForTheSkew(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table, db := tableAndClient(t)
	skewed := func(o *ddblease.Options) { o.MaxClockSkew = 500 * time.Millisecond } // above the margin, LeaseDuration/10
	a := newLease(t, db, table, "job", fast("a"), skewed)
	var aLeadingAtTakeover atomic.Bool
	b := newLease(t, db, table, "job", fast("b"), skewed, offset(450*time.Millisecond), func(o *ddblease.Options) {
		o.Observer = func(e ddblease.Event) {
			if e.Kind == ddblease.EventAcquired {
				aLeadingAtTakeover.Store(a.IsLeader())
			}
		}
	})
	_, err := a.TryAcquire(ctx) // and no heartbeat: a leads until its deadline
	require.NoError(t, err)
	fence, err := b.Acquire(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(2), fence)
	assert.False(t, aLeadingAtTakeover.Load(), "b took over while a still led")
}

// slowOnce delays the next request of an operation, armed by arm, before
// it forwards it.
type slowOnce struct {
	base  http.RoundTripper
	op    string
	delay time.Duration
	armed atomic.Bool
}

func (s *slowOnce) RoundTrip(r *http.Request) (*http.Response, error) {
	if ddbtest.Op(r) == s.op && s.armed.CompareAndSwap(true, false) {
		select {
		case <-time.After(s.delay):
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
	}
	return s.base.RoundTrip(r)
}

// Resign while Run leads leaves the lease to the standbys for two
// RetryIntervals from the moment it is free, not from the call: a
// resignation whose write is slow (a loaded table) still hands over.
func TestResignWhileRunLeadsSlowWrite(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table := srv.NewTable(t)
	slow := &slowOnce{op: "UpdateItem", delay: 300 * time.Millisecond}
	db := srv.Client(func(rt http.RoundTripper) http.RoundTripper { slow.base = rt; return slow })
	a := newLease(t, db, table, "job", fast("a"))
	b := newLease(t, srv.Client(nil), table, "job", fast("b"))
	av := newLeaderView()
	stopA := runAsync(ctx, a, av.fn)
	require.Equal(t, int64(1), receive(t, av.starts, "a leads"))

	tk, stopB := runTakingOver(ctx, b, a, av)
	slow.armed.Store(true)
	require.NoError(t, a.Resign(ctx))
	assert.Equal(t, int64(2), receive(t, tk.started, "b takes over"))
	require.NoError(t, stopB())
	assert.NoError(t, stopA())
}
