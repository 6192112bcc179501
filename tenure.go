package ddblease

import (
	"context"
	"fmt"
	"time"
)

// term is one tenure of this handle: from the acquisition that gave it a
// fence to its end. It owns the tenure's deadline and the leader context,
// and is the one place where "belief ends at the deadline" is enforced: a
// timer ends the term at its deadline whatever calls are in flight, and a
// renewal confirmed at or after the deadline never revives it.
//
// A term's fields are guarded by Lease.mu.
type term struct {
	fence      int64
	version    string    // renewal version of the last write confirmed in this term
	sentAt     time.Time // when that write was sent (Options.Now, monotonic)
	deadline   time.Time // sentAt + LeaseDuration - margin
	acquiredAt time.Time
	renewedAt  time.Time
	draining   bool
	over       bool
	lost       error // why the term ended, if it was lost rather than given up

	ctx    context.Context // ends when the term ends; its cause wraps ErrLost
	cancel context.CancelCauseFunc
	timer  *time.Timer // ends the term at its deadline
}

// tenure is a snapshot of the current term, for code that reads it without
// holding Lease.mu.
type tenure struct {
	held     bool // there is a term and it is not over
	fence    int64
	version  string
	sentAt   time.Time
	deadline time.Time
	draining bool
}

// current returns a snapshot of the current term.
func (l *Lease) current() tenure {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.ten
	if t == nil {
		return tenure{}
	}
	return tenure{held: !t.over, fence: t.fence, version: t.version, sentAt: t.sentAt, deadline: t.deadline, draining: t.draining}
}

// begin opens a term for the item our acquisition produced, sent at
// sentAt. base supplies the values of the leader context. It returns false,
// and opens nothing, when the deadline had already passed.
func (l *Lease) begin(base context.Context, rec Record, sentAt time.Time, latency time.Duration) bool {
	now := l.opts.Now()
	deadline := sentAt.Add(l.opts.LeaseDuration - l.opts.margin())
	if !now.Before(deadline) {
		return false
	}
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(base))
	t := &term{
		fence:      rec.Fence,
		version:    rec.version,
		sentAt:     sentAt,
		deadline:   deadline,
		acquiredAt: sentAt.Round(0),
		renewedAt:  sentAt.Round(0),
		ctx:        ctx,
		cancel:     cancel,
	}
	l.mu.Lock()
	if old := l.ten; old != nil && !old.over {
		l.closeLocked(old, fmt.Errorf("%w: %q fence %d: fence %d was acquired", ErrLost, l.job, old.fence, rec.Fence), LossDeposed)
	}
	l.ten = t
	t.timer = time.AfterFunc(deadline.Sub(now), func() { l.expire(t) })
	l.notify.push(l.event(EventAcquired, Event{Fence: rec.Fence, Latency: latency}))
	l.mu.Unlock()
	l.notify.flush()
	return true
}

// expire is the deadline timer's function: it ends t if its deadline has
// passed by the lease's clock, and otherwise waits again.
func (l *Lease) expire(t *term) {
	l.mu.Lock()
	if t.over {
		l.mu.Unlock()
		return
	}
	if left := t.deadline.Sub(l.opts.Now()); left > 0 {
		t.timer.Reset(left)
		l.mu.Unlock()
		return
	}
	l.closeLocked(t, fmt.Errorf("%w: %q fence %d: local deadline passed without a confirmed heartbeat", ErrLost, l.job, t.fence), LossDeadline)
	l.mu.Unlock()
	l.notify.flush()
}

// renewed records a write of this term's fence, sent at sentAt, as
// confirmed now. It reports false when the term is over, or when the
// confirmation came at or after the deadline: the term then ends, and the
// write only keeps the item ours until it expires.
func (l *Lease) renewed(fence int64, version string, sentAt time.Time, latency time.Duration) bool {
	now := l.opts.Now()
	l.mu.Lock()
	t := l.ten
	if t == nil || t.over || t.fence != fence {
		l.mu.Unlock()
		return false
	}
	if !now.Before(t.deadline) {
		l.closeLocked(t, fmt.Errorf("%w: %q fence %d: the heartbeat was confirmed only after the local deadline", ErrLost, l.job, fence), LossDeadline)
		l.mu.Unlock()
		l.notify.flush()
		return false
	}
	margin := t.deadline.Sub(now)
	t.version = version
	t.sentAt = sentAt
	t.deadline = sentAt.Add(l.opts.LeaseDuration - l.opts.margin())
	t.renewedAt = sentAt.Round(0)
	t.timer.Reset(t.deadline.Sub(now))
	l.notify.push(l.event(EventRenewed, Event{Fence: fence, Latency: latency, Margin: margin}))
	l.mu.Unlock()
	l.notify.flush()
	return true
}

// end closes the term with this fence, if it is open, with the given
// cause; reason is reported with EventLost ("" reports nothing: the caller
// reports the end itself).
func (l *Lease) end(fence int64, cause error, reason LossReason) {
	l.mu.Lock()
	if t := l.ten; t != nil && !t.over && t.fence == fence {
		l.closeLocked(t, cause, reason)
	}
	l.mu.Unlock()
	l.notify.flush()
}

// endResigning closes the term with this fence, if it is open, because
// this handle is giving the lease up: EventResigned is reported at once,
// before the resignation is written.
func (l *Lease) endResigning(fence int64, cause error) {
	l.mu.Lock()
	if t := l.ten; t != nil && !t.over && t.fence == fence {
		l.closeLocked(t, cause, "")
		l.notify.push(l.event(EventResigned, Event{Fence: fence}))
	}
	l.mu.Unlock()
	l.notify.flush()
}

// closeLocked ends t: the leader context is cancelled with cause before
// the lock is released, so that no one can see the term over and its
// context live.
func (l *Lease) closeLocked(t *term, cause error, reason LossReason) {
	t.over = true
	t.draining = false
	if reason != "" {
		t.lost = cause
	}
	t.timer.Stop()
	t.cancel(cause)
	if reason != "" {
		l.notify.push(l.event(EventLost, Event{Fence: t.fence, Reason: reason, Err: cause}))
	}
}

// termContext returns the leader context of the term with this fence, and
// false when that term is no longer the current one or is over.
func (l *Lease) termContext(fence int64) (context.Context, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.ten
	if t == nil || t.fence != fence || t.over {
		return nil, false
	}
	return t.ctx, true
}

// lostCause returns why the last term ended, if it was lost (not given
// up), and nil otherwise.
func (l *Lease) lostCause() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t := l.ten; t != nil && t.over {
		return t.lost
	}
	return nil
}

// holds reports whether the term with this fence is still open.
func (l *Lease) holds(fence int64) bool {
	t := l.current()
	return t.held && t.fence == fence
}

// leads reports whether the term with this fence is open and its local
// deadline has not passed.
func (l *Lease) leads(fence int64) bool {
	t := l.current()
	return t.held && t.fence == fence && l.opts.Now().Before(t.deadline)
}

// setDraining marks the term with this fence as draining: its next
// heartbeat says so in the item.
func (l *Lease) setDraining(fence int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t := l.ten; t != nil && !t.over && t.fence == fence {
		t.draining = true
	}
}

// event fills in the fields every event of this handle carries.
func (l *Lease) event(kind EventKind, e Event) Event {
	e.Kind, e.Job, e.Owner, e.Time = kind, l.job, l.opts.Owner, l.opts.Now()
	return e
}
