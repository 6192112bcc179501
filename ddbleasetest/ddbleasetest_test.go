package ddbleasetest_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/ddbleasetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func key(pk string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: pk}}
}

// noRetry returns a client that makes one attempt per call, so each call is
// one request.
func noRetry(db *dynamodb.Client) *dynamodb.Client {
	return dynamodb.New(db.Options(), func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 })
}

func TestServerTables(t *testing.T) {
	srv := ddbleasetest.NewServer(t)
	db := srv.Client()
	ctx := context.Background()

	leases := srv.NewTable(t)
	out, err := db.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(leases)})
	require.NoError(t, err)
	require.Len(t, out.Table.KeySchema, 2)
	assert.Equal(t, "pk", aws.ToString(out.Table.KeySchema[0].AttributeName))
	assert.Equal(t, "sk", aws.ToString(out.Table.KeySchema[1].AttributeName))
	lease, err := ddblease.New(db, leases, "job")
	require.NoError(t, err)
	fence, err := lease.TryAcquire(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(1), fence)
	require.NoError(t, lease.Resign(ctx))

	items := srv.NewKeyTable(t, "id")
	_, err = db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(items),
		Item: map[string]types.AttributeValue{"id": &types.AttributeValueMemberS{Value: "1"}}})
	require.NoError(t, err)
	_, err = db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(items), Item: key("1")})
	assert.Error(t, err, "an item without the table's key is refused")
}

func TestCloseTwice(t *testing.T) {
	srv := ddbleasetest.Start()
	assert.True(t, srv.InProcess() == (srv.Name == "minidyn"))
	srv.Close()
	srv.Close()
}

func TestFailCountsAndOrder(t *testing.T) {
	srv := ddbleasetest.NewServer(t)
	faults := ddbleasetest.NewFaults()
	db := noRetry(srv.Client(faults.Wrap))
	table := srv.NewKeyTable(t, "pk")
	ctx := context.Background()
	get := func() error {
		_, err := db.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: key("x")})
		return err
	}
	put := func() error {
		_, err := db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: key("x")})
		return err
	}

	faults.Fail("GetItem", ddbleasetest.ServerError, 2)
	faults.Fail("GetItem", ddbleasetest.Reset, 1)
	var apiErr interface{ ErrorCode() string }
	for i := 0; i < 2; i++ {
		err := get()
		require.ErrorAs(t, err, &apiErr)
		assert.Equal(t, "InternalServerError", apiErr.ErrorCode())
	}
	assert.ErrorIs(t, get(), ddbleasetest.ErrInjectedReset)
	assert.NoError(t, get(), "the entries are used up")
	assert.NoError(t, put(), "other operations pass")
	assert.Equal(t, 4, faults.Count("GetItem"))
	assert.Equal(t, 3, faults.Faulted("GetItem"))
	assert.Equal(t, 1, faults.Count("PutItem"))
	assert.Equal(t, 0, faults.Faulted("PutItem"))

	// Fail entries come before the rule; Clear drops both.
	faults.Set(func(op string) ddbleasetest.Action {
		if op == "PutItem" {
			return ddbleasetest.Throttle
		}
		return ddbleasetest.Pass
	})
	faults.Fail(ddbleasetest.AnyOp, ddbleasetest.ServerError, 1)
	require.ErrorAs(t, put(), &apiErr)
	assert.Equal(t, "InternalServerError", apiErr.ErrorCode())
	require.ErrorAs(t, put(), &apiErr)
	assert.Equal(t, "ProvisionedThroughputExceededException", apiErr.ErrorCode())
	assert.NoError(t, get())
	faults.Clear()
	assert.NoError(t, put())
	assert.Equal(t, map[string]int{"GetItem": 5, "PutItem": 4}, faults.Counts())
}

func TestDropResponseAndHold(t *testing.T) {
	srv := ddbleasetest.NewServer(t)
	faults := ddbleasetest.NewFaults()
	db := noRetry(srv.Client(faults.Wrap))
	table := srv.NewKeyTable(t, "pk")
	ctx := context.Background()
	exists := func(pk string) bool {
		out, err := db.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: key(pk), ConsistentRead: aws.Bool(true)})
		require.NoError(t, err)
		return out.Item != nil
	}

	faults.Fail("PutItem", ddbleasetest.DropResponse, 1)
	_, err := db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: key("dropped")})
	assert.ErrorIs(t, err, ddbleasetest.ErrInjectedReset)
	assert.True(t, exists("dropped"), "the server applied the request")

	faults.Fail("PutItem", ddbleasetest.Reset, 1)
	_, err = db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: key("reset")})
	assert.ErrorIs(t, err, ddbleasetest.ErrInjectedReset)
	assert.False(t, exists("reset"), "a reset request never reached the server")

	faults.Fail("PutItem", ddbleasetest.Hold, 1)
	_, err = db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: key("late")})
	assert.ErrorIs(t, err, ddbleasetest.ErrInjectedReset)
	assert.False(t, exists("late"), "held, not sent yet")
	assert.Equal(t, []int{http.StatusOK}, faults.Release())
	assert.True(t, exists("late"), "landed on Release")
}

func TestBlackholeEndsWithContext(t *testing.T) {
	srv := ddbleasetest.NewServer(t)
	faults := ddbleasetest.NewFaults()
	db := noRetry(srv.Client(faults.Wrap))
	table := srv.NewKeyTable(t, "pk")
	faults.Fail("GetItem", ddbleasetest.Blackhole, 1)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := db.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: key("x")})
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("a black-holed request returned before its context ended: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	cancel()
	assert.ErrorIs(t, <-done, context.Canceled)
}

func TestConflict(t *testing.T) {
	srv := ddbleasetest.NewServer(t)
	faults := ddbleasetest.NewFaults()
	db := noRetry(srv.Client(faults.Wrap))
	table := srv.NewKeyTable(t, "pk")
	ctx := context.Background()

	faults.Fail("TransactWriteItems", ddbleasetest.Conflict, 1)
	_, err := db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{Put: &types.Put{TableName: aws.String(table), Item: key("a")}},
		{ConditionCheck: &types.ConditionCheck{TableName: aws.String(table), Key: key("b"), ConditionExpression: aws.String("attribute_not_exists(pk)")}},
		{Delete: &types.Delete{TableName: aws.String(table), Key: key("c")}},
	}})
	var tce *types.TransactionCanceledException
	require.ErrorAs(t, err, &tce)
	require.Len(t, tce.CancellationReasons, 3)
	for _, r := range tce.CancellationReasons {
		assert.Equal(t, "TransactionConflict", aws.ToString(r.Code))
	}

	faults.Fail("UpdateItem", ddbleasetest.Conflict, 1)
	_, err = db.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: key("a"),
		UpdateExpression: aws.String("SET v = :v"), ExpressionAttributeValues: map[string]types.AttributeValue{":v": &types.AttributeValueMemberN{Value: "1"}}})
	var tc *types.TransactionConflictException
	assert.ErrorAs(t, err, &tc)
	assert.Equal(t, "Conflict", ddbleasetest.Conflict.String())
}
