package ddblease

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"
)

// This file owns the runner (one per RunSchedule) and the run protocol
// (runner.execute): every run RunSchedule makes (a slot, a catch-up, an
// operator's trigger) is claimed under the current tenure, handed out
// only if the tenure still leads, run, and its outcome recorded, or left
// where a newer tenure finds it.

// maxGivenUp is how many given-up claims the runner remembers.
const maxGivenUp = 100

// plannedRun is one run RunSchedule may make: a slot of the schedule
// (fired on time or by a catch-up), an operator's trigger, or the
// catch-up a resumption asked for.
type plannedRun struct {
	what   string // "slot", "triggered run" or "catch-up", for the log
	slot   time.Time
	spec   claimSpec
	token  string // the claim's token: one per planned run, within one tenure
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
func (r *runner) execute(ctx context.Context, tn *term, f plannedRun) (done bool, err error) {
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
func (r *runner) claimRetrying(ctx context.Context, tn *term, f plannedRun) (*JobRun, int, error) {
	l := r.l
	var run *JobRun
	_, stop, err := retrier{backoff: fixed(l.opts.RetryInterval), now: l.opts.Now, deadline: r.giveUpAt(f),
		again: func(err error) bool { return retryable(err) && !decided(err) },
		onRetry: func(err error) {
			l.notify.emit(l.event(EventRetry, Event{Op: "claim", Fence: tn.fence, Slot: f.slot, Err: err}))
		},
	}.do(ctx, func(ctx context.Context) error {
		var err error
		run, err = tn.claim(ctx, f.slot, r.o, f.token, f.missed, f.spec)
		return err
	})
	return run, stop, err
}

// unclaimed settles a firing whose claim failed with err (stop: why the
// retries ended): as execute's done and err say.
func (r *runner) unclaimed(ctx context.Context, tn *term, f plannedRun, stop int, err error) (done bool, _ error) {
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
		return r.execute(ctx, tn, plannedRun{what: f.what, slot: f.slot, missed: f.missed, token: randomID(8),
			spec: claimSpec{status: RunSkippedByPause, skippedIn: paused.pausedAt, unswept: f.spec.unswept}})
	case errors.Is(err, errPaused):
		l.log().Info("ddblease: "+f.what+" not run: the job was paused again", "slot", fmtSlot(f.slot))
		return true, nil
	case errors.Is(err, ErrSlotTaken):
		if over := skippedBefore(err, f); over != 0 {
			// Recorded skipped by a pause that began before the slot
			// came due, by a leader whose wall clock was ahead: the claim
			// replaces the record if that pause ended before the slot.
			spec := f.spec
			spec.overSkip = over
			return r.execute(ctx, tn, plannedRun{what: f.what, slot: f.slot, missed: f.missed, token: f.token, spec: spec})
		}
		if leftRunning(err, tn) {
			if f.spec.trigger != "" {
				// A triggered run's item is not a slot's, which a resweep
				// reads: the request stays pending, and its next look
				// marks the run again.
				l.log().Info("ddblease: triggered run left running by an earlier leader; its request stays pending", "run", f.spec.trigger)
				return false, nil
			}
			r.unswept = append(r.unswept, f.slot)
		}
		l.log().Debug("ddblease: "+f.what+" already handled", "slot", fmtSlot(f.slot), "err", err)
		return true, nil
	case errors.Is(err, errClaimedLate):
		// fn is not called on a tenure that is over. The run, claimed,
		// is given up: a slot's is marked abandoned by the next resweep;
		// a trigger's or catch-up's request stays pending, for the next
		// tenure, whose claim finds the run an older tenure left.
		l.log().Warn("ddblease: "+f.what+" not run: the tenure ended while it was being claimed", "slot", fmtSlot(f.slot), "fence", tn.fence)
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
		l.log().Error("ddblease: "+f.what+" skipped: its run item is malformed", "slot", fmtSlot(f.slot), "err", err)
		return true, nil
	case stop == retryDeadline:
		// The wait that would have come next still comes, so that claims
		// failing fast are not sent in a loop from one firing to the next.
		l.log().Warn("ddblease: "+f.what+" given up: the next slot is due", "slot", fmtSlot(f.slot), "err", err)
		r.giveUp(f.token)
		_ = sleep(ctx, jitter(l.opts.RetryInterval))
		return false, nil
	default: // an error retrying cannot mend
		return false, err
	}
}

// runClaimed runs fn on the run claimed for f, and records its outcome.
func (r *runner) runClaimed(ctx context.Context, tn *term, f plannedRun, run *JobRun) (done bool, err error) {
	l := r.l
	if run.finished {
		l.log().Info("ddblease: slot skipped: the job is paused", "slot", fmtSlot(f.slot), "fence", tn.fence)
		return true, nil
	}
	if f.what != "slot" {
		l.log().Info("ddblease: running a "+f.what, "run", run.id, "fence", tn.fence)
	}
	if f.what != "slot" {
		// A trigger's or catch-up's token is reused by this tenure's next
		// look: its claim is then recognised as this one, and fn must not
		// run twice. The run is left for a newer tenure.
		if r.ran[f.token] {
			return false, nil
		}
		if r.ran == nil {
			r.ran = map[string]bool{}
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
func skippedBefore(err error, f plannedRun) int64 {
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
func (r *runner) giveUpAt(f plannedRun) time.Time {
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
	r.called = true
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
	l.log().Warn("ddblease: could not record the run's outcome", args...)
	return false, errors.Is(err, ErrStaleFence)
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

// runner fires a schedule's slots for RunSchedule. Its fields are used by
// one tenure at a time.
type runner struct {
	l     *Lease
	sched Schedule
	fn    func(context.Context, *JobRun) error
	o     *JobOptions // the same for every job of a pool
	last  time.Time   // latest slot handled (fired, found taken or skipped); zero if none
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
	ctl     runnerControl // operator controls (control.go)
	// busySince is when the runs that kept the runner busy since it last
	// looked for due slots began: a slot that came due while this tenure
	// led and was busy (a long fn, a trigger) is fired whatever its age.
	busySince time.Time
	marks     int // abandon writes since the last firing (maxMarks)
	// ran holds the tokens of the triggers and catch-ups whose fn this
	// tenure called: their requests stay pending when the outcome was not
	// recorded, and their claims would be recognised again. nil until the
	// tenure's first.
	ran map[string]bool
	// looked is the last look for a due slot, by both clocks; ahead sums
	// the wall clock's jumps ahead of the runtime clock since (returned).
	looked sent
	ahead  time.Duration
	// called records that fn was called (Pool.RunSchedule's step clears
	// it: a step that did not give fn its context drops it).
	called bool
}

// leftRunning reports whether err, from a claim, says that the run is one
// an older tenure left running, which the claim could not mark abandoned.
func leftRunning(err error, tn *term) bool {
	var taken *SlotTakenError
	return errors.As(err, &taken) && !taken.Abandoned && taken.Run.orphanFor(tn.fence)
}

// runnerControl is RunSchedule's view of the operator controls.
type runnerControl struct {
	look   bool              // read the controls before waiting for a slot
	paused bool              // as last read
	tokens map[string]string // claim token of each trigger and catch-up tried, by id
}
