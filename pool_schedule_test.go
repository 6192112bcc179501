package ddblease_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// poolSlotLog records the runs a pool's RunSchedule hands to fn.
type poolSlotLog struct {
	mu    sync.Mutex
	runs  map[string]map[time.Time][]string // job -> slot -> replicas that ran it
	fence map[string]int64
	t     *testing.T
}

func newPoolSlots(t *testing.T) *poolSlotLog {
	return &poolSlotLog{t: t, runs: map[string]map[time.Time][]string{}, fence: map[string]int64{}}
}

func (s *poolSlotLog) fn(replica string) func(context.Context, string, *ddblease.JobRun) error {
	return func(ctx context.Context, job string, run *ddblease.JobRun) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.runs[job] == nil {
			s.runs[job] = map[time.Time][]string{}
		}
		if run.Trigger() == "" {
			s.runs[job][run.Slot()] = append(s.runs[job][run.Slot()], replica)
		}
		if run.Fence() < s.fence[job] {
			s.t.Errorf("job %s: %s ran with fence %d after fence %d", job, replica, run.Fence(), s.fence[job])
		}
		s.fence[job] = run.Fence()
		return nil
	}
}

// by returns, for each replica, how many slots it ran, and the slots run
// more than once.
func (s *poolSlotLog) by() (perReplica map[string]int, twice []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	perReplica = map[string]int{}
	for job, slots := range s.runs {
		for slot, reps := range slots {
			for _, r := range reps {
				perReplica[r]++
			}
			if len(reps) > 1 {
				twice = append(twice, job+"@"+slot.Format(time.RFC3339Nano))
			}
		}
	}
	return perReplica, twice
}

// A pool's schedules run each slot of each job once, spread over the
// replicas, through a replica that joins and one that leaves; every slot
// fired is recorded as a run of its job.
func TestPoolRunScheduleRunsEachSlotOnce(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	jobs := poolJobs(6)
	log := newPoolSlots(t)
	sched := ddblease.AllJobs(ddblease.Every(500 * time.Millisecond))
	a := newPool(t, db, table, jobs, fast("a"))
	b := newPool(t, db, table, jobs, fast("b"))
	stopA := async(ctx, func(ctx context.Context) error { return a.RunSchedule(ctx, sched, log.fn("a")) })
	time.Sleep(1500 * time.Millisecond)
	stopB := async(ctx, func(ctx context.Context) error { return b.RunSchedule(ctx, sched, log.fn("b")) })
	eventually(t, "b runs its share", func() bool { return len(b.Assigned()) == 3 && len(leaders(b, jobs)) == 3 })
	time.Sleep(1500 * time.Millisecond)
	require.NoError(t, stopA())
	eventually(t, "b leads every job", func() bool { return len(leaders(b, jobs)) == 6 })
	time.Sleep(time.Second)
	require.NoError(t, stopB())
	per, twice := log.by()
	assert.Empty(t, twice, "slots run twice")
	assert.Positive(t, per["a"])
	assert.Positive(t, per["b"])
	admin := newAdmin(t, db, table)
	for _, job := range jobs {
		runs, err := admin.Runs(ctx, job, ddblease.RunRange{})
		require.NoError(t, err)
		log.mu.Lock()
		fired := len(log.runs[job])
		log.mu.Unlock()
		succeeded := 0
		for _, r := range runs {
			if r.Status == ddblease.RunSucceeded {
				succeeded++
			}
		}
		assert.Equal(t, fired, succeeded, "job %s: every slot fired is recorded succeeded", job)
	}
}

// A held job between its slots costs no goroutine: a replica holding 200
// jobs whose next slot is an hour away runs a handful of goroutines for
// the whole pool.
func TestPoolRunScheduleIdleJobsHoldNoGoroutine(t *testing.T) {
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	jobs := poolJobs(200)
	p := newPool(t, db, table, jobs, fast("a"), slowLease)
	stop := async(ctx, func(ctx context.Context) error {
		return p.RunSchedule(ctx, ddblease.AllJobs(ddblease.Every(time.Hour)), func(context.Context, string, *ddblease.JobRun) error { return nil })
	})
	eventually(t, "a leads every job", func() bool { return len(leaders(p, jobs)) == 200 })
	var n int
	var stacks string
	eventually(t, "the steps that began each tenure end", func() bool {
		n, stacks = libraryGoroutines("pool_schedule_test.go")
		return n <= 5
	})
	t.Logf("%s", stacks)
	t.Logf("200 held jobs: %d goroutines in the library", n)
	require.NoError(t, stop())
}

