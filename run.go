package ddblease

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
)

// This file owns Run: the campaign, and term.lead, which runs fn for one
// tenure.

// Run campaigns for the lease and, each time it is acquired, calls fn with a
// leader context and the tenure's fence, while a background heartbeat keeps
// the lease alive.
//
// The leader context is cancelled the moment leadership is lost, and
// IsLeader turns false at the same moment: a heartbeat finds another owner
// or fence (an operator's forced release among them), the local deadline
// passes without a confirmed heartbeat (whatever requests are in flight: a
// timer ends the tenure), or Resign is called on this handle. Its cause
// (context.Cause) then wraps ErrLost. Run waits for fn to return, and
// campaigns again. An operator's resign request (Admin.RequestResign) is
// drained like a shutdown (below), with a cause wrapping
// ErrResignRequested, and Run campaigns again too, leaving the lease to the
// other replicas for a lease duration first.
//
// Whatever fn returns once its leader context has ended by a loss or a
// resign request is the tenure's end, not fn's failure: Run campaigns
// again. Returning ctx.Err() or context.Cause(ctx) there is the expected
// way to stop; any other error is logged at Warn. An error that fn returns
// while its leader context is live is fn's failure, and ends Run.
//
// When ctx ends (a SIGTERM through signal.NotifyContext, say), Run cancels
// the leader context (its cause wraps ctx's cause), keeps the lease while
// fn returns, and resigns the moment it has. If fn still runs a
// RetryInterval later, Run marks the lease as draining, so that standbys
// poll fast (a standby takes over within its fast poll of the
// resignation), and renews it as usual. A function that returns sooner is
// handed over by the resignation alone, one write: a standby takes over at
// its next poll; a renewal that falls due meanwhile is put off while more
// than a heartbeat interval is left to the lease's deadline. If fn is
// still running DrainTimeout after ctx ended, Run stops
// renewing, so the lease lapses at its expiry and a standby may take over
// while fn still runs (its side effects stay fenced); Run still waits for
// fn, and then returns an error wrapping ErrDrainTimeout.
//
// What Run returns:
//   - nil after a clean shutdown: ctx ended, and fn (if it ran) returned
//     and the lease was resigned, or a standby's last look at the lease
//     succeeded. What fn returned then counts as the leader context's end
//     when it is nil or is (or wraps) context.Canceled,
//     context.DeadlineExceeded, the leader context's cause or ctx's cause:
//     a clean hand-over is not a failure, whatever cause ctx was cancelled
//     with;
//   - nil when fn returns nil on its own, while it leads (Run then
//     resigns);
//   - fn's error, after resigning, when fn returns it while it leads, or
//     during a shutdown's drain when it is not the leader context's end
//     (above);
//   - an error wrapping ctx.Err() and its cause, joined with the last
//     error, when ctx ended while every attempt since the last tenure had
//     failed (an unreachable endpoint, say), and when ctx had already ended
//     when Run was called;
//   - at once, an error that retrying cannot mend: a missing table, a wrong
//     key schema, denied access, bad credentials, a malformed lease item —
//     naming the table; and, when no attempt has ever reached the table,
//     the SDK's failure to sign or send a request (no credentials, no
//     region), which retrying would not mend either — after one
//     LeaseDuration of retries when it looks like a network not up yet (a
//     credentials endpoint refusing connections or timing out);
//   - an error wrapping ErrNotResigned when a resignation kept failing until
//     the lease's deadline (the lease lapses at its expiry), or
//     ErrDrainTimeout (above), joined with fn's error if any;
//   - an error wrapping ErrInvalid when fn is nil, or when another Run or
//     RunSchedule is active on this handle: one campaign per handle.
//
// Run does not log the error it returns (EventStopped carries it to the
// observer, and the log has it at Debug level): the caller decides what to
// do with it.
//
// If fn panics, Run ends the tenure (the leader context's cause then wraps
// ErrLost; EventLost with LossPanic), resigns, and panics again with a
// *PanicError holding the value and fn's stack. If fn calls runtime.Goexit
// (t.FailNow or require in a test), Run ends the tenure and resigns the
// same way, and the goroutine goes on unwinding: Run does not return. It
// never returns while fn runs and leaves no goroutine behind.
func (l *Lease) Run(ctx context.Context, fn func(ctx context.Context, fence int64) error) (err error) {
	if fn == nil {
		return invalid("Run: fn is nil")
	}
	return l.campaign(ctx, func(ctx context.Context, t *term) error { return fn(ctx, t.fence) })
}

