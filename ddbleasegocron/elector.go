package ddbleasegocron

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/ddblease/ddblease"
	"github.com/go-co-op/gocron/v2"
)

// ErrNotStarted reports a call on an Elector (or a Locker) before Start.
var ErrNotStarted = errors.New("ddbleasegocron: not started")

// ErrStopped reports a call on an Elector (or a Locker) whose campaign has
// ended; the error returned wraps what the campaign returned, if anything.
var ErrStopped = errors.New("ddbleasegocron: stopped")

// Elector is a gocron.Elector backed by a ddblease lease that campaigns in
// the background: pass it to gocron.WithDistributedElector on every
// replica, and only the replica holding the lease runs the scheduler's jobs.
//
// IsLeader answers from the lease's own state (Lease.State): it makes no
// DynamoDB request, and it stops answering nil at the tenure's local
// deadline even when the heartbeat is stuck. The fence of the tenure is
// available from Fence; pass it to every side effect through a
// ddblease.Guard, so that a job that outlives the tenure (gocron does not
// cancel a running job when leadership is lost) is refused by the sink.
//
// An Elector decides who runs, not which firing runs: after a failover the
// new leader fires by its own clock and start time, so a firing near the
// handover may run on both sides (once on each, fenced) or on neither. Use
// a Locker for exactly once per slot.
type Elector struct {
	lease *ddblease.Lease
	ts    *ddblease.Tenures // a Locker job's runs, or nil

	mu      sync.Mutex
	started bool
	done    chan struct{}
	err     error  // what Run returned; set before done is closed
	holder  string // the last holder seen by the standby, or ""
	hfence  int64
}

var _ gocron.Elector = (*Elector)(nil)

// NewElector returns an Elector on the lease of job in table, made by
// ddblease.New with optFns. It makes no call and starts nothing: Start
// begins the campaign. The Options.Observer, if set, is still called: the
// Elector wraps it to learn who leads.
func NewElector(db ddblease.DynamoDBAPI, table, job string, optFns ...func(*ddblease.Options)) (*Elector, error) {
	return newElector(db, table, job, false, optFns)
}

// newElector returns an Elector whose tenures are led, for a Locker's job
// (runs true), by a ddblease.Tenures that carries the job's runs, or by a
// function that holds the lease until the tenure ends.
func newElector(db ddblease.DynamoDBAPI, table, job string, runs bool, optFns []func(*ddblease.Options)) (*Elector, error) {
	e := &Elector{done: make(chan struct{})}
	optFns = append(slices.Clip(optFns), func(o *ddblease.Options) {
		user := o.Observer
		o.Observer = func(ev ddblease.Event) {
			e.observe(ev)
			if user != nil {
				user(ev)
			}
		}
	})
	l, err := ddblease.New(db, table, job, optFns...)
	if err != nil {
		return nil, err
	}
	e.lease = l
	if runs {
		if e.ts, err = ddblease.NewTenures(l); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// Lease returns the lease the Elector campaigns for: use it for State,
// Holder, Claim or ListRuns, not for Run.
func (e *Elector) Lease() *ddblease.Lease { return e.lease }

func (e *Elector) observe(ev ddblease.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch ev.Kind {
	case ddblease.EventLeaderSeen:
		e.holder, e.hfence = ev.Holder, ev.Fence
	case ddblease.EventAcquired:
		e.holder, e.hfence = ev.Owner, ev.Fence
	}
}

// Start begins the campaign: it runs Lease.Run in a goroutine until ctx
// ends, and returns at once. When ctx ends, Run cancels the tenure, drains
// it (marking the lease draining if that takes longer than a
// RetryInterval) and resigns it, so that a standby takes over at once;
// Wait returns when that is done. gocron does not stop a running job when
// the elector's context ends: to let running jobs finish while the lease is
// still held, shut the scheduler down (gocron's Scheduler.Shutdown waits
// for them) before ending ctx. Start may be called once; a second call is
// an error wrapping ddblease.ErrInvalid.
func (e *Elector) Start(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.started {
		return fmt.Errorf("%w: Elector for %q already started", ddblease.ErrInvalid, e.lease.Job())
	}
	e.started = true
	go func() {
		lead := func(ctx context.Context, _ int64) error {
			<-ctx.Done() // the tenure: IsLeader reads it from the lease
			return nil
		}
		if e.ts != nil {
			lead = e.ts.Lead
		}
		err := e.lease.Run(ctx, lead)
		e.mu.Lock()
		e.err = err
		e.mu.Unlock()
		close(e.done)
	}()
	return nil
}

// Done is closed when the campaign has ended and its goroutine has
// returned.
func (e *Elector) Done() <-chan struct{} { return e.done }

// Wait waits for the campaign to end (its context ended, or an error
// stopped it) and returns what Lease.Run returned: nil after a clean
// shutdown, an error wrapping ddblease.ErrNotResigned when the lease could
// not be resigned and lapses at its expiry, or the error that stopped the
// campaign (a missing table, say). It returns ErrNotStarted before Start.
func (e *Elector) Wait() error {
	e.mu.Lock()
	started := e.started
	e.mu.Unlock()
	if !started {
		return ErrNotStarted
	}
	<-e.done
	return e.Err()
}

// Err returns what Lease.Run returned once the campaign has ended, and nil
// while it runs.
func (e *Elector) Err() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.err
}

// IsLeader implements gocron.Elector. It returns nil while this replica
// holds the lease and its local deadline has not passed, and otherwise an
// error wrapping ddblease.ErrNotLeader that names the holder last seen, if
// any; after the campaign ended, an error wrapping ErrStopped and what the
// campaign returned; before Start, ErrNotStarted. It makes no request.
func (e *Elector) IsLeader(context.Context) error {
	_, err := e.Fence()
	return err
}

// Fence returns the fence of the current tenure, to pass to a
// ddblease.Guard, or the error IsLeader would return.
func (e *Elector) Fence() (int64, error) {
	e.mu.Lock()
	started, holder, hfence := e.started, e.holder, e.hfence
	e.mu.Unlock()
	if !started {
		return 0, ErrNotStarted
	}
	select {
	case <-e.done:
		if err := e.Err(); err != nil {
			return 0, fmt.Errorf("%w: campaign for %q ended: %w", ErrStopped, e.lease.Job(), err)
		}
		return 0, fmt.Errorf("%w: campaign for %q ended", ErrStopped, e.lease.Job())
	default:
	}
	st := e.lease.State()
	if st.Leader {
		return st.Fence, nil
	}
	return 0, notLeader(st, holder, hfence)
}

func notLeader(st ddblease.State, holder string, hfence int64) error {
	if holder != "" && holder != st.Owner {
		return fmt.Errorf("%w: %q is led by %q (fence %d, last seen)", ddblease.ErrNotLeader, st.Job, holder, hfence)
	}
	return fmt.Errorf("%w: %q: this replica (%q) does not hold the lease; holder not known", ddblease.ErrNotLeader, st.Job, st.Owner)
}
