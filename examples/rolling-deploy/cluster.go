package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
)

const job = "nightly-billing"

// tenure is one acquisition of the lease, as first seen by the watcher or
// by the replica's first job run under it.
type tenure struct {
	r        *replica
	fence    int64
	at       time.Time // when first seen
	acquired time.Time // when the acquiring write was sent (State.AcquiredAt)
}

// started is one job run: one call of the function given to RunSchedule.
type started struct {
	r     *replica
	slot  time.Time
	fence int64
	key   string // the run's IdempotencyKey
	at    time.Time
}

// cluster is the replicas running in this process. run's goroutine spawns
// and stops them; the jobs and the watcher report through the channels and
// the fields under mu.
type cluster struct {
	srv      *ddbtest.Server
	table    string
	starts   chan tenure  // new tenures
	runs     chan started // job runs as they start (buffered; dropped when full)
	running  atomic.Int32 // job runs in progress: more than one is a split brain
	stopped  chan struct{}
	watching sync.WaitGroup
	once     sync.Once

	mu       sync.Mutex
	replicas []*replica // in start order
	history  []tenure
	tenured  map[*replica]int64 // the latest fence seen for each replica
	started  map[string]started // by IdempotencyKey: the slots whose job ran
	effects  map[string]int     // by IdempotencyKey: guarded puts accepted
	problems []string
}

// replica is one instance of the service: its own client, Lease, Guard and
// RunSchedule.
type replica struct {
	name  string
	db    *crashable
	lease *ddblease.Lease
	guard *ddblease.Guard
	stop  context.CancelCauseFunc // cancels RunSchedule's context: the in-process SIGTERM
	dead  chan struct{}           // closed when the process is killed
	done  chan struct{}           // closed when RunSchedule has returned
	err   error                   // RunSchedule's result, once done is closed
}

func newCluster(srv *ddbtest.Server, table string) *cluster {
	c := &cluster{srv: srv, table: table, starts: make(chan tenure, 16), runs: make(chan started, 256),
		stopped: make(chan struct{}), tenured: map[*replica]int64{}, started: map[string]started{}, effects: map[string]int{}}
	c.watching.Add(1)
	go c.watch()
	return c
}

// jobOptions are the same for every replica, as RunSchedule requires.
func jobOptions(o *ddblease.JobOptions) { o.CatchUpWindow = *window }

func (c *cluster) spawn(name string) error {
	db := &crashable{DynamoDBAPI: c.srv.Client(nil)}
	dead := make(chan struct{})
	// The library's warnings join the story, without slog's own timestamp,
	// until the process is killed.
	logger := slog.New(slog.NewTextHandler(logWriter{dead}, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}}))
	l, err := ddblease.New(db, c.table, job, func(o *ddblease.Options) {
		o.Owner, o.Logger = name, logger
		o.LeaseDuration, o.HeartbeatInterval, o.RetryInterval = *lease, *beat, *retry
		o.MaxClockSkew, o.DrainTimeout = *skew, *drain
	})
	if err != nil {
		return err // bad flag values
	}
	// The sink's guard goes through the replica's own client: a killed
	// replica's effects do not land either.
	g, err := ddblease.NewGuard(db, c.table, job)
	if err != nil {
		return err
	}
	ctx, stop := context.WithCancelCause(context.Background())
	r := &replica{name: name, db: db, lease: l, guard: g, stop: stop, dead: dead, done: make(chan struct{})}
	c.mu.Lock()
	c.replicas = append(c.replicas, r)
	c.mu.Unlock()
	say("%s starts and campaigns", name)
	go func() {
		defer close(r.done)
		r.err = l.RunSchedule(ctx, ddblease.Every(*tick), func(ctx context.Context, run *ddblease.JobRun) error {
			return c.job(ctx, r, run)
		}, jobOptions)
	}()
	return nil
}

