// Command quickstart is ddblease's full quick start: a replica that leads the job
// "billing-nightly" and writes one invoice per slot of a short schedule,
// fenced, then resigns.
//
//	go run .                                  # an in-process server: no AWS account, no Docker
//	go run . -endpoint http://localhost:8000  # DynamoDB Local, dynalite, LocalStack
//	go run . -region eu-west-1                # AWS, with your usual credentials
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/ddbleasetest"
)

func main() {
	endpoint := flag.String("endpoint", "", "a DynamoDB-compatible endpoint, such as http://localhost:8000")
	region := flag.String("region", "", "an AWS region; with neither -endpoint nor -region, an in-process server is used")
	every := flag.Duration("every", 2*time.Second, "the schedule: one slot every this long")
	runs := flag.Int("runs", 3, "exit after this many runs")
	flag.Parse()
	if *runs < 1 {
		fmt.Fprintln(os.Stderr, "quickstart: -runs must be at least 1")
		os.Exit(2)
	}

	// SIGTERM or Ctrl-C cancels ctx: the running tick's context is
	// cancelled, the lease is kept alive while the tick returns (at most
	// Options.DrainTimeout), then resigned so that a standby leads at once.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, *endpoint, *region, *every, *runs); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, endpoint, region string, every time.Duration, runs int) error {
	db, done, err := client(ctx, endpoint, region)
	if err != nil {
		return err
	}
	defer done()

	// Once, or in your infrastructure code. The invoices table has the same
	// keys as a lease table (string keys "pk" and "sk"), so CreateTable
	// makes it too. Both calls return at once if the table exists.
	for _, table := range []string{"leases", "invoices"} {
		if err := ddblease.CreateTable(ctx, db, table); err != nil {
			return err
		}
	}
	fmt.Println(`tables "leases" and "invoices" are ready`)

	lease, err := ddblease.New(db, "leases", "billing-nightly")
	if err != nil {
		return err
	}
	guard, err := ddblease.NewGuard(db, "leases", "billing-nightly") // the sink's side
	if err != nil {
		return err
	}

	// Every(2s) fires at each multiple of 2 s since the Unix epoch, so a run
	// shows within seconds. Every(24*time.Hour) fires at midnight UTC: a
	// replica started at noon waits twelve hours, silently. A slot that came
	// due while no one led still runs late if it is at most CatchUpWindow
	// old (15 minutes by default: started at 00:10, it runs the midnight
	// slot at once); older ones are skipped (a replica that led before logs
	// how many). Here the window is one period, so a start runs at most the
	// slot just past.
	sched := ddblease.Every(every)
	start := time.Now()
	ctx, finish := context.WithCancel(ctx)
	defer finish()
	fmt.Printf("campaigning for job %q as %s; one slot every %s\n", "billing-nightly", lease.Owner(), every)
	n := 0
	err = lease.RunSchedule(ctx, sched, func(ctx context.Context, run *ddblease.JobRun) error {
		// Only the leader gets here, once per slot: the slot was claimed
		// first with this tenure's fence, a number that grows with every
		// acquisition of the lease.
		n++
		fmt.Printf("run %d: leader with fence %d, slot %s\n", n, run.Fence(), run.Slot().Format(time.TimeOnly))

		// The invoice is keyed by the slot and written through the guard.
		// Put keeps a high-water mark in the item: it stores our fence in
		// the invoice, and writes only if the stored invoice has no fence or
		// one not above ours. So an older tenure is refused once a newer one
		// has written this same invoice (not for items no newer tenure
		// wrote; hence the slot key). attribute_not_exists(pk) makes each
		// slot's invoice written once.
		_, err := guard.Put(ctx, run.Fence(), &dynamodb.PutItemInput{
			TableName: aws.String("invoices"),
			Item: map[string]types.AttributeValue{
				"pk":     &types.AttributeValueMemberS{Value: run.IdempotencyKey()},
				"sk":     &types.AttributeValueMemberS{Value: "invoice"},
				"amount": &types.AttributeValueMemberN{Value: "42"},
			},
			ConditionExpression: aws.String("attribute_not_exists(pk)"),
		})
		if err != nil {
			fmt.Printf("run %d: invoice refused: %v\n", n, err)
			return err // the run is recorded as failed, with this error
		}
		fmt.Printf("run %d: wrote invoice %q with fence %d\n", n, run.IdempotencyKey(), run.Fence())
		if n == runs {
			finish() // enough for a demo: shut down like on SIGTERM
		}
		return nil // the run is recorded as succeeded
	}, func(o *ddblease.JobOptions) { o.CatchUpWindow = every })
	if err != nil {
		return err
	}
	fmt.Println("stopped and resigned the lease: a standby would lead at once")

	// What the table recorded: one run item per slot.
	records, err := lease.ListRuns(context.Background(), sched, start.Add(-every), time.Now())
	if err != nil {
		return err
	}
	for _, r := range records {
		fmt.Printf("slot %s: %s by fence %d\n", r.Slot.Format(time.TimeOnly), r.Status, r.Fence)
	}
	return nil
}

// client returns a DynamoDB client for the chosen server, and a function
// that releases it.
func client(ctx context.Context, endpoint, region string) (*dynamodb.Client, func(), error) {
	if endpoint == "" && region == "" {
		srv := ddbleasetest.Start() // in process, unless DDBLEASE_TEST_ENDPOINT names a server
		if srv.InProcess() {
			fmt.Println("using an in-process DynamoDB-compatible server at", srv.URL)
		} else {
			fmt.Println("using the server named by DDBLEASE_TEST_ENDPOINT:", srv.URL)
		}
		return srv.Client(), srv.Close, nil
	}
	if region == "" {
		region = "us-east-1" // any region will do for a local server
	}
	opts := []func(*config.LoadOptions) error{config.WithRegion(region)}
	if endpoint != "" {
		// A local server accepts any credentials; static ones keep the SDK
		// from looking for real ones (and from asking EC2 instance metadata).
		opts = append(opts, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("local", "local", "")))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, nil, err
	}
	if endpoint == "" {
		fmt.Println("using DynamoDB in", region, "(or AWS_ENDPOINT_URL_DYNAMODB if set)")
		return dynamodb.NewFromConfig(cfg), func() {}, nil
	}
	fmt.Println("using the DynamoDB-compatible server at", endpoint)
	return dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
		o.BaseEndpoint = aws.String(endpoint)
	}), func() {}, nil
}
