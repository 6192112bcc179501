package ddblease_test

// The operator paths of RunSchedule (a trigger, a resume's catch-up, a
// pause) go through the same run protocol as a slot: a claim belongs to
// the tenure that made it, fn runs only while that tenure leads, a run its
// tenure could not finish is found abandoned, a pause is checked by the
// claim itself, and a busy leader still fires the slots that came due
// while it led.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// bodyFaults decorates a client's transport: rule picks what happens to
// each request from its operation and its body (Pass, DropResponse or
// ServerError), and answered, if set, sees the status of each answer that
// reaches the client.
type bodyFaults struct {
	base     http.RoundTripper
	mu       sync.Mutex
	rule     func(op string, body []byte) ddbtest.Action
	answered func(op string, body []byte, status int)
}

func (f *bodyFaults) wrap(rt http.RoundTripper) http.RoundTripper { f.base = rt; return f }

func (f *bodyFaults) set(rule func(op string, body []byte) ddbtest.Action) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rule = rule
}

func (f *bodyFaults) RoundTrip(r *http.Request) (*http.Response, error) {
	op := ddbtest.Op(r)
	var body []byte
	if r.Body != nil {
		b, err := io.ReadAll(r.Body)
		_ = r.Body.Close()
		if err != nil {
			return nil, err
		}
		body = b
		r = r.Clone(r.Context())
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	f.mu.Lock()
	rule := f.rule
	f.mu.Unlock()
	act := ddbtest.Pass
	if rule != nil {
		act = rule(op, body)
	}
	switch act {
	case ddbtest.DropResponse:
		// The server applies the request; the client never learns it.
		if resp, err := f.base.RoundTrip(r); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		return nil, errors.New("read tcp 127.0.0.1: connection reset by peer (injected)")
	case ddbtest.ServerError:
		const msg = `{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"injected"}`
		return &http.Response{
			StatusCode: 500, Status: "500 Internal Server Error",
			Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header:        http.Header{"Content-Type": {"application/x-amz-json-1.0"}},
			Body:          io.NopCloser(strings.NewReader(msg)),
			ContentLength: int64(len(msg)), Request: r,
		}, nil
	}
	resp, err := f.base.RoundTrip(r)
	if err == nil && f.answered != nil {
		f.answered(op, body, resp.StatusCode)
	}
	return resp, err
}

// isWrite reports whether op writes an item.
func isWrite(op string) bool {
	return op == "TransactWriteItems" || op == "UpdateItem" || op == "PutItem"
}

// slotKey is the quoted sort key of the run item of a schedule slot, as
// it appears in a request's body (each test's job has a table of its own).
func slotKey(_ string, slot time.Time) []byte {
	return []byte(`"run#` + slot.UTC().Format("2006-01-02T15:04:05.000000000Z") + `"`)
}

// triggerKey is in the body of every request on a triggered run's item.
var triggerKey = []byte("#trigger-")

// needTransactions skips a test on a server without TransactWriteItems.
func needTransactions(t *testing.T, what string) {
	t.Helper()
	srv.Require(t, srv.Caps(t).Transactions, "TransactWriteItems, which "+what+" needs")
}

// fnCall is what fn saw in one call.
type fnCall struct {
	slot      time.Time
	trigger   string
	fence     int64 // run.Fence()
	itemFence int64 // the fence the run item held as fn began (-1 if unread)
	ctxDone   bool  // the leader context had ended as fn began
	leader    bool  // IsLeader() as fn began
	finishErr error // run.Finish's error, when fn finished the run itself
}

// fnCalls records fn's calls.
type fnCalls struct {
	mu    sync.Mutex
	calls []fnCall
}

func (c *fnCalls) add(call fnCall) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, call)
}

func (c *fnCalls) all() []fnCall {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]fnCall(nil), c.calls...)
}

// itemFence reads the fence of run's item as an operator sees it.
func itemFence(ctx context.Context, admin *ddblease.Admin, run *ddblease.JobRun) int64 {
	if run.Trigger() != "" {
		rec, ok, err := admin.TriggerRun(ctx, ddblease.Trigger{Job: run.Job(), ID: run.Trigger(), At: run.Slot()})
		if err != nil || !ok {
			return -1
		}
		return rec.Fence
	}
	runs, err := admin.Runs(ctx, run.Job(), ddblease.RunRange{From: run.Slot()})
	if err != nil {
		return -1
	}
	for _, r := range runs {
		if r.Slot.Equal(run.Slot()) && r.Trigger == "" {
			return r.Fence
		}
	}
	return -1
}

// recordingFn returns a job function that records each call (with the
// fence the run item holds, read by admin) and records the outcome itself
// with run.Finish, keeping Finish's error.
func recordingFn(admin *ddblease.Admin, l *ddblease.Lease, calls *fnCalls) func(context.Context, *ddblease.JobRun) error {
	return func(ctx context.Context, run *ddblease.JobRun) error {
		c := fnCall{slot: run.Slot(), trigger: run.Trigger(), fence: run.Fence(), ctxDone: ctx.Err() != nil, leader: l.IsLeader()}
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c.itemFence = itemFence(rctx, admin, run)
		c.finishErr = run.Finish(rctx, nil)
		calls.add(c)
		return nil
	}
}

