package ddblease

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Limits of the runner's catch-up bookkeeping.
const (
	// maxSweep is how many of the slots skipped by a catch-up may be read
	// back (BatchGetItem, 100 slots per request, latest first) to count the
	// missed ones and abandon orphaned runs: at most 10 requests at once.
	// Every(1s) skips 900 slots at most in the default window.
	maxSweep = 1_000
	// maxGivenUp is how many given-up claims the runner remembers.
	maxGivenUp = 100
	// maxEnumerate bounds the Next calls made to find the due slots.
	maxEnumerate = 100_000
	// maxSleep bounds one wait for a slot, so that a wall clock that jumps
	// is noticed.
	maxSleep = time.Minute
)

// RunSchedule campaigns for the lease like Run and, while it leads, fires
// fn once for each slot of sched. Each firing claims its slot with Claim
// (the slot is the nominal fire time, never the time the timer woke),
// calls fn with the leader context and the run, and records the outcome
// with Finish unless fn already did (Finish or JobRun.Commit). fn's context
// is cancelled the moment leadership is lost; when ctx ends (SIGTERM through
// signal.NotifyContext), the running firing is drained and the lease
// resigned, as Run does. All replicas must pass equivalent schedules and
// options.
//
// Catch-up rule. When this replica becomes leader, or when a run (a slow
// fn, a triggered run) kept it busy past later slots, several slots may be
// due at once. Only the most recent of them is fired: a slot that came due
// while this tenure led and was busy is fired whatever its age, and one
// that came due while no one led only if it is at most
// JobOptions.CatchUpWindow old (default 15 minutes). Its claim fails with
// ErrSlotTaken, and nothing runs, if another tenure already handled it.
// The older due slots are skipped and read back, latest first, 100 slots
// per BatchGetItem, until one with a run is found (at most the latest
// 1,000); those without a run after the latest one that has a run are
// counted as missed (reported as EventSlotsMissed, logged, and recorded in
// the fired run: RunRecord.Missed, or MissedUnknown if they could not be
// read or none of the 1,000 had a run), and runs an older tenure left
// running among the slots read are marked abandoned, whatever the
// RerunPolicy: only the slot being fired may be run again. The first
// tenure a job ever has (fence 1) counts nothing as missed: no one led
// before it. Slots older than the window are never fired; if this replica
// had led before, it logs how many it skipped that way.
//
// Every run (a slot, a catch-up, a trigger, a resumption's catch-up) goes
// through the same steps. Its claim is one conditional write that checks,
// at that instant, that the lease item still holds this tenure's fence and,
// for slots, that the job is not paused (in the claim's transaction; by a
// strongly consistent read just before it where the server has none). A
// claim answered after the tenure's deadline (a slow answer, a paused
// process) does not run fn: the run is left running, for this replica's
// next firing or a newer tenure to mark abandoned. A claim that keeps
// failing with transient errors is given up once the next slot is due: a
// slot's is swept like a missed slot by the catch-up that follows
// (abandoned if its claim landed); a trigger's request stays pending and is
// tried again a RetryInterval later, after that slot. A triggered run an
// older tenure left running whose marking failed keeps its request pending
// the same way, until it is marked abandoned. A skipped slot that could not be read back,
// and a run an older tenure left running that could not be marked
// abandoned, are tried again after each firing until they are (the latest
// 1,000 such slots are kept), even once they have left the catch-up window;
// the claim of each firing records the latest 100 of them in its run item,
// so that a newer tenure's catch-up that stops at that run reads them back
// too.
//
// Clock steps. Slots are read off the wall clock (Options.Now), whose
// moves the runner compares with the runtime clock's from the handle's
// making. A clock stepped forward fires the slots it passes early (each
// once: their runs protect them). A clock that comes back from such a
// jump, or that steps back further than CatchUpWindow, makes the runner
// start again from the new time at once: the slots the jump passed over
// fire, and a slot already run is found taken and not run again. A clock
// that otherwise falls behind the last slot handled waits until it passes
// that slot, so that slots are claimed in order.
//
// Failures. fn's error is recorded in the run (status failed) and logged,
// and the schedule goes on. A slot whose run item is malformed is logged
// and skipped. If fn panics, its run is recorded as failed with the
// panic's value and stack, and Run's panic handling follows (the tenure
// ends, the lease is resigned, a *PanicError is raised). RunSchedule
// returns what Run returns: nil after a shutdown, or when the schedule has
// no further slot; an error that stops the campaign; or an error wrapping
// ErrInvalid when sched misbehaves.
//
// Cost in DynamoDB requests, besides the lease's own heartbeats: one write
// to claim each fired slot (a TransactWriteItems with a check on the lease
// item where the server supports transactions: about four write units
// instead of one; without transactions, a strongly consistent read of the
// lease item before it), one UpdateItem to finish it, and one BatchGetItem
// per 100 slots a catch-up reads back (at most 10). A paused job's slot
// costs the refused claim and the write that records it skipped. The
// operator controls are read (a strongly consistent read) when a heartbeat
// shows they changed, and when a tenure begins.
func (l *Lease) RunSchedule(ctx context.Context, sched Schedule, fn func(ctx context.Context, run *JobRun) error,
	optFns ...func(*JobOptions)) error {
	if err := checkSchedule(sched); err != nil {
		return fmt.Errorf("RunSchedule: %w", err)
	}
	if fn == nil {
		return invalid("RunSchedule: fn is nil")
	}
	o, err := newJobOptions(optFns)
	if err != nil {
		return err
	}
	if _, err := nextSlot(sched, l.opts.Now()); err != nil {
		return fmt.Errorf("RunSchedule: %w", err)
	}
	// The wall clock's moves are followed from the handle's making, so
	// that a jump ahead that began before the first look is known when the
	// clock comes back from it.
	r := &runner{l: l, sched: sched, fn: fn, o: o, looked: l.born}
	l.ctl.watch()
	return l.campaign(ctx, r.lead)
}

