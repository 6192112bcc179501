package ddblease

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// This file owns term, one tenure: its fence, its end and the leader
// contexts that end with it, the liveness it leads by (a lifetime of its
// own, or its pool session), and its fenced write.

// term is one tenure of this handle: from the acquisition that gave it a
// fence to its end. It owns the tenure's end and the leader contexts
// derived from it (derive), and is the one place where "belief ends at
// the deadline" is enforced for it: it leads while the lifetime of its liveness lasts (lifetime.go),
// whose timer ends it at the deadline whatever calls are in flight, and a
// renewal confirmed at or after the deadline never revives it. The
// acquisition returns the term (Lease.begin); Run's leader, the keeper,
// the resignation, the claims and RunSchedule's runner hold it, and a
// term that is over stays over.
//
// fence, live and base are set at the start; the other fields are
// guarded by Lease.mu.
type term struct {
	l     *Lease
	fence int64
	live  liveness // what it leads by, and who renews it

	version    string // renewal version of the last write confirmed in this term
	acquiredAt time.Time
	draining   bool
	resignSeen bool // onResign was called
	lost       bool // the term was lost (its ending's cause says why) rather than given up
	// onResign is told once when the lease item as read (a renewal's
	// answer, a session's note) asks this tenure to resign (noticeControl).
	onResign resignee

	// A term keeps no context of its own: the contexts that end with it
	// are made when a run needs one (derive), so that a tenure no one runs
	// under (a pool's held job between its steps) holds none; base gives
	// them their values.
	base context.Context
	ends ending // why it ended, and what ends with it: set when it ends
}

// liveness is what a tenure leads by, and who renews it. A lease of its
// own (solo) leads by a lifetime of the tenure's own, renewed by the
// tenure's heartbeats of its lease item (the keeper, heartbeat.go); a
// pool's job by its replica's session (session.go), whose one renewal
// renews every job bound to it. The tenure asks its liveness, never which
// kind it is.
type liveness interface {
	// bind binds an opening tenure, whose acquisition was sent at s; false
	// when the liveness is over before the tenure began (its deadline
	// passed). Called with Lease.mu held.
	bind(t *term, s sent) bool
	// life is the lifetime the tenure leads by.
	life() *lifetime
	// release forgets a tenure that ended. Called with Lease.mu held.
	release(t *term)
	// renewTerm renews the tenure (Lease.Heartbeat, the keeper): a heartbeat
	// of the lease item, or nothing to write for a session's job.
	renewTerm(ctx context.Context, t *term) error
	// keep starts the keeper's renewals (a session renews its jobs: none),
	// and drain its drain mark.
	keep(k *keeper)
	drain(k *keeper)
	// drainExpired is called when fn still runs at DrainTimeout and the
	// keeper has stopped: a lease of its own then lapses at its expiry; a
	// session's job, renewed while the session lives, is resigned.
	drainExpired(t *term)
	// binds adds to an acquisition's update what binds the item to it (a
	// session and its pool), and freeing to a resignation's what frees
	// the item for the next holder (the binding cleared).
	binds(u *leaseUpdate)
	freeing(u *leaseUpdate)
}

// solo is the liveness of a lease of its own: a lifetime of the tenure's
// own.
type solo struct{ lt *lifetime }

func (s *solo) bind(t *term, snt sent) bool {
	s.lt = newLifetime(t.l.opts, t.expire)
	return s.lt.confirm(snt)
}
func (s *solo) life() *lifetime { return s.lt }

// release stops the timer, and leaves the deadline where it is: a
// resignation retries until it passes (resignRetrying).
func (s *solo) release(*term)        { s.lt.stopTimer() }
func (s *solo) keep(k *keeper)       { k.start() }
func (s *solo) drain(k *keeper)      { k.drain() }
func (s *solo) drainExpired(*term)   {}
func (s *solo) binds(*leaseUpdate)   {} // an item bound to a session is not taken (condition): it stays unbound
func (s *solo) freeing(*leaseUpdate) {}

// resignee is told, once, that an operator asked a tenure to resign (the
// lease item carries its fence as ResignFence): Run's drain, or a pool's
// scheduled job.
type resignee interface{ resignRequested() }

// tenure is a snapshot of a term, for code that reads it without holding
// Lease.mu.
type tenure struct {
	held     bool // the term is not over
	fence    int64
	version  string
	sentAt   time.Time // when the last confirmed write its liveness rests on was sent
	deadline time.Time
	// realDeadline is the deadline by the runtime's monotonic clock.
	realDeadline time.Time
	draining     bool
	lost         error // why the term ended, if it was lost
}

// current returns the current or last term, nil before the first.
func (l *Lease) current() *term {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ten
}

