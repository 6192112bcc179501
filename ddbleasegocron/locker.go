package ddbleasegocron

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
)

// DefaultTolerance is the widest tolerance a job has when Job.Tolerance is
// zero (ddblease.DefaultSlotTolerance; see ddblease.MatchSlot).
const DefaultTolerance = ddblease.DefaultSlotTolerance

// ErrNoSlot reports that a firing could not be matched to a slot of its
// job's schedule: no slot lies within the tolerance of the time it fired.
// The Lock fails, so gocron does not run the job for that firing. It is
// ddblease.ErrNoSlot.
var ErrNoSlot = ddblease.ErrNoSlot

// Job describes one gocron job to a Locker: when its slots fall due, and
// how they are claimed. All replicas must describe a job the same way.
type Job struct {
	// Schedule gives the job's slots; it must match the gocron job's own
	// schedule. For a gocron.CronJob, use CronSchedule with the same
	// crontab; for a gocron.DurationJob, ddblease.Every with the same
	// duration and the job started at a multiple of it (AlignedStart).
	// Required.
	Schedule ddblease.Schedule

	// Tolerance is how far from a slot, by the lease's clock, a firing may
	// be and still be matched to it: it must cover how late gocron fires
	// (timer delay, a job waiting for a concurrency limit) and any offset
	// between the scheduler's clock and the lease's (none when both are
	// the system clock). It must stay below half the gaps on both sides of
	// every slot, or a late firing is taken for the next slot. Zero: the
	// rule of ddblease.MatchSlot, DefaultTolerance or a quarter of each gap
	// next to the slot nearest the firing if that is smaller (250ms for
	// the seconds 0 and 1 of "0,1 * * * * *").
	Tolerance time.Duration

	// Options configures the claims (rerun policy, retention of the run
	// items, transactions); see ddblease.JobOptions. All replicas must use
	// the same values.
	Options ddblease.JobOptions
}

// Locker is a gocron.Locker that, instead of a mutex, claims a ddblease
// job run for the firing's slot: pass it to gocron.WithDistributedLocker on
// every replica. Each job has its own lease (job name = gocron job name,
// the key gocron passes), which the Locker keeps campaigning for in the
// background; Lock claims the run on the replica that holds it.
//
// Lock matches the firing to a slot: the job's Schedule slot nearest to the
// lease's clock, within the Tolerance (ddblease.MatchSlot). It then claims that
// slot (Lease.Claim, one conditional write, a transaction with a check on
// the lease item where the server has them). So a slot runs once, on the
// leader, however the replicas' clocks (within MaxClockSkew) and start
// times differ: a replica that fires the same slot late, or after taking
// over from a leader that ran it, finds it taken.
//
// A Lock error makes gocron skip the firing (it calls the job's
// AfterLockError listener with the error): a replica that does not lead
// the job gets an error wrapping ddblease.ErrNotLeader; a slot already run
// or claimed, one wrapping ddblease.ErrSlotTaken; a firing with no slot
// within the tolerance (a schedule that does not match gocron's, or a
// firing delayed past the tolerance), one wrapping ErrNoSlot, and nothing
// runs for it; a job the Locker was not told about, one wrapping
// ddblease.ErrInvalid.
//
// Give the job its function through Task: it is called with the claimed
// run and the run's context, which ends when the tenure is lost, or
// DrainTimeout after the Locker's context ended, and never by gocron's
// Shutdown (which cancels gocron's own job context before it waits for the
// running jobs). A run in flight when the replica shuts down thus finishes
// its effect under the lease it was claimed with.
//
// Unlock records the run as finished (Lease.Claim's JobRun.Finish):
// succeeded, or failed with the error Task's function returned. For a job
// given as a plain gocron task, register RecordError as its
// gocron.AfterJobRunsWithError listener, which gocron calls before it
// unlocks.
//
// What it does not do: slots that fall due while no replica leads the job
// (during a failover, one LeaseDuration at most) are not run later, and a
// run whose leader died stays "running" in its item (ListRuns shows it).
// ddblease's own RunSchedule has a catch-up rule for both.
type Locker struct {
	db     ddblease.DynamoDBAPI
	table  string
	optFns []func(*ddblease.Options)

	mu       sync.Mutex
	jobs     map[string]*lockerJob
	started  bool
	inflight map[string][]*runLock // runs locked and not yet unlocked, per key
}

type lockerJob struct {
	Job
	el *Elector
	ts *ddblease.Tenures
}

var _ gocron.Locker = (*Locker)(nil)

// NewLocker returns a Locker for jobs whose leases and runs live in table.
// Each job's lease is made by ddblease.New with optFns. It makes no call;
// Add the jobs, then Start.
func NewLocker(db ddblease.DynamoDBAPI, table string, optFns ...func(*ddblease.Options)) (*Locker, error) {
	if err := ddblease.CheckClient(db); err != nil {
		return nil, err
	}
	return &Locker{db: db, table: table, optFns: optFns, jobs: map[string]*lockerJob{}, inflight: map[string][]*runLock{}}, nil
}

