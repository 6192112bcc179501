package ddblease

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Run campaigns for the lease and, each time it is acquired, calls fn with a
// leader context and the tenure's fence, while a background heartbeat keeps
// the lease alive.
//
// The leader context is cancelled the moment leadership is lost: a heartbeat
// finds another owner or fence, or the local deadline passes without a
// successful heartbeat; its cause (context.Cause) then wraps ErrLost. Run
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
// Run returns nil after such a shutdown, or when fn returns nil on its own
// (it then resigns). It returns fn's error, other than the context's own,
// after resigning, and any error that stops the campaign (a missing table,
// say). A resignation that keeps failing is retried until the lease's
// deadline and then reported with an error wrapping ErrNotResigned: the
// lease lapses at its expiry. It never returns while fn runs and leaves no
// goroutine behind.
func (l *Lease) Run(ctx context.Context, fn func(ctx context.Context, fence int64) error) error {
	if fn == nil {
		return invalid("Run: fn is nil")
	}
	for {
		fence, err := l.Acquire(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if ctx.Err() != nil {
			return l.resignRetrying(ctx)
		}
		done, err := l.lead(ctx, fence, fn)
		if done {
			return err
		}
	}
}

// lead runs fn for one tenure. done is false when the lease was lost and the
// campaign should go on.
func (l *Lease) lead(ctx context.Context, fence int64, fn func(context.Context, int64) error) (done bool, err error) {
	leaderCtx, cancelLeader := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelLeader(nil)
	k := l.startKeeper(fence, cancelLeader)
	fnDone := make(chan struct{})
	watchDone := make(chan struct{})
	var drainExpired atomic.Bool
	go func() {
		defer close(watchDone)
		select {
		case <-fnDone:
			return
		case <-leaderCtx.Done():
			return
		case <-ctx.Done():
			cancelLeader(fmt.Errorf("ddblease: shutting down: %w", context.Cause(ctx)))
		case <-k.resign: // an operator's resign request (control.go): drain as on shutdown
			cancelLeader(fmt.Errorf("%w: fence %d", ErrResignRequested, fence))
		}
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
	func() {
		defer func() {
			close(fnDone)
			<-watchDone
			k.stop()
		}()
		fnErr = fn(leaderCtx, fence)
	}()

	cause := context.Cause(leaderCtx)
	if leaderCtx.Err() != nil && (errors.Is(fnErr, context.Canceled) || errors.Is(fnErr, context.DeadlineExceeded)) {
		fnErr = nil
	}
	var resignErr, drainErr error
	if l.holds(fence) {
		resignErr = l.resignRetrying(ctx)
	}
	if drainExpired.Load() {
		drainErr = fmt.Errorf("%w: fence %d ran past %v", ErrDrainTimeout, fence, l.opts.DrainTimeout)
	}
	if ctx.Err() == nil && errors.Is(cause, ErrLost) && fnErr == nil {
		l.log.Warn("ddblease: leadership lost; campaigning again", "fence", fence, "cause", cause)
		l.yieldAfter(ctx, fence) // released by force: let another replica lead (control.go)
		return false, nil
	}
	if ctx.Err() == nil && errors.Is(cause, ErrResignRequested) && fnErr == nil {
		if err := errors.Join(resignErr, drainErr); err != nil {
			l.log.Warn("ddblease: resignation on request incomplete", "fence", fence, "err", err)
		}
		l.yieldAfter(ctx, fence) // let another replica lead (control.go)
		return false, nil
	}
	return true, errors.Join(fnErr, resignErr, drainErr)
}
