package ddblease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// This file owns the heartbeat: the renewal of a tenure (term.renew,
// Lease.Heartbeat), which extends the lease on condition that it still
// carries this tenure's owner, fence and a renewal version this handle
// wrote, and the keeper, a timer that renews a tenure every
// HeartbeatInterval while Run leads and reacts to the operator's controls
// it reads (term.noticeControl, controlWatch). A pool's jobs have no
// keeper: their session renews them (session.go), and its notes reach
// term.noticeControl.

// Heartbeat renews the lease with a write conditional on this owner and
// fence, so a stale leader cannot extend it. It returns ErrLost, and the
// tenure ends, once the item names another owner or fence, or the local
// deadline passed before the renewal was confirmed (a late confirmation
// never revives a tenure); ErrNotLeader when this handle has no tenure.
// Other errors (throttling, timeouts) leave the tenure open until its
// deadline: call again.
func (l *Lease) Heartbeat(ctx context.Context) error {
	l.writes.lock(&l.notify)
	defer l.writes.unlock(&l.notify)
	t := l.current()
	if t == nil {
		return fmt.Errorf("%w: heartbeat %q", ErrNotLeader, l.job)
	}
	return t.renew(ctx)
}

// renew is Heartbeat for this term, called with the write lock held.
func (t *term) renew(ctx context.Context) error {
	l := t.l
	sn := t.snapshot()
	if !sn.held {
		if sn.lost != nil {
			return sn.lost
		}
		return fmt.Errorf("%w: heartbeat %q", ErrNotLeader, l.job)
	}
	return t.live.renewTerm(ctx, t)
}

// renewTerm is the heartbeat of a lease of its own: a fenced write of its
// item, and its lifetime renewed with the confirmation.
func (s *solo) renewTerm(ctx context.Context, t *term) error {
	l := t.l
	sn := t.snapshot()
	snt := l.opts.sendNow()
	now := snt.at
	if !t.leads() {
		err := fmt.Errorf("%w: %q fence %d: local deadline passed without a confirmed heartbeat", ErrLost, l.job, sn.fence)
		t.end(err, LossDeadline)
		return err
	}
	rv := randomID(8)
	u := newLeaseUpdate()
	u.renewal(l.opts, now, rv, sn.draining)
	// The write and its read-back end at the deadline: past it, nothing
	// they learn could keep the tenure.
	if err := t.fencedWrite(ctx, l.opts.CallTimeout, sn.deadline, u, rv); err != nil {
		return err
	}
	if !t.renewed(rv, snt, l.opts.Now().Sub(now)) {
		return fmt.Errorf("%w: %q fence %d: the heartbeat was confirmed only after the local deadline", ErrLost, l.job, sn.fence)
	}
	return nil
}

// keeper renews a tenure on a timer until it is stopped or the tenure
// ends: no goroutine waits between renewals, each runs on the timer's own.
// It does not decide when the tenure ends: the term's own timer does, and
// a renewal stuck in a request cannot hold that up.
type keeper struct {
	t  *term
	bo *backoff // back off, from RetryInterval up to half the heartbeat interval
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

// newKeeper returns a keeper of the term t; start sets it going.
func newKeeper(t *term, stopping func() bool) *keeper {
	l := t.l
	return &keeper{t: t, stopping: stopping,
		bo:   &backoff{base: l.opts.RetryInterval, max: l.opts.HeartbeatInterval / 2},
		next: t.snapshot().sentAt.Add(l.opts.HeartbeatInterval)}
}

// start arms the first renewal, a heartbeat interval after the term's last
// write was sent.
func (k *keeper) start() {
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
	if k.stopped || k.drained {
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

	l.writes.lock(&l.notify)
	err := t.renew(context.Background())
	l.writes.unlock(&l.notify)
	if err == nil {
		k.t.noticeControl() // control.go: resign requests, operator controls
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
	wait := k.t.live.life().left() - o.HeartbeatInterval
	if wait <= 0 {
		return false
	}
	k.putOff = true
	k.next = o.Now().Add(wait)
	k.armLocked()
	return true
}

// controlWatch lets the keeper wake a RunSchedule that waits for its next
// slot when the operator controls in the lease item change. Its channel is
// made by RunSchedule (watch), so that a Lease that only runs Run holds
// none; nor does it hold a copy of controls that are all unset (the usual
// case): a lease costs little in a process that holds thousands.
type controlWatch struct {
	mu   sync.Mutex
	seen bool
	last *Control // as last noted; nil when all unset
	wake chan struct{}
	fn   func() // called on a change, besides the channel (Pool.RunSchedule)
}

// watch makes the channel that note wakes, before a runner first reads the
// controls, so that no change noted after that read is missed.
func (w *controlWatch) watch() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.wake == nil {
		w.wake = make(chan struct{}, 1)
	}
}

// watchFunc makes note call fn on each change, before a runner first
// reads the controls.
func (w *controlWatch) watchFunc(fn func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fn = fn
}

// ch returns the channel note wakes; nil (never ready) before watch.
func (w *controlWatch) ch() chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.wake
}

// note records c and wakes a waiting runner if it differs from what was
// noted before.
func (w *controlWatch) note(c Control) {
	w.mu.Lock()
	var prev Control
	if w.last != nil {
		prev = *w.last
	}
	changed := !w.seen || prev != c
	if changed {
		w.last = nil
		if c != (Control{}) {
			w.last = &c
		}
	}
	w.seen = true
	ch, fn := w.wake, w.fn
	w.mu.Unlock()
	if changed && fn != nil {
		fn()
	}
	if changed && ch != nil {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// noticeControl is called with the lease item just observed: by the
// keeper after each successful heartbeat, by a pool's session for a note
// (Pool.noticeNote). It wakes a runner waiting for a slot when the
// controls changed, and calls onResign, once, when the item carries a
// resign request for this tenure.
func (t *term) noticeControl() {
	l := t.l
	l.mu.Lock()
	c, ok := l.obs.rec.control(), l.obs.present && l.obs.rec.Fence == t.fence
	resign := ok && c.ResignFence == t.fence && t.onResign != nil && !t.resignSeen
	if resign {
		t.resignSeen = true
	}
	l.mu.Unlock()
	if !ok {
		return
	}
	l.ctl.note(c)
	if resign {
		t.onResign.resignRequested()
	}
}
