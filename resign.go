package ddblease

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Resign gives the lease up with a write conditional on this owner, fence
// and renewal version that sets its expiry to zero, so that a polling
// standby takes over at once. The item keeps its fence: the next holder's
// is one higher. The tenure ends before the write is sent, whatever its
// outcome; ErrLost means another owner had already taken over, ErrNotLeader
// that this handle had no tenure. Any other error leaves the lease to
// expire by itself.
func (l *Lease) Resign(ctx context.Context) error {
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	t := l.current()
	if !t.held {
		return ErrNotLeader
	}
	// Stop believing before the write can land: a standby may lead the
	// moment it does, before its answer reaches us.
	l.end(t.fence)
	return l.resignLocked(ctx, t)
}

func (l *Lease) resignLocked(ctx context.Context, t tenure) error {
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
	return l.fencedWrite(ctx, l.opts.CallTimeout, t, "SET #exp = :zero, #rv = :rv, #ren = :now, #drn = :false", names, values, rv)
}

// resignRetrying resigns the current tenure, retrying transient failures
// every RetryInterval while the lease may still be in force (until the
// tenure's deadline). It returns nil when the lease was given up or another
// owner already held it, and an error wrapping ErrNotResigned otherwise.
// The context's cancellation is ignored.
func (l *Lease) resignRetrying(ctx context.Context) error {
	ctx = context.WithoutCancel(ctx)
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	t := l.current()
	if !t.held {
		return nil
	}
	l.end(t.fence)
	for {
		err := l.resignLocked(ctx, t)
		switch {
		case err == nil, errors.Is(err, ErrLost):
			return nil
		case !transient(err) || !l.opts.Now().Add(l.opts.RetryInterval).Before(t.deadline):
			return fmt.Errorf("%w: %q fence %d: %w", ErrNotResigned, l.job, t.fence, err)
		}
		l.log.Warn("ddblease: resign failed; retrying", "fence", t.fence, "err", err)
		_ = sleep(ctx, l.opts.RetryInterval)
	}
}

// ResignOnSignal resigns the lease when one of sigs arrives (SIGTERM and
// os.Interrupt when none are given), and does not exit the process: the
// program's own shutdown goes on. It suits code that drives TryAcquire and
// Heartbeat itself. With Run, prefer signal.NotifyContext: cancelling Run's
// context drains the leader's function before resigning.
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
