// Command rolling-deploy runs three replicas of a service that share one
// singleton job through ddblease, then plays a rolling deploy (the leader gets
// SIGTERM, drains and resigns) and a crash (the leader dies without a word),
// printing the hand-over and failover times. It needs no DynamoDB: it starts
// an in-process DynamoDB-compatible server unless -endpoint names one.
//
//	go run ./examples/rolling-deploy
//	go run ./examples/rolling-deploy -endpoint http://127.0.0.1:8000
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
)

var (
	endpoint = flag.String("endpoint", "", "DynamoDB endpoint URL (default: an in-process server)")
	lease    = flag.Duration("lease", 3*time.Second, "LeaseDuration")
	beat     = flag.Duration("heartbeat", time.Second, "HeartbeatInterval")
	retry    = flag.Duration("retry", 200*time.Millisecond, "RetryInterval: how often standbys poll")
	skew     = flag.Duration("skew", 200*time.Millisecond, "MaxClockSkew")
	drain    = flag.Duration("drain", 2*time.Second, "DrainTimeout")
	tick     = flag.Duration("tick", 500*time.Millisecond, "how often the leader's job prints a line")
	finish   = flag.Duration("finish", 250*time.Millisecond, "how long the job takes to finish its batch on SIGTERM")
)

var start = time.Now()

// say prints a line of the story, stamped with the time since start.
func say(format string, args ...any) {
	fmt.Printf("%7.3fs  %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
}

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "rolling-deploy:", err)
		os.Exit(1) // run has joined every goroutine by now
	}
}

func run() error {
	if *endpoint != "" {
		os.Setenv(ddbtest.EndpointEnv, *endpoint) // ddbtest.Start honours it
	}
	srv := ddbtest.Start()
	defer srv.Close()
	ctx := context.Background()
	c := &cluster{srv: srv, table: "ddblease-demo-" + ddbtest.RandomID(), starts: make(chan tenure, 16)}
	if err := ddblease.CreateTable(ctx, srv.Client(nil), c.table); err != nil {
		return err
	}
	say("server %s, table %s; lease %v, heartbeat %v, standby poll %v, max clock skew %v",
		srv.Name, c.table, *lease, *beat, *retry, *skew)
	defer c.shutdown() // on an early return too: never leave a Run behind

	say("── 1. three replicas start; one of them wins the lease")
	for _, name := range []string{"replica-1", "replica-2", "replica-3"} {
		if err := c.spawn(name); err != nil {
			return err
		}
	}
	first, err := c.nextLeader()
	if err != nil {
		return err
	}
	say("%s is the leader with fence %d; the others poll as standbys", first.r.name, first.fence)
	time.Sleep(2 * *beat)

	say("── 2. rolling deploy: ECS sends SIGTERM to the leader, %s", first.r.name)
	// In a real service, signal.NotifyContext ends Run's context on SIGTERM.
	old := first.r
	sigterm := time.Now()
	old.stop(errors.New("SIGTERM"))
	next, err := c.nextLeader()
	if err != nil {
		return err
	}
	handover := next.at.Sub(sigterm)
	say("HAND-OVER %.3fs: SIGTERM to %s → %s leads with fence %d (%v of it was %s finishing its batch)",
		handover.Seconds(), old.name, next.r.name, next.fence, *finish, old.name)
	<-old.done
	say("%s's Run returned %v; ECS starts its replacement", old.name, old.err)
	if err := c.spawn("replica-4"); err != nil {
		return err
	}
	time.Sleep(2**beat + *beat/2) // a crash strikes between two heartbeats

	say("── 3. %s crashes (kill -9): no drain, no resign; its requests stop", next.r.name)
	// Nothing the victim sends reaches the table any more, then its job
	// stops. Its State is what it believed as it died.
	victim := next.r
	crash := time.Now()
	victim.db.kill()
	believed := victim.lease.State()
	close(victim.dead)
	rec, err := c.replicas[len(c.replicas)-1].lease.Holder(ctx) // replica-4 looks
	if err != nil {
		return err
	}
	ms := func(t time.Time) time.Duration { return t.Sub(crash).Round(time.Millisecond) }
	say("the table still names %s (fence %d), renewed %v before the crash and expiring %v after it;"+
		" %s itself would have stopped leading %v after it", rec.Owner, rec.Fence, -ms(rec.RenewedAt),
		ms(rec.ExpiresAt), victim.name, ms(believed.Deadline))
	took, err := c.nextLeader()
	if err != nil {
		return err
	}
	failover := took.at.Sub(crash)
	say("FAILOVER %.3fs: crash of %s → %s leads with fence %d, %v after the table's expiry (lease %v)",
		failover.Seconds(), victim.name, took.r.name, took.fence, took.at.Sub(rec.ExpiresAt).Round(time.Millisecond), *lease)
	// A standby takes over once the recorded expiry is MaxClockSkew old, or
	// once it has watched the same renewal unchanged for a whole lease on its
	// own clock, whichever comes first; never before the expiry.
	if took.at.Before(rec.ExpiresAt) || took.at.Before(believed.Deadline) {
		c.fail("%s took over before the dead leader's lease had expired", took.r.name)
	}
	if err := c.spawn("replica-5"); err != nil {
		return err
	}
	time.Sleep(2 * *beat)

	say("── 4. shutdown: cancel every replica's context and wait for every Run to return")
	c.shutdown()
	for _, r := range c.replicas {
		say("%s: Run returned %s", r.name, strings.ReplaceAll(fmt.Sprint(r.err), "\n", " | "))
	}
	var history []string
	for i, t := range c.history {
		history = append(history, fmt.Sprintf("%d (%s)", t.fence, t.r.name))
		if i > 0 && t.fence <= c.history[i-1].fence {
			c.fail("fence %d was issued after fence %d", t.fence, c.history[i-1].fence)
		}
	}
	fmt.Printf("\nfence history: %s\n", strings.Join(history, ", "))
	fmt.Printf("hand-over (SIGTERM → next leader's job starts): %.3fs, of which %v draining\n", handover.Seconds(), *finish)
	fmt.Printf("failover  (crash → next leader's job starts):   %.3fs, lease duration %v\n", failover.Seconds(), *lease)
	if len(c.problems) > 0 {
		return fmt.Errorf("%s", strings.Join(c.problems, "; "))
	}
	return nil
}

