package ddblease

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// This file owns term, one tenure: its fence, deadline, timer, leader
// context and end, and its fenced write.

// term is one tenure of this handle: from the acquisition that gave it a
// fence to its end. It owns the tenure's deadline, its timer and the
// leader context, and is the one place where "belief ends at the deadline"
// is enforced: the timer ends the term at its deadline whatever calls are
// in flight, and a renewal confirmed at or after the deadline never
// revives it. The acquisition returns the term (Lease.begin); Run's
// leader, the keeper, the resignation, the claims and RunSchedule's runner
// hold it, and a term that is over stays over.
//
// fence, ctx and cancel are set at the start; the other fields are guarded
// by Lease.mu.
type term struct {
	l      *Lease
	fence  int64
	ctx    context.Context // ends when the term ends; its cause wraps ErrLost
	cancel context.CancelCauseFunc

	version  string    // renewal version of the last write confirmed in this term
	sentAt   time.Time // when that write was sent (Options.Now, monotonic)
	deadline time.Time // sentAt + LeaseDuration - margin
	// realDeadline is the same instant by the runtime's own monotonic
	// clock (time.Now), from when that write was sent: the tenure ends at
	// whichever comes first, so that a slow Options.Now cannot stretch it.
	realDeadline time.Time
	acquiredAt   time.Time
	renewedAt    time.Time
	draining     bool
	over         bool
	lost         error // why the term ended, if it was lost rather than given up

	timer *time.Timer // ends the term at its deadline
	armed int         // counts the timer's armings; a stale firing is ignored

	// sess is the pool session the tenure is bound to (session.go), nil
	// for a lease of its own: the session's deadline and timer are the
	// tenure's, and its renewal renews the tenure.
	sess *session
	k    *keeper // the keeper while fn runs, for a session's notes (Lease.noticeNote)
}

// tenure is a snapshot of a term, for code that reads it without holding
// Lease.mu.
type tenure struct {
	held     bool // the term is not over
	fence    int64
	version  string
	sentAt   time.Time
	deadline time.Time
	// realDeadline is the deadline by the runtime's monotonic clock.
	realDeadline time.Time
	draining     bool
	lost         error // why the term ended, if it was lost
}

// sent is when a write was sent, by Options.Now and by the runtime's
// monotonic clock.
type sent struct{ at, real time.Time }

// sendNow returns the time of a write being sent now.
func (o *Options) sendNow() sent { return sent{at: o.Now(), real: time.Now()} }

// current returns the current or last term, nil before the first.
func (l *Lease) current() *term {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ten
}

// begin opens a term for the item our acquisition produced, sent at s, and
// returns it. base supplies the values of the leader context. It returns
// nil, and opens nothing, when the deadline had already passed.
func (l *Lease) begin(base context.Context, rec Record, s sent, latency time.Duration, sess *session) *term {
	t := &term{l: l, fence: rec.Fence, version: rec.version, acquiredAt: s.at.Round(0), renewedAt: s.at.Round(0), sess: sess}
	t.setDeadline(s)
	if t.left() <= 0 {
		return nil
	}
	t.ctx, t.cancel = context.WithCancelCause(context.WithoutCancel(base))
	if sess != nil && !sess.bind(t) {
		t.cancel(nil)
		return nil
	}
	l.mu.Lock()
	if old := l.ten; old != nil && !old.over {
		old.closeLocked(fmt.Errorf("%w: %q fence %d: fence %d was acquired", ErrLost, l.job, old.fence, rec.Fence), LossDeposed)
	}
	l.ten = t
	t.armLocked()
	l.notify.push(l.event(EventAcquired, Event{Fence: rec.Fence, Latency: latency}))
	l.mu.Unlock()
	l.notify.flush()
	return t
}

// setDeadline sets the deadlines of a write of this term sent at s.
func (t *term) setDeadline(s sent) {
	d := t.l.opts.LeaseDuration - t.l.opts.margin()
	t.sentAt, t.deadline, t.realDeadline = s.at, s.at.Add(d), s.real.Add(d)
}

// left returns how long the term may last from now, by Options.Now and by
// the runtime's clock: until the earlier of its deadlines. Called with
// Lease.mu held, or before the term is published.
func (t *term) left() time.Duration {
	if t.sess != nil {
		return t.sess.left()
	}
	return min(t.deadline.Sub(t.l.opts.Now()), time.Until(t.realDeadline))
}

// deadlines returns the term's deadline by Options.Now and by the
// runtime's clock: its session's, for a tenure bound to one.
func (t *term) deadlines() (time.Time, time.Time) {
	if t.sess != nil {
		return t.sess.deadlines()
	}
	return t.deadline, t.realDeadline
}

