package ddblease_test

// Leadership as a user sees it (RunSchedule's leadership across late renewals, clock steps and long outages): each test is the regression test
// of a defect where the library's own idea of its tenure and what a user
// observed disagreed (see tenure_test.go).

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
		if !bytes.Contains(body, []byte(`{"S":"lease"}`)) {
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

// Defect 11: a wall clock stepped forward and then back does not stall the
// schedule for as long as the step.
func TestScheduleSurvivesClockStepBack(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table := srv.NewTable(t)
	var step atomic.Int64
	a := newLease(t, srv.Client(nil), table, "job", fast("a"), steppedClock(&step))
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

// A wall clock stepped ahead after the handle was made but before
// RunSchedule was called (or called again, after a panic) is seen to come
// back too: the slots the jump passed over fire on the corrected clock,
// instead of the runner waiting, as for a clock that fell behind, until the
// clock passes the slots it fired while ahead.
func TestClockBackFromStepBeforeRunScheduleFiresAtOnce(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table := srv.NewTable(t)
	var step atomic.Int64
	a := newLease(t, srv.Client(nil), table, "job", fast("a"), steppedClock(&step))
	step.Store(int64(time.Minute)) // NTP steps the clock a minute ahead...
	fired := make(chan time.Time, 1000)
	stop := runScheduleAsync(ctx, a, ddblease.Every(100*time.Millisecond), func(ctx context.Context, run *ddblease.JobRun) error {
		fired <- run.Slot()
		return nil
	})
	for n := 0; n < 3; {
		if s := receive(t, fired, "a slot on the stepped clock"); s.After(time.Now().Add(30 * time.Second)) {
			n++
		}
	}
	step.Store(0) // ...and back
	for n := 0; n < 3; {
		if s := receive(t, fired, "a slot on the corrected clock"); s.Before(time.Now().Add(time.Second)) {
			n++
		}
	}
	assert.NoError(t, stop())
}

// A wall clock stepped back (and staying behind) does not make the leader
// claim again the slots it already handled: it waits until its clock
// passes the last one, then goes on in order. A claim of an earlier slot
// after later ones would break the order a newer tenure's catch-up relies
// on to find runs left running.
func TestClockStepBackClaimsNoHandledSlot(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table := srv.NewTable(t)
	var step atomic.Int64
	var mu sync.Mutex
	var fired []time.Time
	reclaimed := map[time.Time]bool{}
	watching := atomic.Bool{}
	faults := &bodyFaults{}
	faults.set(func(op string, body []byte) ddbtest.Action {
		if watching.Load() && isWrite(op) && bytes.Contains(body, []byte(`"#claims"`)) {
			mu.Lock()
			for _, s := range fired {
				if bytes.Contains(body, slotKey("job", s)) {
					reclaimed[s] = true
				}
			}
			mu.Unlock()
		}
		return ddbtest.Pass
	})
	a := newLease(t, srv.Client(faults.wrap), table, "job", fast("a"), steppedClock(&step))
	slots := make(chan time.Time, 1000)
	stop := runScheduleAsync(ctx, a, ddblease.Every(200*time.Millisecond), func(ctx context.Context, run *ddblease.JobRun) error {
		mu.Lock()
		fired = append(fired, run.Slot())
		mu.Unlock()
		slots <- run.Slot()
		return nil
	})
	for range 5 {
		receive(t, slots, "a slot")
	}
	watching.Store(true)
	step.Store(int64(-2 * time.Second)) // NTP steps the clock two seconds back
	for n := 0; n < 5; n++ {
		receive(t, slots, "a slot on the stepped clock")
	}
	require.NoError(t, stop())
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(fired); i++ {
		assert.True(t, fired[i].After(fired[i-1]), "slot %s fired after %s", fired[i].Format(time.RFC3339Nano), fired[i-1].Format(time.RFC3339Nano))
	}
	assert.Empty(t, reclaimed, "slots claimed again after the clock stepped back")
}

// A leader whose wall clock is ahead during a pause records as skipped a
// slot that, by the true clock, comes due after the resumption. The slot
// still runs when it comes due; a slot that did come due in the pause
// stays skipped.
func TestSkipRecordedByClockAheadRunsWhenDue(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	admin := newAdmin(t, db, table)
	var step atomic.Int64
	l := newLease(t, db, table, "job", fast("a"), steppedClock(&step))
	const period = 500 * time.Millisecond
	calls := &fnCalls{}
	stop := runScheduleAsync(ctx, l, ddblease.Every(period), recordingFn(admin, l, calls))
	defer func() { assert.NoError(t, stop()) }()
	eventually(t, "a slot run", func() bool { return len(calls.all()) > 0 })

	_, err := admin.Pause(ctx, "job")
	require.NoError(t, err)
	inPause := time.Now().Truncate(period).Add(2 * period)
	skipped := func(slot time.Time) func() bool {
		return func() bool {
			r, ok := runAt(t, admin, "job", slot)
			return ok && r.Status == ddblease.RunSkippedByPause
		}
	}
	eventually(t, "a slot skipped in the pause", skipped(inPause))

	step.Store(int64(5 * time.Second)) // NTP steps the leader's clock ahead...
	// The leader's next slot by its clock (the catch-up fires the one
	// before it), still seconds away by the true clock.
	early := time.Now().Add(5 * time.Second).Truncate(period).Add(period)
	eventually(t, "a slot still to come recorded skipped by the clock ahead", skipped(early))
	_, err = admin.Resume(ctx, "job", false)
	require.NoError(t, err)
	step.Store(0) // ...and back
	require.True(t, time.Now().Before(early), "the slot recorded early is still to come")

	// fn finishes the run, then records its call: wait for both.
	ranEarly := func() bool {
		for _, c := range calls.all() {
			if c.slot.Equal(early) {
				return true
			}
		}
		return false
	}
	eventually(t, "the slot recorded early run by fn when due", func() bool {
		r, ok := runAt(t, admin, "job", early)
		return ok && r.Status == ddblease.RunSucceeded && ranEarly()
	})
	ranInPause := false
	for _, c := range calls.all() {
		ranInPause = ranInPause || c.slot.Equal(inPause)
	}
	assert.False(t, ranInPause, "fn ran a slot that came due in the pause")
	r, _ := runAt(t, admin, "job", inPause)
	assert.Equal(t, ddblease.RunSkippedByPause, r.Status, "the slot that came due in the pause")
}

// Defect 14: a catch-up over more than 100 slots counts the missed ones
// exactly and abandons a run an older tenure left running far back.
func TestCatchUpOverManySlots(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table, db := tableAndClient(t)
	sched := ddblease.Every(time.Second)
	_, orphan := leaveOrphan(ctx, t, db, table, time.Second)

	// b's clock is 150 s ahead: 150 one-second slots fell due since.
	b := newLease(t, db, table, "job", fast("b"), offset(150*time.Second))
	fired := make(chan *ddblease.JobRun, 1)
	rctx, cancel := context.WithCancel(ctx)
	err := b.RunSchedule(rctx, sched, func(ctx context.Context, run *ddblease.JobRun) error {
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

// TestOrphanMarkedAfterFailedMarking: a catch-up finds a run an older
// tenure left running, and the write that marks it abandoned fails
// transiently. The run is marked after the next firing, not left running.
func TestOrphanMarkedAfterFailedMarking(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table, faults, faulty := tableWithFaults(t)
	db := srv.Client(nil)
	sched := ddblease.Every(time.Second)
	_, orphan := leaveOrphan(ctx, t, db, table, time.Second)

	// b's clock is 5 s ahead, so the orphan's slot is among those its
	// first catch-up reads back; the first UpdateItem after that read (the
	// marking) fails, once, and the client does not retry it.
	failed := failUpdateAfter(faults, "BatchGetItem")
	once := dynamodb.New(faulty.Options(), func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 })
	b := newLease(t, once, table, "job", fast("b"), offset(5*time.Second))
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	status := func() ddblease.RunStatus {
		runs, err := b.ListRuns(ctx, sched, orphan.Slot(), orphan.Slot())
		require.NoError(t, err)
		require.Len(t, runs, 1)
		return runs[0].Status
	}
	var firings atomic.Int32
	done := make(chan error, 1)
	go func() {
		done <- b.RunSchedule(rctx, sched, func(ctx context.Context, run *ddblease.JobRun) error {
			firings.Add(1)
			return nil
		})
	}()
	require.Eventually(t, func() bool { return firings.Load() >= 2 }, 20*time.Second, 20*time.Millisecond)
	assert.True(t, failed(), "the marking write was failed")
	assert.Equal(t, ddblease.RunAbandoned, status(), "the orphan is marked after a later firing")
	cancel()
	require.NoError(t, <-done)
}

// clockJumpOnClaim moves a lease's clock a minute ahead as the first claim
// after arm is answered: the claim landed, but by the time its answer is
// read the tenure's deadline has passed, as for a process paused that
// long.
type clockJumpOnClaim struct {
	next   http.RoundTripper
	armed  atomic.Bool
	jumped atomic.Bool
}

func (c *clockJumpOnClaim) now() time.Time {
	if c.jumped.Load() {
		return time.Now().Add(time.Minute)
	}
	return time.Now()
}

func (c *clockJumpOnClaim) RoundTrip(r *http.Request) (*http.Response, error) {
	claim := false
	if c.armed.Load() && r.Body != nil {
		body, err := io.ReadAll(r.Body)
		_ = r.Body.Close()
		if err != nil {
			return nil, err
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		op := ddbtest.Op(r)
		claim = op == "TransactWriteItems" || op == "UpdateItem" && bytes.Contains(body, []byte(`"running"`))
	}
	resp, err := c.next.RoundTrip(r)
	// Only a claim that landed: on a server without transactions the
	// first attempt is refused, and the claim is then sent as UpdateItem.
	if claim && err == nil && resp.StatusCode == http.StatusOK && c.armed.CompareAndSwap(true, false) {
		c.jumped.Store(true)
	}
	return resp, err
}

// TestNoRunWhenClaimAnsweredAfterDeadline: a slot's claim is answered
// after the tenure's deadline has passed by the lease's clock, before the
// deadline timer has run. fn is not called for it on that tenure; the next
// tenure finds the run left running and marks it abandoned.
func TestNoRunWhenClaimAnsweredAfterDeadline(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table := srv.NewTable(t)
	jump := &clockJumpOnClaim{}
	db := srv.Client(func(rt http.RoundTripper) http.RoundTripper { jump.next = rt; return jump })
	l := newLease(t, db, table, "job", fast("a"), func(o *ddblease.Options) { o.Now = jump.now })
	slot := time.Now().Add(time.Second).Truncate(100 * time.Millisecond)
	once := ddblease.ScheduleFunc(func(t time.Time) time.Time {
		if t.Before(slot) {
			return slot
		}
		return time.Time{}
	})
	var calls atomic.Int32
	stop := runScheduleAsync(ctx, l, once, func(ctx context.Context, run *ddblease.JobRun) error {
		calls.Add(1)
		return nil
	})
	eventually(t, "a leads", l.IsLeader)
	jump.armed.Store(true)
	eventually(t, "the claim answered late", jump.jumped.Load)
	runStatus := func() ddblease.RunStatus {
		runs, err := l.ListRuns(ctx, once, slot, slot)
		require.NoError(t, err)
		if len(runs) == 0 {
			return ""
		}
		return runs[0].Status
	}
	eventually(t, "fn called, or the run marked abandoned", func() bool {
		return calls.Load() > 0 || runStatus() == ddblease.RunAbandoned
	})
	assert.Zero(t, calls.Load(), "fn called for a slot claimed by a tenure that was over")
	assert.Equal(t, ddblease.RunAbandoned, runStatus(), "the next tenure marks the run abandoned")
	require.NoError(t, stop())
}

// TestOrphanKeptThroughFailedCatchUps: the catch-up that should find a
// run an older tenure left running cannot read its slots back, and
// neither can the next ones (the job's firings overrun and skip slots).
// Once reads work again, the orphan is still marked abandoned.
func TestOrphanKeptThroughFailedCatchUps(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table, faults, faulty := tableWithFaults(t)
	db := srv.Client(nil)
	sched := ddblease.Every(200 * time.Millisecond)
	a, orphan := leaveOrphan(ctx, t, db, table, 200*time.Millisecond)

	// b's clock is 5 s ahead: its first catch-up reads back the orphan's
	// slot. Every read back fails until three firings have run, each
	// overrunning the next slot.
	failReadsBack(faults)
	b := newLease(t, faulty, table, "job", fast("b"), offset(5*time.Second))
	var firings atomic.Int32
	stop := runScheduleAsync(ctx, b, sched, func(ctx context.Context, run *ddblease.JobRun) error {
		if firings.Add(1) == 3 {
			faults.Clear()
		}
		time.Sleep(300 * time.Millisecond)
		return nil
	})
	defer func() { assert.NoError(t, stop()) }()
	eventuallyAbandoned(ctx, t, a, sched, orphan)
	assert.GreaterOrEqual(t, faults.Faulted("BatchGetItem"), 3, "the catch-ups' reads failed")
}

// TestOrphanMarkedAfterItsWindow: every read back of the slot holding a
// run an older tenure left running fails until that slot has left the
// catch-up window. Once reads work again, the orphan is still marked
// abandoned, although its slot is never fired again.
func TestOrphanMarkedAfterItsWindow(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table, faults, faulty := tableWithFaults(t)
	db := srv.Client(nil)
	sched := ddblease.Every(200 * time.Millisecond)
	a, orphan := leaveOrphan(ctx, t, db, table, 200*time.Millisecond)

	// b's clock is 5 s ahead and its window 5.4 s: its first catch-up
	// reads back the orphan's slot, which leaves the window 0.4 s later.
	// Reads back fail until b fires a slot a second past that.
	const window = 5400 * time.Millisecond
	failReadsBack(faults)
	b := newLease(t, faulty, table, "job", fast("b"), offset(5*time.Second))
	outside := orphan.Slot().Add(window + time.Second)
	var cleared atomic.Bool
	stop := async(ctx, func(ctx context.Context) error {
		return b.RunSchedule(ctx, sched, func(ctx context.Context, run *ddblease.JobRun) error {
			if !run.Slot().Before(outside) && !cleared.Swap(true) {
				faults.Clear()
			}
			return nil
		}, func(o *ddblease.JobOptions) { o.CatchUpWindow = window })
	})
	defer func() { assert.NoError(t, stop()) }()
	eventually(t, "reads back work again", cleared.Load)
	eventuallyAbandoned(ctx, t, a, sched, orphan)
	assert.GreaterOrEqual(t, faults.Faulted("BatchGetItem"), 3, "the reads back failed while the slot was in the window")
}

// TestOrphanBehindLaterRunMarked: an older tenure left a run running and
// then ran a later slot to the end. The next tenure's catch-up reads the
// skipped slots back 100 at a time and stops after the batch holding the
// latest run, not at that run: the orphan, in the same batch, is marked
// abandoned.
func TestOrphanBehindLaterRunMarked(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table, db := tableAndClient(t)
	sched := ddblease.Every(200 * time.Millisecond)
	a := newLease(t, db, table, "job", fast("a"))
	_, err := a.TryAcquire(ctx)
	require.NoError(t, err)
	orphan, err := a.Claim(ctx, time.Now().Truncate(200*time.Millisecond))
	require.NoError(t, err)
	later, err := a.Claim(ctx, orphan.Slot().Add(200*time.Millisecond))
	require.NoError(t, err)
	require.NoError(t, later.Finish(ctx, nil))
	require.NoError(t, a.Resign(ctx))

	// b's clock is 5 s ahead: both slots are among those its first
	// catch-up skips, the finished one the later.
	b := newLease(t, db, table, "job", fast("b"), offset(5*time.Second))
	stop := runScheduleAsync(ctx, b, sched, func(ctx context.Context, run *ddblease.JobRun) error { return nil })
	defer func() { assert.NoError(t, stop()) }()
	eventuallyAbandoned(ctx, t, a, sched, orphan)
}

// TestOrphanFoundByClaimMarkedAfterFailedMarking: the slot a new tenure
// fires first holds a run an older tenure left running, so its claim finds
// the slot taken and marks the run abandoned; that write fails once. The
// slot is not run, and the run is still marked after the next firing.
func TestOrphanFoundByClaimMarkedAfterFailedMarking(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table, faults, faulty := tableWithFaults(t)
	db := srv.Client(nil)
	a := newLease(t, db, table, "job", fast("a"))
	_, err := a.TryAcquire(ctx)
	require.NoError(t, err)
	// Slots every second from the orphan's: the orphan's is the one due
	// when b starts.
	first := time.Now().Round(time.Millisecond)
	sched := ddblease.ScheduleFunc(func(t time.Time) time.Time {
		if t.Before(first) {
			return first
		}
		return first.Add(t.Sub(first).Truncate(time.Second) + time.Second)
	})
	orphan, err := a.Claim(ctx, first)
	require.NoError(t, err)
	require.NoError(t, a.Resign(ctx))

	// The first UpdateItem after b's claim (the marking) fails, and the
	// client does not retry it; b's heartbeats are too far apart to come
	// between.
	failed := failUpdateAfter(faults, "TransactWriteItems")
	once := dynamodb.New(faulty.Options(), func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 })
	b := newLease(t, once, table, "job", fast("b"), func(o *ddblease.Options) {
		o.LeaseDuration, o.HeartbeatInterval = 6*time.Second, 2*time.Second
	})
	var slots sync.Map
	stop := runScheduleAsync(ctx, b, sched, func(ctx context.Context, run *ddblease.JobRun) error {
		slots.Store(run.Slot(), true)
		return nil
	})
	defer func() { assert.NoError(t, stop()) }()
	eventuallyAbandoned(ctx, t, a, sched, orphan)
	assert.True(t, failed(), "the marking write was failed")
	_, ran := slots.Load(first)
	assert.False(t, ran, "fn called for the orphan's slot")
}

// failUpdateAfter fails, with a 500, the first UpdateItem after the first
// request of operation after; the result reports whether it has.
func failUpdateAfter(faults *ddbtest.Faults, after string) (failed func() bool) {
	var mu sync.Mutex
	seen, done := false, false
	faults.Set(func(op string) ddbtest.Action {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case op == after:
			seen = true
		case op == "UpdateItem" && seen && !done:
			done = true
			return ddbtest.ServerError
		}
		return ddbtest.Pass
	})
	return func() bool {
		mu.Lock()
		defer mu.Unlock()
		return done
	}
}

// failReadsBack fails every BatchGetItem, the read back of skipped slots,
// with a 500.
func failReadsBack(faults *ddbtest.Faults) {
	faults.Set(func(op string) ddbtest.Action {
		if op == "BatchGetItem" {
			return ddbtest.ServerError
		}
		return ddbtest.Pass
	})
}

// eventuallyAbandoned waits until the run of orphan's slot is marked
// abandoned, as l lists it.
func eventuallyAbandoned(ctx context.Context, t *testing.T, l *ddblease.Lease, sched ddblease.Schedule, orphan *ddblease.JobRun) {
	t.Helper()
	eventually(t, "the orphan marked abandoned", func() bool {
		runs, err := l.ListRuns(ctx, sched, orphan.Slot(), orphan.Slot())
		require.NoError(t, err)
		return len(runs) == 1 && runs[0].Status == ddblease.RunAbandoned
	})
}

// leaveOrphan has a replica "a" take the lease of "job", claim the current
// slot of an every-unit schedule and resign without finishing it, as one
// that died mid-run: the run stays running.
func leaveOrphan(ctx context.Context, t *testing.T, db ddblease.DynamoDBAPI, table string, unit time.Duration) (*ddblease.Lease, *ddblease.JobRun) {
	t.Helper()
	a := newLease(t, db, table, "job", fast("a"))
	_, err := a.TryAcquire(ctx)
	require.NoError(t, err)
	orphan, err := a.Claim(ctx, time.Now().Truncate(unit))
	require.NoError(t, err)
	require.NoError(t, a.Resign(ctx))
	return a, orphan
}

// A leader whose wall clock steps an hour ahead stops leading by that clock
// until its next renewal lands (up to a second here), and the catch-up it
// then makes skipped more slots than it reads back (1,000 in 10 reads). No
// slot is read back or claimed until the tenure leads again: the skipped
// slots are read back once, not at every RetryInterval meanwhile.
func TestWallClockStepAheadReadsSkippedSlotsBackOnce(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table := srv.NewTable(t)
	var offset atomic.Int64
	var reads atomic.Int32
	faults := &bodyFaults{}
	faults.set(func(op string, body []byte) ddbtest.Action {
		if op == "BatchGetItem" {
			reads.Add(1)
		}
		return ddbtest.Pass
	})
	l := newLease(t, srv.Client(faults.wrap), table, "tick", fast("a"), func(o *ddblease.Options) {
		o.LeaseDuration, o.HeartbeatInterval = 4*time.Second, time.Second
		o.Now = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	})
	var fired atomic.Int32
	stop := runScheduleAsync(ctx, l, ddblease.Every(100*time.Millisecond), func(ctx context.Context, run *ddblease.JobRun) error {
		fired.Add(1)
		return nil
	})
	defer func() { assert.NoError(t, stop()) }()
	eventually(t, "a fires slots", func() bool { return fired.Load() > 3 })

	before := reads.Load()
	offset.Store(int64(time.Hour))
	n := fired.Load()
	eventually(t, "a fires slots again", func() bool { return fired.Load() > n+3 })
	// 10 reads for the catch-up's 1,000 slots, and a few more for the
	// firings after it; a sweep at every try made 110 to 120.
	assert.LessOrEqual(t, reads.Load()-before, int32(30), "BatchGetItem requests after the step")
}