// runAt returns the run of job's schedule slot, if any.
func runAt(t *testing.T, admin *ddblease.Admin, job string, slot time.Time) (ddblease.RunRecord, bool) {
	t.Helper()
	runs, err := admin.Runs(context.Background(), job, ddblease.RunRange{From: slot})
	require.NoError(t, err)
	for _, r := range runs {
		if r.Slot.Equal(slot) && r.Trigger == "" {
			return r, true
		}
	}
	return ddblease.RunRecord{}, false
}

// triggerState describes the run of tr as an operator reads it now.
func triggerState(admin *ddblease.Admin, tr ddblease.Trigger) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rec, ok, err := admin.TriggerRun(ctx, tr)
	switch {
	case err != nil:
		return "unreadable: " + err.Error()
	case !ok:
		return "not claimed"
	}
	return fmt.Sprintf("%s with fence %d, by %q", rec.Status, rec.Fence, rec.Owner)
}

// final reports whether st is a final status.
func final(st ddblease.RunStatus) bool {
	return st == ddblease.RunSucceeded || st == ddblease.RunFailed || st == ddblease.RunAbandoned
}

// checkCallsMatchItem asserts that fn was handed the fence its run item
// holds, and that the run's Finish was accepted.
func checkCallsMatchItem(t *testing.T, calls []fnCall) {
	t.Helper()
	for _, c := range calls {
		assert.Equal(t, c.itemFence, c.fence,
			"fn ran slot %s (trigger %q) with fence %d, but its run item holds fence %d: the claim was not this tenure's",
			c.slot.Format(time.RFC3339Nano), c.trigger, c.fence, c.itemFence)
		assert.NoError(t, c.finishErr, "run.Finish of a run fn was handed was refused")
	}
}

// loseClaimAnswers makes the writes on the items body matches land but
// lose their answers, and the reads of them fail, while l's tenure is
// still the one with fence (or none has followed it): a claim whose
// outcome that tenure cannot learn. Later tenures' requests pass.
func loseClaimAnswers(l *ddblease.Lease, fence int64, match func(body []byte) bool) func(string, []byte) ddbtest.Action {
	return func(op string, body []byte) ddbtest.Action {
		if !match(body) || l.State().Fence > fence {
			return ddbtest.Pass
		}
		if isWrite(op) {
			return ddbtest.DropResponse
		}
		return ddbtest.ServerError
	}
}

// A trigger's claim lands under the leader's tenure but its answer is lost
// (and the run item cannot be read back); an operator then releases the
// tenure by force, and the same replica leads again with a higher fence.
// The claim belonged to the tenure that ended: fn is never handed a run
// whose item holds another fence, and the run ends final (abandoned under
// NeverRerun), so that WaitRun returns.
func TestTriggerClaimAnswerLostRunEndsFinal(t *testing.T) {
	t.Parallel()
	needTransactions(t, "a trigger")
	ctx := withTimeout(t, 60*time.Second)
	table := srv.NewTable(t)
	db := srv.Client(nil)
	faults := &bodyFaults{}
	admin := newAdmin(t, db, table)
	l := newLease(t, srv.Client(faults.wrap), table, "report", fast("a"))
	calls := &fnCalls{}
	stop := runScheduleAsync(ctx, l, farSchedule, recordingFn(admin, l, calls))
	defer func() { assert.NoError(t, stop()) }()
	eventually(t, "a leads", l.IsLeader)
	f1 := l.State().Fence
	faults.set(loseClaimAnswers(l, f1, func(b []byte) bool { return bytes.Contains(b, triggerKey) }))

	tr, err := admin.Trigger(ctx, "report")
	require.NoError(t, err)
	eventually(t, "the trigger's claim landed", func() bool {
		_, ok, err := admin.TriggerRun(ctx, tr)
		return err == nil && ok
	})
	_, err = admin.ForceRelease(ctx, "report", f1)
	require.NoError(t, err)
	eventually(t, "a leads again with a higher fence", func() bool { return l.IsLeader() && l.State().Fence > f1 })

	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	run, err := admin.WaitRun(wctx, tr, 20*time.Millisecond)
	assert.NoError(t, err, "WaitRun: the triggered run never ended: it is %s; the lease's fence is %d",
		triggerState(admin, tr), l.State().Fence)
	got := calls.all()
	checkCallsMatchItem(t, got)
	if err == nil && len(got) == 0 {
		assert.Equal(t, ddblease.RunAbandoned, run.Status, "a run claimed by a tenure that ended, and never run, is abandoned")
	}
	if err == nil && len(got) > 0 {
		assert.Equal(t, ddblease.RunSucceeded, run.Status)
	}
	eventually(t, "the trigger request cleared", func() bool {
		st, err := admin.Job(ctx, "report")
		return err == nil && st.Lease.Control.Triggers == 0
	})
}

