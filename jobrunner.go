package ddblease

import (
	"context"
	"fmt"
	"time"
)

// This file owns RunSchedule and the runner's loop: the runner
// (runprotocol.go) follows the tenures of the lease, and each step of it
// runs the operator's requests (control.go), then the slot due
// (catchup.go), through the run protocol (runprotocol.go).

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
	r := &runner{l: l, sched: sched, fn: fn, o: &o, looked: *l.born}
	l.ctl.watch()
	return l.campaign(ctx, r.lead)
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
	r.ran = nil
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
	handled, err := r.execute(ctx, tn, plannedRun{what: "slot", slot: slot, missed: missed, token: randomID(8),
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
