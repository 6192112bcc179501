package ddblease_test

import (
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The guard tells its observer of every request and of every stale fence
// it refuses.
func TestGuardObserver(t *testing.T) {
	t.Parallel()
	caps := srv.Caps(t)
	ctx := withTimeout(t, 20*time.Second)
	table, faults, db := tableWithFaults(t)
	a := newLease(t, db, table, "billing", fast("a"), slowLease)
	_, err := a.TryAcquire(ctx)
	require.NoError(t, err)
	require.NoError(t, a.Resign(ctx))
	b := newLease(t, db, table, "billing", fast("b"), slowLease)
	_, err = b.TryAcquire(ctx)
	require.NoError(t, err)
	var mu sync.Mutex
	var events []ddblease.Event
	g, err := ddblease.NewGuard(db, table, "billing", func(o *ddblease.GuardOptions) {
		o.Observer = func(e ddblease.Event) { mu.Lock(); events = append(events, e); mu.Unlock() }
	})
	require.NoError(t, err)
	take := func() []ddblease.Event {
		mu.Lock()
		defer mu.Unlock()
		e := events
		events = nil
		return e
	}
	type call struct {
		op      string
		outcome ddblease.CallOutcome
	}
	calls := func(es []ddblease.Event) (cs []call, stale []ddblease.Event) {
		for _, e := range es {
			assert.Equal(t, "billing", e.Job)
			assert.Empty(t, e.Owner)
			assert.False(t, e.Time.IsZero())
			switch e.Kind {
			case ddblease.EventCall:
				assert.GreaterOrEqual(t, e.Latency, time.Duration(0))
				assert.Equal(t, e.Outcome == ddblease.CallOK, e.Err == nil)
				cs = append(cs, call{e.Op, e.Outcome})
			case ddblease.EventStaleFence:
				stale = append(stale, e)
			default:
				t.Errorf("unexpected event %v", e.Kind)
			}
		}
		return cs, stale
	}

	require.NoError(t, g.Check(ctx, 2))
	cs, stale := calls(take())
	assert.Equal(t, []call{{"GetItem", ddblease.CallOK}}, cs)
	assert.Empty(t, stale)

	staleFence(t, g.Check(ctx, 1), 1, 2)
	cs, stale = calls(take())
	assert.Equal(t, []call{{"GetItem", ddblease.CallOK}}, cs)
	require.Len(t, stale, 1)
	assert.Equal(t, ddblease.Event{Kind: ddblease.EventStaleFence, Job: "billing", Time: stale[0].Time, Fence: 1, Current: 2, Op: "Check"}, stale[0])

	_, err = g.Put(ctx, 2, &dynamodb.PutItemInput{TableName: aws.String(table), Item: sink("sink#obs")})
	require.NoError(t, err)
	cs, _ = calls(take())
	assert.Equal(t, []call{{"PutItem", ddblease.CallOK}}, cs)

	_, err = g.Put(ctx, 1, &dynamodb.PutItemInput{TableName: aws.String(table), Item: sink("sink#obs")})
	staleFence(t, err, 1, 2)
	cs, stale = calls(take())
	want := []call{{"PutItem", ddblease.CallConditionFailed}}
	if !caps.AllOld {
		want = append(want, call{"DescribeTable", ddblease.CallOK}, call{"GetItem", ddblease.CallOK})
	}
	assert.Equal(t, want, cs)
	require.Len(t, stale, 1)
	assert.Equal(t, "Put", stale[0].Op)
	assert.Equal(t, int64(2), stale[0].Current)

	faults.Set(every("UpdateItem", ddbtest.Reset))
	_, err = g.Update(ctx, 2, &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: key("sink#obs"),
		UpdateExpression: aws.String("SET v = :v"), ExpressionAttributeValues: map[string]types.AttributeValue{":v": nAttr("1")}})
	require.Error(t, err)
	faults.Set(nil)
	cs, _ = calls(take())
	assert.Equal(t, []call{{"UpdateItem", ddblease.CallInDoubt}, {"GetItem", ddblease.CallOK}}, cs)

	if caps.Transactions {
		staleFence(t, g.TransactWrite(ctx, 1, []types.TransactWriteItem{{Put: &types.Put{TableName: aws.String(table),
			Item: sink("sink#obs#tx")}}}), 1, 2)
		cs, stale = calls(take())
		assert.Equal(t, []call{{"TransactWriteItems", ddblease.CallConditionFailed}}, cs)
		require.Len(t, stale, 1)
		assert.Equal(t, "TransactWrite", stale[0].Op)
	}
}

// Issue 8, defect 13: what the README says each form refuses. After a
// takeover, a stale leader's Put of an item that no newer tenure wrote is
// accepted (the item's high-water mark is all Put knows), while
// TransactWrite, which checks the lease item, refuses it.
func TestGuardFormsRefuseWhatTheySay(t *testing.T) {
	t.Parallel()
	caps := srv.Caps(t)
	ctx := withTimeout(t, 20*time.Second)
	table, db := tableAndClient(t)
	a := newLease(t, db, table, "billing", fast("a"), slowLease)
	old, err := a.TryAcquire(ctx)
	require.NoError(t, err)
	require.NoError(t, a.Resign(ctx))
	b := newLease(t, db, table, "billing", fast("b"), slowLease)
	cur, err := b.TryAcquire(ctx)
	require.NoError(t, err)
	require.Greater(t, cur, old)
	g, err := ddblease.NewGuard(db, table, "billing")
	require.NoError(t, err)

	_, err = g.Put(ctx, old, &dynamodb.PutItemInput{TableName: aws.String(table), Item: sink("invoice#untouched")})
	require.NoError(t, err, "no newer fence wrote this item: Put accepts the stale fence")
	_, err = g.Put(ctx, cur, &dynamodb.PutItemInput{TableName: aws.String(table), Item: sink("invoice#touched")})
	require.NoError(t, err)
	_, err = g.Put(ctx, old, &dynamodb.PutItemInput{TableName: aws.String(table), Item: sink("invoice#touched")})
	staleFence(t, err, old, cur)
	staleFence(t, g.Check(ctx, old), old, cur)
	t.Run("TransactWrite", func(t *testing.T) {
		srv.Require(t, caps.Transactions, "TransactWriteItems")
		staleFence(t, g.TransactWrite(ctx, old, []types.TransactWriteItem{{Put: &types.Put{TableName: aws.String(table),
			Item: sink("invoice#untouched-tx")}}}), old, cur)
		assert.Empty(t, getRaw(t, db, table, "invoice#untouched-tx"))
	})
}