// The same for a resume's catch-up: the claim of the latest slot skipped
// by the pause lands but its answer is lost, and the tenure ends. The
// next tenure does not run the slot with the old tenure's claim: the run
// ends final (abandoned, under NeverRerun) and the catch-up request is
// cleared.
func TestCatchUpClaimAnswerLostRunEndsFinal(t *testing.T) {
	t.Parallel()
	needTransactions(t, "a resume's catch-up")
	ctx := withTimeout(t, 60*time.Second)
	table := srv.NewTable(t)
	db := srv.Client(nil)
	faults := &bodyFaults{}
	admin := newAdmin(t, db, table)
	l := newLease(t, srv.Client(faults.wrap), table, "nightly", fast("a"))
	slot := time.Now().Add(2 * time.Second).Truncate(time.Second)
	sched := listSlots(slot, time.Date(9000, 1, 1, 0, 0, 0, 0, time.UTC))
	calls := &fnCalls{}
	stop := runScheduleAsync(ctx, l, sched, recordingFn(admin, l, calls))
	defer func() { assert.NoError(t, stop()) }()
	eventually(t, "a leads", l.IsLeader)
	f1 := l.State().Fence
	_, err := admin.Pause(ctx, "nightly")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		r, ok := runAt(t, admin, "nightly", slot)
		return ok && r.Status == ddblease.RunSkippedByPause
	}, 30*time.Second, 20*time.Millisecond, "the slot is skipped by the pause")
	require.Empty(t, calls.all(), "fn ran while paused")

	key := slotKey("nightly", slot)
	faults.set(loseClaimAnswers(l, f1, func(b []byte) bool { return bytes.Contains(b, key) }))
	_, err = admin.Resume(ctx, "nightly", true)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		r, ok := runAt(t, admin, "nightly", slot)
		return ok && r.Status == ddblease.RunRunning
	}, 30*time.Second, 20*time.Millisecond, "the catch-up's claim landed")
	_, err = admin.ForceRelease(ctx, "nightly", f1)
	require.NoError(t, err)
	eventually(t, "a leads again with a higher fence", func() bool { return l.IsLeader() && l.State().Fence > f1 })

	var last ddblease.RunRecord
	ended := assert.Eventually(t, func() bool {
		last, _ = runAt(t, admin, "nightly", slot)
		return final(last.Status)
	}, 20*time.Second, 20*time.Millisecond, "the caught-up slot's run never ended")
	if !ended {
		t.Logf("the run stays %s with fence %d; the lease's fence is %d", last.Status, last.Fence, l.State().Fence)
	}
	got := calls.all()
	checkCallsMatchItem(t, got)
	if ended && len(got) == 0 {
		assert.Equal(t, ddblease.RunAbandoned, last.Status, "a run claimed by a tenure that ended, and never run, is abandoned")
	}
	eventually(t, "the catch-up request cleared", func() bool {
		st, err := admin.Job(ctx, "nightly")
		return err == nil && !st.Lease.Control.CatchUpPending
	})
}

// jumpClock is a lease clock that jumps a minute ahead once a claim the
// test picked is answered: the claim landed, but by the time its answer is
// read the tenure's deadline has passed, as for a process paused that
// long, or an answer that took that long.
type jumpClock struct {
	armed  atomic.Bool
	jumped atomic.Bool
}

func (c *jumpClock) now() time.Time {
	if c.jumped.Load() {
		return time.Now().Add(time.Minute)
	}
	return time.Now()
}

// answered jumps the clock at the first successful write matched after arm.
func (c *jumpClock) answered(match func(body []byte) bool) func(string, []byte, int) {
	return func(op string, body []byte, status int) {
		if isWrite(op) && status == http.StatusOK && match(body) && c.armed.CompareAndSwap(true, false) {
			c.jumped.Store(true)
		}
	}
}

// A trigger's claim is answered after the tenure's deadline. fn is not
// called on that tenure, which is over (its fence is stale, its leader
// context ends); the next tenure finds the run left running and the
// operator's WaitRun reports it abandoned.
func TestTriggerClaimAnsweredAfterDeadlineNotRun(t *testing.T) {
	t.Parallel()
	needTransactions(t, "a trigger")
	ctx := withTimeout(t, 60*time.Second)
	table := srv.NewTable(t)
	db := srv.Client(nil)
	clock := &jumpClock{}
	faults := &bodyFaults{answered: clock.answered(func(b []byte) bool { return bytes.Contains(b, triggerKey) })}
	admin := newAdmin(t, db, table)
	l := newLease(t, srv.Client(faults.wrap), table, "report", fast("a"), func(o *ddblease.Options) { o.Now = clock.now })
	calls := &fnCalls{}
	stop := runScheduleAsync(ctx, l, farSchedule, recordingFn(admin, l, calls))
	defer func() { assert.NoError(t, stop()) }()
	eventually(t, "a leads", l.IsLeader)
	f1 := l.State().Fence

	clock.armed.Store(true)
	tr, err := admin.Trigger(ctx, "report")
	require.NoError(t, err)
	eventually(t, "the trigger's claim answered late", clock.jumped.Load)
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	run, err := admin.WaitRun(wctx, tr, 20*time.Millisecond)
	assert.NoError(t, err, "WaitRun: the triggered run never ended: it is %s", triggerState(admin, tr))
	for _, c := range calls.all() {
		assert.NotEqual(t, f1, c.fence,
			"fn ran the trigger for the tenure with fence %d, whose deadline had passed when the claim was answered (leader context done: %v, IsLeader: %v)",
			f1, c.ctxDone, c.leader)
	}
	if err == nil {
		assert.Equal(t, ddblease.RunAbandoned, run.Status,
			"the run claimed by a tenure that was over is abandoned (it ran with fence %d, by %q)", run.Fence, run.Owner)
	}
}