// runner fires a schedule's slots for RunSchedule. Its fields are used by
// one tenure at a time.
type runner struct {
	l     *Lease
	sched Schedule
	fn    func(context.Context, *JobRun) error
	o     JobOptions
	last  time.Time // latest slot handled (fired, found taken or skipped); zero if none
	// fence is the fence of the tenure that led last, zero before the
	// first: a tenure whose fence does not follow it had another between.
	fence int64
	// givenUp holds the claim tokens of the latest slots given up after
	// claims with unknown outcomes: a sweep abandons such a claim if it did
	// land.
	givenUp []string
	// unswept holds skipped slots a catch-up could not read back, and
	// slots whose orphaned run a catch-up or a claim could not mark
	// abandoned (leftRunning): they are read again after each firing until
	// they are swept (the latest maxSweep are kept), so that a run an
	// older tenure left running there is still marked abandoned.
	unswept []time.Time
	ctl     runnerControl // operator controls (jobrunner.go)
	// busySince is when the runs that kept the runner busy since it last
	// looked for due slots began: a slot that came due while this tenure
	// led and was busy (a long fn, a trigger) is fired whatever its age.
	busySince time.Time
	marks     int // abandon writes since the last firing (maxMarks)
	// ran holds the tokens of the triggers and catch-ups whose fn this
	// tenure called: their requests stay pending when the outcome was not
	// recorded, and their claims would be recognised again.
	ran map[string]bool
	// looked is the last look for a due slot, by both clocks; ahead sums
	// the wall clock's jumps ahead of the runtime clock since (returned).
	looked sent
	ahead  time.Duration
}

// lead is the function given to Run: it fires slots for one tenure,
// waiting between them on this goroutine.
func (r *runner) lead(ctx context.Context, tn *term) error {
	r.begin(ctx, tn)
	for ctx.Err() == nil {
		wait, ok, err := r.step(ctx, tn)
		if err != nil || !ok {
			return err
		}
		if wait > 0 {
			if _, err := r.wait(ctx, wait); err != nil {
				return nil
			}
		}
	}
	return nil
}

// begin readies the runner for a tenure: it adopts what the last one
// left, and reads the operator controls at its first step.
func (r *runner) begin(ctx context.Context, tn *term) {
	r.ctl.look = true  // jobrunner.go: read the operator controls before the first wait
	r.ctl.tokens = nil // a claim token belongs to one tenure
	r.ran = map[string]bool{}
	r.busySince = time.Time{}
	r.adopt(ctx, tn)
	r.fence = tn.fence
}

// step makes one step of a tenure's schedule: it runs the requests an
// operator made (triggers, a catch-up) when asked to look, then fires the
// slot due, if any. wait, when positive, is how long to wait before the
// next step (less if the operator controls change: the wait then sets
// ctl.look). ok is false when ctx ended or the schedule has no further
// slot; err is set when the campaign must stop.
func (r *runner) step(ctx context.Context, tn *term) (wait time.Duration, ok bool, err error) {
	if err := r.lookIfAsked(ctx, tn); err != nil { // jobrunner.go: triggers, catch-up
		return 0, false, err
	}
	slot, missed, wait, ok, err := r.due(ctx, tn)
	if err != nil || !ok || slot.IsZero() {
		return wait, ok && ctx.Err() == nil, err
	}
	handled, err := r.execute(ctx, tn, firing{what: "slot", slot: slot, missed: missed, token: randomID(8),
		spec: claimSpec{pause: pauseSlot, unswept: r.pendingIDs()}})
	if err != nil {
		return 0, false, err
	}
	if handled {
		r.last = slot
	}
	r.resweep(ctx, tn)
	r.marks = 0
	// A slot not handled (given up, or the tenure ended) is due again at
	// the next catch-up, which fires a later slot and sweeps it.
	return 0, ctx.Err() == nil, nil
}

// due returns the next slot to fire, applying the catch-up rule, or, with
// a zero slot, how long to wait before looking again. ok is false when
// ctx ended or the schedule has no further slot. missed is -1 when the
// skipped slots could not be read back.
func (r *runner) due(ctx context.Context, tn *term) (slot time.Time, missed int, wait time.Duration, ok bool, err error) {
	l := r.l
	now := l.opts.Now()
	floor := now.Add(-r.o.CatchUpWindow)
	if busy := r.busySince; !busy.IsZero() && busy.Before(floor) {
		floor = busy
	}
	r.busySince = time.Time{}
	returned := r.returned(now)
	behind := r.last.After(now)
	if behind && (returned || r.last.Sub(now) > r.o.CatchUpWindow) {
		// The wall clock came back from a jump forward (the slots the
		// jump passed over were never handled), or stepped back further
		// than the window: start again from now. Slots run early stay
		// protected by their runs.
		r.last, behind = time.Time{}, false
	}
	// A wall clock that fell behind the last slot handled by up to the
	// window otherwise waits for it again: the slots before it are
	// handled, and a claim made now of a slot before it would break the
	// order in which a tenure claims slots, which a newer tenure's sweep
	// (within the window) relies on. It is looked at every RetryInterval
	// meanwhile, so that a step that ends is seen.
	if !r.last.IsZero() {
		if r.last.Before(floor) {
			r.logTooOld(r.last, floor)
			r.last = time.Time{}
		} else {
			floor = r.last
		}
	}
	first, err := nextSlot(r.sched, floor)
	if err != nil {
		return time.Time{}, 0, 0, false, err
	}
	if first.IsZero() {
		l.log.Info("ddblease: the schedule has no further slot", "after", fmtSlot(floor))
		return time.Time{}, 0, 0, false, nil
	}
	if first.After(now) {
		// An operator request wakes the wait (jobrunner.go); the next
		// step reads the controls. A look that left a request pending (a
		// read that failed, a claim given up, a run left running that
		// could not be marked) is made again after a RetryInterval, not at
		// the next slot, which may be a day away.
		d := min(first.Sub(now), maxSleep)
		if behind || r.ctl.look {
			d = min(d, r.l.opts.RetryInterval)
		}
		return time.Time{}, 0, d, true, nil
	}
	if !tn.leads() {
		// The tenure does not lead by both clocks (a wall clock that
		// stepped past its deadline, until the next renewal lands, or a
		// tenure about to end): no slot is read back or claimed until it
		// does again, or ends.
		return time.Time{}, 0, r.l.opts.RetryInterval, true, nil
	}
	latest, older, n, err := r.dueSlots(first, now)
	if err != nil {
		return time.Time{}, 0, 0, false, err
	}
	if n > 0 {
		missed = r.sweep(ctx, tn, older, n, latest)
	}
	return latest, missed, 0, true, nil
}