// An operator's trigger on a job of a pool reaches its holder through its
// session: the run is claimed and recorded, once.
func TestPoolRunScheduleTrigger(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	jobs := poolJobs(2)
	triggered := make(chan string, 4)
	p := newPool(t, db, table, jobs, fast("a"))
	stop := async(ctx, func(ctx context.Context) error {
		return p.RunSchedule(ctx, ddblease.AllJobs(ddblease.Every(time.Hour)), func(_ context.Context, job string, run *ddblease.JobRun) error {
			if run.Trigger() != "" {
				triggered <- job
			}
			return nil
		})
	})
	eventually(t, "a leads every job", func() bool { return len(leaders(p, jobs)) == 2 })
	admin := newAdmin(t, db, table)
	tr, err := admin.Trigger(ctx, jobs[1])
	require.NoError(t, err)
	rec, err := admin.WaitRun(ctx, tr, 100*time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, ddblease.RunSucceeded, rec.Status)
	assert.Equal(t, jobs[1], receive(t, (<-chan string)(triggered), "the triggered run"))
	require.NoError(t, stop())
	assert.Empty(t, triggered, "the trigger ran once")
}

// A schedule that misbehaves for one job is an error naming it, before
// anything runs.
func TestPoolRunScheduleBadInput(t *testing.T) {
	table, db := tableAndClient(t)
	p := newPool(t, db, table, poolJobs(2), fast("a"))
	fn := func(context.Context, string, *ddblease.JobRun) error { return nil }
	err := p.RunSchedule(context.Background(), func(job string) ddblease.Schedule {
		if job == "tenant-01" {
			return nil
		}
		return ddblease.Every(time.Minute)
	}, fn)
	require.ErrorIs(t, err, ddblease.ErrInvalid)
	assert.ErrorContains(t, err, `job "tenant-01"`)
	assert.ErrorIs(t, p.RunSchedule(context.Background(), nil, fn), ddblease.ErrInvalid)
	assert.ErrorIs(t, p.RunSchedule(context.Background(), ddblease.AllJobs(ddblease.Every(time.Minute)), nil), ddblease.ErrInvalid)
}

// A job campaigning for its lease has no tenure to step: a change of the
// operator controls read while it campaigns (here the pause an operator
// set while a plain lease held the job) waits for its tenure, which then
// obeys it, and the job runs nothing twice.
func TestPoolRunScheduleControlsReadWhileCampaigning(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	jobs := poolJobs(1)
	plain := newLease(t, db, table, jobs[0], fast("plain"))
	stopPlain := async(ctx, func(ctx context.Context) error {
		return plain.Run(ctx, func(ctx context.Context, _ int64) error { <-ctx.Done(); return nil })
	})
	eventually(t, "the plain lease leads", plain.IsLeader)
	admin := newAdmin(t, db, table)
	_, err := admin.Pause(ctx, jobs[0])
	require.NoError(t, err)
	log := newPoolSlots(t)
	p := newPool(t, db, table, jobs, fast("a"))
	stop := async(ctx, func(ctx context.Context) error {
		return p.RunSchedule(ctx, ddblease.AllJobs(ddblease.Every(200*time.Millisecond)), log.fn("a"))
	})
	time.Sleep(time.Second) // the pool campaigns, reading the held item and its pause
	assert.False(t, p.Lease(jobs[0]).IsLeader())
	require.NoError(t, stopPlain())
	eventually(t, "the pool leads the job", p.Lease(jobs[0]).IsLeader)
	time.Sleep(500 * time.Millisecond)
	per, _ := log.by()
	assert.Zero(t, per["a"], "a paused job runs no slot")
	_, err = admin.Resume(ctx, jobs[0], false)
	require.NoError(t, err)
	eventually(t, "the resumed job runs its slots", func() bool { per, _ := log.by(); return per["a"] >= 2 })
	require.NoError(t, stop())
	_, twice := log.by()
	assert.Empty(t, twice, "slots run twice")
}

// inFlight decorates a client: it delays each UpdateItem of a lease item,
// as a busy table does, and records the most sent at once.
type inFlight struct {
	ddblease.DynamoDBAPI
	table   string
	delay   time.Duration
	mu      sync.Mutex
	now, hi int
}

// slowPoolTable returns a fresh table behind a client whose lease-item
// writes take 20 ms each and are counted in flight, and 200 job names.
func slowPoolTable(t *testing.T) (*inFlight, []string) {
	table, db := tableAndClient(t)
	return &inFlight{DynamoDBAPI: db, table: table, delay: 20 * time.Millisecond}, poolJobs(200)
}

func (c *inFlight) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if sk, _ := in.Key[ddblease.DefaultSortKey].(*types.AttributeValueMemberS); sk == nil || sk.Value != "lease" {
		return c.DynamoDBAPI.UpdateItem(ctx, in, optFns...) // not a write to a lease item
	}
	c.mu.Lock()
	c.now++
	c.hi = max(c.hi, c.now)
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.now--
		c.mu.Unlock()
	}()
	time.Sleep(c.delay)
	return c.DynamoDBAPI.UpdateItem(ctx, in, optFns...)
}

