package ddbleaserobfig

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/robfig/cron/v3"
)

// ErrNotStarted reports a Wait before Start.
var ErrNotStarted = errors.New("ddbleaserobfig: not started")

// DefaultTolerance is the widest tolerance a job has when
// JobOptions.Tolerance is zero (ddblease.DefaultSlotTolerance; see
// ddblease.MatchSlot).
const DefaultTolerance = ddblease.DefaultSlotTolerance

// ErrNoSlot reports that a firing could not be matched to a slot of its
// job's schedule: no slot lies within the tolerance of the time it fired.
// Nothing runs for that firing. It is ddblease.ErrNoSlot.
var ErrNoSlot = ddblease.ErrNoSlot

// JobOptions configures one job of a Wrapper.
type JobOptions struct {
	// Tolerance is how far from a slot, by the lease's clock, a firing may
	// be and still be matched to it. It must cover how late the cron fires
	// (robfig fires on time or late, never early, by its own clock) and any
	// offset between the cron's clock and the lease's (none when both are
	// the system clock), and stay below half the gaps on both sides of
	// every slot. Zero: the rule of ddblease.MatchSlot, DefaultTolerance
	// or a quarter of each gap next to the slot nearest the firing if that
	// is smaller (250ms for the seconds 0 and 1 of "0,1 * * * * *").
	// Ignored for a cron.ConstantDelaySchedule (see Wrapper.Job).
	Tolerance time.Duration

	// Job configures the claims (rerun policy, retention, transactions);
	// see ddblease.JobOptions. All replicas must use the same values.
	Job ddblease.JobOptions
}

// Wrapper makes cron.Jobs that run each slot once across replicas. Each
// job has its own lease (job name as given to Job) in one table; Start
// campaigns for them all in the background.
type Wrapper struct {
	db     ddblease.DynamoDBAPI
	table  string
	optFns []func(*ddblease.Options)

	mu      sync.Mutex
	jobs    []*job
	names   map[string]bool
	started bool
	wg      sync.WaitGroup
	errs    []error
}

// New returns a Wrapper whose leases and runs live in table; each job's
// lease is made by ddblease.New with optFns. It makes no call.
func New(db ddblease.DynamoDBAPI, table string, optFns ...func(*ddblease.Options)) (*Wrapper, error) {
	if err := ddblease.CheckClient(db); err != nil {
		return nil, err
	}
	return &Wrapper{db: db, table: table, optFns: optFns, names: map[string]bool{}}, nil
}

// job is one wrapped job: its lease and the tenures its firings run under.
type job struct {
	w     *Wrapper
	lease *ddblease.Lease
	ts    *ddblease.Tenures
	sched ddblease.Schedule
	tol   time.Duration // 0: the rule of ddblease.MatchSlot
	o     ddblease.JobOptions
	fn    func(context.Context, *ddblease.JobRun) error
}

// Job returns a cron.Job that runs fn once per slot of sched across the
// replicas: pass the same schedule to the cron (c.Schedule(sched, job)),
// with the same name and schedule on every replica. Each time the cron
// fires it, the job
//
//   - skips the firing (logged at debug level) unless this replica leads
//     the job's lease and is not draining it for a shutdown;
//   - matches the firing to the slot of sched nearest to the lease's
//     clock within the tolerance; a firing with no slot near it is logged
//     as an error and nothing runs (a schedule that differs from the
//     cron's, or a firing delayed past the tolerance);
//   - claims the slot's run (Lease.Claim); a slot already claimed is
//     skipped (logged at debug level);
//   - calls fn with the run and the run's context, and records fn's
//     outcome with Finish unless fn finished the run itself (JobRun.Finish
//     or Commit).
//
// The run's context ends the moment the tenure it was claimed under is
// lost (its cause wraps ddblease.ErrLost), or when the lease's
// DrainTimeout has passed since the Wrapper's context ended (its cause
// wraps ddblease.ErrDrainTimeout). It does not end when the Wrapper's
// context ends: on SIGTERM, the firing in flight completes its effect and
// is recorded before the lease is resigned (see Start).
//
// A cron.ConstantDelaySchedule (@every) is anchored at the time each
// replica's cron started, so replicas do not agree on its firing times; its
// slots are taken to be the multiples of the delay since the Unix epoch
// (ddblease.Every), and each firing is matched to the nearest of them.
//
// opts, if given, configures the job (the last one counts). Job must be
// called before Start. An empty or invalid name, a name used
// twice, a nil schedule or fn, or a negative tolerance is an error
// wrapping ddblease.ErrInvalid.
func (w *Wrapper) Job(name string, sched cron.Schedule, fn func(ctx context.Context, run *ddblease.JobRun) error, opts ...JobOptions) (cron.Job, error) {
	if sched == nil || fn == nil {
		return nil, fmt.Errorf("%w: job %q: schedule and fn must not be nil", ddblease.ErrInvalid, name)
	}
	var o JobOptions
	if len(opts) > 0 {
		o = opts[len(opts)-1]
	}
	if o.Tolerance < 0 {
		return nil, fmt.Errorf("%w: job %q: Tolerance %v is negative", ddblease.ErrInvalid, name, o.Tolerance)
	}
	l, err := ddblease.New(w.db, w.table, name, w.optFns...)
	if err != nil {
		return nil, err
	}
	ts, err := ddblease.NewTenures(l)
	if err != nil {
		return nil, err
	}
	j := &job{w: w, lease: l, ts: ts, sched: sched, tol: o.Tolerance, o: o.Job, fn: fn}
	if cd, ok := sched.(cron.ConstantDelaySchedule); ok {
		j.sched, j.tol = ddblease.Every(cd.Delay), cd.Delay/2
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.started:
		return nil, fmt.Errorf("%w: job %q added after Start", ddblease.ErrInvalid, name)
	case w.names[name]:
		return nil, fmt.Errorf("%w: job %q added twice", ddblease.ErrInvalid, name)
	}
	w.names[name] = true
	w.jobs = append(w.jobs, j)
	return j, nil
}

