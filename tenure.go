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
	fence    int64
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

	ctx    context.Context // ends when the term ends; its cause wraps ErrLost
	cancel context.CancelCauseFunc
	timer  *time.Timer // ends the term at its deadline
	armed  int         // counts the timer's armings; a stale firing is ignored
}

// arm (re)starts t's timer to end it in d, by the monotonic clock of the
// runtime. Called with Lease.mu held.
func (l *Lease) arm(t *term, d time.Duration) {
	if t.timer != nil {
		t.timer.Stop()
	}
	t.armed++
	armed := t.armed
	t.timer = time.AfterFunc(d, func() { l.expire(t, armed) })
}

// tenure is a snapshot of the current term, for code that reads it without
// holding Lease.mu.
type tenure struct {
	held     bool // there is a term and it is not over
	fence    int64
	version  string
	sentAt   time.Time
	deadline time.Time
	// realDeadline is the deadline by the runtime's monotonic clock.
	realDeadline time.Time
	draining     bool
}

// current returns a snapshot of the current term.
func (l *Lease) current() tenure {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.ten
	if t == nil {
		return tenure{}
	}
	return tenure{held: !t.over, fence: t.fence, version: t.version, sentAt: t.sentAt, deadline: t.deadline,
		realDeadline: t.realDeadline, draining: t.draining}
}

// sent is when a write was sent, by Options.Now and by the runtime's
// monotonic clock.
type sent struct{ at, real time.Time }

// sendNow returns the time of a write being sent now.
func (l *Lease) sendNow() sent { return sent{at: l.opts.Now(), real: time.Now()} }

// left returns how long a term with these deadlines (by Options.Now and by
// the runtime's clock) may last from now: until the earlier of them.
func (l *Lease) left(deadline, realDeadline time.Time) time.Duration {
	return min(deadline.Sub(l.opts.Now()), time.Until(realDeadline))
}

// begin opens a term for the item our acquisition produced, sent at s.
// base supplies the values of the leader context. It returns false, and
// opens nothing, when the deadline had already passed.
func (l *Lease) begin(base context.Context, rec Record, s sent, latency time.Duration) bool {
	sentAt := s.at
	deadline := sentAt.Add(l.opts.LeaseDuration - l.opts.margin())
	realDeadline := s.real.Add(l.opts.LeaseDuration - l.opts.margin())
	if l.left(deadline, realDeadline) <= 0 {
		return false
	}
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(base))
	t := &term{
		fence:        rec.Fence,
		version:      rec.version,
		sentAt:       sentAt,
		deadline:     deadline,
		realDeadline: realDeadline,
		acquiredAt:   sentAt.Round(0),
		renewedAt:    sentAt.Round(0),
		ctx:          ctx,
		cancel:       cancel,
	}
	l.mu.Lock()
	if old := l.ten; old != nil && !old.over {
		l.closeLocked(old, fmt.Errorf("%w: %q fence %d: fence %d was acquired", ErrLost, l.job, old.fence, rec.Fence), LossDeposed)
	}
	l.ten = t
	l.arm(t, l.left(deadline, realDeadline))
	l.notify.push(l.event(EventAcquired, Event{Fence: rec.Fence, Latency: latency}))
	l.mu.Unlock()
	l.notify.flush()
	return true
}

// expire is the deadline timer's function: it ends t, unless t was renewed
// (or ended) since this arming. The timer was armed for the earlier of the
// two deadlines, so a tenure ends after at most LeaseDuration - margin of
// real time from its last confirmed write's sending, even when
// Options.Now runs slow; IsLeader turns false when Options.Now passes the
// deadline, and with the timer otherwise.
func (l *Lease) expire(t *term, armed int) {
	l.mu.Lock()
	if t.over || t.armed != armed {
		l.mu.Unlock()
		return
	}
	l.closeLocked(t, fmt.Errorf("%w: %q fence %d: local deadline passed without a confirmed heartbeat", ErrLost, l.job, t.fence), LossDeadline)
	l.mu.Unlock()
	l.notify.flush()
}

// renewed records a write of this term's fence, sent at s, as confirmed
// now. It reports false when the term is over, or when the confirmation
// came at or after the deadline: the term then ends, and the write only
// keeps the item ours until it expires.
func (l *Lease) renewed(fence int64, version string, s sent, latency time.Duration) bool {
	now := l.opts.Now()
	l.mu.Lock()
	t := l.ten
	if t == nil || t.over || t.fence != fence {
		l.mu.Unlock()
		return false
	}
	if l.left(t.deadline, t.realDeadline) <= 0 {
		l.closeLocked(t, fmt.Errorf("%w: %q fence %d: the heartbeat was confirmed only after the local deadline", ErrLost, l.job, fence), LossDeadline)
		l.mu.Unlock()
		l.notify.flush()
		return false
	}
	margin := t.deadline.Sub(now)
	t.version = version
	t.sentAt = s.at
	t.deadline = s.at.Add(l.opts.LeaseDuration - l.opts.margin())
	t.realDeadline = s.real.Add(l.opts.LeaseDuration - l.opts.margin())
	t.renewedAt = s.at.Round(0)
	l.arm(t, l.left(t.deadline, t.realDeadline))
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
// deadline has not passed, by Options.Now and by the runtime's clock. It
// does not wait for the deadline timer, which may not have run yet (a
// process just resumed from a pause, say).
func (l *Lease) leads(fence int64) bool {
	t := l.current()
	return t.held && t.fence == fence && l.left(t.deadline, t.realDeadline) > 0
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
