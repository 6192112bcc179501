package ddblease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// This file owns Tenures: the runs an external scheduler fires, carried
// through a lease's tenures as RunSchedule carries its own (the gocron and
// robfig adapters use it).

// Tenures follows the tenures of one lease for the runs that an external
// scheduler starts under them. Give its Lead to Lease.Run as the leader
// function; each run the scheduler fires calls Join, runs with the
// tenure's Context, and calls Done once its outcome is recorded (a
// JobRun's Finish, say).
//
// A run's context does not end when the campaign's context ends or the
// scheduler shuts down: it lives through the drain, so that a run under way
// records its outcome while the lease is still held, and Lead (so Run)
// waits for the runs that joined before the lease is resigned. It ends the
// moment the tenure ends (lost or resigned; its cause then wraps ErrLost),
// or DrainTimeout after the drain began (ErrDrainTimeout). No run may join
// a tenure that is draining.
type Tenures struct {
	l *Lease

	mu        sync.Mutex
	cur       *Tenure       // the tenure Lead is in, or nil
	published chan struct{} // closed when Lead publishes a tenure; made by a Join that waits for one
}

// Tenure is one tenure of a lease as the runs under it see it (Tenures).
type Tenure struct {
	fence  int64
	ctx    context.Context
	cancel context.CancelCauseFunc
	runs   sync.WaitGroup
	open   bool // runs may join; guarded by Tenures.mu
}

// NewTenures returns a Tenures for the runs under l's tenures. l must be
// run with its Lead (Lease.Run(ctx, ts.Lead)); a nil l is an error
// wrapping ErrInvalid.
func NewTenures(l *Lease) (*Tenures, error) {
	if l == nil {
		return nil, invalid("NewTenures: the lease is nil")
	}
	return &Tenures{l: l}, nil
}

// Lead is the leader function to give Lease.Run: it publishes the tenure
// of fence for Join, waits for the leader context to end, and then for
// the runs that joined: at once when the tenure was lost (their context
// is cancelled with its cause), or while they drain after a shutdown or an
// operator's resign request. It returns an error wrapping ErrDrainTimeout
// when runs were still running DrainTimeout after the drain began.
func (ts *Tenures) Lead(leaderCtx context.Context, fence int64) (err error) {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(leaderCtx))
	t := &Tenure{fence: fence, ctx: ctx, cancel: cancel, open: true}
	ts.publish(t)
	defer func() {
		ts.mu.Lock()
		if ts.cur == t {
			ts.cur = nil
		}
		ts.mu.Unlock()
		cancel(fmt.Errorf("%w: %q fence %d: the tenure is over", ErrLost, ts.l.job, fence))
	}()
	defer ts.endWithTerm(t)()
	<-leaderCtx.Done()
	ts.mu.Lock()
	t.open = false
	ts.mu.Unlock()
	if cause := context.Cause(leaderCtx); errors.Is(cause, ErrLost) {
		cancel(cause)
		t.runs.Wait()
		return nil
	}
	d := ts.l.opts.DrainTimeout
	expired := make(chan error, 1)
	timer := time.AfterFunc(d, func() {
		err := fmt.Errorf("%w: %q fence %d: a run was still running %v after the drain began (%v)",
			ErrDrainTimeout, ts.l.job, fence, d, context.Cause(leaderCtx))
		expired <- err
		cancel(err)
	})
	t.runs.Wait()
	if !timer.Stop() {
		return <-expired
	}
	return nil
}

// publish makes t the tenure Join finds, and wakes the Joins waiting.
func (ts *Tenures) publish(t *Tenure) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.cur = t
	if ts.published != nil {
		close(ts.published)
		ts.published = nil
	}
}

// endWithTerm ends t's runs' context the moment the lease's tenure of t's
// fence ends (lost or resigned), and returns the function that stops
// watching. A tenure already over when Lead began ends them at once.
func (ts *Tenures) endWithTerm(t *Tenure) (stop func() bool) {
	tm := ts.l.current()
	if tm == nil || tm.fence != t.fence {
		t.cancel(fmt.Errorf("%w: %q fence %d: the tenure ended as it began", ErrLost, ts.l.job, t.fence))
		return func() bool { return false }
	}
	w := tm.ends.whenOver(func() {
		cause := tm.ends.why()
		if !errors.Is(cause, ErrLost) {
			cause = fmt.Errorf("%w: %q fence %d: resigned", ErrLost, ts.l.job, t.fence)
		}
		t.cancel(cause)
	})
	return func() bool { return tm.ends.unwatch(w) }
}

// Join registers a run with the current tenure and returns it; the caller
// calls the tenure's Done when the run's outcome is recorded. It fails with
// an error wrapping ErrNotLeader when there is no tenure, or when it is
// draining or over. A firing at the instant the lease leads but Lead has
// not yet published the tenure waits for it, at most a RetryInterval.
func (ts *Tenures) Join() (*Tenure, error) {
	wait := time.NewTimer(ts.l.opts.RetryInterval)
	defer wait.Stop()
	for {
		st := ts.l.State()
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
			return nil, fmt.Errorf("%w: %q: this replica (%q) has no tenure", ErrNotLeader, ts.l.job, ts.l.opts.Owner)
		case !t.open:
			return nil, fmt.Errorf("%w: %q fence %d is draining before it resigns: no new run", ErrNotLeader, ts.l.job, t.fence)
		}
		t.runs.Add(1)
		return t, nil
	}
}

// Context is the runs' context of the tenure (Tenures says when it ends).
func (t *Tenure) Context() context.Context { return t.ctx }

// Fence is the tenure's fence.
func (t *Tenure) Fence() int64 { return t.fence }

// Done tells the tenure that a run that joined it has recorded its outcome.
func (t *Tenure) Done() { t.runs.Done() }
