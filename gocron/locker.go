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

// DefaultTolerance is how far from a slot a firing may be and still be
// matched to it, when Job.Tolerance is zero.
const DefaultTolerance = 2 * time.Second

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
	// the system clock). It must stay below half the shortest gap between
	// slots, or a late firing is taken for the next slot. Default
	// DefaultTolerance, or a quarter of the gap between the next two slots
	// if that is smaller.
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
// lease's clock, within the Tolerance (NearestSlot). It then claims that
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
// Unlock records the run as finished (Lease.Claim's JobRun.Finish):
// succeeded, or failed with the error that RecordError saw. Register
// RecordError as the job's gocron.AfterJobRunsWithError listener, which
// gocron calls before it unlocks.
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
}

var _ gocron.Locker = (*Locker)(nil)

// NewLocker returns a Locker for jobs whose leases and runs live in table.
// Each job's lease is made by ddblease.New with optFns. It makes no call;
// Add the jobs, then Start.
func NewLocker(db ddblease.DynamoDBAPI, table string, optFns ...func(*ddblease.Options)) (*Locker, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: DynamoDB client is nil", ddblease.ErrInvalid)
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
	el, err := NewElector(l.db, l.table, key, l.optFns...)
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
	l.jobs[key] = &lockerJob{Job: job, el: el}
	return nil
}

// Start begins campaigning, in the background, for the lease of every job
// added, until ctx ends; it returns at once. When ctx ends each lease is
// resigned (see Elector.Start); shut the gocron scheduler down first so
// that running jobs finish while their leases are held. Start may be
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
	lease := j.el.Lease()
	now := lease.Options().Now()
	tol := j.Tolerance
	if tol == 0 {
		tol = defaultTolerance(j.Schedule, now)
	}
	slot, err := NearestSlot(j.Schedule, now, tol)
	if err != nil {
		return nil, fmt.Errorf("job %q: %w", key, err)
	}
	opts := j.Options
	run, err := lease.Claim(ctx, slot, func(o *ddblease.JobOptions) { *o = opts })
	if err != nil {
		return nil, err
	}
	lk := &runLock{l: l, key: key, run: run}
	l.mu.Lock()
	l.inflight[key] = append(l.inflight[key], lk)
	l.mu.Unlock()
	return lk, nil
}

// defaultTolerance is DefaultTolerance, or a quarter of the gap between
// the two slots after now if that is smaller.
func defaultTolerance(s ddblease.Schedule, now time.Time) time.Duration {
	a, err := safeNext(s, now)
	if err != nil || a.IsZero() {
		return DefaultTolerance
	}
	b, err := safeNext(s, a)
	if err != nil || b.IsZero() {
		return DefaultTolerance
	}
	return min(DefaultTolerance, b.Sub(a)/4)
}

// Run returns the run that key's job is running on this replica: the one
// its latest Lock claimed and Unlock has not finished. A job calls it for
// the fence to pass to a ddblease.Guard (JobRun.Fence) and the slot's
// idempotency key (JobRun.IdempotencyKey). ok is false when no run of key
// is in flight here.
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
// the oldest of them that has none yet.
func (l *Locker) RecordError(_ uuid.UUID, jobName string, err error) {
	if err == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, lk := range l.inflight[jobName] {
		if lk.err == nil {
			lk.err = err
			return
		}
	}
}

// runLock is the gocron.Lock of one claimed run.
type runLock struct {
	l   *Locker
	key string
	run *ddblease.JobRun
	err error // guarded by l.mu
}

// Unlock records the run as finished: succeeded, or failed with the error
// RecordError recorded. It is bounded by the lease's CallTimeout and made
// even when ctx has ended (gocron passes the job's context, which its
// shutdown cancels). A run that a newer tenure took over or marked
// abandoned is refused with an error wrapping ddblease.ErrStaleFence.
func (lk *runLock) Unlock(ctx context.Context) error {
	l := lk.l
	l.mu.Lock()
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
	return lk.run.Finish(context.WithoutCancel(ctx), runErr)
}