// begin opens a term for the item our acquisition produced, sent at s,
// bound to live, and returns it. base supplies the values of the leader
// context. It returns nil, and opens nothing, when the deadline had
// already passed.
func (l *Lease) begin(base context.Context, rec Record, s sent, latency time.Duration, live liveness) *term {
	t := &term{l: l, fence: rec.Fence, version: rec.version, acquiredAt: s.at.Round(0), live: live, base: base}
	t.ends.mu = &l.mu
	l.mu.Lock()
	if !live.bind(t, s) {
		l.mu.Unlock()
		return nil
	}
	if old := l.ten; old != nil && !old.ends.overLocked() {
		old.closeLocked(fmt.Errorf("%w: %q fence %d: fence %d was acquired", ErrLost, l.job, old.fence, rec.Fence), LossDeposed)
	}
	l.ten = t
	l.notify.push(l.event(EventAcquired, Event{Fence: rec.Fence, Latency: latency}))
	l.mu.Unlock()
	l.notify.flush()
	return t
}

// derive returns a leader context: it ends when the term ends, with the
// cause the term ended with (wrapping ErrLost for a loss), or when cancel
// is called, and carries the values of the campaign's context
// (campaignSlot.values), not its end.
func (t *term) derive() (ctx context.Context, cancel context.CancelCauseFunc) {
	return t.ends.derive(t.base)
}

// expire is the solo lifetime's timer function: it ends the term.
func (t *term) expire() {
	l := t.l
	l.mu.Lock()
	if t.ends.overLocked() {
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
	life := t.live.life()
	d, rd := life.deadlines()
	sn := tenure{held: !t.ends.overLocked(), fence: t.fence, version: t.version, sentAt: life.lastSent().at, deadline: d,
		realDeadline: rd, draining: t.draining}
	if t.lost {
		sn.lost = t.ends.cause
	}
	return sn
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
// "does this tenure lead now", by both clocks of its liveness's lifetime.
func (t *term) leadsLocked() bool { return !t.ends.overLocked() && t.live.life().left() > 0 }

// holds reports whether the term is still open.
func (t *term) holds() bool {
	t.l.mu.Lock()
	defer t.l.mu.Unlock()
	return !t.ends.overLocked()
}

// renewed records a heartbeat of this term, sent at s, as confirmed now.
// It reports false when the term is over, or when the confirmation came
// at or after the deadline: the term then ends, and the write only keeps
// the item ours until it expires.
func (t *term) renewed(version string, s sent, latency time.Duration) bool {
	l := t.l
	now := l.opts.Now()
	l.mu.Lock()
	if t.ends.overLocked() {
		l.mu.Unlock()
		return false
	}
	life := t.live.life()
	d, _ := life.deadlines()
	if !life.confirm(s) {
		t.closeLocked(fmt.Errorf("%w: %q fence %d: the heartbeat was confirmed only after the local deadline", ErrLost, l.job, t.fence), LossDeadline)
		l.mu.Unlock()
		l.notify.flush()
		return false
	}
	t.version = version
	l.notify.push(l.event(EventRenewed, Event{Fence: t.fence, Latency: latency, Margin: d.Sub(now)}))
	l.mu.Unlock()
	l.notify.flush()
	return true
}

// end closes the term, if it is open, with the given cause; reason is
// reported with EventLost. Reason "" is this handle giving the lease up:
// EventResigned is reported at once, before the resignation is written.
func (t *term) end(cause error, reason LossReason) {
	l := t.l
	l.mu.Lock()
	if !t.ends.overLocked() {
		t.closeLocked(cause, reason)
		if reason == "" {
			l.notify.push(l.event(EventResigned, Event{Fence: t.fence}))
		}
	}
	l.mu.Unlock()
	l.notify.flush()
}

// closeLocked ends the term: the contexts derived from it are cancelled
// with cause before the lock is released, so that no one can see the term
// over and a leader context live; its watches are called. reason ""
// reports nothing: the caller reports the end.
func (t *term) closeLocked(cause error, reason LossReason) {
	t.ends.endLocked(cause)
	t.draining = false
	if reason != "" {
		t.lost = true
	}
	t.live.release(t)
	if reason != "" {
		t.l.notify.push(t.l.event(EventLost, Event{Fence: t.fence, Reason: reason, Err: cause}))
	}
}

// setDraining marks the term as draining: its next heartbeat says so in
// the item.
func (t *term) setDraining() {
	t.l.mu.Lock()
	defer t.l.mu.Unlock()
	if !t.ends.overLocked() {
		t.draining = true
	}
}

// fencedWrite applies an update to the lease item on condition that it
// still names this owner and the tenure's fence, and carries a renewal
// version this handle wrote. It returns ErrLost (and ends the tenure) when
// the condition fails, and the error when the outcome stays unknown. The
// write and its read-back end by until (zero: CallTimeout each).
func (t *term) fencedWrite(ctx context.Context, timeout time.Duration, until time.Time, u *leaseUpdate, rv string) error {
	l := t.l
	u.names["#owner"], u.names["#fence"], u.names["#rv"] = attrOwner, attrFence, attrVersion
	u.values[":me"], u.values[":fence"] = avS(l.opts.Owner), avN(t.fence)
	cond := "#owner = :me AND #fence = :fence"
	if mine := l.vers.condition(u.values); mine != "" {
		cond += " AND " + mine
	}
	in := &dynamodb.UpdateItemInput{
		TableName:                           aws.String(l.table),
		Key:                                 l.opts.Layout.leaseKey(l.job),
		UpdateExpression:                    aws.String(u.expression()),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            u.names,
		ExpressionAttributeValues:           u.values,
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
