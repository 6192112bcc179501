package ddbleasegocron_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/ddbleasegocron"
	"github.com/go-co-op/gocron/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// deploy is replicas running the documented gocron set-up (a Locker, a job
// made with Locker.Task writing its slot's effect through Guard.Put keyed
// by the run's idempotency key), each shut down the documented way.
type deploy struct {
	t     *testing.T
	table string
	sink  string
	sched ddblease.Schedule

	mu       sync.Mutex
	effects  map[time.Time][]string // replicas whose write of the slot's effect was accepted
	errs     []error
	holdNext string // the replica whose next run waits, once begun, for its shutdown
	inside   chan time.Time
}

// deployReplica is one replica. Its scheduler is given spy, which records
// the job context gocron passes to Lock: the same context gocron passes to
// a plain task, and cancels when its Shutdown begins.
type deployReplica struct {
	name      string
	lk        *ddbleasegocron.Locker
	s         gocron.Scheduler
	sigterm   context.CancelFunc // the signal.NotifyContext of the replica
	gocronCtx atomic.Pointer[context.Context]
	draining  chan struct{} // closed when the lease drains (ddblease.EventDraining)
	stopped   bool
}

type spyLocker struct {
	*ddbleasegocron.Locker
	r *deployReplica
}

func (s spyLocker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	s.r.gocronCtx.Store(&ctx)
	return s.Locker.Lock(ctx, key)
}

const deployCrontab = "*/2 * * * * *" // every other second

func newDeploy(t *testing.T) *deploy {
	sched, err := ddbleasegocron.CronSchedule(deployCrontab, true, time.UTC)
	require.NoError(t, err)
	return &deploy{t: t, table: srv.NewTable(t), sink: srv.NewKeyTable(t, "pk"), sched: sched, effects: map[time.Time][]string{}}
}

func (d *deploy) add(name string) *deployReplica {
	t := d.t
	r := &deployReplica{name: name, draining: make(chan struct{})}
	db := srv.Client(nil)
	var once sync.Once
	lk, err := ddbleasegocron.NewLocker(db, d.table, func(o *ddblease.Options) {
		o.Owner = name
		o.LeaseDuration, o.HeartbeatInterval, o.RetryInterval = 2*time.Second, 600*time.Millisecond, 150*time.Millisecond
		o.CallTimeout, o.MaxClockSkew, o.DrainTimeout = 500*time.Millisecond, 400*time.Millisecond, 10*time.Second
		o.Observer = func(ev ddblease.Event) {
			if ev.Kind == ddblease.EventDraining {
				once.Do(func() { close(r.draining) })
			}
		}
	})
	require.NoError(t, err)
	r.lk = lk
	require.NoError(t, lk.Add(jobName, ddbleasegocron.Job{Schedule: d.sched}))
	guard, err := ddblease.NewGuard(db, d.table, jobName)
	require.NoError(t, err)
	ctx, sigterm := context.WithCancel(context.Background())
	r.sigterm = sigterm
	r.s, err = gocron.NewScheduler(gocron.WithDistributedLocker(spyLocker{lk, r}), gocron.WithLocation(time.UTC))
	require.NoError(t, err)
	_, err = r.s.NewJob(gocron.CronJob(deployCrontab, true),
		lk.Task(jobName, func(ctx context.Context, run *ddblease.JobRun) error {
			d.mu.Lock()
			hold := d.holdNext == name
			if hold {
				d.holdNext = ""
			}
			d.mu.Unlock()
			if hold {
				d.inside <- run.Slot()
				// The shutdown lands mid-run: gocron has cancelled its job
				// context and the lease is draining before the effect is
				// written.
				<-(*r.gocronCtx.Load()).Done()
				<-r.draining
			}
			return d.effect(ctx, guard, r, run)
		}),
		gocron.WithName(jobName))
	require.NoError(t, err)
	require.NoError(t, lk.Start(ctx))
	r.s.Start()
	t.Cleanup(func() { r.stop() })
	return r
}

// effect writes the slot's effect once: keyed by the run's idempotency key,
// fenced by the run's fence.
func (d *deploy) effect(ctx context.Context, guard *ddblease.Guard, r *deployReplica, run *ddblease.JobRun) error {
	_, err := guard.Put(ctx, run.Fence(), &dynamodb.PutItemInput{
		TableName: aws.String(d.sink),
		Item: map[string]types.AttributeValue{
			"pk":   &types.AttributeValueMemberS{Value: run.IdempotencyKey()},
			"slot": &types.AttributeValueMemberS{Value: run.Slot().Format(time.RFC3339Nano)},
			"by":   &types.AttributeValueMemberS{Value: r.name},
		},
		ConditionExpression: aws.String("attribute_not_exists(pk)"),
	})
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		d.errs = append(d.errs, fmt.Errorf("%s slot %s fence %d: %w", r.name, run.Slot().Format(time.TimeOnly), run.Fence(), err))
		return err
	}
	d.effects[run.Slot()] = append(d.effects[run.Slot()], r.name)
	return nil
}

