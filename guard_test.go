package ddblease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
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

// Test 3 of the issue. Every form of the guard refuses a stale fence, with
// both fences in the error, and accepts the current one; the transactional
// forms leave nothing written when refused.
func TestGuardFormsRefuseStaleFence(t *testing.T) {
	t.Parallel()
	caps := srv.Caps(t)
	ctx := withTimeout(t, 20*time.Second)
	table, faults, db := tableWithFaults(t)
	// a held fence 1 and claimed a slot; b took over with fence 2.
	a := newLease(t, db, table, "billing", fast("a"), slowLease)
	b := newLease(t, db, table, "billing", fast("b"), slowLease)
	_, err := a.TryAcquire(ctx)
	require.NoError(t, err)
	runA, err := a.Claim(ctx, time.Unix(3600, 0))
	require.NoError(t, err)
	require.NoError(t, a.Resign(ctx))
	_, err = b.TryAcquire(ctx)
	require.NoError(t, err)
	runB, err := b.Claim(ctx, time.Unix(7200, 0))
	require.NoError(t, err)
	g, err := ddblease.NewGuard(db, table, "billing")
	require.NoError(t, err)
	assert.Equal(t, "billing", g.Job())
	requests := func(fn func()) map[string]int {
		before := faults.Counts()
		fn()
		return diff(before, faults.Counts())
	}

	t.Run("Check", func(t *testing.T) {
		assert.Equal(t, map[string]int{"GetItem": 1}, requests(func() { require.NoError(t, g.Check(ctx, 2)) }))
		staleFence(t, g.Check(ctx, 1), 1, 2)
		staleFence(t, g.Check(ctx, 3), 3, 2) // never issued
		assert.Contains(t, g.Check(ctx, 1).Error(), "current fence is 2")
	})

	t.Run("Do", func(t *testing.T) {
		var got []int64
		fn := func(_ context.Context, fence int64) error { got = append(got, fence); return nil }
		require.NoError(t, g.Do(ctx, 2, fn))
		staleFence(t, g.Do(ctx, 1, fn), 1, 2)
		assert.Equal(t, []int64{2}, got)
	})

	t.Run("TransactWrite", func(t *testing.T) {
		write := func(fence int64, extra ...types.TransactWriteItem) error {
			items := append([]types.TransactWriteItem{
				{Put: &types.Put{TableName: aws.String(table), Item: sink(fmt.Sprintf("sink#tx#%d", fence))}},
				{Update: &types.Update{TableName: aws.String(table), Key: key("sink#counter"),
					UpdateExpression:          aws.String("ADD n :one"),
					ExpressionAttributeValues: map[string]types.AttributeValue{":one": nAttr("1")}}},
			}, extra...)
			return g.TransactWrite(ctx, fence, items)
		}
		if !caps.Transactions {
			require.ErrorIs(t, write(2), ddblease.ErrTransactionsUnsupported)
			srv.Require(t, false, "TransactWriteItems")
		}
		assert.Equal(t, map[string]int{"TransactWriteItems": 1}, requests(func() { require.NoError(t, write(2)) }))
		err := write(1, types.TransactWriteItem{Delete: &types.Delete{TableName: aws.String(table), Key: key("sink#tx#2")}})
		staleFence(t, err, 1, 2)
		var tce *types.TransactionCanceledException
		assert.ErrorAs(t, err, &tce, "the SDK's error stays in the chain")
		assert.Empty(t, getRaw(t, srv.Client(nil), table, "sink#tx#1"), "nothing written")
		assert.NotEmpty(t, getRaw(t, srv.Client(nil), table, "sink#tx#2"), "nothing deleted")
		assert.Equal(t, nAttr("1"), getRaw(t, srv.Client(nil), table, "sink#counter")["n"], "nothing updated")
	})

	t.Run("Put", func(t *testing.T) {
		put := func(fence int64, v string, cond string) error {
			in := &dynamodb.PutItemInput{TableName: aws.String(table), Item: sink("sink#put", "v", v)}
			if cond != "" {
				in.ConditionExpression = aws.String(cond)
			}
			_, err := g.Put(ctx, fence, in)
			return err
		}
		assert.Equal(t, map[string]int{"PutItem": 1}, requests(func() { require.NoError(t, put(2, "two", "")) }))
		staleFence(t, put(1, "one", ""), 1, 2)
		staleFence(t, put(1, "one", "attribute_exists(pk)"), 1, 2)
		stored := getRaw(t, srv.Client(nil), table, "sink#put")
		assert.Equal(t, sAttr("two"), stored["v"])
		assert.Equal(t, nAttr("2"), stored["fence"], "the item keeps its fence high-water mark")
		// The user's own condition failing is not a stale fence.
		err := put(2, "again", "attribute_not_exists(pk)")
		var ccf *types.ConditionalCheckFailedException
		require.ErrorAs(t, err, &ccf)
		assert.NotErrorIs(t, err, ddblease.ErrStaleFence)
		require.NoError(t, put(2, "again", "attribute_exists(pk)"))
		if !caps.AllOld {
			// The refusal is explained by a consistent read; the table's
			// key schema is learnt once.
			assert.Equal(t, map[string]int{"PutItem": 1, "GetItem": 1},
				requests(func() { staleFence(t, put(1, "one", ""), 1, 2) }))
		}
	})

	t.Run("Update", func(t *testing.T) {
		update := func(fence int64, expr string, values ...string) error {
			in := &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: key("sink#upd"),
				UpdateExpression: aws.String(expr), ExpressionAttributeValues: map[string]types.AttributeValue{}}
			for i := 0; i+1 < len(values); i += 2 {
				in.ExpressionAttributeValues[values[i]] = nAttr(values[i+1])
			}
			if len(values) == 0 {
				in.ExpressionAttributeValues = nil
			}
			_, err := g.Update(ctx, fence, in)
			return err
		}
		assert.Equal(t, map[string]int{"UpdateItem": 1}, requests(func() { require.NoError(t, update(2, "SET v = :v", ":v", "2")) }))
		require.NoError(t, update(2, "set w = :w, x = :w", ":w", "3"))
		require.NoError(t, update(2, "ADD n :one", ":one", "1"))
		staleFence(t, update(1, "SET v = :v", ":v", "1"), 1, 2)
		staleFence(t, update(1, "ADD n :one", ":one", "1"), 1, 2)
		staleFence(t, update(1, "REMOVE w"), 1, 2)
		stored := getRaw(t, srv.Client(nil), table, "sink#upd")
		assert.Equal(t, nAttr("2"), stored["v"])
		assert.Equal(t, nAttr("3"), stored["w"])
		assert.Equal(t, nAttr("1"), stored["n"])
		assert.Equal(t, nAttr("2"), stored["fence"])
	})

	t.Run("Commit", func(t *testing.T) {
		items := func(fence int64) []types.TransactWriteItem {
			return []types.TransactWriteItem{{Put: &types.Put{TableName: aws.String(table),
				Item: sink(fmt.Sprintf("sink#commit#%d", fence))}}}
		}
		if !caps.Transactions {
			require.ErrorIs(t, runB.Commit(ctx, items(2)), ddblease.ErrTransactionsUnsupported)
			srv.Require(t, false, "TransactWriteItems")
		}
		assert.Equal(t, map[string]int{"TransactWriteItems": 1}, requests(func() { require.NoError(t, runB.Commit(ctx, items(2))) }))
		staleFence(t, runA.Commit(ctx, items(1)), 1, 2)
		assert.Empty(t, getRaw(t, srv.Client(nil), table, "sink#commit#1"), "nothing written")
		runs, err := b.ListRuns(ctx, ddblease.Every(time.Hour), time.Unix(3600, 0), time.Unix(7200, 0))
		require.NoError(t, err)
		require.Len(t, runs, 2)
		assert.Equal(t, ddblease.RunRunning, runs[0].Status, "the refused commit leaves the stale run as it was")
		assert.Equal(t, ddblease.RunSucceeded, runs[1].Status)
	})
}