// The same for a resume's catch-up: its claim is answered after the
// tenure's deadline, fn is not called for it on that tenure, and the run
// is found abandoned by the next tenure.
func TestCatchUpClaimAnsweredAfterDeadlineNotRun(t *testing.T) {
	t.Parallel()
	needTransactions(t, "a resume's catch-up")
	ctx := withTimeout(t, 60*time.Second)
	table := srv.NewTable(t)
	db := srv.Client(nil)
	slot := time.Now().Add(2 * time.Second).Truncate(time.Second)
	key := slotKey("nightly", slot)
	clock := &jumpClock{}
	faults := &bodyFaults{answered: clock.answered(func(b []byte) bool {
		return bytes.Contains(b, key) && bytes.Contains(b, []byte(`"`+string(ddblease.RunRunning)+`"`))
	})}
	admin := newAdmin(t, db, table)
	l := newLease(t, srv.Client(faults.wrap), table, "nightly", fast("a"), func(o *ddblease.Options) { o.Now = clock.now })
	sched := listSlots(slot, time.Date(9000, 1, 1, 0, 0, 0, 0, time.UTC))
	calls := &fnCalls{}
	stop := runScheduleAsync(ctx, l, sched, recordingFn(admin, l, calls))
	defer func() { assert.NoError(t, stop()) }()
	eventually(t, "a leads", l.IsLeader)
	f1 := l.State().Fence
	_, err := admin.Pause(ctx, "nightly")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		r, ok := runAt(t, admin, "nightly", slot)
		return ok && r.Status == ddblease.RunSkippedByPause
	}, 30*time.Second, 20*time.Millisecond, "the slot is skipped by the pause")

	clock.armed.Store(true)
	_, err = admin.Resume(ctx, "nightly", true)
	require.NoError(t, err)
	eventually(t, "the catch-up's claim answered late", clock.jumped.Load)
	var last ddblease.RunRecord
	require.Eventually(t, func() bool {
		last, _ = runAt(t, admin, "nightly", slot)
		return final(last.Status)
	}, 20*time.Second, 20*time.Millisecond, "the caught-up slot's run never ended")
	for _, c := range calls.all() {
		assert.NotEqual(t, f1, c.fence,
			"fn ran the catch-up for the tenure with fence %d, whose deadline had passed when the claim was answered (leader context done: %v, IsLeader: %v)",
			f1, c.ctxDone, c.leader)
	}
	assert.Equal(t, ddblease.RunAbandoned, last.Status,
		"the run claimed by a tenure that was over is abandoned (it ran with fence %d, by %q)", last.Fence, last.Owner)
}

// A triggered run's tenure ends while fn runs (an operator releases it by
// force; another replica takes over), and the one write of its outcome
// fails. The run is not left running for ever: the operator sees it
// abandoned, since it is a running run of a tenure older than the lease's.
func TestTriggerRunUnfinishedAfterTenureEndsIsAbandoned(t *testing.T) {
	t.Parallel()
	needTransactions(t, "a trigger")
	ctx := withTimeout(t, 60*time.Second)
	table := srv.NewTable(t)
	db := srv.Client(nil)
	var failFinish atomic.Bool
	faults := &bodyFaults{}
	faults.set(func(op string, body []byte) ddbtest.Action {
		if failFinish.Load() && isWrite(op) && bytes.Contains(body, triggerKey) {
			return ddbtest.ServerError
		}
		return ddbtest.Pass
	})
	admin := newAdmin(t, db, table)
	a := newLease(t, srv.Client(faults.wrap), table, "report", fast("a"))
	b := newLease(t, db, table, "report", fast("b"))
	started := make(chan int64, 1)
	var calls atomic.Int32
	fn := func(ctx context.Context, run *ddblease.JobRun) error {
		calls.Add(1)
		if run.Owner() == "a" {
			failFinish.Store(true)
			started <- run.Fence()
			<-ctx.Done()
		}
		return nil
	}
	stopA := runScheduleAsync(ctx, a, farSchedule, fn)
	defer func() { assert.NoError(t, stopA()) }()
	eventually(t, "a leads", a.IsLeader)
	stopB := runScheduleAsync(ctx, b, farSchedule, fn)
	defer func() { assert.NoError(t, stopB()) }()

	tr, err := admin.Trigger(ctx, "report")
	require.NoError(t, err)
	f1 := receive(t, started, "a runs the trigger")
	_, err = admin.ForceRelease(ctx, "report", f1)
	require.NoError(t, err)
	eventually(t, "b leads", b.IsLeader)

	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	run, err := admin.WaitRun(wctx, tr, 20*time.Millisecond)
	if assert.NoError(t, err, "WaitRun: the triggered run whose tenure ended never ended: it is %s; b leads with fence %d",
		triggerState(admin, tr), b.State().Fence) {
		assert.Equal(t, ddblease.RunAbandoned, run.Status)
	}
	rec, ok, err := admin.TriggerRun(ctx, tr)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, ddblease.RunAbandoned, rec.Status, "TriggerRun")
	runs, err := admin.Runs(ctx, "report", ddblease.RunRange{})
	require.NoError(t, err)
	for _, r := range runs {
		if r.Trigger == tr.ID {
			assert.Equal(t, ddblease.RunAbandoned, r.Status, "Admin.Runs")
		}
	}
	eventually(t, "the trigger request cleared", func() bool {
		st, err := admin.Job(ctx, "report")
		return err == nil && st.Lease.Control.Triggers == 0
	})
	assert.EqualValues(t, 1, calls.Load(), "the trigger ran once (NeverRerun)")
}

