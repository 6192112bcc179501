// Package runtenure gives the scheduler adapters (ddbleasegocron/, ddbleaserobfig/)
// one implementation of a run's context: the runs claimed under a tenure
// keep a context that lives through a shutdown's drain, and the lease is
// resigned only after their outcome is recorded. It is internal to this
// repository: the adapters' modules import it from the root module.
package runtenure

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ddblease/ddblease"
)

// Tenures follows the tenures of one lease for the runs claimed under
// them. Its Lead is the function given to Lease.Run, and its Observe sees
// every event of the lease.
type Tenures struct {
	Lease *ddblease.Lease // set before the campaign starts

	mu        sync.Mutex
	cur       *Tenure       // the tenure Lead is in, or nil
	published chan struct{} // closed when Lead publishes a tenure; made by a Join that waits for one
}

// Tenure is one leadership, as its runs see it. Its context is the runs'
// context: it ends when the tenure is lost (its cause wraps
// ddblease.ErrLost), or DrainTimeout after a drain began (ErrDrainTimeout),
// and not when the campaign's context ends or a scheduler shuts down. Lead
// waits for the runs that joined it before it returns, so the lease is
// resigned after their outcome is recorded.
type Tenure struct {
	fence  int64
	ctx    context.Context
	cancel context.CancelCauseFunc
	runs   sync.WaitGroup
	open   bool // runs may join; guarded by tenures.mu
}

// Lead publishes the tenure of fence, waits for its leader context to end,
// and then for the runs that joined it: at once when the tenure was lost
// (their context is cancelled with its cause), or while they drain after
// a shutdown or an operator's resign request.
func (ts *Tenures) Lead(leaderCtx context.Context, fence int64) (err error) {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(leaderCtx))
	t := &Tenure{fence: fence, ctx: ctx, cancel: cancel, open: true}
	ts.mu.Lock()
	ts.cur = t
	if ts.published != nil {
		close(ts.published)
		ts.published = nil
	}
	ts.mu.Unlock()
	defer func() {
		ts.mu.Lock()
		if ts.cur == t {
			ts.cur = nil
		}
		ts.mu.Unlock()
		cancel(fmt.Errorf("%w: %q fence %d: the tenure is over", ddblease.ErrLost, ts.Lease.Job(), fence))
	}()
	// A loss before t was published was reported before observe could
	// see it.
	if st := ts.Lease.State(); !st.Leader || st.Fence != fence {
		cancel(fmt.Errorf("%w: %q fence %d: the tenure ended as it began", ddblease.ErrLost, ts.Lease.Job(), fence))
	}
	<-leaderCtx.Done()
	ts.mu.Lock()
	t.open = false
	ts.mu.Unlock()
	var expired error
	if cause := context.Cause(leaderCtx); errors.Is(cause, ddblease.ErrLost) {
		cancel(cause)
	} else {
		d := ts.Lease.Options().DrainTimeout
		var mu sync.Mutex
		timer := time.AfterFunc(d, func() {
			err := fmt.Errorf("%w: %q fence %d: the run was still running %v after the drain began (%v)",
				ddblease.ErrDrainTimeout, ts.Lease.Job(), fence, d, cause)
			mu.Lock()
			expired = err
			mu.Unlock()
			cancel(err)
		})
		defer func() {
			timer.Stop()
			mu.Lock()
			err = expired
			mu.Unlock()
		}()
	}
	t.runs.Wait()
	// A drain that ran out is an error of Lead, for Run to return, even
	// when Run's own DrainTimeout (of the same length) has not fired yet.
	return nil
}

// Observe ends the runs' context of the current tenure the moment the
// lease reports its end.
func (ts *Tenures) Observe(ev ddblease.Event) {
	if ev.Kind != ddblease.EventLost && ev.Kind != ddblease.EventResigned {
		return
	}
	ts.mu.Lock()
	t := ts.cur
	ts.mu.Unlock()
	if t == nil || t.fence != ev.Fence {
		return
	}
	cause := ev.Err
	if cause == nil || !errors.Is(cause, ddblease.ErrLost) {
		cause = fmt.Errorf("%w: %q fence %d: resigned", ddblease.ErrLost, ev.Job, ev.Fence)
	}
	t.cancel(cause)
}

// Join registers a run with the current tenure and returns it; the caller
// calls t.Done when the run's outcome is recorded. It fails with an
// error wrapping ddblease.ErrNotLeader when there is no tenure, or when it
// is draining or over.
func (ts *Tenures) Join() (*Tenure, error) {
	// The lease may already say it leads while Lease.Run has not yet
	// called Lead: a firing at that instant waits for the tenure to be
	// published (at most a RetryInterval) instead of being turned away.
	wait := time.NewTimer(ts.Lease.Options().RetryInterval)
	defer wait.Stop()
	for {
		st := ts.Lease.State()
		ts.mu.Lock()
		t := ts.cur
		if st.Leader && (t == nil || t.fence != st.Fence) {
			if ts.published == nil {
				ts.published = make(chan struct{})
			}
			ch := ts.published
			ts.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-wait.C:
			}
			ts.mu.Lock()
			t = ts.cur
		}
		defer ts.mu.Unlock()
		switch {
		case t == nil || t.ctx.Err() != nil:
			return nil, fmt.Errorf("%w: %q: this replica (%q) has no tenure", ddblease.ErrNotLeader, ts.Lease.Job(), ts.Lease.Owner())
		case !t.open:
			return nil, fmt.Errorf("%w: %q fence %d is draining before it resigns: no new run", ddblease.ErrNotLeader, ts.Lease.Job(), t.fence)
		}
		t.runs.Add(1)
		return t, nil
	}
}

// Context is the runs' context of the tenure.
func (t *Tenure) Context() context.Context { return t.ctx }

// Fence is the tenure's fence.
func (t *Tenure) Fence() int64 { return t.fence }

// Done tells the tenure that a run that joined it has recorded its outcome.
func (t *Tenure) Done() { t.runs.Done() }
