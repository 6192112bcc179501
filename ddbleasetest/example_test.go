package ddbleasetest_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/ddbleasetest"
)

// A server, a client and a ddblease table. In a test, NewServer(t) and
// srv.NewTable(t) do the same and clean up when the test ends.
func Example() {
	srv := ddbleasetest.Start()
	defer srv.Close()
	db := srv.Client()
	ctx := context.Background()

	table := "leases-" + ddbleasetest.RandomID()
	if err := ddblease.CreateTable(ctx, db, table); err != nil {
		fmt.Println(err)
		return
	}
	lease, err := ddblease.New(db, table, "nightly")
	if err != nil {
		fmt.Println(err)
		return
	}
	fence, err := lease.TryAcquire(ctx)
	fmt.Println("acquired with fence", fence, err)
	fmt.Println("resign:", lease.Resign(ctx))
	// Output:
	// acquired with fence 1 <nil>
	// resign: <nil>
}

// DropResponse lets the server apply a write and loses its answer. The SDK
// retries the request; a conditional write then fails its condition, because
// the first attempt landed: the outcome is in doubt unless the caller reads
// the item back.
func ExampleFaults_dropResponse() {
	srv := ddbleasetest.Start()
	defer srv.Close()
	faults := ddbleasetest.NewFaults()
	db := srv.Client(faults.Wrap)
	ctx := context.Background()
	table, err := newKeyTable(ctx, db, "pk")
	if err != nil {
		fmt.Println(err)
		return
	}

	faults.Fail("PutItem", ddbleasetest.DropResponse, 1)
	_, err = db.PutItem(ctx, &dynamodb.PutItemInput{
		TableName:           aws.String(table),
		Item:                map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "invoice-1"}},
		ConditionExpression: aws.String("attribute_not_exists(pk)"),
	})
	var ccf *types.ConditionalCheckFailedException
	fmt.Println("condition failed:", errors.As(err, &ccf))
	fmt.Println("PutItem requests:", faults.Count("PutItem"), "faulted:", faults.Faulted("PutItem"))

	out, _ := db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName:      aws.String(table),
		Key:            map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "invoice-1"}},
		ConsistentRead: aws.Bool(true),
	})
	fmt.Println("item stored:", out.Item != nil)
	// Output:
	// condition failed: true
	// PutItem requests: 2 faulted: 1
	// item stored: true
}

// Blackhole never answers: the call fails when its context ends. Give every
// call a deadline (ddblease does: Options.CallTimeout).
func ExampleFaults_blackhole() {
	srv := ddbleasetest.Start()
	defer srv.Close()
	faults := ddbleasetest.NewFaults()
	db := srv.Client(faults.Wrap)
	ctx := context.Background()
	table, err := newKeyTable(ctx, db, "pk")
	if err != nil {
		fmt.Println(err)
		return
	}

	faults.Fail(ddbleasetest.AnyOp, ddbleasetest.Blackhole, -1)
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err = db.GetItem(cctx, &dynamodb.GetItemInput{
		TableName: aws.String(table),
		Key:       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "x"}},
	})
	fmt.Println("deadline exceeded:", errors.Is(err, context.DeadlineExceeded))
	// Output:
	// deadline exceeded: true
}

// Throttle answers ProvisionedThroughputExceededException and ServerError
// answers HTTP 500; the SDK retries both (three attempts by default). A test
// can shorten the SDK's backoff between attempts.
func ExampleFaults_throttle() {
	srv := ddbleasetest.Start()
	defer srv.Close()
	faults := ddbleasetest.NewFaults()
	db := dynamodb.New(srv.Client(faults.Wrap).Options(), func(o *dynamodb.Options) {
		o.Retryer = retry.AddWithMaxBackoffDelay(retry.NewStandard(), 10*time.Millisecond)
	})
	ctx := context.Background()
	table, err := newKeyTable(ctx, db, "pk")
	if err != nil {
		fmt.Println(err)
		return
	}
	key := map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "x"}}

	faults.Fail("GetItem", ddbleasetest.Throttle, 1)
	faults.Fail("GetItem", ddbleasetest.ServerError, 1)
	_, err = db.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: key})
	fmt.Println("after a throttle and a 500:", err, "in", faults.Count("GetItem"), "requests")

	faults.Fail("GetItem", ddbleasetest.Throttle, -1)
	_, err = db.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: key})
	var pte *types.ProvisionedThroughputExceededException
	fmt.Println("throttled every time:", errors.As(err, &pte))
	// Output:
	// after a throttle and a 500: <nil> in 3 requests
	// throttled every time: true
}

// Conflict makes a TransactWriteItems fail as if another transaction held
// its items: a TransactionCanceledException with one TransactionConflict
// reason per item. A plain write gets TransactionConflictException.
func ExampleFaults_conflict() {
	srv := ddbleasetest.Start()
	defer srv.Close()
	faults := ddbleasetest.NewFaults()
	db := dynamodb.New(srv.Client(faults.Wrap).Options(), func(o *dynamodb.Options) {
		o.RetryMaxAttempts = 1 // show the error itself, not the SDK's retries
	})
	ctx := context.Background()
	table, err := newKeyTable(ctx, db, "pk")
	if err != nil {
		fmt.Println(err)
		return
	}
	item := func(pk string) types.TransactWriteItem {
		return types.TransactWriteItem{Put: &types.Put{
			TableName: aws.String(table),
			Item:      map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: pk}},
		}}
	}

	faults.Fail(ddbleasetest.AnyOp, ddbleasetest.Conflict, -1)
	_, err = db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{
		TransactItems: []types.TransactWriteItem{item("a"), item("b")},
	})
	var tce *types.TransactionCanceledException
	if errors.As(err, &tce) {
		for _, r := range tce.CancellationReasons {
			fmt.Println("reason:", aws.ToString(r.Code))
		}
	}
	_, err = db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item("c").Put.Item})
	var tc *types.TransactionConflictException
	fmt.Println("plain write conflicted:", errors.As(err, &tc))
	// Output:
	// reason: TransactionConflict
	// reason: TransactionConflict
	// plain write conflicted: true
}

// newKeyTable creates a table keyed by the string attribute key.
func newKeyTable(ctx context.Context, db *dynamodb.Client, key string) (string, error) {
	name := "items-" + ddbleasetest.RandomID()
	return name, ddbleasetest.CreateKeyTable(ctx, db, name, key, types.ScalarAttributeTypeS)
}