// Under Rerun, a newer tenure (b) takes over a triggered run an older one
// (a) still runs. a's outcome is refused, since b leads: a must leave the
// request pending, for b may end before it records its own outcome. b does
// (its finish fails, then its tenure ends), and the next tenure (c) runs
// the trigger to its end.
func TestTriggerTakenOverThenLeftRunningEndsFinal(t *testing.T) {
	t.Parallel()
	needTransactions(t, "a trigger")
	ctx := withTimeout(t, 60*time.Second)
	table := srv.NewTable(t)
	db := srv.Client(nil)
	var failFinishB atomic.Bool
	faults := &bodyFaults{}
	faults.set(func(op string, body []byte) ddbtest.Action {
		if failFinishB.Load() && isWrite(op) && bytes.Contains(body, triggerKey) {
			return ddbtest.ServerError
		}
		return ddbtest.Pass
	})
	admin := newAdmin(t, db, table)
	a := newLease(t, db, table, "report", fast("a"))
	b := newLease(t, srv.Client(faults.wrap), table, "report", fast("b"))
	c := newLease(t, db, table, "report", fast("c"))
	startedA, startedB := make(chan int64, 1), make(chan int64, 1)
	releaseA := make(chan struct{})
	var mu sync.Mutex
	var owners []string
	fn := func(ctx context.Context, run *ddblease.JobRun) error {
		mu.Lock()
		owners = append(owners, run.Owner())
		mu.Unlock()
		switch run.Owner() {
		case "a":
			startedA <- run.Fence()
			<-releaseA // past the end of its tenure
		case "b":
			failFinishB.Store(true)
			startedB <- run.Fence()
			<-ctx.Done()
		}
		return nil
	}
	schedule := func(l *ddblease.Lease) func() error {
		return async(ctx, func(ctx context.Context) error {
			return l.RunSchedule(ctx, farSchedule, fn, func(o *ddblease.JobOptions) { o.Rerun = ddblease.Rerun })
		})
	}
	stopA := schedule(a)
	eventually(t, "a leads", a.IsLeader)
	stopB := schedule(b)
	defer func() { assert.NoError(t, stopB()) }()

	tr, err := admin.Trigger(ctx, "report")
	require.NoError(t, err)
	fa := receive(t, startedA, "a runs the trigger")
	_, err = admin.ForceRelease(ctx, "report", fa)
	require.NoError(t, err)
	fb := receive(t, startedB, "b runs the trigger again")
	close(releaseA) // a's outcome is refused: b leads
	require.NoError(t, stopA())

	stopC := schedule(c)
	defer func() { assert.NoError(t, stopC()) }()
	_, err = admin.ForceRelease(ctx, "report", fb)
	require.NoError(t, err)

	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	run, err := admin.WaitRun(wctx, tr, 20*time.Millisecond)
	if assert.NoError(t, err, "WaitRun: the triggered run was left %s; c leads: %v", triggerState(admin, tr), c.IsLeader()) {
		assert.Equal(t, ddblease.RunSucceeded, run.Status)
		assert.Equal(t, "c", run.Owner)
	}
	mu.Lock()
	assert.Equal(t, []string{"a", "b", "c"}, owners, "the owners whose fn ran the trigger")
	mu.Unlock()
	eventually(t, "the trigger request cleared", func() bool {
		st, err := admin.Job(ctx, "report")
		return err == nil && st.Lease.Control.Triggers == 0
	})
}

// An operator pauses the job while the claim of a slot is failing and
// being retried; then the table recovers. The slot is not run: the pause
// holds for every claim written after it, so the slot is recorded as
// skipped by the pause (or has no run), and so is the next slot. Without
// transactions the pause is read just before each attempt.
func TestPauseDuringRetriedClaimSkipsSlot(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table := srv.NewTable(t)
	db := srv.Client(nil)
	slot := time.Now().Add(2 * time.Second).Truncate(time.Second)
	next := slot.Add(3 * time.Second)
	key := slotKey("tick", slot)
	var failing atomic.Bool
	var failed atomic.Int32
	failing.Store(true)
	faults := &bodyFaults{}
	faults.set(func(op string, body []byte) ddbtest.Action {
		if failing.Load() && isWrite(op) && bytes.Contains(body, key) {
			failed.Add(1)
			return ddbtest.ServerError
		}
		return ddbtest.Pass
	})
	admin := newAdmin(t, db, table)
	l := newLease(t, srv.Client(faults.wrap), table, "tick", fast("a"))
	sched := listSlots(slot, next, time.Date(9000, 1, 1, 0, 0, 0, 0, time.UTC))
	calls := &fnCalls{}
	stop := runScheduleAsync(ctx, l, sched, recordingFn(admin, l, calls))
	defer func() { assert.NoError(t, stop()) }()
	eventually(t, "a leads", l.IsLeader)

	require.Eventually(t, func() bool { return failed.Load() > 0 }, 30*time.Second, 10*time.Millisecond,
		"the slot's claim is tried")
	_, err := admin.Pause(ctx, "tick")
	require.NoError(t, err)
	failing.Store(false)

	// The runner handles slots in order: once the next slot is handled,
	// the one whose claim was retried is settled.
	require.Eventually(t, func() bool {
		r, ok := runAt(t, admin, "tick", next)
		return ok && r.Status != ddblease.RunRunning
	}, 30*time.Second, 20*time.Millisecond, "the next slot handled")
	for _, c := range calls.all() {
		assert.False(t, c.slot.Equal(slot), "fn ran slot %s, whose claim was being retried when the job was paused",
			slot.Format(time.RFC3339))
		assert.False(t, c.slot.Equal(next), "fn ran slot %s, which fell due while the job was paused", next.Format(time.RFC3339))
	}
	if r, ok := runAt(t, admin, "tick", slot); ok {
		assert.Equal(t, ddblease.RunSkippedByPause, r.Status, "the run of the slot whose claim was retried across the pause")
	}
	r, _ := runAt(t, admin, "tick", next)
	assert.Equal(t, ddblease.RunSkippedByPause, r.Status, "the next slot")
}

