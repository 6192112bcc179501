package ddblease_test

// Leadership as a user sees it: the leader context handed to fn, IsLeader,
// and what Run returns. Each test is the regression test of a defect where
// the library's own idea of its tenure and what a user observed disagreed.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
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

	var aLiveAtTakeover, aLeaderAtTakeover atomic.Bool
	bStarted := make(chan int64, 1)
	stopB := runAsync(ctx, b, func(ctx context.Context, fence int64) error {
		aLiveAtTakeover.Store(av.live())
		aLeaderAtTakeover.Store(a.IsLeader())
		bStarted <- fence
		<-ctx.Done()
		return nil
	})
	assert.Equal(t, int64(2), receive(t, bStarted, "b takes over"))
	assert.False(t, aLiveAtTakeover.Load(), "a's leader context was live when b began to lead")
	assert.False(t, aLeaderAtTakeover.Load(), "a.IsLeader() was true when b began to lead")
	h.set(func(string) bool { return false })
	assert.NoError(t, stopB())
	_ = stopA()
}

// lateRenewal, once armed, lets the next heartbeat (an UpdateItem of the
// lease item) land but loses its answer, and from then on holds every
// GetItem (the read-back that would confirm it) and every later write of
// the lease item, until released.
type lateRenewal struct {
	base  http.RoundTripper
	armed atomic.Bool
	hold  atomic.Bool
}

func (l *lateRenewal) RoundTrip(r *http.Request) (*http.Response, error) {
	op := ddbtest.Op(r)
	if op == "GetItem" && l.hold.Load() {
		<-r.Context().Done()
		return nil, r.Context().Err()
	}
	if op == "UpdateItem" && (l.armed.Load() || l.hold.Load()) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		if !bytes.Contains(body, []byte(`"lease#`)) {
			return l.base.RoundTrip(r)
		}
		if l.hold.Load() {
			<-r.Context().Done()
			return nil, r.Context().Err()
		}
		if l.armed.CompareAndSwap(true, false) {
			l.hold.Store(true)
			if resp, err := l.base.RoundTrip(r); err == nil {
				_ = resp.Body.Close()
			}
			return nil, errors.New("read tcp: connection reset by peer (injected)")
		}
	}
	return l.base.RoundTrip(r)
}

// Defect 2: a renewal confirmed only after the local deadline does not
// revive the tenure; the schedule keeps firing, under a new tenure.
func TestScheduleKeepsFiringAfterLateRenewal(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table := srv.NewTable(t)
	lr := &lateRenewal{}
	a := newLease(t, srv.Client(func(rt http.RoundTripper) http.RoundTripper { lr.base = rt; return lr }), table, "job", fast("a"))
	fences := make(chan int64, 1000)
	done := make(chan error, 1)
	rctx, cancel := context.WithCancel(ctx)
	go func() {
		done <- a.RunSchedule(rctx, ddblease.Every(50*time.Millisecond), func(ctx context.Context, run *ddblease.JobRun) error {
			fences <- run.Fence()
			return nil
		})
	}()
	require.Equal(t, int64(1), receive(t, fences, "a slot fires"))
	lr.armed.Store(true)
	// The tenure ends at its deadline; then the server is reachable again,
	// and a read-back would confirm the lost renewal, too late.
	for lr.armed.Load() || a.IsLeader() {
		select {
		case <-ctx.Done():
			t.Fatalf("the tenure did not end: armed %v leader %v state %+v", lr.armed.Load(), a.IsLeader(), a.State())
		case <-time.After(5 * time.Millisecond):
		}
	}
	lr.hold.Store(false)
	// A later tenure fires several slots: the schedule did not stall.
	for n := 0; n < 3; {
		if receive(t, fences, "slots after the lost renewal") > 1 {
			n++
		}
	}
	cancel()
	assert.NoError(t, <-done)
}