// stop is the documented shutdown on SIGTERM: the signal context ends (the
// Locker's leases drain and resign), the scheduler is shut down, and the
// Locker waited for.
func (r *deployReplica) stop() (shutdownErr, waitErr error) {
	if r.stopped {
		return nil, nil
	}
	r.stopped = true
	r.sigterm()
	return r.s.Shutdown(), r.lk.Wait()
}

func (d *deploy) ran() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.effects)
}

// TestRollingDeployLosesNoEffect runs two real gocron schedulers with
// Lockers on one table and shuts the leader down, the documented way,
// while a run is in flight: gocron's Shutdown has cancelled its job
// context and the lease is draining when the run writes its effect. The
// effect is written, the run is recorded succeeded, the lease is resigned
// after it, and the other replica carries on: every slot in the window has
// its effect exactly once, and its run item says succeeded.
func TestRollingDeployLosesNoEffect(t *testing.T) {
	t.Parallel()
	d := newDeploy(t)
	r0 := d.add("r0")
	waitUntil(t, func() bool { return r0.lk.Elector(jobName).Lease().IsLeader() })
	r1 := d.add("r1")
	waitUntil(t, func() bool { return d.ran() >= 1 })

	d.mu.Lock()
	d.holdNext, d.inside = "r0", make(chan time.Time)
	d.mu.Unlock()
	var held time.Time
	select {
	case held = <-d.inside:
	case <-time.After(30 * time.Second):
		t.Fatal("r0 never ran again")
	}
	shutdownErr, waitErr := r0.stop()
	assert.NoError(t, shutdownErr, "gocron's Shutdown")
	assert.NoError(t, waitErr, "the Locker's drain and resignation")
	before := d.ran()
	waitUntil(t, func() bool { return d.ran() >= before+2 })
	shutdownErr, waitErr = r1.stop()
	assert.NoError(t, shutdownErr)
	assert.NoError(t, waitErr)

	d.mu.Lock()
	effects, errs := d.effects, slices.Clone(d.errs)
	d.mu.Unlock()
	assert.Empty(t, errs, "failed writes")
	var slots []time.Time
	for s := range effects {
		slots = append(slots, s)
	}
	slices.SortFunc(slots, time.Time.Compare)
	window := slotsBetween(d.sched, slots[0], slots[len(slots)-1])
	t.Logf("slots %s to %s; r0 shut down in slot %s", window[0].Format(time.TimeOnly), window[len(window)-1].Format(time.TimeOnly), held.Format(time.TimeOnly))
	assert.Equal(t, []string{"r0"}, effects[held], "the run in flight at the shutdown wrote its effect")
	for _, s := range window {
		assert.Len(t, effects[s], 1, "slot %s: effect written by %v", s.Format(time.TimeOnly), effects[s])
	}

	// The sink holds one effect per slot.
	out, err := srv.Client(nil).Scan(context.Background(), &dynamodb.ScanInput{TableName: aws.String(d.sink)})
	require.NoError(t, err)
	perSlot := map[string]int{}
	for _, it := range out.Items {
		perSlot[it["slot"].(*types.AttributeValueMemberS).Value]++
	}
	assert.Len(t, out.Items, len(window))
	for _, s := range window {
		assert.Equal(t, 1, perSlot[s.Format(time.RFC3339Nano)], "slot %s in the sink", s.Format(time.TimeOnly))
	}

	// Every run item says succeeded; r0's last one too.
	l, err := ddblease.New(srv.Client(nil), d.table, jobName)
	require.NoError(t, err)
	runs, err := l.ListRuns(context.Background(), d.sched, window[0], window[len(window)-1])
	require.NoError(t, err)
	require.Len(t, runs, len(window))
	for _, r := range runs {
		assert.Equal(t, ddblease.RunSucceeded, r.Status, "slot %s by %s: %s", r.Slot.Format(time.TimeOnly), r.Owner, r.Error)
		if r.Slot.Equal(held) {
			assert.Equal(t, "r0", r.Owner)
		}
	}
	assert.Equal(t, "r1", runs[len(runs)-1].Owner, "the standby carried on")
}