// A triggered run is still running when a slot falls due, and goes on
// until the slot is older than CatchUpWindow. The slot came due while
// this tenure led: once the trigger's fn returns, it is fired, once.
// CatchUpWindow limits only the slots that fell due while no one led.
func TestSlotDueDuringLongTriggerStillFires(t *testing.T) {
	t.Parallel()
	needTransactions(t, "a trigger")
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	admin := newAdmin(t, db, table)
	const window = time.Second
	// The slot is fixed before RunSchedule starts; the trigger is
	// requested as soon as the replica leads, well before the slot.
	s := time.Now().Add(4 * time.Second).Truncate(100 * time.Millisecond)
	sched := listSlots(s, time.Date(9000, 1, 1, 0, 0, 0, 0, time.UTC))
	l := newLease(t, db, table, "report", fast("a"))
	var mu sync.Mutex
	var slotRuns []*ddblease.JobRun
	triggerStarted := make(chan time.Time, 1)
	fn := func(ctx context.Context, run *ddblease.JobRun) error {
		if run.Trigger() != "" {
			triggerStarted <- time.Now()
			// Run until the slot is older than the window.
			select {
			case <-time.After(time.Until(s.Add(window + 500*time.Millisecond))):
			case <-ctx.Done():
			}
			return nil
		}
		mu.Lock()
		slotRuns = append(slotRuns, run)
		mu.Unlock()
		return nil
	}
	stop := async(ctx, func(ctx context.Context) error {
		return l.RunSchedule(ctx, sched, fn, func(o *ddblease.JobOptions) { o.CatchUpWindow = window })
	})
	defer func() { assert.NoError(t, stop()) }()
	eventually(t, "a leads", l.IsLeader)
	_, err := admin.Trigger(ctx, "report")
	require.NoError(t, err)
	began := receive(t, triggerStarted, "the trigger runs")
	require.True(t, began.Before(s), "the triggered run began after the slot fell due (%v late): the machine is too slow for this test", began.Sub(s))

	fired := assert.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(slotRuns) > 0
	}, 20*time.Second, 20*time.Millisecond,
		"slot %s, due while the triggered run ran, was never fired once the trigger's fn returned", s.Format(time.RFC3339Nano))
	if !fired {
		if r, ok := runAt(t, admin, "report", s); ok {
			t.Logf("the slot's run: %s", r.Status)
		} else {
			t.Logf("the slot has no run")
		}
		return
	}
	// fn has been called; its outcome is recorded once it returns.
	eventually(t, "the slot's run recorded succeeded", func() bool {
		r, ok := runAt(t, admin, "report", s)
		return ok && r.Status == ddblease.RunSucceeded
	})
	runs, err := l.ListRuns(ctx, sched, s, s)
	require.NoError(t, err)
	assert.Len(t, runs, 1)
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, slotRuns, 1, "the slot fired once")
}