// Defect 3: Resign while Run leads ends the leader context before the
// lease is given up; Run goes on campaigning without taking the lease
// straight back, and reports the loss.
func TestResignWhileRunLeads(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table := srv.NewTable(t)
	db := srv.Client(nil)
	var events eventLog
	a := newLease(t, db, table, "job", fast("a"), events.option)
	b := newLease(t, db, table, "job", fast("b"))
	av := newLeaderView()
	stopA := runAsync(ctx, a, av.fn)
	require.Equal(t, int64(1), receive(t, av.starts, "a leads"))

	var aLiveAtTakeover, aLeaderAtTakeover atomic.Bool
	bStarted := make(chan int64, 1)
	stopB := runAsync(ctx, b, func(ctx context.Context, fence int64) error {
		aLiveAtTakeover.Store(av.live())
		aLeaderAtTakeover.Store(a.IsLeader())
		bStarted <- fence
		<-ctx.Done()
		return nil
	})
	require.NoError(t, a.Resign(ctx))
	assert.Equal(t, int64(2), receive(t, bStarted, "b takes over"))
	assert.False(t, aLiveAtTakeover.Load(), "a's leader context was live when b began to lead")
	assert.False(t, aLeaderAtTakeover.Load())
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
	faults.Set(func(op string) ddbtest.Action {
		if op == "UpdateItem" {
			return ddbtest.Throttle
		}
		return ddbtest.Pass
	})
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

// Defect 9: errors that retrying cannot mend stop Run at once and name the
// table; a campaign that ends while failing says so; an ended context is
// not a clean shutdown.
func TestRunReportsPersistentErrors(t *testing.T) {
	t.Parallel()
	never := func(context.Context, int64) error {
		t.Error("fn called")
		return nil
	}
	t.Run("wrong key schema", func(t *testing.T) {
		t.Parallel()
		ctx := withTimeout(t, 20*time.Second)
		name := "ddblease-badkey-" + ddbtest.RandomID()
		db := srv.Client(nil)
		require.NoError(t, ddbtest.CreateRawTable(ctx, db, name, "id", types.ScalarAttributeTypeS))
		var warns countingHandler
		l := newLease(t, db, name, "job", fast("a"), func(o *ddblease.Options) { o.Logger = slog.New(&warns) })
		err := l.Run(ctx, never)
		require.Error(t, err)
		assert.ErrorIs(t, err, ddblease.ErrTableSchema)
		assert.ErrorContains(t, err, name)
		assert.ErrorContains(t, err, `partition key "pk"`)
		assert.Zero(t, warns.warnings.Load(), "a permanent error is not retried")
	})
	t.Run("missing table", func(t *testing.T) {
		t.Parallel()
		ctx := withTimeout(t, 20*time.Second)
		l := newLease(t, srv.Client(nil), "ddblease-missing-"+ddbtest.RandomID(), "job", fast("a"))
		err := l.Run(ctx, never)
		require.Error(t, err)
		assert.ErrorContains(t, err, "not found")
		assert.ErrorContains(t, err, "ddblease-missing-")
	})
	t.Run("malformed lease item", func(t *testing.T) {
		t.Parallel()
		ctx := withTimeout(t, 20*time.Second)
		table := srv.NewTable(t)
		db := srv.Client(nil)
		_, err := db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: map[string]types.AttributeValue{
			"pk":    &types.AttributeValueMemberS{Value: "lease#job"},
			"owner": &types.AttributeValueMemberS{Value: "x"},
			"fence": &types.AttributeValueMemberS{Value: "not a number"},
		}})
		require.NoError(t, err)
		err = newLease(t, db, table, "job", fast("a")).Run(ctx, never)
		assert.ErrorIs(t, err, ddblease.ErrMalformedItem)
		assert.ErrorContains(t, err, table)
	})
	t.Run("cancelled context", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		l := newLease(t, srv.Client(nil), srv.NewTable(t), "job", fast("a"))
		assert.ErrorIs(t, l.Run(ctx, never), context.Canceled)
		err := l.RunSchedule(ctx, ddblease.Every(time.Second), func(context.Context, *ddblease.JobRun) error { return nil })
		assert.ErrorIs(t, err, context.Canceled)
	})
	t.Run("unreachable endpoint", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		defer cancel()
		var warns countingHandler
		l := newLease(t, ddbtest.Endpoint("http://127.0.0.1:1").Client(nil), "ddblease-nowhere", "job", fast("a"),
			func(o *ddblease.Options) { o.Logger = slog.New(&warns) })
		err := l.Run(ctx, never)
		require.Error(t, err)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.ErrorContains(t, err, "127.0.0.1:1")
		// About 30 attempts failed; their warnings are rate-limited.
		assert.LessOrEqual(t, warns.warnings.Load(), int32(2))
	})
}