// returned compares how far the wall clock moved since the last look with
// how far the runtime clock did, keeping the sum of the wall clock's jumps
// ahead, and reports whether it has just stepped back from such a jump
// (the slots the jump passed over were never handled) rather than fallen
// behind.
func (r *runner) returned(now time.Time) bool {
	real := time.Now()
	prev := r.looked
	r.looked = sent{at: now, real: real}
	if prev.at.IsZero() {
		return false
	}
	jump := now.Round(0).Sub(prev.at.Round(0)) - real.Sub(prev.real)
	was := r.ahead
	r.ahead = max(0, r.ahead+jump)
	skew := r.l.opts.MaxClockSkew
	return jump < -skew && was >= -jump-skew
}

// dueSlots returns the latest slot due at now, starting from first (which
// is due), up to maxSweep of the slots before it (oldest first), and how many
// slots before it there are (a lower bound when there are very many).
func (r *runner) dueSlots(first, now time.Time) (latest time.Time, older []time.Time, n int, err error) {
	latest = first
	for i := 0; ; i++ {
		if i == maxEnumerate {
			// A very dense schedule: find the latest slot by looking back
			// from now over doubling spans instead.
			l2, older2, err := r.recentSlots(now)
			if err != nil || l2.IsZero() {
				return latest, older, n, err
			}
			return l2, older2, n + len(older2), nil
		}
		next, err := nextSlot(r.sched, latest)
		if err != nil {
			return time.Time{}, nil, 0, err
		}
		if next.IsZero() || next.After(now) {
			return latest, older, n, nil
		}
		older = append(older, latest)
		if len(older) > maxSweep {
			older = older[1:]
		}
		n++
		latest = next
	}
}

// recentSlots finds the latest slot due at now, and some before it, by
// enumerating from now-span for doubling spans.
func (r *runner) recentSlots(now time.Time) (latest time.Time, older []time.Time, err error) {
	for span := time.Microsecond; span < r.o.CatchUpWindow; span *= 2 {
		s, err := nextSlot(r.sched, now.Add(-span))
		if err != nil || s.IsZero() {
			return time.Time{}, nil, err
		}
		if s.After(now) {
			continue
		}
		latest = s
		for i := 0; i < maxEnumerate; i++ {
			next, err := nextSlot(r.sched, latest)
			if err != nil {
				return time.Time{}, nil, err
			}
			if next.IsZero() || next.After(now) {
				return latest, older, nil
			}
			older = append(older, latest)
			if len(older) > maxSweep {
				older = older[1:]
			}
			latest = next
		}
		return latest, older, nil
	}
	return time.Time{}, nil, nil
}

// firing is one run RunSchedule may make: a slot of the schedule (fired
// on time or by a catch-up), an operator's trigger, or the catch-up a
// resumption asked for.
type firing struct {
	what   string // "slot", "triggered run" or "catch-up", for the log
	slot   time.Time
	spec   claimSpec
	token  string // the claim's token: one per firing, within one tenure
	missed int
}

// execute is the one protocol every run of RunSchedule goes through. It
// claims the run under the current tenure with a token of that tenure;
// the claim checks at the instant of the write what must hold then (the
// lease's fence, and for slots and catch-ups that the job is not paused),
// and hands the run out only if the tenure still leads by both clocks once
// the answer is in. Transient failures are retried until the next slot is
// due (giveUpAt). Then fn runs, and its outcome is recorded, or the run is
// left running where a newer tenure finds it: the next resweep of this
// tenure (a slot) or the request still pending (a trigger, a catch-up).
//
// done reports that the run is settled: fn ran and its outcome is recorded,
// the slot was recorded as skipped by the pause, or the run was found
// handled already. err is set only when the campaign must stop.
func (r *runner) execute(ctx context.Context, tn *term, f firing) (done bool, err error) {
	run, stop, err := r.claimRetrying(ctx, tn, f)
	if err != nil {
		return r.unclaimed(ctx, tn, f, stop, err)
	}
	return r.runClaimed(ctx, tn, f, run)
}

// claimRetrying claims f's run under tenure tn, retrying transient
// failures until the next slot is due; the errors it returns are each the
// claim's answer, or the last failure with the reason the retries stopped
// (retrier.do's stop).
func (r *runner) claimRetrying(ctx context.Context, tn *term, f firing) (*JobRun, int, error) {
	l := r.l
	var run *JobRun
	_, stop, err := retrier{backoff: fixed(l.opts.RetryInterval), now: l.opts.Now, deadline: r.giveUpAt(f),
		again: func(err error) bool { return retryable(err) && !decided(err) },
		onRetry: func(err error) {
			l.notify.emit(l.event(EventRetry, Event{Op: "claim", Fence: tn.fence, Slot: f.slot, Err: err}))
		},
	}.do(ctx, func(ctx context.Context) error {
		var err error
		run, err = tn.claim(ctx, f.slot, &r.o, f.token, f.missed, f.spec)
		return err
	})
	return run, stop, err
}

