package ddbleaserobfig_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/ddbleaserobfig"
	"github.com/robfig/cron/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const deploySpec = "*/2 * * * * *" // every other second

// TestRollingDeployLosesNoEffect runs two real robfig crons with Wrappers
// on one table and shuts the leader down, the documented way, while a run
// is in flight: the lease is draining when the run writes its effect
// through Guard.Put keyed by the run's idempotency key. The effect is
// written, the run is recorded succeeded, the lease is resigned after it,
// and the other replica carries on: every slot in the window has its
// effect exactly once, and its run item says succeeded.
func TestRollingDeployLosesNoEffect(t *testing.T) {
	t.Parallel()
	table, sink := srv.NewTable(t), srv.NewKeyTable(t, "pk")
	sched, err := secondsParser.Parse(deploySpec)
	require.NoError(t, err)

	var mu sync.Mutex
	effects := map[time.Time][]string{}
	var errs []error
	holdNext, inside := "", make(chan time.Time)

	type rep struct {
		w       *ddbleaserobfig.Wrapper
		c       *cron.Cron
		sigterm context.CancelFunc
		stopped bool
	}
	stop := func(r *rep) error { // the documented shutdown on SIGTERM
		if r.stopped {
			return nil
		}
		r.stopped = true
		r.sigterm()
		<-r.c.Stop().Done()
		return r.w.Wait()
	}
	add := func(name string) *rep {
		draining := make(chan struct{})
		var once sync.Once
		db := srv.Client(nil)
		w, err := ddbleaserobfig.New(db, table, func(o *ddblease.Options) {
			o.Owner, o.Logger = name, quiet
			o.LeaseDuration, o.HeartbeatInterval, o.RetryInterval = 2*time.Second, 600*time.Millisecond, 150*time.Millisecond
			o.CallTimeout, o.MaxClockSkew, o.DrainTimeout = 500*time.Millisecond, 400*time.Millisecond, 10*time.Second
			o.Observer = func(ev ddblease.Event) {
				if ev.Kind == ddblease.EventDraining {
					once.Do(func() { close(draining) })
				}
			}
		})
		require.NoError(t, err)
		guard, err := ddblease.NewGuard(db, table, jobName)
		require.NoError(t, err)
		j, err := w.Job(jobName, sched, func(ctx context.Context, run *ddblease.JobRun) error {
			mu.Lock()
			hold := holdNext == name
			if hold {
				holdNext = ""
			}
			mu.Unlock()
			if hold {
				inside <- run.Slot()
				<-draining // the shutdown lands mid-run
			}
			_, err := guard.Put(ctx, run.Fence(), &dynamodb.PutItemInput{
				TableName: aws.String(sink),
				Item: map[string]types.AttributeValue{
					"pk":   &types.AttributeValueMemberS{Value: run.IdempotencyKey()},
					"slot": &types.AttributeValueMemberS{Value: run.Slot().Format(time.RFC3339Nano)},
					"by":   &types.AttributeValueMemberS{Value: name},
				},
				ConditionExpression: aws.String("attribute_not_exists(pk)"),
			})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("%s slot %s fence %d: %w", name, run.Slot().Format(time.TimeOnly), run.Fence(), err))
				return err
			}
			effects[run.Slot()] = append(effects[run.Slot()], name)
			return nil
		})
		require.NoError(t, err)
		c := cron.New(cron.WithLocation(time.UTC), cron.WithParser(secondsParser))
		c.Schedule(sched, j)
		ctx, sigterm := context.WithCancel(context.Background())
		require.NoError(t, w.Start(ctx))
		c.Start()
		r := &rep{w: w, c: c, sigterm: sigterm}
		t.Cleanup(func() { _ = stop(r) })
		return r
	}
	ran := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(effects)
	}

	r0 := add("r0")
	waitUntil(t, func() bool { return r0.w.Lease(jobName).IsLeader() })
	r1 := add("r1")
	waitUntil(t, func() bool { return ran() >= 1 })
	mu.Lock()
	holdNext = "r0"
	mu.Unlock()
	var held time.Time
	select {
	case held = <-inside:
	case <-time.After(30 * time.Second):
		t.Fatal("r0 never ran again")
	}
	assert.NoError(t, stop(r0), "r0's drain and resignation")
	before := ran()
	waitUntil(t, func() bool { return ran() >= before+2 })
	assert.NoError(t, stop(r1))

	mu.Lock()
	defer mu.Unlock()
	assert.Empty(t, errs, "failed writes")
	var slots []time.Time
	for s := range effects {
		slots = append(slots, s)
	}
	slices.SortFunc(slots, time.Time.Compare)
	var window []time.Time
	for x := slots[0]; !x.After(slots[len(slots)-1]); x = sched.Next(x).UTC() {
		window = append(window, x)
	}
	t.Logf("slots %s to %s; r0 shut down in slot %s", window[0].Format(time.TimeOnly), window[len(window)-1].Format(time.TimeOnly), held.Format(time.TimeOnly))
	assert.Equal(t, []string{"r0"}, effects[held], "the run in flight at the shutdown wrote its effect")
	for _, s := range window {
		assert.Len(t, effects[s], 1, "slot %s: effect written by %v", s.Format(time.TimeOnly), effects[s])
	}
	out, err := srv.Client(nil).Scan(context.Background(), &dynamodb.ScanInput{TableName: aws.String(sink)})
	require.NoError(t, err)
	assert.Len(t, out.Items, len(window), "one effect per slot in the sink")

	l, err := ddblease.New(srv.Client(nil), table, jobName)
	require.NoError(t, err)
	runs, err := l.ListRuns(context.Background(), sched, window[0], window[len(window)-1])
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
