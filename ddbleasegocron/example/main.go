// Command example runs a gocron scheduler on each of three replicas, with
// a ddblease Locker: the job fires every second on every replica, and each
// second's slot runs once, on the replica that leads the job, writing a
// report through a ddblease Guard. Half-way through, the leader shuts down
// (as on SIGTERM): a run in flight finishes and is recorded under its
// lease, the lease is resigned, and another replica carries on. It needs no DynamoDB: it starts an in-process
// DynamoDB-compatible server unless -endpoint names one.
//
//	go run ./example                  (from the ddbleasegocron directory)
//	go run ./example -endpoint http://127.0.0.1:8000
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/ddbleasegocron"
	"github.com/ddblease/ddblease/ddbleasetest"
	"github.com/go-co-op/gocron/v2"
)

var endpoint = flag.String("endpoint", "", "DynamoDB endpoint URL (default: an in-process server)")

const (
	crontab = "* * * * * *" // every second (gocron's seconds field)
	job     = "report"
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "example:", err)
		os.Exit(1)
	}
}

func run() error {
	if *endpoint != "" {
		os.Setenv(ddbleasetest.EndpointEnv, *endpoint) // ddbleasetest.Start honours it
	}
	srv := ddbleasetest.Start()
	defer srv.Close()
	ctx := context.Background()
	db := srv.Client(nil)
	table, sink := "leases-"+ddbleasetest.RandomID(), "reports-"+ddbleasetest.RandomID()
	if err := ddblease.CreateTable(ctx, db, table); err != nil {
		return err
	}
	if err := ddbleasetest.CreateKeyTable(ctx, db, sink, "pk", types.ScalarAttributeTypeS); err != nil {
		return err
	}

	var wg sync.WaitGroup
	stops := map[string]context.CancelFunc{}
	errs := make(chan error, 3)
	for _, name := range []string{"replica-1", "replica-2", "replica-3"} {
		rctx, stop := context.WithCancel(ctx)
		stops[name] = stop
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := replica(rctx, srv.Client(nil), table, sink, name); err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
			}
		}()
		time.Sleep(700 * time.Millisecond) // staggered starts
	}
	time.Sleep(3 * time.Second)
	l, err := ddblease.New(db, table, job)
	if err != nil {
		return err
	}
	holder, err := l.Holder(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("%s leads; shutting it down\n", holder.Owner)
	if stop := stops[holder.Owner]; stop != nil {
		stop()
	}
	time.Sleep(3 * time.Second)
	for _, stop := range stops {
		stop()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}

	// Every slot ran once: the job runs as the table records them.
	sched, err := ddbleasegocron.CronSchedule(crontab, true, time.UTC)
	if err != nil {
		return err
	}
	now := time.Now()
	runs, err := l.ListRuns(ctx, sched, now.Add(-10*time.Second), now)
	if err != nil {
		return err
	}
	for _, r := range runs {
		fmt.Printf("slot %s  %-9s  fence %d  %s\n", r.Slot.Format("15:04:05"), r.Owner, r.Fence, r.Status)
	}
	return nil
}

// replica is one replica's scheduler: a gocron.Scheduler with a ddblease
// Locker, until ctx ends.
func replica(ctx context.Context, db *dynamodb.Client, table, sink, name string) error {
	quiet := slog.New(slog.DiscardHandler)
	// snippet: locker
	locker, err := ddbleasegocron.NewLocker(db, table, func(o *ddblease.Options) {
		o.Owner = name
		o.LeaseDuration, o.RetryInterval = 3*time.Second, 200*time.Millisecond
		o.Logger = quiet
	})
	if err != nil {
		return err
	}
	sched, err := ddbleasegocron.CronSchedule(crontab, true, time.UTC)
	if err != nil {
		return err
	}
	if err := locker.Add(job, ddbleasegocron.Job{Schedule: sched}); err != nil {
		return err
	}
	guard, err := ddblease.NewGuard(db, table, job)
	if err != nil {
		return err
	}
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker), gocron.WithLocation(time.UTC))
	if err != nil {
		return err
	}
	// The task gets the run its firing claimed, and the run's context:
	// it lives until the run's tenure is lost (or DrainTimeout after
	// ctx ended), not until gocron's Shutdown, which cancels gocron's
	// own job context before it waits.
	_, err = s.NewJob(gocron.CronJob(crontab, true),
		locker.Task(job, func(ctx context.Context, run *ddblease.JobRun) error {
			return guard.TransactWrite(ctx, run.Fence(), []types.TransactWriteItem{{Put: &types.Put{
				TableName: aws.String(sink),
				Item: map[string]types.AttributeValue{
					"pk":    &types.AttributeValueMemberS{Value: run.IdempotencyKey()},
					"fence": &types.AttributeValueMemberN{Value: strconv.FormatInt(run.Fence(), 10)},
				},
				ConditionExpression: aws.String("attribute_not_exists(pk)"),
			}}})
		}),
		gocron.WithName(job), // the Locker's key
	)
	if err != nil {
		return err
	}
	// ctx is the replica's signal.NotifyContext: when it ends, each lease
	// drains (no new run; the running one finishes and is recorded),
	// then resigns, so that a standby takes over at once.
	if err := locker.Start(ctx); err != nil {
		return err
	}
	s.Start()
	<-ctx.Done()
	err = s.Shutdown() // no new firing; waits for the running job
	return errors.Join(err, locker.Wait())
	// snippet: end
}