// unclaimed settles a firing whose claim failed with err (stop: why the
// retries ended): as execute's done and err say.
func (r *runner) unclaimed(ctx context.Context, tn *term, f firing, stop int, err error) (done bool, _ error) {
	l := r.l
	var paused pausedError
	switch {
	case errors.Is(err, errPaused) && f.spec.overSkip != 0:
		return true, nil // the skip stands: a newer pause began since
	case errors.As(err, &paused) && f.what == "slot":
		// An earlier attempt may have landed unseen (a retry of ours or
		// of the SDK's): its run, if any, is given up and swept like one
		// claimed too late.
		r.giveUp(f.token)
		r.unswept = append(r.unswept, f.slot)
		return r.execute(ctx, tn, firing{what: f.what, slot: f.slot, missed: f.missed, token: randomID(8),
			spec: claimSpec{status: RunSkippedByPause, skippedIn: paused.pausedAt, unswept: f.spec.unswept}})
	case errors.Is(err, errPaused):
		l.log.Info("ddblease: "+f.what+" not run: the job was paused again", "slot", fmtSlot(f.slot))
		return true, nil
	case errors.Is(err, ErrSlotTaken):
		if over := skippedBefore(err, f); over != 0 {
			// Recorded skipped by a pause that began before the slot
			// came due, by a leader whose wall clock was ahead: the claim
			// replaces the record if that pause ended before the slot.
			spec := f.spec
			spec.overSkip = over
			return r.execute(ctx, tn, firing{what: f.what, slot: f.slot, missed: f.missed, token: f.token, spec: spec})
		}
		if leftRunning(err, tn) {
			if f.spec.trigger != "" {
				// A triggered run's item is not a slot's, which a resweep
				// reads: the request stays pending, and its next look
				// marks the run again.
				l.log.Info("ddblease: triggered run left running by an earlier leader; its request stays pending", "run", f.spec.trigger)
				return false, nil
			}
			r.unswept = append(r.unswept, f.slot)
		}
		l.log.Debug("ddblease: "+f.what+" already handled", "slot", fmtSlot(f.slot), "err", err)
		return true, nil
	case errors.Is(err, errClaimedLate):
		// fn is not called on a tenure that is over. The run, claimed,
		// is given up: a slot's is marked abandoned by the next resweep;
		// a trigger's or catch-up's request stays pending, for the next
		// tenure, whose claim finds the run an older tenure left.
		l.log.Warn("ddblease: "+f.what+" not run: the tenure ended while it was being claimed", "slot", fmtSlot(f.slot), "fence", tn.fence)
		r.giveUp(f.token)
		if f.what == "slot" {
			r.unswept = append(r.unswept, f.slot)
		}
		_ = sleep(ctx, l.opts.RetryInterval)
		return false, nil
	case errors.Is(err, ErrLost), errors.Is(err, ErrNotLeader):
		// The tenure is over: its timer cancels ctx, and Run campaigns
		// again. Wait for that, but never for ever.
		_ = sleep(ctx, l.opts.RetryInterval)
		return false, nil
	case stop == retryEnded || ctx.Err() != nil:
		return false, nil
	case errors.Is(err, ErrMalformedItem):
		l.log.Error("ddblease: "+f.what+" skipped: its run item is malformed", "slot", fmtSlot(f.slot), "err", err)
		return true, nil
	case stop == retryDeadline:
		// The wait that would have come next still comes, so that claims
		// failing fast are not sent in a loop from one firing to the next.
		l.log.Warn("ddblease: "+f.what+" given up: the next slot is due", "slot", fmtSlot(f.slot), "err", err)
		r.giveUp(f.token)
		_ = sleep(ctx, jitter(l.opts.RetryInterval))
		return false, nil
	default: // an error retrying cannot mend
		return false, err
	}
}

// runClaimed runs fn on the run claimed for f, and records its outcome.
func (r *runner) runClaimed(ctx context.Context, tn *term, f firing, run *JobRun) (done bool, err error) {
	l := r.l
	if run.finished {
		l.log.Info("ddblease: slot skipped: the job is paused", "slot", fmtSlot(f.slot), "fence", tn.fence)
		return true, nil
	}
	if f.what != "slot" {
		l.log.Info("ddblease: running a "+f.what, "run", run.id, "fence", tn.fence)
	}
	if f.what != "slot" {
		// A trigger's or catch-up's token is reused by this tenure's next
		// look: its claim is then recognised as this one, and fn must not
		// run twice. The run is left for a newer tenure.
		if r.ran[f.token] {
			return false, nil
		}
		r.ran[f.token] = true
	}
	// A run whose outcome could not be recorded is not settled: a slot
	// stays due, so that a newer tenure's catch-up finds the run left
	// running and marks it abandoned; a request stays pending. A slot's
	// outcome refused because a newer tenure leads is that tenure's to
	// sweep; a request stays pending even then, until the tenure that ran
	// it last records it: a newer tenure's claim may have taken the run
	// over (Rerun) and that tenure may end before it records the outcome.
	recorded, superseded := r.runAndFinish(ctx, tn, run)
	return recorded || superseded && f.what == "slot", nil
}

