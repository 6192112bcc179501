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

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

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
// RetryIntervals before it tries again. To stop Run, cancel its context
// instead: it drains the function before it resigns.
func (l *Lease) Resign(ctx context.Context) error {
	t := l.current()
	if t == nil || !t.holds() {
		return ErrNotLeader
	}
	// Stop believing before the write can land: a standby may lead the
	// moment it does, before its answer reaches us.
	var reason LossReason
	l.mu.Lock()
	if l.campaigning.Load() {
		// Run leads: to it, this is a loss; it campaigns again after a
		// pause that leaves the lease to the standbys.
		reason = LossResignedElsewhere
		l.yieldUntil = l.opts.Now().Add(2 * l.opts.RetryInterval)
	}
	l.mu.Unlock()
	cause := fmt.Errorf("%w: %q fence %d: resigned by a call to Resign", ErrLost, l.job, t.fence)
	if reason != "" {
		t.end(cause, reason)
	} else {
		t.endResigning(cause)
	}
	l.writes.lock()
	defer l.writes.unlock()
	return t.resign(ctx)
}

func (t *term) resign(ctx context.Context) error {
	l := t.l
	now := l.opts.Now()
	rv := randomID(8)
	names := map[string]string{
		"#owner": attrOwner, "#fence": attrFence, "#exp": attrExpires, "#rv": attrVersion,
		"#ren": attrRenewedAt, "#drn": attrDraining,
	}
	values := map[string]types.AttributeValue{
		":me":    avS(l.opts.Owner),
		":fence": avN(t.fence),
		":zero":  avN(0),
		":rv":    avS(rv),
		":now":   avN(now.UnixMilli()),
		":false": avBool(false),
	}
	err := t.fencedWrite(ctx, l.opts.CallTimeout, time.Time{}, "SET #exp = :zero, #rv = :rv, #ren = :now, #drn = :false", names, values, rv)
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
func (tm *term) resignRetrying(ctx context.Context, cause error) error {
	l, fence := tm.l, tm.fence
	ctx = context.WithoutCancel(ctx)
	t := tm.snapshot()
	if !t.held {
		return nil
	}
	tm.endResigning(cause)
	// The lock is taken for each attempt, not across the waits between
	// them, so that the events of each are delivered as it ends.
	_, _, err := retrier{backoff: fixed(l.opts.RetryInterval), now: l.opts.Now, deadline: t.deadline,
		onRetry: func(err error) { l.notify.emit(l.event(EventRetry, Event{Op: "resign", Fence: fence, Err: err})) },
	}.do(ctx, func(ctx context.Context) error {
		l.writes.lock()
		defer l.writes.unlock()
		return tm.resign(ctx)
	})
	if err == nil || errors.Is(err, ErrLost) {
		return nil
	}
	err = fmt.Errorf("%w: %q fence %d: %w", ErrNotResigned, l.job, fence, err)
	l.log.Warn("ddblease: could not resign; the lease lapses at its expiry", "fence", fence, "err", err)
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
