// Command example runs a robfig/cron Cron on each of three replicas, its
// job wrapped by ddbleaserobfig: the job fires every second on every
// replica, and each second's slot runs once, on the replica that leads the
// job, writing a report through a ddblease Guard. Half-way through, the
// leader shuts down (as on SIGTERM): its running firing finishes, it
// resigns, and another replica carries on. It needs no DynamoDB: it starts
// an in-process DynamoDB-compatible server unless -endpoint names one.
//
//	go run ./example                  (from the ddbleaserobfig directory)
//	go run ./example -endpoint http://127.0.0.1:8000
package main

import (
	"context"
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
	"github.com/ddblease/ddblease/ddbleaserobfig"
	"github.com/ddblease/ddblease/ddbleasetest"
	"github.com/robfig/cron/v3"
)

var endpoint = flag.String("endpoint", "", "DynamoDB endpoint URL (default: an in-process server)")

const (
	spec = "* * * * * *" // every second (with cron.WithSeconds)
	job  = "report"
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

	sched, err := cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow).Parse(spec)
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

// replica is one replica's cron, until ctx ends.
func replica(ctx context.Context, db *dynamodb.Client, table, sink, name string) error {
	quiet := slog.New(slog.DiscardHandler)
	// snippet: wrapper
	w, err := ddbleaserobfig.New(db, table, func(o *ddblease.Options) {
		o.Owner = name
		o.LeaseDuration, o.RetryInterval = 3*time.Second, 200*time.Millisecond
		o.Logger = quiet
	})
	if err != nil {
		return err
	}
	guard, err := ddblease.NewGuard(db, table, job)
	if err != nil {
		return err
	}
	c := cron.New(cron.WithSeconds(), cron.WithLocation(time.UTC))
	sched, err := cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow).Parse(spec)
	if err != nil {
		return err
	}
	j, err := w.Job(job, sched, func(ctx context.Context, run *ddblease.JobRun) error {
		return guard.TransactWrite(ctx, run.Fence(), []types.TransactWriteItem{{Put: &types.Put{
			TableName: aws.String(sink),
			Item: map[string]types.AttributeValue{
				"pk":    &types.AttributeValueMemberS{Value: run.IdempotencyKey()},
				"fence": &types.AttributeValueMemberN{Value: strconv.FormatInt(run.Fence(), 10)},
			},
			ConditionExpression: aws.String("attribute_not_exists(pk)"),
		}}})
	})
	if err != nil {
		return err
	}
	c.Schedule(sched, j)
	if err := w.Start(ctx); err != nil {
		return err
	}
	c.Start()
	<-ctx.Done()
	<-c.Stop().Done() // no new firing; waits for the running one, whose context lives on
	return w.Wait()   // the running firing recorded, then the lease resigned
	// snippet: end
}
