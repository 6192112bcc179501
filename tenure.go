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

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

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
	return !t.over && t.left() > 0
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
	if tm.sess != nil {
		// The pool's session renews a tenure bound to it.
		if !tm.leads() {
			err := fmt.Errorf("%w: %q fence %d: the pool session's local deadline passed", ErrLost, l.job, t.fence)
			tm.end(err, LossDeadline)
			return err
		}
		return nil
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

// keeper renews a tenure on a timer until it is stopped or the tenure
// ends: no goroutine waits between renewals, each runs on the timer's own.
// It does not decide when the tenure ends: the term's own timer does, and
// a renewal stuck in a request cannot hold that up.
type keeper struct {
	t  *term
	bo *backoff // back off, from RetryInterval up to half the heartbeat interval
	// onResign is called once, from a renewal, when the item it returned
	// asks this tenure to resign (control.go).
	onResign   func()
	resignOnce sync.Once
	// stopping reports that fn is being stopped (Run's ctx or the leader
	// context has ended): a renewal due then is put off (putOffLocked).
	stopping func() bool

	mu       sync.Mutex
	timer    *time.Timer
	next     time.Time // when the next renewal is due, by Options.Now
	stopped  bool
	drained  bool
	putOff   bool           // a renewal was put off while fn was being stopped
	urgent   int            // drain requests: a renewal that began before one is followed by another at once
	inFlight sync.WaitGroup // the renewal running, if any
}

// keeper returns a keeper of the term; start sets it going.
func (t *term) keeper(onResign func(), stopping func() bool) *keeper {
	l := t.l
	return &keeper{t: t, onResign: onResign, stopping: stopping,
		bo:   &backoff{base: l.opts.RetryInterval, max: l.opts.HeartbeatInterval / 2},
		next: t.snapshot().sentAt.Add(l.opts.HeartbeatInterval)}
}

// start arms the first renewal, a heartbeat interval after the term's last
// write was sent.
func (k *keeper) start() {
	if k.t.sess != nil {
		return // the pool's session renews the tenure
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.armLocked()
}

// armLocked sets the timer for the next renewal. Called with k.mu held.
func (k *keeper) armLocked() {
	if k.stopped || !k.t.holds() {
		return
	}
	k.timer = time.AfterFunc(max(k.next.Sub(k.t.l.opts.Now()), 0), k.fire)
}

// stop ends the keeper and waits for a renewal in flight: it is not
// abandoned (it completes, bounded by CallTimeout and the deadline), so that
// the resignation that usually follows finds its outcome known. It is
// idempotent.
func (k *keeper) stop() {
	k.mu.Lock()
	k.stopped = true
	if k.timer != nil {
		k.timer.Stop()
	}
	k.mu.Unlock()
	k.inFlight.Wait()
}

// drain marks the lease as draining with a renewal sent at once, so that
// standbys poll fast until the resignation.
func (k *keeper) drain() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.stopped || k.drained || k.t.sess != nil {
		return
	}
	k.drained = true
	k.t.setDraining()
	k.urgent++
	k.next = time.Time{}
	if k.timer != nil && k.timer.Stop() {
		k.armLocked()
	} // else a renewal is running: it is followed by another at once
}

// fire is the timer's function: one renewal, then the timer for the next.
func (k *keeper) fire() {
	t, l := k.t, k.t.l
	k.mu.Lock()
	if k.stopped || !t.holds() {
		k.mu.Unlock()
		return
	}
	if l.opts.Now().Before(k.next) {
		k.armLocked() // the runtime's clock ran ahead of Options.Now
		k.mu.Unlock()
		return
	}
	if k.putOffLocked() {
		k.mu.Unlock()
		return
	}
	urgent := k.urgent
	k.inFlight.Add(1)
	k.mu.Unlock()
	defer k.inFlight.Done()

	l.writes.lock()
	err := t.renew(context.Background())
	l.writes.unlock()
	if err == nil {
		k.noticeControl() // control.go: resign requests, operator controls
	}
	k.mu.Lock()
	stopped := k.stopped
	k.mu.Unlock()
	if err != nil && !stopped && !errors.Is(err, ErrLost) && !errors.Is(err, ErrNotLeader) {
		l.notify.emit(l.event(EventRetry, Event{Op: "heartbeat", Fence: t.fence, Err: err}))
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	switch {
	case k.stopped, errors.Is(err, ErrLost), errors.Is(err, ErrNotLeader):
		return
	case err == nil:
		k.next = t.snapshot().sentAt.Add(l.opts.HeartbeatInterval)
		k.bo.reset()
	default:
		k.next = l.opts.Now().Add(k.bo.next())
	}
	if k.urgent != urgent {
		k.next = time.Time{}
	}
	k.armLocked()
}

// putOffLocked puts off, once, a renewal that falls due while fn is being
// stopped and no drain mark was asked for: fn is about to return, and the
// resignation that follows makes the renewal moot (at shutdown, thousands
// of leases would otherwise renew while their resignations queue). It is
// put off until one heartbeat interval is left to the deadline, so that
// the renewal still has the time a regular one has to get through; the
// drain mark, written if fn still runs a RetryInterval after the drain
// began, renews at once. It reports whether it put the renewal off.
// Called with k.mu held.
func (k *keeper) putOffLocked() bool {
	if k.putOff || k.drained || !k.stopping() {
		return false
	}
	o := k.t.l.opts
	s := k.t.snapshot()
	wait := min(s.deadline.Sub(o.Now()), time.Until(s.realDeadline)) - o.HeartbeatInterval
	if wait <= 0 {
		return false
	}
	k.putOff = true
	k.next = o.Now().Add(wait)
	k.armLocked()
	return true
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
		l.yieldUntil = time.Now().Add(2 * l.opts.RetryInterval)
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
	update := "SET #exp = :zero, #rv = :rv, #ren = :now, #drn = :false"
	if t.sess != nil {
		update += ", #ses = :nos" // free: a standby of the pool takes it at its next poll
		names["#ses"], values[":nos"] = attrSession, avS(noSession)
	}
	err := t.fencedWrite(ctx, l.opts.CallTimeout, time.Time{}, update, names, values, rv)
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
	r := retrier{backoff: fixed(l.opts.RetryInterval), now: l.opts.Now, deadline: t.deadline,
		onRetry: func(err error) { l.notify.emit(l.event(EventRetry, Event{Op: "resign", Fence: fence, Err: err})) },
	}
	if tm.sess != nil {
		// A lease bound to a pool session stays this replica's while the
		// session lives, and no other replica may take it: retry while it
		// does, not only until the deadline the session had when the
		// resignation began.
		r.deadline = time.Time{}
		r.again = func(err error) bool { return retryable(err) && !tm.sess.isOver() }
	}
	_, _, err := r.do(ctx, func(ctx context.Context) error {
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