// Test 4 of the issue. A deposed leader whose client serves stale
// eventually consistent reads (it still sees its own fence and a free slot)
// gets nothing through: the guard reads with a consistent read, and the
// atomic forms and the claim are conditions checked by the table.
func TestStaleReadsCannotPassGuardOrClaim(t *testing.T) {
	t.Parallel()
	caps := srv.Caps(t)
	ctx := withTimeout(t, 20*time.Second)
	table, db := tableAndClient(t)
	stale := &ddbtest.StaleReads{}
	dbA := srv.Client(stale.Wrap)
	slot := time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC)
	slotKey := "jobrun#nightly#2026-11-30T02:00:00Z"
	read := func(c *dynamodb.Client, pk string) map[string]types.AttributeValue {
		out, err := c.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: key(pk)})
		require.NoError(t, err)
		return out.Item
	}
	a, b := deposedPair(t, dbA, db, table, "nightly", func(*ddblease.Lease) {
		// What a's replica sees, and will keep seeing.
		require.Equal(t, nAttr("1"), read(dbA, "lease#nightly")["fence"])
		require.Empty(t, read(dbA, slotKey))
		stale.Freeze()
	})
	run, err := b.Claim(ctx, slot)
	require.NoError(t, err)
	gB, err := ddblease.NewGuard(db, table, "nightly")
	require.NoError(t, err)
	_, err = gB.Put(ctx, run.Fence(), &dynamodb.PutItemInput{TableName: aws.String(table), Item: sink("sink#nightly", "by", "b")})
	require.NoError(t, err)

	// The decorator does serve stale reads: a check that read eventually
	// consistently would accept fence 1.
	require.Equal(t, nAttr("1"), read(dbA, "lease#nightly")["fence"])
	require.Empty(t, read(dbA, slotKey))
	served := stale.Served()
	require.Equal(t, 2, served)

	g, err := ddblease.NewGuard(dbA, table, "nightly")
	require.NoError(t, err)
	staleFence(t, g.Check(ctx, 1), 1, 2)
	staleFence(t, g.Do(ctx, 1, func(context.Context, int64) error {
		t.Error("fn called with a stale fence")
		return nil
	}), 1, 2)
	_, err = g.Put(ctx, 1, &dynamodb.PutItemInput{TableName: aws.String(table), Item: sink("sink#nightly", "by", "a")})
	staleFence(t, err, 1, 2)
	_, err = g.Update(ctx, 1, &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: key("sink#nightly"),
		UpdateExpression: aws.String("SET #by = :a"), ExpressionAttributeNames: map[string]string{"#by": "by"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":a": sAttr("a")}})
	staleFence(t, err, 1, 2)
	if caps.Transactions {
		staleFence(t, g.TransactWrite(ctx, 1, []types.TransactWriteItem{{Put: &types.Put{
			TableName: aws.String(table), Item: sink("sink#nightly#tx")}}}), 1, 2)
	}
	require.True(t, a.IsLeader(), "a still believes it leads")
	_, err = a.Claim(ctx, slot)
	if caps.Transactions {
		require.ErrorIs(t, err, ddblease.ErrLost, "the claim's check on the lease item refuses a deposed leader")
	} else {
		require.ErrorIs(t, err, ddblease.ErrSlotTaken, "the claim's condition refuses a taken slot")
	}
	assert.Equal(t, served, stale.Served(), "neither the guard nor the claim made an eventually consistent read")

	assert.Equal(t, sAttr("b"), getRaw(t, db, table, "sink#nightly")["by"])
	assert.Empty(t, getRaw(t, db, table, "sink#nightly#tx"))
	runs, err := b.ListRuns(ctx, oneSlot(slot), slot, slot)
	require.NoError(t, err)
	require.Len(t, runs, 1)
	assert.Equal(t, "b", runs[0].Owner)
	assert.Equal(t, ddblease.RunRunning, runs[0].Status)
}

