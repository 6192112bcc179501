package ddblease

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// This file owns the end of a tenure by its holder: the drain (drainWatch:
// fn's leader context ended, fn given DrainTimeout to return), the
// resignation that hands the lease over in one write (term.resign, and
// term.resignRetrying where a hand-over must not be lost), Resign,
// ResignOnSignal for SIGTERM, and the yield to the others after an
// operator's resign request (term.yieldToOthers).

// Resign gives the lease up with a write conditional on this owner, fence
// and renewal version that sets its expiry to zero, so that a polling
// standby takes over at once. The item keeps its fence: the next holder's
// is one higher. The tenure ends before the write is sent, whatever its
// outcome: IsLeader is false and the leader context of a Run on this
// handle is cancelled (its cause wraps ErrLost) before a standby can lead.
// ErrLost means another owner had already taken over, ErrNotLeader that
// this handle had no tenure. Any other error leaves the lease to expire by
// itself.
//
// Called while Run or RunSchedule leads on this handle, Resign hands the
// lease over: Run's function sees its context end, and Run goes on
// campaigning, leaving the free lease to the standbys for two
// RetryIntervals from the moment it is free before it tries again. To
// stop Run, cancel its context instead: it drains the function before it
// resigns.
func (l *Lease) Resign(ctx context.Context) error {
	t := l.current()
	if t == nil || !t.holds() {
		return ErrNotLeader
	}
	// Stop believing before the write can land: a standby may lead the
	// moment it does, before its answer reaches us.
	var reason LossReason
	campaigns := l.camp.active.Load()
	if campaigns {
		// Run leads: to it, this is a loss; it campaigns again after a
		// pause that leaves the lease to the standbys.
		reason = LossResignedElsewhere
		l.yield.open(2 * l.opts.RetryInterval)
	}
	cause := fmt.Errorf("%w: %q fence %d: resigned by a call to Resign", ErrLost, l.job, t.fence)
	t.end(cause, reason)
	l.writes.lock(&l.notify)
	defer l.writes.unlock(&l.notify)
	err := t.resign(ctx)
	if campaigns {
		// The pause runs from the moment the lease is free: a slow
		// write must not use it up.
		l.yield.open(2 * l.opts.RetryInterval)
	}
	return err
}

func (t *term) resign(ctx context.Context) error {
	l := t.l
	done, err := l.bound.attempt(ctx) // a pool's replica hands its jobs over a few at a time
	if err != nil {
		return err
	}
	defer done()
	rv := randomID(8)
	u := newLeaseUpdate()
	u.released(l.opts.Now(), rv)
	t.live.freeing(u)
	err = t.fencedWrite(ctx, l.opts.CallTimeout, time.Time{}, u, rv)
	var moved *movedOnError
	if errors.As(err, &moved) && moved.inDoubt {
		// The answer was lost and the lease has a newer holder: either our
		// resignation landed and a standby took over, or the lease expired
		// first. Either way it is given up.
		return nil
	}
	return err
}

// resignRetrying ends the tenure with this fence and resigns it, retrying
// transient failures every RetryInterval while the lease may still be in
// force (until the tenure's deadline). It returns nil when the lease was
// given up or another owner already held it, and an error wrapping
// ErrNotResigned otherwise. The context's cancellation is ignored.
func (t *term) resignRetrying(ctx context.Context, cause error) error {
	l, fence := t.l, t.fence
	ctx = context.WithoutCancel(ctx)
	sn := t.snapshot()
	if !sn.held {
		return nil
	}
	t.end(cause, "")
	// The lock is taken for each attempt, not across the waits between
	// them, so that the events of each are delivered as it ends.
	// It is retried while the lifetime the tenure led by lasts: a lease of
	// its own until the tenure's deadline (its item may be taken once its
	// expiry passes); a pool's job while its session lives (no other
	// replica may take it meanwhile), not only until the deadline the
	// session had when the resignation began.
	life := t.live.life()
	r := retrier{backoff: fixed(l.opts.RetryInterval),
		again:   func(err error) bool { return retryable(err) && life.left() > 0 },
		onRetry: func(err error) { l.notify.emit(l.event(EventRetry, Event{Op: "resign", Fence: fence, Err: err})) },
	}
	_, _, err := r.do(ctx, func(ctx context.Context) error {
		l.writes.lock(&l.notify)
		defer l.writes.unlock(&l.notify)
		return t.resign(ctx)
	})
	if err == nil || errors.Is(err, ErrLost) {
		return nil
	}
	err = fmt.Errorf("%w: %q fence %d: %w", ErrNotResigned, l.job, fence, err)
	l.log().Warn("ddblease: could not resign; the lease lapses at its expiry", "fence", fence, "err", err)
	return err
}

