package ddblease

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"
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
// Catch-up rule. When this replica becomes leader, or when fn ran past
// later slots, several slots may be due at once. Only the most recent of
// them is fired, and only if it is at most JobOptions.CatchUpWindow old
// (default 15 minutes); its claim fails with ErrSlotTaken, and nothing runs,
// if another tenure already handled it. The older due slots in the window
// are skipped and read back, latest first, 100 slots per BatchGetItem,
// until one with a run is found (at most the latest 1,000); those without
// a run after the latest one that has a run are counted as missed
// (reported as EventSlotsMissed, logged, and recorded in the fired run:
// RunRecord.Missed, or MissedUnknown if they could not be read or none of
// the 1,000 had a run), and runs an older tenure left running among the
// slots read are marked abandoned, whatever the RerunPolicy: only the slot
// being fired may be run again. The first tenure a job ever has (fence 1)
// counts nothing as missed: no one led before it. Slots older than the
// window are never fired; if this replica had led before, it logs how
// many it skipped that way. A slot whose claim keeps failing with
// transient errors, or whose outcome could not be recorded before the
// tenure ended, is given up once the next slot is due, and is swept like a
// missed slot by the catch-up that follows (abandoned if its claim landed).
// A claim answered after the tenure's deadline (a slow answer, a paused
// process) does not run fn: the run is given up, and marked abandoned
// after a later firing (by this replica, or by a newer tenure's catch-up).
// A skipped slot that could not be read back, and a slot whose
// run an older tenure left running could not be marked abandoned (by a
// catch-up, or by the claim that found it), is tried again after each
// firing until it is (the latest 1,000 such slots are kept), even once it
// has left the catch-up window.
//
// Clock steps. Slots are read off the wall clock (Options.Now). A clock
// stepped forward fires the slots it passes early (each once: their runs
// protect them); a clock stepped back behind the last slot handled makes
// the runner start again from the new time at once, so a slot already run
// is found taken and not run again, and the next due slot fires on time.
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
// instead of one), one UpdateItem to finish it, and one BatchGetItem per
// 100 slots a catch-up reads back (at most 10; a strongly consistent read
// per slot).
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
	r := &runner{l: l, sched: sched, fn: fn, o: o}
	return l.Run(ctx, r.lead)
}

// runner fires a schedule's slots for RunSchedule. Its fields are used by
// one tenure at a time.
type runner struct {
	l     *Lease
	sched Schedule
	fn    func(context.Context, *JobRun) error
	o     JobOptions
	last  time.Time // latest slot handled (fired, found taken or skipped); zero if none
	// givenUp holds the claim tokens of the latest slots given up after
	// claims with unknown outcomes: a sweep abandons such a claim if it did
	// land.
	givenUp []string
	// unswept holds skipped slots a catch-up could not read back, and
	// slots whose orphaned run a catch-up or a claim could not mark
	// abandoned (keepOrphan): they are read again after each firing until
	// they are swept (the latest maxSweep are kept), so that a run an
	// older tenure left running there is still marked abandoned.
	unswept []time.Time
	ctl     runnerControl // operator controls (control.go)
}

// lead is the function given to Run: it fires slots for one tenure.
func (r *runner) lead(ctx context.Context, fence int64) error {
	r.ctl.look = true // control.go: read the operator controls before the first wait
	for ctx.Err() == nil {
		if err := r.lookIfAsked(ctx, fence); err != nil { // control.go: triggers, catch-up
			return err
		}
		slot, missed, ok, err := r.due(ctx, fence)
		if err != nil || !ok {
			return err
		}
		if slot.IsZero() {
			continue // control.go: woken by a change of the operator controls
		}
		handled, err := r.fireUnlessPaused(ctx, fence, slot, missed) // control.go
		if err != nil {
			return err
		}
		if handled {
			r.last = slot
		}
		r.resweep(ctx, fence)
		// A slot not handled (given up, or the tenure ended) is due again
		// at the next catch-up, which fires a later slot and sweeps it.
	}
	return nil
}

// due waits for the next slot to fire and applies the catch-up rule. ok is
// false when ctx ended or the schedule has no further slot. missed is -1
// when the skipped slots could not be read back.
func (r *runner) due(ctx context.Context, fence int64) (slot time.Time, missed int, ok bool, err error) {
	l := r.l
	for {
		now := l.opts.Now()
		floor := now.Add(-r.o.CatchUpWindow)
		if r.last.After(now) {
			// The wall clock stepped back past the last slot handled: start
			// again from now. Slots run early stay protected by their runs.
			r.last = time.Time{}
		}
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
			return time.Time{}, 0, false, err
		}
		if first.IsZero() {
			l.log.Info("ddblease: the schedule has no further slot", "after", fmtSlot(floor))
			return time.Time{}, 0, false, nil
		}
		if first.After(now) {
			// control.go: an operator request wakes the wait; due then
			// returns no slot, and lead reads the controls.
			if woken, err := r.wait(ctx, min(first.Sub(now), maxSleep)); err != nil || woken {
				return time.Time{}, 0, err == nil, nil
			}
			continue
		}
		latest, older, n, err := r.dueSlots(first, now)
		if err != nil {
			return time.Time{}, 0, false, err
		}
		if n > 0 {
			missed = r.sweep(ctx, fence, older, n, latest)
		}
		return latest, missed, true, nil
	}
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