// job is one run of the schedule: RunSchedule calls it on the leader, once
// per slot, after claiming the slot. It does its work, writes the slot's
// effect through the guard, and returns.
func (c *cluster) job(ctx context.Context, r *replica, run *ddblease.JobRun) error {
	if c.running.Add(1) > 1 {
		c.fail("%s started slot %s while another job run was in progress", r.name, hms(run.Slot()))
	}
	defer c.running.Add(-1)
	for _, o := range c.snapshot() {
		if o != r && o.lease.IsLeader() && r.lease.IsLeader() {
			c.fail("%s and %s both believe they lead", r.name, o.name)
		}
	}
	c.noteTenure(r) // if the watcher has not yet
	say("%s runs slot %s with fence %d", r.name, hms(run.Slot()), run.Fence())
	s := started{r, run.Slot(), run.Fence(), run.IdempotencyKey(), time.Now()}
	c.mu.Lock()
	_, dup := c.started[s.key]
	c.started[s.key] = s
	c.mu.Unlock()
	if dup {
		c.fail("slot %s ran twice", hms(s.slot))
	}
	select {
	case c.runs <- s:
	default:
	}

	select {
	case <-r.dead: // a dead process does no more work
		return errors.New("killed")
	case <-time.After(*work):
	case <-ctx.Done():
		if cause := context.Cause(ctx); errors.Is(cause, ddblease.ErrLost) {
			say("%s lost the lease and drops slot %s at once: %v", r.name, hms(run.Slot()), cause)
			return cause
		}
		// Shutdown: RunSchedule keeps the lease alive (marked draining, so
		// standbys poll fast) until we return, then resigns.
		say("%s: %v; finishing slot %s", r.name, context.Cause(ctx), hms(run.Slot()))
		select {
		case <-r.dead:
			return errors.New("killed")
		case <-time.After(*finish):
		}
		// The batch is done: its effect still goes out, fenced.
		ctx = context.WithoutCancel(ctx)
	}
	return c.effect(ctx, r, run)
}

// effect writes the slot's side effect into the sink item keyed by the
// run's IdempotencyKey, through the guard: refused if a newer fence wrote
// the item, and, by the item's own condition, if the slot's effect exists.
func (c *cluster) effect(ctx context.Context, r *replica, run *ddblease.JobRun) error {
	key := run.IdempotencyKey()
	_, err := r.guard.Put(ctx, run.Fence(), &dynamodb.PutItemInput{
		TableName: aws.String(c.table),
		Item: map[string]types.AttributeValue{
			"pk": &types.AttributeValueMemberS{Value: "effect#" + key},
			"sk": &types.AttributeValueMemberS{Value: "effect"},
			"by": &types.AttributeValueMemberS{Value: r.name},
		},
		ConditionExpression: aws.String("attribute_not_exists(pk)"),
	})
	var exists *types.ConditionalCheckFailedException
	switch {
	case err == nil:
		c.mu.Lock()
		c.effects[key]++
		c.mu.Unlock()
		return nil
	case errors.Is(err, ddblease.ErrStaleFence):
		say("%s: the sink refused slot %s's effect: %v", r.name, hms(run.Slot()), err)
	case errors.As(err, &exists):
		say("%s: slot %s's effect is already in the sink; not repeated", r.name, hms(run.Slot()))
		return nil
	}
	return err
}

// watch reports every new tenure, by polling each replica's view of its
// own leadership every millisecond, until shutdown.
func (c *cluster) watch() {
	defer c.watching.Done()
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-c.stopped:
			return
		case <-t.C:
		}
		for _, r := range c.snapshot() {
			c.noteTenure(r)
		}
	}
}

// noteTenure records r's tenure, if it leads, the first time the watcher or
// r's job sees it.
func (c *cluster) noteTenure(r *replica) {
	s := r.lease.State()
	c.mu.Lock()
	if !s.Leader || s.Fence <= c.tenured[r] {
		c.mu.Unlock()
		return
	}
	c.tenured[r] = s.Fence
	tn := tenure{r, s.Fence, time.Now(), s.AcquiredAt}
	c.history = append(c.history, tn)
	c.mu.Unlock()
	say("%s leads with fence %d", r.name, s.Fence)
	select {
	case c.starts <- tn:
	default:
	}
}