// Under Rerun, a leader (a) runs a slot past the end of its tenure; the
// next leader (b) claims the slot again, and its tenure ends before it can
// record the outcome. When a leads again, the run b left running is marked
// abandoned at once, though a's catch-up begins after the slot it handled
// itself.
func TestSlotRerunByTenureBetweenIsSweptWhenFirstLeaderReturns(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table := srv.NewTable(t)
	db := srv.Client(nil)
	slot := time.Now().Add(1500 * time.Millisecond).Truncate(time.Second)
	var failB atomic.Bool
	faults := &bodyFaults{}
	faults.set(func(op string, body []byte) ddbtest.Action {
		if failB.Load() {
			return ddbtest.ServerError
		}
		return ddbtest.Pass
	})
	admin := newAdmin(t, db, table)
	a := newLease(t, db, table, "tick", fast("a"))
	var bCampaigns atomic.Bool // b tries to acquire again, and fails
	b := newLease(t, srv.Client(faults.wrap), table, "tick", fast("b"), func(o *ddblease.Options) {
		o.Observer = func(e ddblease.Event) {
			if e.Kind == ddblease.EventRetry && e.Op == "acquire" {
				bCampaigns.Store(true)
			}
		}
	})
	startedA, startedB := make(chan int64, 1), make(chan int64, 1)
	releaseA := make(chan struct{})
	fn := func(ctx context.Context, run *ddblease.JobRun) error {
		switch run.Owner() {
		case "a":
			if run.Fence() == 1 {
				startedA <- run.Fence()
				<-releaseA // past the end of its tenure
			}
		case "b":
			failB.Store(true) // b's outcome, heartbeats, acquisitions and looks fail from now on
			startedB <- run.Fence()
			<-ctx.Done()
		}
		return nil
	}
	sched := listSlots(slot, time.Date(9000, 1, 1, 0, 0, 0, 0, time.UTC))
	schedule := func(l *ddblease.Lease) func() error {
		return async(ctx, func(ctx context.Context) error {
			return l.RunSchedule(ctx, sched, fn, func(o *ddblease.JobOptions) { o.Rerun = ddblease.Rerun })
		})
	}
	stopA := schedule(a)
	defer func() { assert.NoError(t, stopA()) }()
	eventually(t, "a leads", a.IsLeader)
	stopB := schedule(b)
	defer func() { _ = stopB() }()

	fa := receive(t, startedA, "a runs the slot")
	_, err := admin.ForceRelease(ctx, "tick", fa)
	require.NoError(t, err)
	fb := receive(t, startedB, "b runs the slot again")
	close(releaseA) // a's outcome is refused: b leads

	eventually(t, "a leads again", func() bool { st := a.State(); return st.Leader && st.Fence > fb })
	eventually(t, "the run b left running marked abandoned", func() bool {
		r, ok := runAt(t, admin, "tick", slot)
		return ok && r.Status == ddblease.RunAbandoned
	})
	r, _ := runAt(t, admin, "tick", slot)
	assert.Equal(t, "b", r.Owner)
	assert.Equal(t, fb, r.Fence)
	// Every request of b's has failed since its tenure: once it campaigns
	// again, its campaign ends with that failure beside the cancellation.
	eventually(t, "b campaigns again", bCampaigns.Load)
	assert.ErrorIs(t, stopB(), context.Canceled)
}

// A triggered run left running by a deposed leader (a) is found by the next
// leader's claim (b), whose marking of it abandoned fails. The request
// stays pending, and b's next look, a RetryInterval later (the schedule's
// next slot is far), marks the run abandoned: trigger --wait returns.
func TestTriggerLeftRunningWhoseMarkingFailsIsMarkedLater(t *testing.T) {
	t.Parallel()
	needTransactions(t, "a trigger")
	ctx := withTimeout(t, 60*time.Second)
	table := srv.NewTable(t)
	db := srv.Client(nil)
	var failed atomic.Int32
	faults := &bodyFaults{}
	faults.set(func(op string, body []byte) ddbtest.Action {
		if op == "UpdateItem" && bytes.Contains(body, triggerKey) && bytes.Contains(body, []byte(`{"S":"abandoned"}`)) &&
			failed.Add(1) <= 4 {
			return ddbtest.ServerError
		}
		return ddbtest.Pass
	})
	var failA atomic.Bool // a's outcome is not recorded
	faultsA := &bodyFaults{}
	faultsA.set(func(op string, body []byte) ddbtest.Action {
		if failA.Load() && isWrite(op) && bytes.Contains(body, triggerKey) {
			return ddbtest.ServerError
		}
		return ddbtest.Pass
	})
	admin := newAdmin(t, db, table)
	a := newLease(t, srv.Client(faultsA.wrap), table, "report", fast("a"))
	b := newLease(t, srv.Client(faults.wrap), table, "report", fast("b"))
	startedA := make(chan int64, 1)
	fn := func(ctx context.Context, run *ddblease.JobRun) error {
		if run.Owner() == "a" {
			failA.Store(true)
			startedA <- run.Fence()
			<-ctx.Done()
		}
		return nil
	}
	schedule := func(l *ddblease.Lease) func() error {
		return async(ctx, func(ctx context.Context) error { return l.RunSchedule(ctx, farSchedule, fn) })
	}
	stopA := schedule(a)
	eventually(t, "a leads", a.IsLeader)
	tr, err := admin.Trigger(ctx, "report")
	require.NoError(t, err)
	fa := receive(t, startedA, "a runs the trigger")
	stopB := schedule(b)
	defer func() { assert.NoError(t, stopB()) }()
	// a's tenure ends under fn, its outcome is not recorded, and the run is
	// left running. a leaves the lease to b for a lease duration.
	_, err = admin.ForceRelease(ctx, "report", fa)
	require.NoError(t, err)
	defer func() { assert.NoError(t, stopA()) }()

	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	run, err := admin.WaitRun(wctx, tr, 20*time.Millisecond)
	if assert.NoError(t, err, "WaitRun: the triggered run was left %s", triggerState(admin, tr)) {
		assert.Equal(t, ddblease.RunAbandoned, run.Status)
		assert.Equal(t, "a", run.Owner)
		assert.True(t, b.IsLeader(), "b marked it")
	}
	assert.Greater(t, failed.Load(), int32(0), "b's marking of the run failed at first")
	eventually(t, "the trigger request cleared", func() bool {
		st, err := admin.Job(ctx, "report")
		return err == nil && st.Lease.Control.Triggers == 0
	})
}