// countingHandler counts the warnings logged through it.
type countingHandler struct{ warnings atomic.Int32 }

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn {
		h.warnings.Add(1)
	}
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

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
	assert.Contains(t, string(pe.Stack), "leadership_test.go")
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
	assert.Contains(t, runs[0].Error, "leadership_test.go", "the stack is recorded")

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

// nilErr has a value receiver: calling Error on a nil *nilErr panics.
type nilErr struct{ msg string }

func (e nilErr) Error() string { return e.msg }

// Defect 10: a typed nil returned as an error never panics the library.
func TestTypedNilError(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table := srv.NewTable(t)
	a := newLease(t, srv.Client(nil), table, "job", fast("a"))
	err := a.Run(ctx, func(context.Context, int64) error {
		var e *nilErr
		return e
	})
	require.Error(t, err)
	assert.ErrorContains(t, err, "nil *ddblease_test.nilErr")
	_, err = a.TryAcquire(ctx)
	require.NoError(t, err)
	run, err := a.Claim(ctx, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	require.NoError(t, err)
	var e *nilErr
	require.NoError(t, run.Finish(ctx, e))
	runs, err := a.ListRuns(ctx, ddblease.Every(time.Hour), run.Slot(), run.Slot())
	require.NoError(t, err)
	require.Len(t, runs, 1)
	assert.Equal(t, ddblease.RunFailed, runs[0].Status)
}

// Defect 11: a wall clock stepped forward and then back does not stall the
// schedule for as long as the step.
func TestScheduleSurvivesClockStepBack(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table := srv.NewTable(t)
	var step atomic.Int64
	a := newLease(t, srv.Client(nil), table, "job", fast("a"), func(o *ddblease.Options) {
		o.Now = func() time.Time { return time.Now().Add(time.Duration(step.Load())) }
	})
	fired := make(chan time.Time, 1000)
	done := make(chan error, 1)
	rctx, cancel := context.WithCancel(ctx)
	go func() {
		done <- a.RunSchedule(rctx, ddblease.Every(100*time.Millisecond), func(ctx context.Context, run *ddblease.JobRun) error {
			fired <- run.Slot()
			return nil
		})
	}()
	receive(t, fired, "a slot")
	step.Store(int64(time.Minute)) // NTP steps the clock a minute ahead...
	ahead := receive(t, fired, "a slot on the stepped clock")
	for ahead.Before(time.Now().Add(30 * time.Second)) {
		ahead = receive(t, fired, "a slot on the stepped clock")
	}
	step.Store(0) // ...and back
	// Slots on the corrected clock fire again, long before the minute the
	// clock was ahead has passed (the test's context ends in 30 s).
	for n := 0; n < 3; {
		if s := receive(t, fired, "a slot on the corrected clock"); s.Before(time.Now().Add(time.Second)) {
			n++
		}
	}
	cancel()
	assert.NoError(t, <-done)
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

// Defect 14: a catch-up over more than 100 slots counts the missed ones
// exactly and abandons a run an older tenure left running far back.
func TestCatchUpOverManySlots(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table := srv.NewTable(t)
	db := srv.Client(nil)
	sched := ddblease.Every(time.Second)
	a := newLease(t, db, table, "job", fast("a"))
	_, err := a.TryAcquire(ctx)
	require.NoError(t, err)
	orphan, err := a.Claim(ctx, time.Now().Truncate(time.Second))
	require.NoError(t, err) // left running: a dies mid-run
	require.NoError(t, a.Resign(ctx))

	// b's clock is 150 s ahead: 150 one-second slots fell due since.
	b := newLease(t, db, table, "job", fast("b"), offset(150*time.Second))
	fired := make(chan *ddblease.JobRun, 1)
	rctx, cancel := context.WithCancel(ctx)
	err = b.RunSchedule(rctx, sched, func(ctx context.Context, run *ddblease.JobRun) error {
		fired <- run
		cancel()
		return nil
	})
	require.NoError(t, err)
	run := <-fired
	n, known := run.Missed()
	assert.True(t, known)
	assert.Equal(t, int(run.Slot().Sub(orphan.Slot())/time.Second)-1, n, "the slots between the orphan and the fired one")
	runs, err := b.ListRuns(ctx, sched, orphan.Slot(), orphan.Slot())
	require.NoError(t, err)
	require.Len(t, runs, 1)
	assert.Equal(t, ddblease.RunAbandoned, runs[0].Status)
}

// eventLog collects a handle's events.
type eventLog struct {
	mu     sync.Mutex
	events []ddblease.Event
}

func (l *eventLog) option(o *ddblease.Options) {
	o.Observer = func(e ddblease.Event) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.events = append(l.events, e)
	}
}

func (l *eventLog) find(k ddblease.EventKind) *ddblease.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.events {
		if l.events[i].Kind == k {
			e := l.events[i]
			return &e
		}
	}
	return nil
}