// campaign is Run, handing fn the term itself.
//
// campaign, lead and leading.call stay on the stack of Run's goroutine for
// as long as fn runs, a whole tenure: they keep their frames small (events
// and errors are built in the functions they call), so that the stack of a
// goroutine parked in fn can shrink to the runtime's smaller sizes.
func (l *Lease) campaign(ctx context.Context, fn func(ctx context.Context, t *term) error) (err error) {
	base := ctx // the slot keeps its address
	if err := l.camp.enter(l, &base); err != nil {
		return err
	}
	stopped := false
	defer func() { l.camp.leave(l, stopped, err) }()
	for {
		t, failing, err := l.acquire(ctx)
		if err != nil {
			stopped = true
			if ctx.Err() != nil && !failing {
				return nil
			}
			return err
		}
		done, err := t.lead(ctx, fn)
		if done {
			stopped = true
			return err
		}
	}
}

// lead runs fn for this tenure. done is false when the tenure ended without
// a shutdown or an error, and the campaign should go on.
func (t *term) lead(ctx context.Context, fn func(context.Context, *term) error) (done bool, err error) {
	if !t.holds() {
		return ctx.Err() != nil, nil // over before it began
	}
	if ctx.Err() != nil {
		// Run's ctx ended before fn began.
		return true, t.resignRetrying(ctx, fmt.Errorf("%w: %q fence %d: shutting down", ErrLost, t.l.job, t.fence))
	}
	ld := t.startLeading(ctx)
	defer ld.cancelLeader(nil)
	ld.call(ctx, fn)
	return ld.end(ctx)
}

// leading is a tenure while its fn runs: the leader context, the drain and
// the keeper, and how fn ended.
type leading struct {
	drainWatch
	leaderCtx context.Context
	stopWatch func() bool // stops the watch on Run's ctx
	fnErr     error
	panicked  *PanicError
	// over: the leader context had ended when fn returned, or Run's own
	// ctx had (the watcher may not have cancelled the leader context yet:
	// an fn that stops on ctx, captured from the caller, races it), so
	// that what fn returned is the tenure's end, not fn's own outcome.
	// returned: fn returned at all (false after a panic or
	// runtime.Goexit).
	over, returned bool
	drainErr       error
}

// startLeading makes the leader context and starts the keeper and the
// watches that drain the tenure.
func (t *term) startLeading(ctx context.Context) *leading {
	ld := &leading{}
	ld.leaderCtx, ld.cancelLeader = t.derive()
	w := &ld.drainWatch
	w.t = t
	w.k = newKeeper(t, func() bool { return ctx.Err() != nil || ld.leaderCtx.Err() != nil })
	t.l.mu.Lock()
	t.onResign = w // an operator's resign request, drained as a shutdown
	t.l.mu.Unlock()
	t.live.keep(w.k)
	ld.stopWatch = context.AfterFunc(ctx, func() {
		w.start(fmt.Errorf("ddblease: shutting down: %w", context.Cause(ctx)))
	})
	return ld
}

// call runs fn on the leader context and records how it ended.
func (ld *leading) call(ctx context.Context, fn func(context.Context, *term) error) {
	defer ld.fnEnded(ctx)
	ld.fnErr = soundError(fn(ld.leaderCtx, ld.t))
	ld.over = ld.leaderCtx.Err() != nil || ctx.Err() != nil
	ld.returned = true
}

