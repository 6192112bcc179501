// Command rolling-deploy runs three replicas of a service that share one
// scheduled job through ddblease: each replica calls RunSchedule with the same
// schedule, and the leader runs the job once per slot, writing the slot's
// effect through a Guard. It then plays a rolling deploy (the leader gets
// SIGTERM mid-run, drains and resigns) and a crash (the leader dies without a
// word), printing the hand-over and failover times, and ends with the slots
// as ListRuns reports them, checked against the catch-up rule and the sink.
// It needs no DynamoDB: it starts an in-process DynamoDB-compatible server
// unless -endpoint names one.
//
//	go run ./examples/rolling-deploy
//	go run ./examples/rolling-deploy -endpoint http://127.0.0.1:8000
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

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
	tick     = flag.Duration("tick", 500*time.Millisecond, "the schedule's period: Every(tick), one job run per slot")
	work     = flag.Duration("work", 100*time.Millisecond, "how long one job run takes")
	finish   = flag.Duration("finish", 250*time.Millisecond, "how long the run in progress takes to finish its batch on SIGTERM")
	window   = flag.Duration("catchup", 0, "JobOptions.CatchUpWindow (default: 2 ticks)")
)

var start = time.Now()

// say prints a line of the story, stamped with the time since start.
func say(format string, args ...any) {
	fmt.Printf("%7.3fs  %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
}

// hms formats a slot (or any instant) as HH:MM:SS.mmm, UTC.
func hms(t time.Time) string { return t.UTC().Format("15:04:05.000") }

func main() {
	flag.Parse()
	if *window == 0 {
		*window = 2 * *tick
	}
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
	table := "ddblease-demo-" + ddbtest.RandomID()
	if err := ddblease.CreateTable(ctx, srv.Client(nil), table); err != nil {
		return err
	}
	c := newCluster(srv, table)
	defer c.shutdown() // on an early return too: never leave a RunSchedule behind
	say("server %s, table %s; lease %v, heartbeat %v, standby poll %v, max clock skew %v",
		srv.Name, table, *lease, *beat, *retry, *skew)
	say("schedule Every(%v): one job run of %v per slot, its effect keyed by the run's IdempotencyKey; catch-up window %v",
		*tick, *work, *window)

	say("── 1. three replicas start; one of them wins the lease and runs the slots")
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

	// In a real service, signal.NotifyContext ends RunSchedule's context on
	// SIGTERM. It comes in the middle of a run, which is drained.
	old := first.r
	if _, err := c.nextRun(old, time.Now()); err != nil {
		return err
	}
	time.Sleep(*work / 2)
	say("── 2. rolling deploy: ECS sends SIGTERM to the leader, %s, in the middle of a run", old.name)
	sigterm := time.Now()
	old.stop(errors.New("SIGTERM"))
	next, err := c.nextLeader()
	if err != nil {
		return err
	}
	handover := next.at.Sub(sigterm)
	say("HAND-OVER %.3fs: SIGTERM to %s → %s leads with fence %d (%v of it was %s finishing its batch)",
		handover.Seconds(), old.name, next.r.name, next.fence, *finish, old.name)
	after, err := c.nextRun(next.r, sigterm)
	if err != nil {
		return err
	}
	say("%s's first run: slot %s, %.3fs after SIGTERM", next.r.name, hms(after.slot), after.at.Sub(sigterm).Seconds())
	<-old.done
	say("%s's RunSchedule returned %v; ECS starts its replacement", old.name, old.err)
	if err := c.spawn("replica-4"); err != nil {
		return err
	}

	victim := next.r
	last, err := c.nextRun(victim, time.Now())
	if err != nil {
		return err
	}
	time.Sleep(time.Until(last.at.Add(*work + (*tick-*work)/2))) // between two runs
	say("── 3. %s crashes (kill -9) between two runs: no drain, no resign; its requests stop", victim.name)
	// Nothing the victim sends reaches the table any more, then its job
	// stops. Its State is what it believed as it died.
	crash := time.Now()
	victim.db.kill()
	believed := victim.lease.State()
	close(victim.dead)
	rec, err := c.snapshot()[3].lease.Holder(ctx) // replica-4 looks
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
	caught, err := c.nextRun(took.r, crash)
	if err != nil {
		return err
	}
	say("%s's first run: slot %s, %v after it fell due", took.r.name, hms(caught.slot),
		caught.at.Sub(caught.slot).Round(time.Millisecond))
	if err := c.spawn("replica-5"); err != nil {
		return err
	}
	time.Sleep(2 * *beat)

	say("── 4. shutdown: cancel every replica's context and wait for every RunSchedule to return")
	c.shutdown()
	for _, r := range c.snapshot() {
		say("%s: RunSchedule returned %s", r.name, strings.ReplaceAll(fmt.Sprint(r.err), "\n", " | "))
	}
	var history []string
	for i, t := range c.history {
		history = append(history, fmt.Sprintf("%d (%s)", t.fence, t.r.name))
		if i > 0 && t.fence <= c.history[i-1].fence {
			c.fail("fence %d was issued after fence %d", t.fence, c.history[i-1].fence)
		}
	}
	fmt.Printf("\nfence history: %s\n", strings.Join(history, ", "))
	sum, err := c.summary(ctx, marks{handover: next.fence, victim: next.fence, failover: took.fence})
	if err != nil {
		return err
	}
	fmt.Printf("\nhand-over (SIGTERM → next leader holds the lease): %.3fs, of which %v draining; its first run %.3fs after SIGTERM\n",
		handover.Seconds(), *finish, after.at.Sub(sigterm).Seconds())
	fmt.Printf("failover  (crash → next leader holds the lease):   %.3fs, lease duration %v\n", failover.Seconds(), *lease)
	fmt.Printf("slots: %d run, %d missed during the hand-over, %d during the failover (%s)\n",
		sum.run, sum.handover, sum.missed, sum.verdict)
	if len(c.problems) > 0 {
		return fmt.Errorf("%s", strings.Join(c.problems, "; "))
	}
	return nil
}
