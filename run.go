package ddblease

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"
)

// Run campaigns for the lease and, each time it is acquired, calls fn with a
// leader context and the tenure's fence, while a background heartbeat keeps
// the lease alive.
//
// The leader context is cancelled the moment leadership is lost, and
// IsLeader turns false at the same moment: a heartbeat finds another owner
// or fence, the local deadline passes without a confirmed heartbeat
// (whatever requests are in flight: a timer ends the tenure), or Resign is
// called on this handle. Its cause (context.Cause) then wraps ErrLost. Run
// waits for fn to return, and campaigns again.
//
// When ctx ends (a SIGTERM through signal.NotifyContext, say), Run cancels
// the leader context, marks the lease as draining so that standbys poll
// fast, keeps renewing the lease while fn returns, and resigns the moment it
// has: a standby takes over within its fast poll. If fn is still running
// DrainTimeout after ctx ended, Run stops renewing, so the lease lapses at
// its expiry and a standby may take over while fn still runs (its side
// effects stay fenced); Run still waits for fn, and then returns an error
// wrapping ErrDrainTimeout.
//
// What Run returns:
//   - nil after a clean shutdown: ctx ended, and fn (if it ran) returned
//     and the lease was resigned, or a standby's last look at the lease
//     succeeded; and nil when fn returns nil on its own (Run then resigns);
//   - fn's error, other than the leader context's own, after resigning;
//   - an error wrapping ctx.Err() and its cause, joined with the last
//     error, when ctx ended while every attempt since the last tenure had
//     failed (an unreachable endpoint, say), and when ctx had already ended
//     when Run was called;
//   - at once, an error that retrying cannot mend: a missing table, a wrong
//     key schema, denied access, bad credentials, a malformed lease item —
//     naming the table;
//   - an error wrapping ErrNotResigned when a resignation kept failing until
//     the lease's deadline (the lease lapses at its expiry), or
//     ErrDrainTimeout (above), joined with fn's error if any;
//   - an error wrapping ErrInvalid when fn is nil, or when another Run or
//     RunSchedule is active on this handle: one campaign per handle.
//
// If fn panics, Run ends the tenure (the leader context's cause then wraps
// ErrLost), resigns, and panics again with a *PanicError holding the value
// and fn's stack. It never returns while fn runs and leaves no goroutine
// behind.
func (l *Lease) Run(ctx context.Context, fn func(ctx context.Context, fence int64) error) (err error) {
	if fn == nil {
		return invalid("Run: fn is nil")
	}
	if !l.campaigning.CompareAndSwap(false, true) {
		return invalid("Run %q: another Run or RunSchedule is active on this handle; use one Lease per contender", l.job)
	}
	defer l.campaigning.Store(false)
	l.runCtx.Store(&ctx)
	defer l.runCtx.Store(nil)
	if ctx.Err() != nil {
		return fmt.Errorf("ddblease: run %q: %w", l.job, ended(ctx))
	}
	l.notify.emit(l.event(EventCampaign, Event{}))
	stopped := false
	defer func() {
		if stopped {
			l.notify.emit(l.event(EventStopped, Event{Err: err}))
		}
	}()
	for {
		fence, failing, err := l.acquire(ctx)
		if err != nil {
			stopped = true
			if ctx.Err() != nil && !failing {
				return nil
			}
			return err
		}
		done, err := l.lead(ctx, fence, fn)
		if done {
			stopped = true
			return err
		}
	}
}

// lead runs fn for one tenure. done is false when the tenure ended without
// a shutdown or an error, and the campaign should go on.
func (l *Lease) lead(ctx context.Context, fence int64, fn func(context.Context, int64) error) (done bool, err error) {
	termCtx, ok := l.termContext(fence)
	if !ok {
		return ctx.Err() != nil, nil // over before it began
	}
	if ctx.Err() != nil {
		return true, l.resignRetrying(ctx, fence, fmt.Errorf("%w: %q fence %d: shutting down", ErrLost, l.job, fence))
	}
	leaderCtx, cancelLeader := context.WithCancelCause(termCtx)
	defer cancelLeader(nil)
	k := l.startKeeper(fence, termCtx)
	fnDone := make(chan struct{})
	watchDone := make(chan struct{})
	var drainExpired atomic.Bool
	go func() {
		defer close(watchDone)
		select {
		case <-fnDone:
			return
		case <-termCtx.Done():
			return
		case <-ctx.Done():
			cancelLeader(fmt.Errorf("ddblease: shutting down: %w", context.Cause(ctx)))
		case <-k.resign: // control.go: an operator's resign request, drained as a shutdown
			cancelLeader(fmt.Errorf("%w: fence %d", ErrResignRequested, fence))
		}
		l.notify.emit(l.event(EventDraining, Event{Fence: fence}))
		k.drain()
		t := time.NewTimer(l.opts.DrainTimeout)
		defer t.Stop()
		select {
		case <-fnDone:
		case <-t.C:
			drainExpired.Store(true)
			l.log.Warn("ddblease: leader function still running after DrainTimeout; no longer renewing", "fence", fence)
			k.stop()
		}
	}()
	var fnErr error
	var panicked *PanicError
	func() {
		defer func() {
			if p := recover(); p != nil {
				if pe, ok := p.(*PanicError); ok {
					panicked = pe // from RunSchedule's runner, which recorded the run
				} else {
					panicked = &PanicError{Value: p, Stack: debug.Stack()}
				}
			}
			close(fnDone)
			<-watchDone
			k.stop()
		}()
		fnErr = soundError(fn(leaderCtx, fence))
	}()

	if panicked != nil {
		l.end(fence, fmt.Errorf("%w: %q fence %d: the leader's function panicked: %v", ErrLost, l.job, fence, panicked.Value), LossPanic)
		l.writeMu.Lock()
		if err := l.resignLocked(context.WithoutCancel(ctx), tenure{held: true, fence: fence}); err != nil && !errors.Is(err, ErrLost) {
			l.log.Warn("ddblease: could not resign after a panic; the lease lapses at its expiry", "fence", fence, "err", err)
		}
		l.writeMu.Unlock()
		panic(panicked)
	}
	lost := termCtx.Err() != nil
	if leaderCtx.Err() != nil && (errors.Is(fnErr, context.Canceled) || errors.Is(fnErr, context.DeadlineExceeded)) {
		fnErr = nil
	}
	var resignErr, drainErr error
	if !lost {
		resignErr = l.resignRetrying(ctx, fence, fmt.Errorf("%w: %q fence %d: resigning", ErrLost, l.job, fence))
	}
	if drainExpired.Load() {
		drainErr = fmt.Errorf("%w: fence %d ran past %v", ErrDrainTimeout, fence, l.opts.DrainTimeout)
	}
	// control.go: after an operator's resign request (the term was given
	// up, not lost) or forced release, campaign on, leaving the lease to
	// the other replicas for a while.
	asked := errors.Is(context.Cause(leaderCtx), ErrResignRequested)
	if ctx.Err() == nil && (lost || asked) && fnErr == nil {
		l.yieldToOthers(fence, errors.Join(resignErr, drainErr))
		return false, nil
	}
	return true, errors.Join(fnErr, resignErr, drainErr)
}