// ResignOnSignal resigns the lease when one of sigs arrives (SIGTERM and
// os.Interrupt when none are given), and does not exit the process: the
// program's own shutdown goes on. It suits code that drives TryAcquire and
// Heartbeat itself. With Run, prefer signal.NotifyContext: cancelling Run's
// context drains the leader's function before resigning.
//
// It handles one signal: from the moment it arrives, the signals are no
// longer caught here, so a second one has its default effect (a second
// Ctrl-C ends the process) unless the program catches it elsewhere.
//
// The returned stop function unregisters the handler, waits for a
// resignation in progress and returns its error (nil if no signal came or
// this handle held no lease). It is safe to call more than once.
func (l *Lease) ResignOnSignal(sigs ...os.Signal) (stop func() error) {
	if len(sigs) == 0 {
		sigs = []os.Signal{syscall.SIGTERM, os.Interrupt}
	}
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sigs...)
	quit := make(chan struct{})
	done := make(chan struct{})
	var err error
	go func() {
		defer close(done)
		select {
		case <-ch:
			signal.Stop(ch)
			if e := l.Resign(context.Background()); e != nil && !errors.Is(e, ErrNotLeader) {
				err = e
			}
		case <-quit:
		}
	}()
	var once sync.Once
	return func() error {
		once.Do(func() {
			signal.Stop(ch)
			close(quit)
		})
		<-done
		return err
	}
}

// resignRequested is the tenure's call (term.onResign) when an operator
// asked it to resign: it is drained as for a shutdown.
func (w *drainWatch) resignRequested() {
	w.start(fmt.Errorf("%w: fence %d", ErrResignRequested, w.t.fence))
}

// drainWatch drains a tenure when Run's context ends or an operator asks
// it to resign: it cancels the leader context at once, marks the lease
// draining if fn is still running a RetryInterval later (a standby polls
// that often: a function that returns sooner is handed over by the
// resignation alone, one write), and stops renewing once DrainTimeout has
// passed. It holds no goroutine: its parts run on timers and
// context.AfterFunc.
type drainWatch struct {
	t            *term
	k            *keeper
	cancelLeader context.CancelCauseFunc

	mu            sync.Mutex
	done, started bool
	expired       bool // DrainTimeout passed before fn returned
	mark, timeout *time.Timer
	running       sync.WaitGroup // the timers' functions under way, which finish waits for
}

// fire returns a timer's function that runs f unless fn has returned, and
// that finish waits for.
func (w *drainWatch) fire(f func()) func() {
	return func() {
		w.mu.Lock()
		if w.done {
			w.mu.Unlock()
			return
		}
		w.running.Add(1)
		w.mu.Unlock()
		defer w.running.Done()
		f()
	}
}

// start begins the drain, once, unless fn has returned or the tenure has
// ended.
func (w *drainWatch) start(cause error) {
	l, fence := w.t.l, w.t.fence
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done || w.started || !w.t.holds() {
		return
	}
	w.started = true
	w.cancelLeader(cause)
	l.notify.emit(l.event(EventDraining, Event{Fence: fence}))
	w.mark = time.AfterFunc(l.opts.RetryInterval, w.fire(func() { w.t.live.drain(w.k) }))
	w.timeout = time.AfterFunc(l.opts.DrainTimeout, w.fire(func() {
		w.mu.Lock()
		w.expired = true
		w.mu.Unlock()
		l.log().Warn("ddblease: leader function still running after DrainTimeout; no longer renewing", "fence", fence)
		w.k.stop()
		w.t.live.drainExpired(w.t)
	}))
}

// finish is called once fn has returned: no drain starts after it, and a
// timer's function under way has ended when it returns. It reports whether
// DrainTimeout had passed.
func (w *drainWatch) finish() (expired bool) {
	w.mu.Lock()
	w.done = true
	if w.started {
		w.mark.Stop()
		w.timeout.Stop()
	}
	w.mu.Unlock()
	w.running.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.expired
}

// yieldToOthers applies the hand-over rule after an operator ended this
// replica's tenure, by a resign request or a forced release (as
// the lease item last seen shows): Acquire leaves a free lease to the other
// replicas for one LeaseDuration, so that the lease goes to another replica
// instead of straight back to the one asked to let go; a lone replica takes
// it back after that. err, the resignation's own failure if any, is logged.
func (t *term) yieldToOthers(err error) {
	l, fence := t.l, t.fence
	l.mu.Lock()
	c, present := l.obs.rec.control(), l.obs.present
	l.mu.Unlock()
	if present && (c.ResignFence == fence || c.ReleasedFence == fence) {
		l.yield.open(l.opts.LeaseDuration)
		l.log().Info("ddblease: handing the lease over on an operator's request; leaving it to the other replicas for a lease duration",
			"fence", fence, "err", err)
	}
}