// kinds returns the kinds seen, requests left out.
func (l *eventLog) kinds() []ddblease.EventKind {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ks []ddblease.EventKind
	for _, e := range l.events {
		if e.Kind != ddblease.EventCall {
			ks = append(ks, e.Kind)
		}
	}
	return ks
}

// The observer sees a tenure from campaign to resignation, in order, and
// each request with its outcome; a standby sees the hand-over.
func TestObserver(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table := srv.NewTable(t)
	db := srv.Client(nil)
	var ae, be eventLog
	a := newLease(t, db, table, "job", fast("a"), ae.option)
	b := newLease(t, db, table, "job", fast("b"), be.option)
	av, bv := newLeaderView(), newLeaderView()
	stopA := runAsync(ctx, a, av.fn)
	receive(t, av.starts, "a leads")
	stopB := runAsync(ctx, b, bv.fn)
	for ae.find(ddblease.EventRenewed) == nil || be.find(ddblease.EventLeaderSeen) == nil {
		select {
		case <-ctx.Done():
			t.Fatal("no renewal or no leader seen")
		case <-time.After(20 * time.Millisecond):
		}
	}
	require.NoError(t, stopA())
	receive(t, bv.starts, "b leads")
	require.NoError(t, stopB())

	want := []ddblease.EventKind{ddblease.EventCampaign, ddblease.EventAcquired, ddblease.EventRenewed,
		ddblease.EventDraining, ddblease.EventResigned, ddblease.EventStopped}
	got := ae.kinds()
	i := 0
	for _, k := range got {
		if i < len(want) && k == want[i] {
			i++
		}
	}
	assert.Equal(t, len(want), i, "a's events %v do not follow %v", got, want)
	renewed := ae.find(ddblease.EventRenewed)
	assert.Equal(t, int64(1), renewed.Fence)
	assert.Positive(t, renewed.Margin)
	assert.Equal(t, "a", renewed.Owner)
	assert.Equal(t, "job", renewed.Job)
	seen := be.find(ddblease.EventLeaderSeen)
	assert.Equal(t, "a", seen.Holder)
	assert.Equal(t, int64(1), seen.Fence)
	acq := be.find(ddblease.EventAcquired)
	require.NotNil(t, acq)
	assert.Equal(t, int64(2), acq.Fence)
	stopped := ae.find(ddblease.EventStopped)
	assert.NoError(t, stopped.Err)
	call := ae.find(ddblease.EventCall)
	require.NotNil(t, call)
	assert.NotEmpty(t, call.Op)
	assert.Equal(t, ddblease.CallOK, call.Outcome)
}