// fire claims slot, calls fn and records the outcome. handled is false
// when the slot was given up or the tenure ended before it was claimed; err
// is set only when the campaign must stop.
func (r *runner) fire(ctx context.Context, fence int64, slot time.Time, missed int) (handled bool, err error) {
	l := r.l
	token := randomID(8)
	var run *JobRun
	bo := fixed(l.opts.RetryInterval)
	for {
		var err error
		run, err = l.claim(ctx, slot, &r.o, token, missed)
		if err == nil {
			break
		}
		switch {
		case errors.Is(err, ErrSlotTaken):
			l.log.Debug("ddblease: slot already handled", "slot", fmtSlot(slot), "err", err)
			r.keepOrphan(err, fence, slot)
			return true, nil
		case errors.Is(err, ErrLost), errors.Is(err, ErrNotLeader):
			// The tenure is over: its timer cancels ctx, and Run campaigns
			// again. Wait for that, but never for ever.
			_ = sleep(ctx, l.opts.RetryInterval)
			return false, nil
		case ctx.Err() != nil:
			return false, nil
		case errors.Is(err, ErrMalformedItem):
			l.log.Error("ddblease: slot skipped: its run item is malformed", "slot", fmtSlot(slot), "err", err)
			return true, nil
		case !retryable(err):
			return false, err
		}
		if next, nerr := nextSlot(r.sched, slot); nerr == nil && !next.IsZero() && !next.After(l.opts.Now()) {
			l.log.Warn("ddblease: slot given up: the next one is due", "slot", fmtSlot(slot), "err", err)
			r.giveUp(token)
			return false, nil
		}
		l.notify.emit(l.event(EventRetry, Event{Op: "claim", Fence: fence, Slot: slot, Err: err}))
		if bo.wait(ctx) != nil {
			return false, nil
		}
	}
	if !l.leads(fence) {
		// The tenure's deadline passed while the claim was in flight (a
		// slow answer, a paused process): fn is not called on a tenure
		// that is over. The run, claimed, is given up: the next resweep
		// marks it abandoned, whichever slot is handled next. Then wait
		// for the tenure's timer to cancel ctx, as for ErrLost.
		l.log.Warn("ddblease: slot not run: the tenure ended while it was being claimed", "slot", fmtSlot(slot), "fence", fence)
		r.giveUp(token)
		r.unswept = append(r.unswept, slot)
		_ = sleep(ctx, l.opts.RetryInterval)
		return false, nil
	}
	// A run whose outcome could not be recorded is not handled: the slot
	// stays due, so that a newer tenure's catch-up finds the run left
	// running and marks it abandoned.
	return r.runAndFinish(ctx, fence, run), nil
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
func (r *runner) call(ctx context.Context, fence int64, run *JobRun) error {
	returned := false
	defer func() {
		p := recover()
		switch {
		case p != nil:
			pe := &PanicError{Value: p, Stack: debug.Stack()}
			r.finish(ctx, fence, run, pe)
			panic(pe)
		case !returned:
			r.finish(ctx, fence, run, errGoexit)
		}
	}()
	err := soundError(r.fn(ctx, run))
	returned = true
	return err
}

// errGoexit is recorded as the error of a run whose function called
// runtime.Goexit (t.FailNow in a test, say) instead of returning.
var errGoexit = errors.New("ddblease: the job's function exited without returning (runtime.Goexit)")

// finish records the run's outcome, retrying transient errors while the
// tenure lasts, even when ctx has ended (the firing is draining). It
// reports whether the outcome is recorded.
func (r *runner) finish(ctx context.Context, fence int64, run *JobRun, fnErr error) bool {
	l := r.l
	if run.isFinished() {
		return true
	}
	fctx := context.WithoutCancel(ctx)
	bo := fixed(l.opts.RetryInterval)
	for {
		err := run.Finish(fctx, fnErr)
		if err == nil {
			return true
		}
		if errors.Is(err, ErrStaleFence) || !retryable(err) || !l.leads(fence) {
			args := []any{"slot", run.id, "fence", fence, "err", err}
			if fnErr != nil {
				args = append(args, "run_err", fnErr)
			}
			l.log.Warn("ddblease: could not record the run's outcome", args...)
			return errors.Is(err, ErrStaleFence) // a newer tenure settled it
		}
		l.notify.emit(l.event(EventRetry, Event{Op: "finish", Fence: fence, Slot: run.slot, Err: err}))
		_ = bo.wait(fctx)
	}
}