// armLocked (re)starts the timer to end the term at its deadline, by the
// monotonic clock of the runtime. The timer is armed for the earlier of
// the two deadlines, so a tenure ends after at most LeaseDuration - margin
// of real time from its last confirmed write's sending, even when
// Options.Now runs slow.
func (t *term) armLocked() {
	if t.sess != nil {
		return // the session's timer ends it
	}
	if t.timer != nil {
		t.timer.Stop()
	}
	t.armed++
	armed := t.armed
	t.timer = time.AfterFunc(t.left(), func() { t.expire(armed) })
}

// expire is the timer's function: it ends the term, unless it was renewed
// (or ended) since this arming.
func (t *term) expire(armed int) {
	l := t.l
	l.mu.Lock()
	if t.over || t.armed != armed {
		l.mu.Unlock()
		return
	}
	t.closeLocked(fmt.Errorf("%w: %q fence %d: local deadline passed without a confirmed heartbeat", ErrLost, l.job, t.fence), LossDeadline)
	l.mu.Unlock()
	l.notify.flush()
}

// snapshot returns the term's state as it is now.
func (t *term) snapshot() tenure {
	t.l.mu.Lock()
	defer t.l.mu.Unlock()
	d, rd := t.deadlines()
	return tenure{held: !t.over, fence: t.fence, version: t.version, sentAt: t.sentAt, deadline: d,
		realDeadline: rd, draining: t.draining, lost: t.lost}
}

// leads reports whether the term is open and its local deadline has not
// passed, by Options.Now and by the runtime's clock. It does not wait for
// the timer, which may not have run yet (a process just resumed from a
// pause, say).
func (t *term) leads() bool {
	t.l.mu.Lock()
	defer t.l.mu.Unlock()
	return t.leadsLocked()
}

// leadsLocked is leads, called with Lease.mu held: the one answer to
// "does this tenure lead now", by both clocks, and by its session's
// deadline for a tenure bound to one.
func (t *term) leadsLocked() bool { return !t.over && t.left() > 0 }

// remaining is left, taking Lease.mu.
func (t *term) remaining() time.Duration {
	t.l.mu.Lock()
	defer t.l.mu.Unlock()
	return t.left()
}

// holds reports whether the term is still open.
func (t *term) holds() bool {
	t.l.mu.Lock()
	defer t.l.mu.Unlock()
	return !t.over
}

// renewed records a write of this term, sent at s, as confirmed now. It
// reports false when the term is over, or when the confirmation came at or
// after the deadline: the term then ends, and the write only keeps the
// item ours until it expires.
func (t *term) renewed(version string, s sent, latency time.Duration) bool {
	l := t.l
	now := l.opts.Now()
	l.mu.Lock()
	if t.over {
		l.mu.Unlock()
		return false
	}
	if t.left() <= 0 {
		t.closeLocked(fmt.Errorf("%w: %q fence %d: the heartbeat was confirmed only after the local deadline", ErrLost, l.job, t.fence), LossDeadline)
		l.mu.Unlock()
		l.notify.flush()
		return false
	}
	margin := t.deadline.Sub(now)
	t.version = version
	t.setDeadline(s)
	t.renewedAt = s.at.Round(0)
	t.armLocked()
	l.notify.push(l.event(EventRenewed, Event{Fence: t.fence, Latency: latency, Margin: margin}))
	l.mu.Unlock()
	l.notify.flush()
	return true
}

// end closes the term, if it is open, with the given cause; reason is
// reported with EventLost.
func (t *term) end(cause error, reason LossReason) {
	t.l.mu.Lock()
	if !t.over {
		t.closeLocked(cause, reason)
	}
	t.l.mu.Unlock()
	t.l.notify.flush()
}

// endResigning closes the term, if it is open, because this handle is
// giving the lease up: EventResigned is reported at once, before the
// resignation is written.
func (t *term) endResigning(cause error) {
	l := t.l
	l.mu.Lock()
	if !t.over {
		t.closeLocked(cause, "")
		l.notify.push(l.event(EventResigned, Event{Fence: t.fence}))
	}
	l.mu.Unlock()
	l.notify.flush()
}

// closeLocked ends the term: the leader context is cancelled with cause
// before the lock is released, so that no one can see the term over and
// its context live. reason "" reports nothing: the caller reports the end.
func (t *term) closeLocked(cause error, reason LossReason) {
	t.over = true
	t.draining = false
	if reason != "" {
		t.lost = cause
	}
	if t.timer != nil {
		t.timer.Stop()
	}
	if t.sess != nil {
		t.sess.unbind(t)
	}
	t.cancel(cause)
	if reason != "" {
		t.l.notify.push(t.l.event(EventLost, Event{Fence: t.fence, Reason: reason, Err: cause}))
	}
}

// setDraining marks the term as draining: its next heartbeat says so in
// the item.
func (t *term) setDraining() {
	t.l.mu.Lock()
	defer t.l.mu.Unlock()
	if !t.over {
		t.draining = true
	}
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
		Key:                                 l.opts.Layout.leaseKey(l.job),
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
		return fmt.Errorf("ddblease: write lease %q: %w", l.job, explainTableError(ctx, l.db, l.table, l.opts.Layout, err))
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