// skippedBefore returns, for a slot's claim refused because its run is
// recorded skipped by a pause that began at or before the slot (and not
// yet tried over), when that pause began; otherwise 0. A slot is skipped
// by a pause it came due in, or by the pause that stopped its claim's
// retries (the pause began after the slot): only the first kind may have
// been recorded early by a wall clock ahead, and the claim over it checks
// that the slot lies after that pause.
func skippedBefore(err error, f firing) int64 {
	var taken *SlotTakenError
	if f.what != "slot" || f.spec.overSkip != 0 || !errors.As(err, &taken) {
		return 0
	}
	if rec := taken.Run; rec.Status == RunSkippedByPause && rec.skippedIn != 0 && rec.skippedIn <= f.slot.UnixMilli() {
		return rec.skippedIn
	}
	return 0
}

// decided reports whether err, from a claim, is an answer rather than a
// failure: the job is paused, the slot is taken, the tenure is over, the
// run item is malformed.
func decided(err error) bool {
	for _, e := range []error{errPaused, ErrSlotTaken, errClaimedLate, ErrLost, ErrNotLeader, ErrMalformedItem} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// giveUpAt returns when a firing's claim is given up: once the next slot
// after it is due (after now, for a firing outside the schedule), or
// never (zero) when the schedule has no further slot.
func (r *runner) giveUpAt(f firing) time.Time {
	from := f.slot
	if f.what != "slot" {
		from = r.l.opts.Now()
	}
	next, err := nextSlot(r.sched, from)
	if err != nil {
		return time.Time{}
	}
	return next
}

// giveUp remembers the token of a claim given up, so that a sweep marks
// its run abandoned if the claim landed.
func (r *runner) giveUp(token string) {
	r.givenUp = append(r.givenUp, token)
	if len(r.givenUp) > maxGivenUp {
		r.givenUp = r.givenUp[1:]
	}
}

// call calls fn for run. If fn panics, the run is recorded as failed with
// the panic's value and stack, and the panic goes on as a *PanicError, for
// Run to end the tenure and resign. If fn calls runtime.Goexit, the run is
// recorded as failed, and Run ends the tenure as after a panic.
func (r *runner) call(ctx context.Context, tn *term, run *JobRun) error {
	if r.busySince.IsZero() {
		r.busySince = r.l.opts.Now()
	}
	returned := false
	defer func() {
		p := recover()
		switch {
		case p != nil:
			pe := &PanicError{Value: p, Stack: debug.Stack()}
			r.finish(ctx, tn, run, pe)
			panic(pe)
		case !returned:
			r.finish(ctx, tn, run, errGoexit)
		}
	}()
	err := soundError(r.fn(ctx, run))
	returned = true
	return err
}

// finish records the run's outcome, retrying transient errors while the
// tenure lasts, even when ctx has ended (the firing is draining). It
// reports whether the outcome is recorded, and whether it was refused
// because a newer tenure leads.
func (r *runner) finish(ctx context.Context, tn *term, run *JobRun, fnErr error) (recorded, superseded bool) {
	l := r.l
	if run.isFinished() {
		return true, false
	}
	// Retried while the tenure leads, even when ctx has ended (the firing
	// is draining).
	_, _, err := retrier{backoff: fixed(l.opts.RetryInterval),
		again: func(err error) bool { return retryable(err) && !errors.Is(err, ErrStaleFence) && tn.leads() },
		onRetry: func(err error) {
			l.notify.emit(l.event(EventRetry, Event{Op: "finish", Fence: tn.fence, Slot: run.slot, Err: err}))
		},
	}.do(context.WithoutCancel(ctx), func(ctx context.Context) error { return run.Finish(ctx, fnErr) })
	if err == nil {
		return true, false
	}
	args := []any{"slot", run.id, "fence", tn.fence, "err", err}
	if fnErr != nil {
		args = append(args, "run_err", fnErr)
	}
	l.log.Warn("ddblease: could not record the run's outcome", args...)
	return false, errors.Is(err, ErrStaleFence)
}

// sweep reads back the skipped slots, latest first, 100 per request,
// until it reaches one that has a run: the slots after the latest run are
// the missed ones, and runs that an older tenure left running (or that this
// one claimed and gave up) in the slots read are marked abandoned. n is how
// many slots were skipped in all, of which older are the latest. It returns
// the number missed, or -1 when it is not known (the slots could not be
// read, or there were more than were enumerated).
//
// The first tenure a job ever has (fence 1) skips the slots before its
// acquisition: no one led then, so nothing was missed and nothing can be
// left running.
func (r *runner) sweep(ctx context.Context, tn *term, older []time.Time, n int, latest time.Time) int {
	l := r.l
	if tn.fence == 1 {
		acquired := tn.acquiredAt
		i := 0
		for i < len(older) && older[i].Before(acquired) {
			i++
		}
		n -= i
		older = older[i:]
		if len(older) == 0 {
			return 0
		}
	}
	missed, abandoned, found, counted := 0, 0, false, false
	var again []time.Time // orphans whose marking failed transiently
	for end := len(older); end > 0 && !found; end -= 100 {
		chunk := older[max(end-100, 0):end]
		ids := make([]string, len(chunk))
		for i, s := range chunk {
			ids[i] = fmtSlot(s)
		}
		var items map[string]map[string]types.AttributeValue
		_, _, err := retrier{backoff: fixed(l.opts.RetryInterval), attempts: 3}.do(ctx, func(ctx context.Context) error {
			var err error
			items, err = l.getRuns(ctx, ids)
			return err
		})
		if err != nil {
			r.unswept = append(append(r.unswept, older[:end]...), again...)
			l.notify.emit(l.event(EventSlotsMissed, Event{Slot: latest, Fence: tn.fence, Missed: -1, Err: err}))
			return -1
		}
		for i := len(ids) - 1; i >= 0; i-- {
			item, ok := items[ids[i]]
			if !ok {
				if !counted {
					missed++
				}
				continue
			}
			// The latest run ends the count. The latest run an older tenure
			// claimed ends the search: its runner handled the slots before
			// it. A run of this tenure (a resumption's catch-up, a claim
			// given up) does not.
			counted = true
			if rec, err := decodeRun(r.l.opts.Layout, item); err != nil || rec.Fence < tn.fence {
				found = true
			}
			r.inherit(item)
			ok, retry := r.abandonOrphan(ctx, tn, chunk[i], item)
			if ok {
				abandoned++
			}
			if retry {
				again = append(again, chunk[i])
			}
		}
	}
	r.unswept = append(r.unswept, again...)
	if abandoned > 0 {
		l.log.Info("ddblease: runs left running by an earlier leader were marked abandoned", "abandoned", abandoned,
			"firing", fmtSlot(latest))
	}
	if !counted && n > len(older) {
		// More slots were skipped than enumerated: the count is a lower
		// bound.
		missed = -1
	}
	if missed != 0 {
		l.notify.emit(l.event(EventSlotsMissed, Event{Slot: latest, Fence: tn.fence, Missed: missed}))
	}
	return missed
}

// abandonOrphan marks the run item of slot abandoned if an older tenure
// left it running, or this one claimed and gave it up. It reports whether
// it did, and whether the marking failed transiently (the slot is then
// kept for the next resweep).
func (r *runner) abandonOrphan(ctx context.Context, tn *term, slot time.Time, item map[string]types.AttributeValue) (abandoned, retry bool) {
	l := r.l
	id := fmtSlot(slot)
	rec, err := decodeRun(r.l.opts.Layout, item)
	if err != nil {
		l.log.Error("ddblease: skipped slot has a malformed run item", "slot", id, "err", err)
		return false, false
	}
	givenUp := rec.Status == RunRunning && rec.Fence == tn.fence && slices.Contains(r.givenUp, rec.claim)
	if !rec.orphanFor(tn.fence) && !givenUp {
		return false, false
	}
	if r.marks >= maxMarks {
		return false, true // kept for the next resweep
	}
	r.marks++
	_, ok, err := tn.abandon(ctx, rec)
	if err != nil {
		l.log.Warn("ddblease: could not mark an orphaned run abandoned", "slot", id, "fence", rec.Fence, "err", err)
		return false, retryable(err)
	}
	return ok, false
}

// maxMarks bounds the abandon writes made between two firings (a sweep
// and the resweep after it), so that a table that fails them fast is not
// sent a burst; the rest wait for the next resweep.
const maxMarks = 10

// inherit takes on the slots that the tenure which claimed this run
// (item) could not sweep, recorded in its claim: they are read back by
// the next resweep.
func (r *runner) inherit(item map[string]types.AttributeValue) {
	rec, err := decodeRun(r.l.opts.Layout, item)
	if err != nil {
		return
	}
	for _, id := range rec.unswept {
		if s, err := time.Parse(time.RFC3339Nano, id); err == nil {
			r.unswept = append(r.unswept, s.UTC())
		}
	}
}

// maxRecorded is how many unswept slots a claim records (the latest).
const maxRecorded = 100

// pendingIDs returns the latest slots still to be swept, for a claim to
// record (claimSpec.unswept).
func (r *runner) pendingIDs() []string {
	if len(r.unswept) == 0 {
		return nil
	}
	slots := slices.Clone(r.unswept)
	slices.SortFunc(slots, time.Time.Compare)
	slots = slices.CompactFunc(slots, time.Time.Equal)
	slots = slots[max(len(slots)-maxRecorded, 0):]
	ids := make([]string, len(slots))
	for i, s := range slots {
		ids[i] = fmtSlot(s)
	}
	return ids
}

// leftRunning reports whether err, from a claim, says that the run is one
// an older tenure left running, which the claim could not mark abandoned.
func leftRunning(err error, tn *term) bool {
	var taken *SlotTakenError
	return errors.As(err, &taken) && !taken.Abandoned && taken.Run.orphanFor(tn.fence)
}

// resweep reads back the slots a catch-up could not, and marks orphaned
// runs among them abandoned; what it cannot read or mark it keeps for the
// next time, the latest maxSweep slots, whatever their age: a slot that
// left the catch-up window while its reads failed is never fired again,
// but its run, if left running, must still be marked.
func (r *runner) resweep(ctx context.Context, tn *term) {
	if len(r.unswept) == 0 || ctx.Err() != nil || !tn.leads() {
		return
	}
	slots := r.unswept
	slices.SortFunc(slots, time.Time.Compare)
	slots = slices.CompactFunc(slots, time.Time.Equal)
	if len(slots) > maxSweep {
		slots = slots[len(slots)-maxSweep:] // the latest, as a catch-up reads
	}
	r.unswept = nil
	for start := 0; start < len(slots); start += 100 {
		chunk := slots[start:min(start+100, len(slots))]
		ids := make([]string, len(chunk))
		for i, s := range chunk {
			ids[i] = fmtSlot(s)
		}
		items, err := r.l.getRuns(ctx, ids)
		if err != nil {
			r.unswept = append(r.unswept, slots[start:]...)
			return
		}
		for i, id := range ids {
			if item, ok := items[id]; ok {
				if _, retry := r.abandonOrphan(ctx, tn, chunk[i], item); retry {
					r.unswept = append(r.unswept, chunk[i])
				}
			}
		}
	}
}

// adopt reads, when a tenure begins, the latest run among the 100 slots
// before the catch-up window (the window's own slots are fired or swept by
// the catch-up), in one BatchGetItem: a run an older tenure left running
// there is marked abandoned, and the slots its claim recorded as still to
// sweep are taken on. This is how the run of a leader that died during a
// slow schedule's slot (nightly, say) is settled when the next tenure
// begins after the window, and how a tenure that could not sweep hands its
// slots on. The job's first tenure (fence 1) has no predecessor.
//
// When another replica led between this runner's tenures, the last slot
// this runner handled is read in the same request: the catch-up begins
// after it, but the tenure between may have claimed it again (Rerun) and
// left it running.
func (r *runner) adopt(ctx context.Context, tn *term) {
	if tn.fence == 1 {
		return
	}
	slots := r.slotsBefore(r.l.opts.Now().Add(-r.o.CatchUpWindow), 100, r.o.Retention)
	var own time.Time // the last slot handled, when a tenure came between
	if r.fence != 0 && tn.fence != r.fence+1 && !r.last.IsZero() &&
		(len(slots) == 0 || r.last.After(slots[len(slots)-1])) {
		own = r.last
		if len(slots) == 100 {
			slots = slots[1:] // one request still
		}
	}
	if len(slots) == 0 && own.IsZero() {
		return
	}
	ids := make([]string, len(slots), len(slots)+1)
	for i, s := range slots {
		ids[i] = fmtSlot(s)
	}
	if !own.IsZero() {
		ids = append(ids, fmtSlot(own))
	}
	items, err := r.l.getRuns(ctx, ids)
	if err != nil {
		r.unswept = append(r.unswept, slots...)
		if !own.IsZero() {
			r.unswept = append(r.unswept, own)
		}
		return
	}
	if !own.IsZero() {
		if item, ok := items[fmtSlot(own)]; ok {
			r.inherit(item)
			if _, retry := r.abandonOrphan(ctx, tn, own, item); retry {
				r.unswept = append(r.unswept, own)
			}
		}
	}
	for i := len(slots) - 1; i >= 0; i-- {
		if item, ok := items[ids[i]]; ok {
			r.inherit(item)
			if _, retry := r.abandonOrphan(ctx, tn, slots[i], item); retry {
				r.unswept = append(r.unswept, slots[i])
			}
			return
		}
	}
}

// slotsBefore returns up to the latest n slots at or before t (oldest
// first), looking back at most limit, by enumerating from t less doubling
// spans.
func (r *runner) slotsBefore(t time.Time, n int, limit time.Duration) []time.Time {
	var slots []time.Time
	for span := time.Second; ; span *= 2 {
		span = min(span, limit)
		slots = slots[:0]
		s, err := nextSlot(r.sched, t.Add(-span))
		for i := 0; err == nil && !s.IsZero() && !s.After(t) && i < maxEnumerate; i++ {
			slots = append(slots, s)
			s, err = nextSlot(r.sched, s)
		}
		if err != nil || len(slots) >= n || span >= limit {
			return slots[max(len(slots)-n, 0):]
		}
	}
}

// logTooOld logs the slots after last that fell out of the catch-up window
// before this replica could fire them.
func (r *runner) logTooOld(last, floor time.Time) {
	n, s := 0, last
	for n < maxEnumerate {
		next, err := nextSlot(r.sched, s)
		if err != nil || next.IsZero() || next.After(floor) {
			break
		}
		n++
		s = next
	}
	if n > 0 {
		r.l.log.Warn("ddblease: slots older than the catch-up window were skipped", "after", fmtSlot(last),
			"skipped", n, "window", r.o.CatchUpWindow)
	}
}

// runnerControl is RunSchedule's view of the operator controls.
type runnerControl struct {
	look   bool              // read the controls before waiting for a slot
	paused bool              // as last read
	tokens map[string]string // claim token of each trigger and catch-up tried, by id
}

// wait sleeps for d, or until the keeper sees the operator controls change
// (woken), or ctx ends (err).
func (r *runner) wait(ctx context.Context, d time.Duration) (woken bool, err error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false, context.Cause(ctx)
	case <-t.C:
		return false, nil
	case <-r.l.ctl.ch():
		r.ctl.look = true
		return true, nil
	}
}

