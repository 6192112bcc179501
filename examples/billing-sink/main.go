// Command billing-sink plays a nightly billing job whose tick writes an
// invoice through a ddblease Guard, and an old leader that is paused in the
// middle of last night's run (a long GC pause, a frozen VM) and wakes up
// after a standby took over and billed the night itself: the old leader's
// invoice write and its attempt to record the run are refused. It needs no
// DynamoDB: it starts an in-process DynamoDB-compatible server unless
// -endpoint names one.
//
//	go run ./examples/billing-sink
//	go run ./examples/billing-sink -endpoint http://127.0.0.1:8000
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
)

var (
	endpoint = flag.String("endpoint", "", "DynamoDB endpoint URL (default: an in-process server)")
	lease    = flag.Duration("lease", 2*time.Second, "LeaseDuration")
)

const job = "billing-nightly"

var start = time.Now()

// say prints a line of the story, stamped with the time since start.
func say(format string, args ...any) {
	fmt.Printf("%7.3fs  %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
}

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "billing-sink:", err)
		os.Exit(1) // run has joined every goroutine by now
	}
}

func run() error {
	if *endpoint != "" {
		os.Setenv(ddbtest.EndpointEnv, *endpoint) // ddbtest.Start honours it
	}
	srv := ddbtest.Start()
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := srv.Client(nil)
	table := "billing-" + ddbtest.RandomID()
	if err := ddblease.CreateTable(ctx, db, table); err != nil {
		return err
	}
	options := func(owner string) func(*ddblease.Options) {
		return func(o *ddblease.Options) {
			o.Owner = owner
			o.LeaseDuration = *lease
			o.RetryInterval = *lease / 10
			o.MaxClockSkew = *lease / 10
			o.Logger = slog.New(slog.DiscardHandler)
		}
	}
	// Every replica runs the same schedule with the same job options. A
	// billing run that may be repeated must be idempotent per slot: the
	// invoice is keyed by the slot, written through the guard.
	nightly := ddblease.Every(24 * time.Hour) // midnight UTC
	jobOptions := func(o *ddblease.JobOptions) {
		o.Rerun = ddblease.Rerun         // a newer tenure re-runs a run left running
		o.CatchUpWindow = 24 * time.Hour // a missed night is billed late rather than never
	}
	guard, err := ddblease.NewGuard(db, table, job)
	if err != nil {
		return err
	}
	lastNight := nightly.Next(time.Now().Add(-24 * time.Hour))
	invoiceKey := "invoice#" + lastNight.Format("2006-01-02")
	writeInvoice := func(ctx context.Context, fence int64, by string) error {
		_, err := guard.Put(ctx, fence, &dynamodb.PutItemInput{
			TableName: aws.String(table),
			Item: map[string]types.AttributeValue{
				"pk":     &types.AttributeValueMemberS{Value: invoiceKey},
				"sk":     &types.AttributeValueMemberS{Value: "invoice"},
				"amount": &types.AttributeValueMemberN{Value: "1250"},
				"by":     &types.AttributeValueMemberS{Value: by},
			},
		})
		return err
	}

	// Replica A leads, claims last night's slot and starts billing.
	a, err := ddblease.New(db, table, job, options("replica-a"))
	if err != nil {
		return err
	}
	fenceA, err := a.TryAcquire(ctx)
	if err != nil {
		return err
	}
	runA, err := a.Claim(ctx, lastNight, jobOptions)
	if err != nil {
		return err
	}
	say("replica-a leads with fence %d and claims the slot %s", fenceA, runA.Slot().Format(time.RFC3339))
	say("replica-a is paused while computing the invoice: it stops renewing its lease")

	// Replica B runs the schedule as a standby. Once A's lease has expired
	// it leads, and its catch-up finds last night's run left running by an
	// older fence: under the Rerun policy it bills the night itself.
	b, err := ddblease.New(db, table, job, options("replica-b"))
	if err != nil {
		return err
	}
	bctx, stopB := context.WithCancel(ctx)
	defer stopB()
	billed := make(chan struct{})
	var once sync.Once
	errB := make(chan error, 1)
	go func() {
		errB <- b.RunSchedule(bctx, nightly, func(ctx context.Context, run *ddblease.JobRun) error {
			say("replica-b leads and runs the slot %s again with fence %d", run.Slot().Format(time.RFC3339), run.Fence())
			if err := writeInvoice(ctx, run.Fence(), "replica-b"); err != nil {
				return err
			}
			say("replica-b wrote %s with fence %d", invoiceKey, run.Fence())
			once.Do(func() { close(billed) })
			return nil
		}, jobOptions)
	}()
	select {
	case <-billed:
	case err := <-errB:
		return fmt.Errorf("replica-b stopped: %v", err)
	case <-ctx.Done():
		return ctx.Err()
	}

	// A wakes up and carries on where it was paused.
	say("replica-a wakes up and writes its invoice with fence %d", runA.Fence())
	var stale *ddblease.StaleFenceError
	refused := 0
	if err := writeInvoice(ctx, runA.Fence(), "replica-a"); errors.As(err, &stale) {
		refused++
		say("  refused: %v", err)
	} else {
		return fmt.Errorf("the stale write was not refused: %v", err)
	}
	if err := runA.Finish(ctx, nil); errors.As(err, &stale) {
		refused++
		say("replica-a tries to record the run as succeeded: refused: %v", err)
	} else {
		return fmt.Errorf("the stale finish was not refused: %v", err)
	}

	// SIGTERM for B: it drains and resigns.
	stopB()
	if err := <-errB; err != nil {
		return err
	}
	runs, err := b.ListRuns(ctx, nightly, lastNight, lastNight)
	if err != nil || len(runs) != 1 {
		return fmt.Errorf("list runs: %v %v", runs, err)
	}
	r := runs[0]
	out, err := db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(table), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: invoiceKey},
			"sk": &types.AttributeValueMemberS{Value: "invoice"}},
	})
	if err != nil {
		return err
	}
	by, fence := "?", "?"
	if v, ok := out.Item["by"].(*types.AttributeValueMemberS); ok {
		by = v.Value
	}
	if v, ok := out.Item["fence"].(*types.AttributeValueMemberN); ok {
		fence = v.Value
	}
	say("run of %s: %s by %s with fence %d, claimed %d times", r.Slot.Format(time.RFC3339), r.Status, r.Owner, r.Fence, r.Claims)
	say("%s: written by %s with fence %s; %d stale writes refused", invoiceKey, by, fence, refused)
	return nil
}