// fnEnded runs as fn's call ends, however it ends: it recovers a panic (for
// end to raise again), stops the watches and the keeper, and ends the
// tenure of an fn that called runtime.Goexit, whose unwinding goes on.
func (ld *leading) fnEnded(ctx context.Context) {
	p := recover()
	if p != nil {
		if pe, ok := p.(*PanicError); ok {
			ld.panicked = pe // from RunSchedule's runner, which recorded the run
		} else {
			ld.panicked = &PanicError{Value: p, Stack: debug.Stack()}
		}
	}
	t := ld.t
	ld.stopWatch()
	drainExpired := ld.finish()
	ld.k.stop()
	if drainExpired {
		ld.drainErr = fmt.Errorf("%w: fence %d ran past %v", ErrDrainTimeout, t.fence, t.l.opts.DrainTimeout)
	}
	if p == nil && !ld.returned {
		// runtime.Goexit (t.FailNow, say) unwinds this goroutine past
		// Run: end the tenure as after a panic, and let the unwinding go
		// on.
		t.endAbnormally(ctx, fmt.Errorf("%w: %q fence %d: the leader's function exited without returning (runtime.Goexit)",
			ErrLost, t.l.job, t.fence))
	}
}

// end settles the tenure once fn has returned (or panicked: it panics
// again): it resigns unless the tenure is over, and tells the campaign
// whether to go on.
func (ld *leading) end(ctx context.Context) (done bool, err error) {
	t := ld.t
	l, fence := t.l, t.fence
	if ld.panicked != nil {
		t.endAbnormally(ctx, fmt.Errorf("%w: %q fence %d: the leader's function panicked: %v", ErrLost, l.job, fence, ld.panicked.Value))
		panic(ld.panicked)
	}
	fnErr := ld.fnErr
	if ld.over && endsWith(fnErr, ld.leaderCtx, ctx) {
		fnErr = nil // the leader context's own end, handed back
	}
	var resignErr error
	if t.holds() {
		resignErr = t.resignRetrying(ctx, fmt.Errorf("%w: %q fence %d: resigning", ErrLost, l.job, fence))
	}
	if ld.over && ctx.Err() == nil {
		// The tenure ended under fn (lost, Resign called, an operator's
		// resign request or forced release): whatever fn returned then is
		// the tenure's end, not a failure that stops the campaign. After an
		// operator's request, campaign on leaving the lease to the other
		// replicas for a while (resign.go).
		if fnErr != nil {
			l.log().Warn("ddblease: the leader's function returned an error after its tenure ended; campaigning again",
				"fence", fence, "err", fnErr, "cause", context.Cause(ld.leaderCtx))
		}
		t.yieldToOthers(errors.Join(resignErr, ld.drainErr))
		return false, nil
	}
	return true, errors.Join(fnErr, resignErr, ld.drainErr)
}

// endsWith reports whether err, returned by a function whose leader
// context leaderCtx had ended, only hands that end back: it is or wraps
// context.Canceled, context.DeadlineExceeded or the leader context's cause
// (context.Cause), or, when Run's own ctx ended, ctx's cause.
func endsWith(err error, leaderCtx, ctx context.Context) bool {
	switch {
	case err == nil, errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, context.Cause(leaderCtx)):
		return true
	}
	return ctx.Err() != nil && errors.Is(err, context.Cause(ctx))
}

// endAbnormally ends the tenure with fence, whose function did not return (it
// panicked or called runtime.Goexit), and resigns it at once: there is
// nothing left to drain.
func (t *term) endAbnormally(ctx context.Context, cause error) {
	l := t.l
	t.end(cause, LossPanic)
	l.writes.lock(&l.notify)
	defer l.writes.unlock(&l.notify)
	if err := t.resign(context.WithoutCancel(ctx)); err != nil && !errors.Is(err, ErrLost) {
		l.log().Warn("ddblease: could not resign after the leader's function ended abnormally; the lease lapses at its expiry",
			"fence", t.fence, "err", err)
	}
}