// lookIfAsked reads the controls when the runner was woken, or its tenure
// just began.
func (r *runner) lookIfAsked(ctx context.Context, tn *term) error {
	if !r.ctl.look {
		return nil
	}
	r.ctl.look = false
	_, known, err := r.control(ctx, tn)
	if !known && err == nil && ctx.Err() == nil {
		// Not read (a transient error): look again after a
		// RetryInterval (due), rather than wait for the controls to
		// change again.
		r.ctl.look = true
	}
	return err
}

// control reads the lease item with a strongly consistent read, runs the
// pending triggers and catch-up, and returns whether the job is paused.
// known is false when the item could not be read (a transient error, or a
// malformed item: logged). err is set only when the campaign must stop.
func (r *runner) control(ctx context.Context, tn *term) (paused, known bool, err error) {
	l := r.l
	item, err := getItem(ctx, l.db, l.table, l.opts.Layout.leaseKey(l.job), l.opts.CallTimeout)
	switch {
	case ctx.Err() != nil:
		return false, false, nil
	case err != nil && retryable(err):
		l.log.Warn("ddblease: could not read the operator controls", "err", err)
		return false, false, nil
	case err != nil:
		return false, false, fmt.Errorf("ddblease: read lease %q: %w", l.job, err)
	case len(item) == 0:
		return r.ctl.paused, true, nil // the tenure is over: the claim will say so
	}
	rec, err := decodeLease(l.opts.Layout, item)
	if err != nil {
		l.log.Error("ddblease: the lease item is malformed", "err", err)
		return false, false, nil
	}
	if rec.Fence != tn.fence {
		// The tenure is over; the keeper ends it soon. Without a
		// transaction, a claim would rest on the local tenure alone.
		return false, false, nil
	}
	c := rec.Control
	l.ctl.note(c)
	select { // what we just read needs no second look
	case <-l.ctl.ch():
	default:
	}
	if r.ctl.paused != c.Paused {
		l.log.Info("ddblease: operator pause changed", "paused", c.Paused, "pausedBy", c.PausedBy, "resumedBy", c.ResumedBy)
	}
	r.ctl.paused = c.Paused
	trs, _ := pendingTriggers(item) // decodeLease checked them
	for _, tr := range trs {
		if ctx.Err() != nil {
			return c.Paused, true, nil
		}
		if err := r.runTrigger(ctx, tn, tr); err != nil {
			return c.Paused, true, err
		}
	}
	if c.catchUp != "" && !c.Paused && ctx.Err() == nil {
		if err := r.catchUp(ctx, tn, c); err != nil {
			return c.Paused, true, err
		}
	}
	return c.Paused, true, nil
}