// A replica that starts many jobs at once does not send all their
// acquisitions together: on a slow table, requests queued in the client
// would see their CallTimeout pass before they are sent, and be retried
// for ever. Every job is held, without a failed attempt.
func TestPoolBoundsAcquisitionsInFlight(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	slow, jobs := slowPoolTable(t)
	var retries atomic.Int32
	p := newPool(t, slow, slow.table, jobs, fast("a"), slowLease, func(o *ddblease.Options) {
		o.Observer = func(e ddblease.Event) {
			if e.Kind == ddblease.EventRetry {
				retries.Add(1)
			}
		}
	})
	stop := async(ctx, func(ctx context.Context) error {
		return p.RunSchedule(ctx, ddblease.AllJobs(ddblease.Every(time.Hour)), func(context.Context, string, *ddblease.JobRun) error { return nil })
	})
	eventually(t, "a leads every job", func() bool { return len(leaders(p, jobs)) == len(jobs) })
	slow.mu.Lock()
	hi := slow.hi
	slow.mu.Unlock()
	require.NoError(t, stop())
	t.Logf("200 jobs: at most %d lease-item writes in flight at once", hi)
	assert.LessOrEqual(t, hi, 32, "acquisitions in flight at once")
	assert.Zero(t, retries.Load(), "failed attempts")
}

// A replica that stops hands its jobs over without sending every
// resignation at once, as it acquires them: at most 32 lease-item writes
// are in flight, and every job is resigned (free for the others at once).
func TestPoolBoundsResignationsInFlight(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	slow, jobs := slowPoolTable(t)
	p := newPool(t, slow, slow.table, jobs, fast("a"), slowLease)
	stop := async(ctx, func(ctx context.Context) error {
		return p.Run(ctx, func(ctx context.Context, _ string, _ int64) error { <-ctx.Done(); return nil })
	})
	eventually(t, "a leads every job", func() bool { return len(leaders(p, jobs)) == len(jobs) })
	slow.mu.Lock()
	slow.hi = 0
	slow.mu.Unlock()
	require.NoError(t, stop())
	slow.mu.Lock()
	hi := slow.hi
	slow.mu.Unlock()
	t.Logf("200 jobs: at most %d lease-item writes in flight at once as the pool stopped", hi)
	assert.LessOrEqual(t, hi, 32, "resignations in flight at once")
	for _, job := range jobs {
		h, err := p.Lease(job).Holder(ctx)
		require.NoError(t, err)
		assert.True(t, h.ExpiresAt.IsZero(), "job %s not resigned: %+v", job, h)
	}
}

// slots returns how many slots of job have run.
func (s *poolSlotLog) slots(job string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.runs[job])
}

// An operator's pause and resume of a pool job are handled by the session
// (its renewal takes the handled note out of a set, emptying it): the
// replica's RunSchedule goes on through three pauses, the paused job runs
// no slot while its neighbours run theirs, and the table answers reads
// after, through the same server a user's tests run on.
func TestPoolPauseAndResumeKeepTheReplicaRunning(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	jobs := poolJobs(3)
	log := newPoolSlots(t)
	p := newPool(t, db, table, jobs, fast("a"))
	done := make(chan error, 1)
	go func() {
		done <- p.RunSchedule(ctx, ddblease.AllJobs(ddblease.Every(100*time.Millisecond)), log.fn("a"))
	}()
	admin := newAdmin(t, db, table)
	for round := range 3 {
		eventually(t, "the job runs its slots", func() bool { return log.slots(jobs[0]) >= 2 })
		_, err := admin.Pause(ctx, jobs[0])
		require.NoError(t, err, "round %d", round)
		time.Sleep(300 * time.Millisecond) // a renewal reads the note; the tenure obeys it
		paused, other := log.slots(jobs[0]), log.slots(jobs[1])
		time.Sleep(600 * time.Millisecond) // two heartbeats: renewals that take the note out
		assert.Equal(t, paused, log.slots(jobs[0]), "round %d: a paused job ran a slot", round)
		assert.Greater(t, log.slots(jobs[1]), other, "round %d: the job beside it stopped too", round)
		select {
		case err := <-done:
			t.Fatalf("round %d: RunSchedule returned while the job was paused: %v", round, err)
		default:
		}
		pools, err := admin.Pools(ctx)
		require.NoError(t, err, "round %d: the table answers a Query", round)
		require.Len(t, pools, 1)
		_, err = admin.Resume(ctx, jobs[0], false)
		require.NoError(t, err, "round %d", round)
		before := log.slots(jobs[0])
		eventually(t, "the resumed job runs its slots", func() bool { return log.slots(jobs[0]) >= before+2 })
	}
	select {
	case err := <-done:
		t.Fatalf("RunSchedule returned: %v", err)
	default:
	}
	_, twice := log.by()
	assert.Empty(t, twice, "slots run twice")
}