// The guard fails closed: a missing or malformed lease item, or a failed
// read, rejects; bad input is an error, never a panic.
func TestGuardFailsClosed(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table, faults, db := tableWithFaults(t)
	g, err := ddblease.NewGuard(db, table, "nightly", func(o *ddblease.GuardOptions) { o.CallTimeout = time.Second })
	require.NoError(t, err)
	called := false
	fn := func(context.Context, int64) error { called = true; return nil }

	t.Run("no lease item", func(t *testing.T) {
		staleFence(t, g.Check(ctx, 1), 1, 0)
		assert.Contains(t, g.Check(ctx, 1).Error(), "no lease")
		staleFence(t, g.Do(ctx, 1, fn), 1, 0)
	})

	t.Run("malformed lease item", func(t *testing.T) {
		putRaw(t, srv.Client(nil), table, withKey("lease#nightly", item("fence", "1", "owner", "x")))
		require.ErrorIs(t, g.Check(ctx, 1), ddblease.ErrMalformedItem)
		require.ErrorIs(t, g.Do(ctx, 1, fn), ddblease.ErrMalformedItem)
	})

	t.Run("read fails", func(t *testing.T) {
		putRaw(t, srv.Client(nil), table, withKey("lease#nightly", map[string]types.AttributeValue{"fence": nAttr("1")}))
		require.NoError(t, g.Check(ctx, 1))
		faults.Set(every("GetItem", ddbtest.ServerError))
		defer faults.Set(nil)
		err := g.Check(ctx, 1)
		require.Error(t, err)
		assert.NotErrorIs(t, err, ddblease.ErrStaleFence)
		require.Error(t, g.Do(ctx, 1, fn))
	})
	assert.False(t, called)

	t.Run("bad input", func(t *testing.T) {
		before := total(faults.Counts())
		for name, opts := range map[string]struct {
			db         ddblease.DynamoDBAPI
			table, job string
			opt        func(*ddblease.GuardOptions)
		}{
			"nil client":       {nil, table, "nightly", nil},
			"short table":      {db, "ab", "nightly", nil},
			"empty job":        {db, table, "", nil},
			"long job":         {db, table, strings.Repeat("j", ddblease.MaxJobLength+1), nil},
			"negative timeout": {db, table, "nightly", func(o *ddblease.GuardOptions) { o.CallTimeout = -1 }},
			"control char":     {db, table, "nightly", func(o *ddblease.GuardOptions) { o.FenceAttribute = "f\n" }},
		} {
			_, err := ddblease.NewGuard(opts.db, opts.table, opts.job, opts.opt)
			require.ErrorIs(t, err, ddblease.ErrInvalid, name)
		}
		require.ErrorIs(t, g.Check(ctx, 0), ddblease.ErrInvalid)
		require.ErrorIs(t, g.Do(ctx, 1, nil), ddblease.ErrInvalid)
		require.ErrorIs(t, g.TransactWrite(ctx, -1, []types.TransactWriteItem{{}}), ddblease.ErrInvalid)
		require.ErrorIs(t, g.TransactWrite(ctx, 1, nil), ddblease.ErrInvalid)
		require.ErrorIs(t, g.TransactWrite(ctx, 1, make([]types.TransactWriteItem, 100)), ddblease.ErrInvalid)
		_, err := g.Put(ctx, 1, nil)
		require.ErrorIs(t, err, ddblease.ErrInvalid)
		_, err = g.Put(ctx, 1, &dynamodb.PutItemInput{TableName: aws.String(table)})
		require.ErrorIs(t, err, ddblease.ErrInvalid)
		_, err = g.Put(ctx, 0, &dynamodb.PutItemInput{TableName: aws.String(table), Item: key("x")})
		require.ErrorIs(t, err, ddblease.ErrInvalid)
		_, err = g.Put(ctx, 1, &dynamodb.PutItemInput{TableName: aws.String(table), Item: key("x"),
			ExpressionAttributeNames: map[string]string{"#ddbleaseFence": "x"}})
		require.ErrorIs(t, err, ddblease.ErrInvalid)
		_, err = g.Update(ctx, 1, &dynamodb.UpdateItemInput{TableName: aws.String(table)})
		require.ErrorIs(t, err, ddblease.ErrInvalid)
		_, err = g.Update(ctx, 1, &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: key("x"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":ddbleaseFence": nAttr("1")}})
		require.ErrorIs(t, err, ddblease.ErrInvalid)
		assert.Equal(t, before, total(faults.Counts()), "bad input makes no request")
	})

	t.Run("malformed fence mark", func(t *testing.T) {
		putRaw(t, srv.Client(nil), table, sink("sink#bad", "fence", "high"))
		_, err := g.Put(ctx, 1, &dynamodb.PutItemInput{TableName: aws.String(table), Item: key("sink#bad")})
		require.Error(t, err, "a mark that is not a number refuses the write")
		assert.Equal(t, sAttr("high"), getRaw(t, srv.Client(nil), table, "sink#bad")["fence"])
	})
}

