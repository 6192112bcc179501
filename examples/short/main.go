// Command short is the README's quick start: while it leads the job
// "billing-nightly", it writes one invoice per slot through the guard.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/ddbleasetest"
)

func main() {
	every := flag.Duration("every", 2*time.Second, "one slot every this long")
	runs := flag.Int("runs", 3, "stop after this many runs (0: at SIGTERM)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	// Your service passes its own client: dynamodb.NewFromConfig(cfg).
	srv := ddbleasetest.Start() // in process, or the server DDBLEASE_TEST_ENDPOINT names
	defer srv.Close()
	db := srv.Client()
	for _, table := range []string{"leases", "invoices"} {
		check(ddblease.CreateTable(ctx, db, table)) // returns at once if it exists
	}
	lease, err := ddblease.New(db, "leases", "billing-nightly")
	check(err)
	guard, err := ddblease.NewGuard(db, "leases", "billing-nightly") // the sink's side
	check(err)

	n := 0
	invoice := func(ctx context.Context, run *ddblease.JobRun) error {
		// Only the leader gets here, once per slot, with its tenure's fence.
		_, err := guard.Put(ctx, run.Fence(), &dynamodb.PutItemInput{
			TableName: aws.String("invoices"),
			Item: map[string]types.AttributeValue{
				// CreateTable made "invoices" with a lease table's keys: pk and sk.
				"pk":     &types.AttributeValueMemberS{Value: run.IdempotencyKey()}, // job#slot
				"sk":     &types.AttributeValueMemberS{Value: "invoice"},
				"amount": &types.AttributeValueMemberN{Value: "42"},
			},
			ConditionExpression: aws.String("attribute_not_exists(pk)"), // one invoice per slot
		})
		if err != nil {
			return err // recorded as the run's failure; a stale fence is refused
		}
		fmt.Printf("wrote invoice %s with fence %d\n", run.IdempotencyKey(), run.Fence())
		if n++; n == *runs {
			stop() // shut down as on SIGTERM: Run resigns once fn returns
		}
		return nil
	}
	check(lease.RunSchedule(ctx, ddblease.Every(*every), invoice))
	fmt.Println("stopped and resigned the lease")
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
