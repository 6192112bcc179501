package ddblease

import (
	"sync"
	"time"
)

// This file owns the lifetime: how long a holder may believe what the
// table confirmed, the one deadline arithmetic of the library. A lease of
// its own leads by its tenure's lifetime, renewed by its heartbeats; a
// pool's job by its replica's session's, renewed for all its jobs at once
// (session.go). The tenure (tenure.go) is bound to a liveness, either of
// the two, and never asks which.

// holdFor is how long a holder believes a write confirmed by the table
// keeps the lease (or session) its own, from when the write was sent:
// LeaseDuration less the margin that absorbs clock rates. Every holder's
// deadline is this past a sending.
func (o *Options) holdFor() time.Duration { return o.LeaseDuration - o.margin() }

// expiry is the expiry a write sent at at records (Unix ms): what other
// replicas judge by, a whole LeaseDuration on the writer's clock.
func (o *Options) expiry(at time.Time) int64 { return at.Add(o.LeaseDuration).UnixMilli() }

// sent is when a write was sent, by Options.Now and by the runtime's
// monotonic clock.
type sent struct{ at, real time.Time }

// sendNow returns the time of a write being sent now.
func (o *Options) sendNow() sent { return sent{at: o.Now(), real: time.Now()} }

// lifetime is a holder's belief, from a confirmed write to its deadline:
// the write's send time by Options.Now and by the runtime's monotonic
// clock, the deadline holdFor past it on each (the belief ends at the
// earlier, so that a slow Options.Now cannot stretch it), and a timer
// that calls expire at that deadline. A confirmation that comes at or
// after the deadline it would extend never revives it: the lifetime is
// then over, and stays over.
type lifetime struct {
	hold   time.Duration
	now    func() time.Time
	expire func() // the timer's: the deadline passed with no confirmation

	mu    sync.Mutex
	last  sent // the last confirmed write's sending; zero before the first
	over  bool
	timer *time.Timer
	armed int // counts the timer's armings; a stale firing is ignored
}

func newLifetime(o *Options, expire func()) *lifetime {
	return &lifetime{hold: o.holdFor(), now: o.Now, expire: expire}
}

// left returns how long the belief lasts from now by both clocks: 0
// before the first confirmation and once it is over.
func (lt *lifetime) left() time.Duration {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	return lt.leftLocked()
}

func (lt *lifetime) leftLocked() time.Duration {
	if lt.over || lt.last.at.IsZero() {
		return 0
	}
	return max(min(lt.last.at.Add(lt.hold).Sub(lt.now()), time.Until(lt.last.real.Add(lt.hold))), 0)
}

// deadlines returns the deadline by Options.Now and by the runtime's
// clock (zero before the first confirmation).
func (lt *lifetime) deadlines() (time.Time, time.Time) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if lt.last.at.IsZero() {
		return time.Time{}, time.Time{}
	}
	return lt.last.at.Add(lt.hold), lt.last.real.Add(lt.hold)
}

// renewed returns when the last confirmed write was sent, by Options.Now
// (zero before the first).
func (lt *lifetime) renewed() time.Time { return lt.lastSent().at.Round(0) }

// lastSent returns the sending of the last confirmed write.
func (lt *lifetime) lastSent() sent {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	return lt.last
}

// confirm records a write sent at s as confirmed now, and (re)arms the
// timer for its deadline. It reports false, and the lifetime is over,
// when it was over, or when the confirmation comes at or after the
// deadline it held or the one s would give.
func (lt *lifetime) confirm(s sent) bool {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	late := lt.over || !lt.last.at.IsZero() && lt.leftLocked() <= 0 ||
		!lt.now().Before(s.at.Add(lt.hold)) || !time.Now().Before(s.real.Add(lt.hold))
	if late {
		lt.endLocked()
		return false
	}
	lt.last = s
	lt.armLocked()
	return true
}

func (lt *lifetime) armLocked() {
	if lt.timer != nil {
		lt.timer.Stop()
	}
	lt.armed++
	armed := lt.armed
	lt.timer = time.AfterFunc(lt.leftLocked(), func() { lt.fire(armed) })
}

// fire is the timer's function: unless a confirmation re-armed the timer
// since, the lifetime is over (no later confirmation revives it) and
// expire is called.
func (lt *lifetime) fire(armed int) {
	lt.mu.Lock()
	if lt.over || lt.armed != armed {
		lt.mu.Unlock()
		return
	}
	if lt.leftLocked() > 0 { // Options.Now ran behind the runtime's clock
		lt.armLocked()
		lt.mu.Unlock()
		return
	}
	lt.endLocked()
	lt.mu.Unlock()
	lt.expire()
}

// end ends the lifetime.
func (lt *lifetime) end() {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	lt.endLocked()
}

// stopTimer stops the timer, leaving the deadline where it is: the
// lifetime's holder ended (a resignation), and expire is not called.
func (lt *lifetime) stopTimer() {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	lt.armed++
	if lt.timer != nil {
		lt.timer.Stop()
	}
}

func (lt *lifetime) endLocked() {
	lt.over = true
	if lt.timer != nil {
		lt.timer.Stop()
	}
}

// isOver reports whether the lifetime ended.
func (lt *lifetime) isOver() bool {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	return lt.over
}