func (c *cluster) snapshot() []*replica {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*replica(nil), c.replicas...)
}

// nextLeader waits for the next tenure to start.
func (c *cluster) nextLeader() (tenure, error) {
	select {
	case t := <-c.starts:
		return t, nil
	case <-time.After(3 * *lease):
		return tenure{}, fmt.Errorf("no replica took the lease within %v", 3**lease)
	}
}

// nextRun waits for r to start a job run at or after after.
func (c *cluster) nextRun(r *replica, after time.Time) (started, error) {
	timeout := time.After(3 * *lease)
	for {
		select {
		case s := <-c.runs:
			if s.r == r && !s.at.Before(after) {
				return s, nil
			}
		case <-timeout:
			return started{}, fmt.Errorf("%s ran no slot within %v", r.name, 3**lease)
		}
	}
}

// shutdown cancels every replica and waits until every RunSchedule has
// returned, then stops the watcher.
func (c *cluster) shutdown() {
	c.once.Do(func() {
		rs := c.snapshot()
		for _, r := range rs {
			r.stop(errors.New("shutdown"))
		}
		for _, r := range rs {
			<-r.done
		}
		close(c.stopped)
		c.watching.Wait()
	})
}

func (c *cluster) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	say("!! %s", msg)
	c.mu.Lock()
	c.problems = append(c.problems, msg)
	c.mu.Unlock()
}

// logWriter prints a replica's log lines, unless the replica is dead: a
// killed process says nothing, though its goroutines go on here.
type logWriter struct{ dead <-chan struct{} }

func (w logWriter) Write(p []byte) (int, error) {
	select {
	case <-w.dead:
	default:
		say("    [ddblease] %s", strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

// crashable is a replica's DynamoDB client that can be killed: kill waits
// for the requests already on the wire, and from then on every call fails at
// once, as if the process were gone and its packets never arrived. It covers
// every call a Lease, its job runs and a Guard make on the way; the embedded
// client serves the rest (CreateTable, DescribeTable).
type crashable struct {
	ddblease.DynamoDBAPI
	mu   sync.RWMutex
	dead bool
}

func (c *crashable) kill() { c.mu.Lock(); c.dead = true; c.mu.Unlock() }

func call[T any](c *crashable, f func() (T, error)) (T, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.dead {
		var zero T
		return zero, errors.New("connection refused (the replica was killed)")
	}
	return f()
}

func (c *crashable) GetItem(ctx context.Context, in *dynamodb.GetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	return call(c, func() (*dynamodb.GetItemOutput, error) { return c.DynamoDBAPI.GetItem(ctx, in, o...) })
}

func (c *crashable) PutItem(ctx context.Context, in *dynamodb.PutItemInput, o ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	return call(c, func() (*dynamodb.PutItemOutput, error) { return c.DynamoDBAPI.PutItem(ctx, in, o...) })
}

func (c *crashable) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	return call(c, func() (*dynamodb.UpdateItemOutput, error) { return c.DynamoDBAPI.UpdateItem(ctx, in, o...) })
}

func (c *crashable) DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, o ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error) {
	return call(c, func() (*dynamodb.DeleteItemOutput, error) { return c.DynamoDBAPI.DeleteItem(ctx, in, o...) })
}

func (c *crashable) Query(ctx context.Context, in *dynamodb.QueryInput, o ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error) {
	return call(c, func() (*dynamodb.QueryOutput, error) { return c.DynamoDBAPI.Query(ctx, in, o...) })
}

func (c *crashable) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, o ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	return call(c, func() (*dynamodb.BatchGetItemOutput, error) { return c.DynamoDBAPI.BatchGetItem(ctx, in, o...) })
}

func (c *crashable) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, o ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	return call(c, func() (*dynamodb.TransactWriteItemsOutput, error) {
		return c.DynamoDBAPI.TransactWriteItems(ctx, in, o...)
	})
}