// A sink in DynamoDB refuses a stale leader's write with Guard.Put: the
// record keeps the highest fence that wrote it. (Guard.TransactWrite also
// refuses records that no newer fence has written, where the server has
// transactions.)
func ExampleGuard_Put() {
	ctx := context.Background()
	db := srv.Client(nil)
	table := "example-" + ddbtest.RandomID()
	if err := ddblease.CreateTable(ctx, db, table); err != nil {
		fmt.Println(err)
		return
	}
	old, _ := ddblease.New(db, table, "nightly-billing", func(o *ddblease.Options) { o.Owner = "old" })
	cur, _ := ddblease.New(db, table, "nightly-billing", func(o *ddblease.Options) { o.Owner = "new" })
	oldFence, _ := old.TryAcquire(ctx)
	_ = old.Resign(ctx) // a rolling deploy replaces the old leader
	newFence, _ := cur.TryAcquire(ctx)

	g, err := ddblease.NewGuard(db, table, "nightly-billing")
	if err != nil {
		fmt.Println(err)
		return
	}
	write := func(fence int64, by string) error {
		_, err := g.Put(ctx, fence, &dynamodb.PutItemInput{
			TableName: aws.String(table),
			Item:      sink("invoice#2026-11", "by", by),
		})
		return err
	}
	fmt.Println("new leader's write:", write(newFence, "new"))
	err = write(oldFence, "old")
	var stale *ddblease.StaleFenceError
	if errors.As(err, &stale) {
		fmt.Println("old leader's write refused: fence", stale.Fence, "current", stale.Current)
	}
	// Output:
	// new leader's write: <nil>
	// old leader's write refused: fence 1 current 2
}