// token returns the claim token used for the request id, the same on every
// attempt, so that a claim whose answer was lost is recognised.
func (r *runner) token(id string) string {
	if r.ctl.tokens == nil {
		r.ctl.tokens = map[string]string{}
	}
	if t, ok := r.ctl.tokens[id]; ok {
		return t
	}
	if len(r.ctl.tokens) > maxSweep {
		clear(r.ctl.tokens)
	}
	t := randomID(8)
	r.ctl.tokens[id] = t
	return t
}

// runTrigger runs a triggered run through the one run protocol (execute),
// then clears its request once the run is settled. A run not settled
// (its claim given up, its outcome not recorded, the tenure over) leaves
// the request pending: this tenure looks again after a RetryInterval
// (unless fn ran for it: then only a newer tenure's claim, which finds the
// run it left).
func (r *runner) runTrigger(ctx context.Context, tn *term, tr pendingTrigger) error {
	token := r.token(tr.id)
	done, err := r.execute(ctx, tn, firing{what: "triggered run", slot: tr.slot, token: token,
		spec: claimSpec{trigger: tr.id}})
	if err != nil || !done {
		r.ctl.look = r.ctl.look || err == nil && ctx.Err() == nil && !r.ran[token]
		return err
	}
	r.clearControl(ctx, "REMOVE #tr.#id", "", map[string]string{"#tr": attrTriggers, "#id": tr.id}, map[string]types.AttributeValue{})
	delete(r.ctl.tokens, tr.id)
	return nil
}

