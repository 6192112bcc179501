package ddblease

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrResignRequested is the cause (context.Cause) of a leader context that
// Run cancelled because an operator asked the tenure to resign (see
// Admin.RequestResign).
var ErrResignRequested = errors.New("ddblease: resignation requested")

// controlWatch lets the keeper wake a RunSchedule that waits for its next
// slot when the operator controls in the lease item change.
type controlWatch struct {
	mu   sync.Mutex
	last Control
	seen bool
	wake chan struct{}
}

func (w *controlWatch) ch() chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.wake == nil {
		w.wake = make(chan struct{}, 1)
	}
	return w.wake
}

// note records c and wakes a waiting runner if it differs from what was
// noted before.
func (w *controlWatch) note(c Control) {
	ch := w.ch()
	w.mu.Lock()
	changed := !w.seen || w.last != c
	w.last, w.seen = c, true
	w.mu.Unlock()
	if changed {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// ResignRequested reports whether the lease item, as this handle last saw
// it, asks its current tenure to resign (see Admin.RequestResign). Run and
// RunSchedule honour the request by themselves at the next heartbeat; code
// that drives TryAcquire and Heartbeat itself checks it after each
// heartbeat and calls Resign.
func (l *Lease) ResignRequested() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.ten
	return t != nil && !t.over && l.obs.present && l.obs.rec.Fence == t.fence && l.obs.rec.Control.ResignFence == t.fence
}

// noticeControl is called by the keeper after each successful heartbeat,
// with the item that heartbeat returned already observed. It wakes a
// runner waiting for a slot when the controls changed, and asks Run to
// resign when the item carries a resign request for this tenure.
func (k *keeper) noticeControl() {
	l := k.t.l
	l.mu.Lock()
	c, ok := l.obs.rec.Control, l.obs.present && l.obs.rec.Fence == k.t.fence
	l.mu.Unlock()
	if !ok {
		return
	}
	l.ctl.note(c)
	if c.ResignFence == k.t.fence {
		k.resignOnce.Do(func() { close(k.resign) })
	}
}

// yieldToOthers applies the hand-over rule after an operator ended this
// replica's tenure, by a resign request or a forced release (as
// the lease item last seen shows): Acquire leaves a free lease to the other
// replicas for one LeaseDuration, so that the lease goes to another replica
// instead of straight back to the one asked to let go; a lone replica takes
// it back after that. err, the resignation's own failure if any, is logged.
func (t *term) yieldToOthers(err error) {
	l, fence := t.l, t.fence
	l.mu.Lock()
	c, present := l.obs.rec.Control, l.obs.present
	asked := present && (c.ResignFence == fence || c.ReleasedFence == fence)
	if asked {
		l.yieldUntil = l.opts.Now().Add(l.opts.LeaseDuration)
	}
	l.mu.Unlock()
	if asked {
		l.log.Info("ddblease: handing the lease over on an operator's request; leaving it to the other replicas for a lease duration",
			"fence", fence, "err", err)
	}
}

// movedOn is the cause of the end of the tenure with fence when the lease
// item, rec, names another owner or fence: an operator's forced release of
// this tenure, or another tenure.
func movedOn(job string, fence int64, rec Record) error {
	c := rec.Control
	if c.ReleasedFence != fence {
		return fmt.Errorf("%w: %q fence %d: now held by %q with fence %d", ErrLost, job, fence, rec.Owner, rec.Fence)
	}
	held := ""
	if c.ReleasedFence+1 != rec.Fence {
		held = fmt.Sprintf(", held by %q", rec.Owner)
	}
	return fmt.Errorf("%w: %q fence %d: released by force by operator %q at %s; the fence is now %d%s",
		ErrLost, job, fence, c.ReleasedBy, c.ReleasedAt.UTC().Format(time.RFC3339), rec.Fence, held)
}