// tenure is one start of the leader's job.
type tenure struct {
	r     *replica
	fence int64
	at    time.Time
}

// cluster is the replicas running in this process. Only run's goroutine
// touches replicas; the jobs report through starts, history and problems.
type cluster struct {
	srv      *ddbtest.Server
	table    string
	replicas []*replica // in start order
	starts   chan tenure
	running  atomic.Int32 // jobs running now: more than one is a split brain
	mu       sync.Mutex
	history  []tenure
	problems []string
	once     sync.Once
}

// replica is one instance of the service: its own client, Lease and Run.
type replica struct {
	name  string
	db    *crashable
	lease *ddblease.Lease
	stop  context.CancelCauseFunc // cancels Run's context: the in-process SIGTERM
	dead  chan struct{}           // closed when the process is killed
	done  chan struct{}           // closed when Run has returned
	err   error                   // Run's result, once done is closed
}

func (c *cluster) spawn(name string) error {
	db := &crashable{DynamoDBAPI: c.srv.Client(nil)}
	// The library's warnings join the story, without slog's own timestamp.
	logger := slog.New(slog.NewTextHandler(logWriter{}, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}}))
	l, err := ddblease.New(db, c.table, "nightly-billing", func(o *ddblease.Options) {
		o.Owner, o.Logger = name, logger
		o.LeaseDuration, o.HeartbeatInterval, o.RetryInterval = *lease, *beat, *retry
		o.MaxClockSkew, o.DrainTimeout = *skew, *drain
	})
	if err != nil {
		return err // bad flag values
	}
	ctx, stop := context.WithCancelCause(context.Background())
	r := &replica{name: name, db: db, lease: l, stop: stop, dead: make(chan struct{}), done: make(chan struct{})}
	c.replicas = append(c.replicas, r)
	say("%s starts and campaigns", name)
	go func() {
		defer close(r.done)
		r.err = l.Run(ctx, func(ctx context.Context, fence int64) error { return c.job(ctx, r, fence) })
	}()
	return nil
}

// job is the singleton work. Run calls it on the leader only; it runs until
// its leader context ends, or the process dies.
func (c *cluster) job(ctx context.Context, r *replica, fence int64) error {
	if c.running.Add(1) > 1 {
		c.fail("%s started its job with fence %d while another leader's job was running", r.name, fence)
	}
	defer c.running.Add(-1)
	say("%s leads with fence %d", r.name, fence)
	t := tenure{r, fence, time.Now()}
	c.mu.Lock()
	c.history = append(c.history, t)
	c.mu.Unlock()
	select {
	case c.starts <- t:
	case <-ctx.Done():
	}
	ticker := time.NewTicker(*tick)
	defer ticker.Stop()
	for n := 1; ; n++ {
		select {
		case <-r.dead:
			return errors.New("killed")
		case <-ctx.Done():
			if cause := context.Cause(ctx); errors.Is(cause, ddblease.ErrLost) {
				say("%s lost the lease and stops at once: %v", r.name, cause)
				return nil
			}
			// Shutdown: Run keeps the lease alive (marked draining, so
			// standbys poll fast) until we return, then resigns.
			say("%s: %v; finishing batch %d", r.name, context.Cause(ctx), n)
			time.Sleep(*finish)
			say("%s: batch %d done; Run resigns fence %d", r.name, n, fence)
			return nil
		case <-ticker.C:
			select {
			case <-r.dead: // a dead process does no more work
				return errors.New("killed")
			default:
			}
			say("%s   job: batch %d done under fence %d", r.name, n, fence)
		}
	}
}

// nextLeader waits for the next job to start.
func (c *cluster) nextLeader() (tenure, error) {
	select {
	case t := <-c.starts:
		return t, nil
	case <-time.After(3 * *lease):
		return tenure{}, fmt.Errorf("no replica took the lease within %v", 3**lease)
	}
}

// shutdown cancels every replica and waits until every Run has returned.
func (c *cluster) shutdown() {
	c.once.Do(func() {
		for _, r := range c.replicas {
			r.stop(errors.New("shutdown"))
		}
		for _, r := range c.replicas {
			<-r.done
		}
	})
}

func (c *cluster) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	say("!! %s", msg)
	c.mu.Lock()
	c.problems = append(c.problems, msg)
	c.mu.Unlock()
}

type logWriter struct{}

func (logWriter) Write(p []byte) (int, error) {
	say("    [ddblease] %s", strings.TrimSpace(string(p)))
	return len(p), nil
}

// crashable is a replica's DynamoDB client that can be killed: kill waits
// for the requests already on the wire, and from then on every call fails at
// once, as if the process were gone and its packets never arrived. A Lease
// calls only GetItem and UpdateItem; the embedded client serves the rest.
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

func (c *crashable) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, o ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	return call(c, func() (*dynamodb.UpdateItemOutput, error) { return c.DynamoDBAPI.UpdateItem(ctx, in, o...) })
}
