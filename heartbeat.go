package ddblease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Heartbeat renews the lease with a write conditional on this owner and
// fence, so a stale leader cannot extend it. It returns ErrLost, and the
// tenure ends, once the item names another owner or fence, or the local
// deadline passed before the renewal was confirmed (a late confirmation
// never revives a tenure); ErrNotLeader when this handle has no tenure.
// Other errors (throttling, timeouts) leave the tenure open until its
// deadline: call again.
func (l *Lease) Heartbeat(ctx context.Context) error {
	l.writes.lock()
	defer l.writes.unlock()
	t := l.current()
	if t == nil {
		return fmt.Errorf("%w: heartbeat %q", ErrNotLeader, l.job)
	}
	return t.renew(ctx)
}

// renew is Heartbeat for this term, called with the write lock held.
func (tm *term) renew(ctx context.Context) error {
	l := tm.l
	t := tm.snapshot()
	if !t.held {
		if t.lost != nil {
			return t.lost
		}
		return fmt.Errorf("%w: heartbeat %q", ErrNotLeader, l.job)
	}
	snt := l.opts.sendNow()
	now := snt.at
	if !now.Before(t.deadline) {
		err := fmt.Errorf("%w: %q fence %d: local deadline passed without a confirmed heartbeat", ErrLost, l.job, t.fence)
		tm.end(err, LossDeadline)
		return err
	}
	rv := randomID(8)
	update := "SET #exp = :exp, #rv = :rv, #lms = :lms, #ren = :now, #drn = :drn"
	names := map[string]string{
		"#owner": attrOwner, "#fence": attrFence, "#exp": attrExpires, "#rv": attrVersion,
		"#lms": attrLeaseMs, "#ren": attrRenewedAt, "#drn": attrDraining,
	}
	values := map[string]types.AttributeValue{
		":me":    avS(l.opts.Owner),
		":fence": avN(t.fence),
		":exp":   avN(now.Add(l.opts.LeaseDuration).UnixMilli()),
		":rv":    avS(rv),
		":lms":   avN(l.opts.LeaseDuration.Milliseconds()),
		":now":   avN(now.UnixMilli()),
		":drn":   avBool(t.draining),
	}
	// The write and its read-back end at the deadline: past it, nothing
	// they learn could keep the tenure.
	if err := tm.fencedWrite(ctx, l.opts.CallTimeout, t.deadline, update, names, values, rv); err != nil {
		return err
	}
	if !tm.renewed(rv, snt, l.opts.Now().Sub(now)) {
		return fmt.Errorf("%w: %q fence %d: the heartbeat was confirmed only after the local deadline", ErrLost, l.job, t.fence)
	}
	return nil
}

// fencedWrite applies an update to the lease item on condition that it
// still names this owner and the tenure's fence, and carries a renewal
// version this handle wrote. It returns ErrLost (and ends the tenure) when
// the condition fails, and the error when the outcome stays unknown. The
// write and its read-back end by until (zero: CallTimeout each).
func (t *term) fencedWrite(ctx context.Context, timeout time.Duration, until time.Time, update string,
	names map[string]string, values map[string]types.AttributeValue, rv string) error {
	l := t.l
	cond := "#owner = :me AND #fence = :fence"
	if mine := l.mineIn(values); mine != "" {
		cond += " AND " + mine
	}
	in := &dynamodb.UpdateItemInput{
		TableName:                           aws.String(l.table),
		Key:                                 l.key,
		UpdateExpression:                    aws.String(update),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            names,
		ExpressionAttributeValues:           values,
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
	rec, ours, err := l.write(ctx, timeout, until, in, rv)
	switch {
	case ours:
		return nil
	case err != nil && (rec == Record{} || rec.Owner == l.opts.Owner && rec.Fence == t.fence):
		// Unknown outcome, and the item does not tell us we lost.
		return fmt.Errorf("ddblease: write lease %q: %w", l.job, explainTableError(ctx, l.db, l.table, err))
	}
	var lost error
	switch {
	case rec == (Record{}):
		lost = fmt.Errorf("%w: %q fence %d: the lease item is gone", ErrLost, l.job, t.fence)
	case rec.Owner == l.opts.Owner && rec.Fence == t.fence:
		lost = fmt.Errorf("%w: %q fence %d: the item carries a renewal version this handle no longer tracks", ErrLost, l.job, t.fence)
	default:
		lost = &movedOnError{err: movedOn(l.job, t.fence, rec), inDoubt: err != nil}
	}
	t.end(lost, LossDeposed)
	return lost
}

// keeper renews a tenure in the background until it is stopped or the
// tenure ends. It does not decide when the tenure ends: the term's own
// timer does, and a keeper stuck in a request cannot hold that up.
type keeper struct {
	t         *term
	cancel    context.CancelFunc
	done      chan struct{}
	drainc    chan struct{}
	drainOnce sync.Once
	// resign is closed when a heartbeat returns an item that asks this
	// tenure to resign (control.go).
	resign     chan struct{}
	resignOnce sync.Once
}

func (t *term) keep() *keeper {
	ctx, cancel := context.WithCancel(context.Background())
	k := &keeper{t: t, cancel: cancel, done: make(chan struct{}), drainc: make(chan struct{}),
		resign: make(chan struct{})}
	go k.loop(ctx)
	return k
}

// stop ends the keeper and waits for its goroutine. It is idempotent.
func (k *keeper) stop() {
	k.cancel()
	<-k.done
}

// drain asks the keeper to mark the lease as draining at once, so that
// standbys poll fast until the resignation.
func (k *keeper) drain() { k.drainOnce.Do(func() { close(k.drainc) }) }

func (k *keeper) loop(ctx context.Context) {
	defer close(k.done)
	t, l := k.t, k.t.l
	drainc := k.drainc
	next := t.snapshot().sentAt.Add(l.opts.HeartbeatInterval)
	// Back off, from RetryInterval up to half the heartbeat interval, so
	// that an overloaded server is not made worse.
	bo := &backoff{base: l.opts.RetryInterval, max: l.opts.HeartbeatInterval / 2}
	for {
		if !t.holds() {
			return
		}
		timer := time.NewTimer(max(next.Sub(l.opts.Now()), 0))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-t.ctx.Done():
			timer.Stop()
			return
		case <-drainc:
			timer.Stop()
			drainc = nil
			t.setDraining()
		case <-timer.C:
			if l.opts.Now().Before(next) {
				continue
			}
		}
		// A heartbeat in flight is not abandoned when the keeper stops: it
		// completes (bounded by CallTimeout and the deadline), so that the
		// resignation that usually follows finds its outcome known.
		l.writes.lock()
		err := t.renew(context.WithoutCancel(ctx))
		l.writes.unlock()
		switch {
		case err == nil:
			next = t.snapshot().sentAt.Add(l.opts.HeartbeatInterval)
			bo.reset()
			k.noticeControl() // control.go: resign requests, operator controls
		case ctx.Err() != nil, errors.Is(err, ErrLost), errors.Is(err, ErrNotLeader):
			return
		default:
			l.notify.emit(l.event(EventRetry, Event{Op: "heartbeat", Fence: t.fence, Err: err}))
			next = l.opts.Now().Add(bo.next())
		}
	}
}

// movedOnError reports that the lease item names another owner or fence.
// inDoubt: the write's own outcome is unknown (it may have landed before
// the item moved on).
type movedOnError struct {
	err     error
	inDoubt bool
}

func (e *movedOnError) Error() string { return e.err.Error() }
func (e *movedOnError) Unwrap() error { return e.err }