// catchUp runs the latest slot that fell due during the pause that c ended,
// claiming again its run skipped by the pause, through the one run
// protocol, then clears the request once the run is settled.
func (r *runner) catchUp(ctx context.Context, tn *term, c Control) error {
	l := r.l
	if !c.PausedAt.IsZero() && !c.ResumedAt.IsZero() {
		first, err := nextSlot(r.sched, c.PausedAt)
		if err == nil && !first.IsZero() && !first.After(c.ResumedAt) {
			var latest time.Time
			if latest, _, _, err = r.dueSlots(first, c.ResumedAt); err == nil {
				// The slots before it were in the pause, or before it: their
				// count is not known.
				token := r.token(c.catchUp)
				done, err := r.execute(ctx, tn, firing{what: "catch-up", slot: latest, token: token, missed: -1,
					spec: claimSpec{reclaimed: true, pause: pauseNow}})
				if err != nil || !done {
					r.ctl.look = r.ctl.look || err == nil && ctx.Err() == nil && !r.ran[token]
					return err
				}
				// r.last is left alone: the schedule's own catch-up still
				// reads back the slots before this one.
			}
		}
		if err != nil {
			l.log.Error("ddblease: catch-up: the schedule failed; dropping the request", "err", err)
		}
	}
	r.clearControl(ctx, "SET #cud = :cu", "#cu = :cu", map[string]string{"#cu": attrCatchUp, "#cud": attrCatchUpDone},
		map[string]types.AttributeValue{":cu": avS(c.catchUp)})
	delete(r.ctl.tokens, c.catchUp)
	return nil
}

// runAndFinish runs fn for a claimed run and records its outcome (a panic
// in fn is recorded and goes on, through r.call). It reports what finish
// does. A failed run is logged once: by the record of its
// outcome (EventRunFinished), or by finish when it cannot be recorded.
func (r *runner) runAndFinish(ctx context.Context, tn *term, run *JobRun) (recorded, superseded bool) {
	fnErr := r.call(ctx, tn, run)
	if fnErr != nil && ctx.Err() != nil && (errors.Is(fnErr, context.Canceled) || errors.Is(fnErr, context.DeadlineExceeded)) {
		fnErr = fmt.Errorf("%w (%v)", fnErr, context.Cause(ctx))
	}
	return r.finish(ctx, tn, run, fnErr)
}

// clearControl removes a handled operator request from the lease item. It
// touches no attribute of the lease protocol, so it cannot disturb the
// holder's writes; a failure leaves the request to be handled again, which
// finds its run already claimed.
func (r *runner) clearControl(ctx context.Context, update, cond string, names map[string]string, values map[string]types.AttributeValue) {
	l := r.l
	names["#pk"] = l.opts.Layout.PartitionKey
	full := "attribute_exists(#pk)"
	if cond != "" {
		full += " AND " + cond
	}
	in := &dynamodb.UpdateItemInput{
		TableName: aws.String(l.table), Key: l.opts.Layout.leaseKey(l.job), UpdateExpression: aws.String(update),
		ConditionExpression: aws.String(full), ExpressionAttributeNames: names,
	}
	if len(values) > 0 {
		in.ExpressionAttributeValues = values
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.opts.CallTimeout)
	defer cancel()
	if _, err := l.db.UpdateItem(cctx, in); err != nil && len(failedConditions(err)) == 0 {
		l.log.Warn("ddblease: could not clear a handled operator request", "err", err)
	}
}