// A slot's claim lands, its answer lost; the operator pauses the job
// before the claim's retry. The retry finds the claim applied (DynamoDB
// answers the resent token with success; the in-process server refuses it
// on the pause), but the slot is not run: a slot whose claim was being
// retried as the pause began is skipped, and the run its first attempt
// wrote is marked abandoned.
func TestPauseAfterClaimLandedUnseenSkipsSlot(t *testing.T) {
	t.Parallel()
	needTransactions(t, "the claim's check of the pause")
	ctx := withTimeout(t, 60*time.Second)
	table := srv.NewTable(t)
	db := srv.Client(nil)
	admin := newAdmin(t, db, table)
	slot := time.Now().Add(2 * time.Second).Truncate(time.Second)
	key := slotKey("tick", slot)
	var claims atomic.Int32
	pauseErr := make(chan error, 1)
	faults := &bodyFaults{}
	faults.set(func(op string, body []byte) ddbtest.Action {
		if op == "TransactWriteItems" && bytes.Contains(body, key) {
			switch claims.Add(1) {
			case 1:
				return ddbtest.DropResponse // it lands; its answer is lost
			case 2:
				_, err := admin.Pause(ctx, "tick")
				pauseErr <- err
			}
		}
		return ddbtest.Pass
	})
	l := newLease(t, srv.Client(faults.wrap), table, "tick", fast("a"))
	assertPausedSlotNotRun(ctx, t, l, admin, slot, pauseErr, func() string {
		return fmt.Sprintf("claim requests %d", claims.Load())
	})
}

// As above, but every answer to the claim's first transaction is lost,
// and so is the read of the lease item that would tell whether the job
// was paused: the slot is not run on that unknown. The claim is sent again,
// finds the pause, and the slot is skipped.
func TestPauseUnreadAfterClaimLandedUnseenSkipsSlot(t *testing.T) {
	t.Parallel()
	needTransactions(t, "the claim's check of the pause")
	ctx := withTimeout(t, 60*time.Second)
	table := srv.NewTable(t)
	db := srv.Client(nil)
	admin := newAdmin(t, db, table)
	slot := time.Now().Add(2 * time.Second).Truncate(time.Second)
	key, leaseKey := slotKey("tick", slot), []byte(`{"S":"lease"}`)
	var mu sync.Mutex
	var first string        // the claim's first transaction token
	var sentAgain bool      // a claim with another token was sent
	var attempts, reads int // of the first token; of the lease item's read-backs failed
	pauseErr := make(chan error, 1)
	faults := &bodyFaults{}
	faults.set(func(op string, body []byte) ddbtest.Action {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case op == "TransactWriteItems" && bytes.Contains(body, key):
			var in struct{ ClientRequestToken string }
			_ = json.Unmarshal(body, &in)
			if first == "" {
				first = in.ClientRequestToken
			}
			if in.ClientRequestToken != first {
				sentAgain = true
				return ddbtest.Pass
			}
			if attempts++; attempts == 2 {
				_, err := admin.Pause(ctx, "tick")
				pauseErr <- err
			}
			return ddbtest.DropResponse // it lands, or is refused; its answer is lost
		case op == "GetItem" && bytes.Contains(body, leaseKey) && attempts >= 2 && !sentAgain:
			reads++
			return ddbtest.ServerError // the lease item's read-back, every attempt
		}
		return ddbtest.Pass
	})
	l := newLease(t, srv.Client(faults.wrap), table, "tick", fast("a"))
	assertPausedSlotNotRun(ctx, t, l, admin, slot, pauseErr, func() string {
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprintf("attempts of the first claim %d", attempts)
	})
	mu.Lock()
	defer mu.Unlock()
	assert.Positive(t, reads, "the lease item's read-back failed")
}

// assertPausedSlotNotRun runs l's schedule of job "tick": slot, then none
// until the year 9000; waits for the pause its faults make (pauseErr), and asserts
// that the slot's run is marked abandoned and that fn never ran it. detail
// describes the faults, for a failure.
func assertPausedSlotNotRun(ctx context.Context, t *testing.T, l *ddblease.Lease, admin *ddblease.Admin, slot time.Time,
	pauseErr <-chan error, detail func() string) {
	t.Helper()
	var ran atomic.Int32
	stop := runScheduleAsync(ctx, l, listSlots(slot, time.Date(9000, 1, 1, 0, 0, 0, 0, time.UTC)),
		func(ctx context.Context, run *ddblease.JobRun) error {
			ran.Add(1)
			return nil
		})
	defer func() { assert.NoError(t, stop()) }()
	require.NoError(t, receive(t, pauseErr, "the pause, before the claim's retry"))
	settled := assert.Eventually(t, func() bool {
		r, ok := runAt(t, admin, "tick", slot)
		return ok && r.Status == ddblease.RunAbandoned
	}, 15*time.Second, 20*time.Millisecond, "the slot's run marked abandoned")
	if !settled {
		r, ok := runAt(t, admin, "tick", slot)
		t.Logf("the slot's run (found %v): %s, fence %d, claims %d; %s", ok, r.Status, r.Fence, r.Claims, detail())
	}
	assert.Zero(t, ran.Load(), "fn ran for a slot whose claim was retried across the pause")
}