// Add tells the Locker about the gocron job named key (gocron.WithName; by
// default gocron names a job after its function). It must be called before
// Start; a key added twice, an empty or invalid one, a nil Schedule or a
// negative Tolerance is an error wrapping ddblease.ErrInvalid.
func (l *Locker) Add(key string, job Job) error {
	if job.Schedule == nil {
		return fmt.Errorf("%w: job %q: Schedule is nil", ddblease.ErrInvalid, key)
	}
	if job.Tolerance < 0 {
		return fmt.Errorf("%w: job %q: Tolerance %v is negative", ddblease.ErrInvalid, key, job.Tolerance)
	}
	el, err := newElector(l.db, l.table, key, true, l.optFns)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.started:
		return fmt.Errorf("%w: job %q added after Start", ddblease.ErrInvalid, key)
	case l.jobs[key] != nil:
		return fmt.Errorf("%w: job %q added twice", ddblease.ErrInvalid, key)
	}
	l.jobs[key] = &lockerJob{Job: job, el: el, ts: el.ts}
	return nil
}

// Start begins campaigning, in the background, for the lease of every job
// added, until ctx ends; it returns at once. When ctx ends (SIGTERM through
// signal.NotifyContext), each lease that this replica holds drains: Lock
// claims no new run (its error wraps ddblease.ErrNotLeader), the runs in
// flight keep their context (Task) until they return and Unlock records
// their outcome, and then the lease is resigned, so that a standby takes
// over at once. The drain ends early if the lease is lost; past the
// lease's DrainTimeout the runs' context is cancelled and the lease lapses
// at its expiry (Wait returns an error wrapping ddblease.ErrDrainTimeout).
// Shut the scheduler down when ctx ends too (Scheduler.Shutdown: no new
// firing, and it waits for the running jobs), then Wait. Start may be
// called once.
func (l *Locker) Start(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started {
		return fmt.Errorf("%w: Locker already started", ddblease.ErrInvalid)
	}
	if len(l.jobs) == 0 {
		return fmt.Errorf("%w: Locker has no job: Add them before Start", ddblease.ErrInvalid)
	}
	l.started = true
	for _, j := range l.jobs {
		if err := j.el.Start(ctx); err != nil {
			return err // not reached: each elector is new
		}
	}
	return nil
}

// Wait waits until every job's campaign has ended and returns what their
// Lease.Run calls returned, joined (see Elector.Wait).
func (l *Locker) Wait() error {
	l.mu.Lock()
	started := l.started
	jobs := make([]*lockerJob, 0, len(l.jobs))
	for _, j := range l.jobs {
		jobs = append(jobs, j)
	}
	l.mu.Unlock()
	if !started {
		return ErrNotStarted
	}
	var errs []error
	for _, j := range jobs {
		if err := j.el.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("job %q: %w", j.el.Lease().Job(), err))
		}
	}
	return errors.Join(errs...)
}

// Elector returns the Elector that campaigns for key's lease, or nil if
// key was not added: its Lease gives State and ListRuns.
func (l *Locker) Elector(key string) *Elector {
	l.mu.Lock()
	defer l.mu.Unlock()
	if j := l.jobs[key]; j != nil {
		return j.el
	}
	return nil
}

// Lock implements gocron.Locker: it claims the run of the slot that the
// firing of key stands for. See Locker for the errors.
func (l *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	l.mu.Lock()
	j, started := l.jobs[key], l.started
	l.mu.Unlock()
	if j == nil {
		return nil, fmt.Errorf("%w: gocron job %q was not added to the Locker", ddblease.ErrInvalid, key)
	}
	if !started {
		return nil, ErrNotStarted
	}
	if _, err := j.el.Fence(); err != nil {
		return nil, err
	}
	t, err := j.ts.Join()
	if err != nil {
		return nil, err
	}
	lease := j.el.Lease()
	slot, err := ddblease.MatchSlot(j.Schedule, lease.Options().Now(), j.Tolerance)
	if err != nil {
		t.Done()
		return nil, fmt.Errorf("job %q: %w", key, err)
	}
	opts := j.Options
	// Claimed under the tenure's context, not gocron's: a firing that
	// gocron has begun runs, also when its shutdown has begun.
	run, err := lease.Claim(t.Context(), slot, func(o *ddblease.JobOptions) { *o = opts })
	if err != nil {
		t.Done()
		return nil, err
	}
	lk := &runLock{l: l, key: key, run: run, ten: t}
	l.mu.Lock()
	l.inflight[key] = append(l.inflight[key], lk)
	l.mu.Unlock()
	return lk, nil
}

// Run returns the run that key's job is running on this replica: the one
// its latest Lock claimed and Unlock has not finished, for its fence
// (JobRun.Fence, for a ddblease.Guard) and the slot's idempotency key
// (JobRun.IdempotencyKey). ok is false when no run of key is in flight
// here. Task passes the run to the job's function, with the context to
// write with; gocron's own job context is cancelled when its Shutdown
// begins.
func (l *Locker) Run(key string) (run *ddblease.JobRun, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	runs := l.inflight[key]
	if len(runs) == 0 {
		return nil, false
	}
	return runs[len(runs)-1].run, true
}