// Lease returns the lease of the job named name, or nil: use it for State
// or ListRuns, not for Run.
func (w *Wrapper) Lease(name string) *ddblease.Lease {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, j := range w.jobs {
		if j.lease.Job() == name {
			return j.lease
		}
	}
	return nil
}

// Start campaigns, in the background, for the lease of every job, until
// ctx ends; it returns at once. When ctx ends (SIGTERM through
// signal.NotifyContext), each lease this replica holds drains: a new
// firing runs nothing, the firings in flight keep their context until
// they return and their outcome is recorded, and then the lease is
// resigned, so that a standby takes over at once. The drain ends early if
// the lease is lost; past the lease's DrainTimeout the firings' context is
// cancelled and the lease lapses at its expiry (Wait returns an error
// wrapping ddblease.ErrDrainTimeout). Stop the cron when ctx ends too
// (cron.Stop: no new firing), then Wait. Start may be called once.
func (w *Wrapper) Start(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		return fmt.Errorf("%w: Wrapper already started", ddblease.ErrInvalid)
	}
	if len(w.jobs) == 0 {
		return fmt.Errorf("%w: Wrapper has no job", ddblease.ErrInvalid)
	}
	w.started = true
	for _, j := range w.jobs {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			if err := j.lease.Run(ctx, j.ts.Lead); err != nil {
				w.mu.Lock()
				w.errs = append(w.errs, fmt.Errorf("job %q: %w", j.lease.Job(), err))
				w.mu.Unlock()
			}
		}()
	}
	return nil
}

// Wait waits until every campaign has ended and returns what their
// Lease.Run calls returned, joined: nil after a clean shutdown, an error
// wrapping ddblease.ErrNotResigned or ddblease.ErrDrainTimeout, or the
// error that stopped a campaign (a missing table, say).
func (w *Wrapper) Wait() error {
	w.mu.Lock()
	started := w.started
	w.mu.Unlock()
	if !started {
		return ErrNotStarted
	}
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return errors.Join(w.errs...)
}

// Run implements cron.Job: one firing.
func (j *job) Run() {
	l := j.lease
	log := l.Options().Logger.With("job", l.Job())
	t, err := j.ts.Join()
	if err != nil {
		log.Debug("ddbleaserobfig: firing skipped", "err", err)
		return
	}
	defer t.Done()
	slot, err := ddblease.MatchSlot(j.sched, l.Options().Now(), j.tol)
	if err != nil {
		log.Error("ddbleaserobfig: firing not run: no slot of the schedule near it", "err", err)
		return
	}
	o := j.o
	run, err := l.Claim(t.Context(), slot, func(jo *ddblease.JobOptions) { *jo = o })
	switch {
	case errors.Is(err, ddblease.ErrSlotTaken), errors.Is(err, ddblease.ErrNotLeader), errors.Is(err, ddblease.ErrLost):
		log.Debug("ddbleaserobfig: firing skipped", "slot", slot, "err", err)
		return
	case err != nil:
		log.Warn("ddbleaserobfig: firing not run: the claim failed", "slot", slot, "err", err)
		return
	}
	fnErr := j.fn(t.Context(), run)
	if fnErr != nil && t.Context().Err() != nil && (errors.Is(fnErr, context.Canceled) || errors.Is(fnErr, context.DeadlineExceeded)) {
		fnErr = fmt.Errorf("%w (%v)", fnErr, context.Cause(t.Context()))
	}
	if fnErr != nil {
		log.Warn("ddbleaserobfig: job run failed", "slot", slot, "fence", run.Fence(), "err", fnErr)
	}
	if err := run.Finish(context.WithoutCancel(t.Context()), fnErr); err != nil && !errors.Is(err, ddblease.ErrInvalid) {
		// ErrInvalid: fn already finished the run (Finish or Commit).
		log.Warn("ddbleaserobfig: could not record the run's outcome", "slot", slot, "fence", run.Fence(), "err", err)
	}
}