// RecordError records err as the outcome of the run of the job named
// jobName that is in flight on this replica, so that Unlock marks it
// failed. Its signature is that of gocron's AfterJobRunsWithError
// listener:
//
//	gocron.WithEventListeners(gocron.AfterJobRunsWithError(locker.RecordError))
//
// gocron calls it after the job function returned and before Unlock. When
// several runs of one job are in flight on the replica (a job that
// overruns its period, without gocron.WithSingletonMode), the error goes to
// the oldest of them that has none yet. A job made with Task needs no
// listener: the runs its function ran are left alone.
func (l *Locker) RecordError(_ uuid.UUID, jobName string, err error) {
	if err == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, lk := range l.inflight[jobName] {
		if lk.err == nil && !lk.task {
			lk.err = err
			return
		}
	}
}

// Task returns the gocron task of the job named key, for
// Scheduler.NewJob with gocron.WithName(key): each time the job runs, it
// calls fn with the run its firing's Lock claimed and that run's context,
// and records fn's error in the run (failed), or success.
//
// The run's context ends when the tenure the run was claimed under is lost
// (its cause wraps ddblease.ErrLost; the fence is refused by a Guard from
// then on), or when the lease's DrainTimeout has passed since the
// Locker's context ended (ddblease.ErrDrainTimeout). It does not end when
// gocron shuts down, nor when the Locker's context ends: on SIGTERM, the
// run in flight completes and is recorded before the lease is resigned.
// Write the run's effects with it, fenced (JobRun.Fence) and keyed by slot
// (JobRun.IdempotencyKey).
//
// fn must not be nil (NewJob then refuses the task). A task run without a
// run of key in flight (a scheduler without this Locker, a job of another
// name, or gocron.WithDisabledDistributedJobLocker) returns an error
// wrapping ddblease.ErrInvalid and does not call fn. When several runs of
// the job are in flight (a job that overruns its period without
// gocron.WithSingletonMode), fn gets the latest that no task has taken.
func (l *Locker) Task(key string, fn func(ctx context.Context, run *ddblease.JobRun) error) gocron.Task {
	if fn == nil {
		return nil
	}
	return gocron.NewTask(func() error {
		lk, err := l.take(key)
		if err != nil {
			return err
		}
		ctx := lk.ten.Context()
		err = fn(ctx, lk.run)
		if err != nil && ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
			err = fmt.Errorf("%w (%v)", err, context.Cause(ctx))
		}
		if err != nil {
			l.mu.Lock()
			lk.err = err
			l.mu.Unlock()
		}
		return err
	})
}

// take returns the latest run of key in flight that no task has taken,
// and marks it taken.
func (l *Locker) take(key string) (*runLock, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	runs := l.inflight[key]
	for i := len(runs) - 1; i >= 0; i-- {
		if lk := runs[i]; !lk.task {
			lk.task = true
			return lk, nil
		}
	}
	return nil, fmt.Errorf("%w: Task %q ran with no run of %q in flight: give the scheduler this Locker "+
		"(gocron.WithDistributedLocker) and the job the name %q (gocron.WithName)", ddblease.ErrInvalid, key, key, key)
}

// runLock is the gocron.Lock of one claimed run.
type runLock struct {
	l    *Locker
	key  string
	run  *ddblease.JobRun
	ten  *ddblease.Tenure // the tenure it was claimed under
	err  error            // guarded by l.mu
	task bool             // a Task runs it; guarded by l.mu
	// unlocked is set by Unlock; guarded by l.mu
	unlocked bool
}

// Unlock records the run as finished: succeeded, or failed with the error
// its Task's function returned or RecordError recorded. It is bounded by
// the lease's CallTimeout and made even when ctx has ended (gocron passes
// its job context, which its shutdown cancels). A run that a newer tenure
// took over or marked abandoned is refused with an error wrapping
// ddblease.ErrStaleFence. Then the run leaves its tenure's drain.
func (lk *runLock) Unlock(context.Context) error {
	l := lk.l
	l.mu.Lock()
	if lk.unlocked {
		l.mu.Unlock()
		return fmt.Errorf("%w: the run of %q slot %s was already unlocked", ddblease.ErrInvalid, lk.key, lk.run.Slot().Format(time.RFC3339Nano))
	}
	lk.unlocked = true
	runs := l.inflight[lk.key]
	for i, r := range runs {
		if r == lk {
			l.inflight[lk.key] = append(runs[:i:i], runs[i+1:]...)
			break
		}
	}
	if len(l.inflight[lk.key]) == 0 {
		delete(l.inflight, lk.key)
	}
	runErr := lk.err
	l.mu.Unlock()
	defer lk.ten.Done()
	return lk.run.Finish(context.WithoutCancel(lk.ten.Context()), runErr)
}
