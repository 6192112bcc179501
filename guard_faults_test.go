package ddblease_test

import (
	"context"
	"errors"
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

// Issue 8, defect 6. A guarded write whose first attempt was applied and
// whose answer was lost is reported as applied (and applied once), not as
// the failure of the SDK's retry; on both servers (dynalite returns no item
// with a failed condition: the guard reads it).
func TestGuardWriteLandedAnswerLost(t *testing.T) {
	t.Parallel()
	caps := srv.Caps(t)
	ctx := withTimeout(t, 30*time.Second)
	table, faults, db := tableWithFaults(t)
	raw := srv.Client(nil)
	g, err := ddblease.NewGuard(db, table, "billing")
	require.NoError(t, err)
	requests := func(fn func()) map[string]int {
		before := faults.Counts()
		fn()
		return diff(before, faults.Counts())
	}

	t.Run("README example: Put with attribute_not_exists(pk)", func(t *testing.T) {
		faults.Set(firstN("PutItem", 1, ddbtest.DropResponse))
		defer faults.Set(nil)
		var out *dynamodb.PutItemOutput
		n := requests(func() {
			out, err = g.Put(ctx, 1, &dynamodb.PutItemInput{
				TableName:           aws.String(table),
				Item:                sink("invoice#2026-11", "amount", "42"),
				ConditionExpression: aws.String("attribute_not_exists(pk)"),
			})
		})
		require.NoError(t, err, "the invoice is stored: the write landed")
		require.NotNil(t, out)
		assert.Empty(t, out.Attributes)
		assert.Equal(t, 2, n["PutItem"], "the SDK retried the write whose answer was lost")
		if !caps.AllOld {
			assert.Equal(t, 1, n["GetItem"], "the item is read back where the server returns none")
		}
		stored := getRaw(t, raw, table, "invoice#2026-11")
		assert.Equal(t, sAttr("42"), stored["amount"])
		assert.Equal(t, nAttr("1"), stored["fence"])
		assert.IsType(t, &types.AttributeValueMemberS{}, stored[ddblease.DefaultGuardTokenAttribute], "the write token is stored")
		// The same Put again is the caller's condition failing: not stale.
		_, err = g.Put(ctx, 1, &dynamodb.PutItemInput{TableName: aws.String(table),
			Item: sink("invoice#2026-11"), ConditionExpression: aws.String("attribute_not_exists(pk)")})
		var ccf *types.ConditionalCheckFailedException
		require.ErrorAs(t, err, &ccf)
		assert.NotErrorIs(t, err, ddblease.ErrStaleFence)
	})

	t.Run("unconditional Put", func(t *testing.T) {
		faults.Set(firstN("PutItem", 1, ddbtest.DropResponse))
		defer faults.Set(nil)
		_, err := g.Put(ctx, 1, &dynamodb.PutItemInput{TableName: aws.String(table), Item: sink("sink#plain", "v", "a")})
		require.NoError(t, err)
		assert.Equal(t, sAttr("a"), getRaw(t, raw, table, "sink#plain")["v"])
	})

	t.Run("every answer lost", func(t *testing.T) {
		faults.Set(every("PutItem", ddbtest.DropResponse))
		defer faults.Set(nil)
		var n map[string]int
		n = requests(func() {
			_, err = g.Put(ctx, 1, &dynamodb.PutItemInput{TableName: aws.String(table), Item: sink("sink#lost", "v", "b"),
				ConditionExpression: aws.String("attribute_not_exists(pk)")})
		})
		require.NoError(t, err, "the read-back finds the write's token")
		assert.Greater(t, n["PutItem"], 1)
		assert.Equal(t, 1, n["GetItem"])
		assert.Equal(t, sAttr("b"), getRaw(t, raw, table, "sink#lost")["v"])
	})

	t.Run("nothing applied", func(t *testing.T) {
		faults.Set(every("PutItem", ddbtest.Reset))
		defer faults.Set(nil)
		_, err := g.Put(ctx, 1, &dynamodb.PutItemInput{TableName: aws.String(table), Item: sink("sink#never")})
		require.Error(t, err)
		assert.NotErrorIs(t, err, ddblease.ErrStaleFence)
		assert.Contains(t, err.Error(), "not applied as far as a consistent read shows")
		assert.Empty(t, getRaw(t, raw, table, "sink#never"))
	})

	t.Run("refused outright: no read-back", func(t *testing.T) {
		var err error
		n := requests(func() {
			_, err = g.Put(ctx, 1, &dynamodb.PutItemInput{TableName: aws.String(table + "-missing"), Item: sink("x")})
		})
		require.Error(t, err)
		assert.Equal(t, map[string]int{"PutItem": 1}, n)
	})

	t.Run("conflicts with transactions are retried", func(t *testing.T) {
		faults.Set(firstN("PutItem", 2, ddbtest.Conflict))
		n := requests(func() {
			_, err = g.Put(ctx, 1, &dynamodb.PutItemInput{TableName: aws.String(table), Item: sink("sink#conflict", "v", "c")})
		})
		require.NoError(t, err)
		assert.Equal(t, map[string]int{"PutItem": 3}, n)
		assert.Equal(t, sAttr("c"), getRaw(t, raw, table, "sink#conflict")["v"])
		faults.Set(firstN("UpdateItem", 2, ddbtest.Conflict))
		n = requests(func() {
			_, err = g.Update(ctx, 1, &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: key("sink#conflict"),
				UpdateExpression: aws.String("SET v = :v"), ExpressionAttributeValues: map[string]types.AttributeValue{":v": sAttr("d")}})
		})
		require.NoError(t, err)
		assert.Equal(t, map[string]int{"UpdateItem": 3}, n)
		assert.Equal(t, sAttr("d"), getRaw(t, raw, table, "sink#conflict")["v"])
		// A conflict that outlasts CallTimeout fails closed.
		gShort, err := ddblease.NewGuard(db, table, "billing", func(o *ddblease.GuardOptions) { o.CallTimeout = 200 * time.Millisecond })
		require.NoError(t, err)
		faults.Set(every("PutItem", ddbtest.Conflict))
		defer faults.Set(nil)
		_, err = gShort.Put(ctx, 1, &dynamodb.PutItemInput{TableName: aws.String(table), Item: sink("sink#conflict2")})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "kept conflicting with other writes")
		var tce *types.TransactionConflictException
		require.ErrorAs(t, err, &tce)
		assert.Empty(t, getRaw(t, raw, table, "sink#conflict2"))
	})

	t.Run("Update is applied once", func(t *testing.T) {
		faults.Set(firstN("UpdateItem", 1, ddbtest.DropResponse))
		defer faults.Set(nil)
		var out *dynamodb.UpdateItemOutput
		n := requests(func() {
			out, err = g.Update(ctx, 1, &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: key("sink#counter"),
				UpdateExpression:          aws.String("ADD n :one"),
				ExpressionAttributeValues: map[string]types.AttributeValue{":one": nAttr("1")},
				ReturnValues:              types.ReturnValueAllNew,
			})
		})
		require.NoError(t, err)
		assert.Equal(t, 2, n["UpdateItem"])
		assert.Equal(t, nAttr("1"), getRaw(t, raw, table, "sink#counter")["n"], "the SDK's retry did not add twice")
		assert.Equal(t, nAttr("1"), out.Attributes["n"], "ALL_NEW holds the item as read back")
	})

	t.Run("a stale fence is still refused", func(t *testing.T) {
		_, err := g.Put(ctx, 3, &dynamodb.PutItemInput{TableName: aws.String(table), Item: sink("sink#plain")})
		require.NoError(t, err)
		faults.Set(firstN("PutItem", 1, ddbtest.DropResponse))
		defer faults.Set(nil)
		_, err = g.Put(ctx, 2, &dynamodb.PutItemInput{TableName: aws.String(table), Item: sink("sink#plain")})
		staleFence(t, err, 2, 3)
	})

	t.Run("the token attribute is configurable and reserved", func(t *testing.T) {
		g2, err := ddblease.NewGuard(db, table, "billing", func(o *ddblease.GuardOptions) { o.TokenAttribute = "tok" })
		require.NoError(t, err)
		_, err = g2.Put(ctx, 1, &dynamodb.PutItemInput{TableName: aws.String(table), Item: sink("sink#tok")})
		require.NoError(t, err)
		assert.Contains(t, getRaw(t, raw, table, "sink#tok"), "tok")
		_, err = g2.Put(ctx, 1, &dynamodb.PutItemInput{TableName: aws.String(table), Item: sink("sink#tok", "tok", "mine")})
		require.ErrorIs(t, err, ddblease.ErrInvalid)
		assert.Contains(t, err.Error(), `"tok"`)
		_, err = ddblease.NewGuard(db, table, "billing", func(o *ddblease.GuardOptions) { o.TokenAttribute = "fence" })
		require.ErrorIs(t, err, ddblease.ErrInvalid)
	})
}

// Issue 8, defect 7. A caller's condition is ANDed with the fence check and
// cannot escape it; malformed ones are refused before any request.
func TestGuardConditionCannotEscape(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table, faults, db := tableWithFaults(t)
	raw := srv.Client(nil)
	g, err := ddblease.NewGuard(db, table, "billing")
	require.NoError(t, err)
	_, err = g.Put(ctx, 5, &dynamodb.PutItemInput{TableName: aws.String(table), Item: sink("sink#esc", "by", "five")})
	require.NoError(t, err)
	_, err = g.Update(ctx, 5, &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: key("sink#esc2"),
		UpdateExpression: aws.String("SET #by = :by"), ExpressionAttributeNames: map[string]string{"#by": "by"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":by": sAttr("five")}})
	require.NoError(t, err)

	put := func(cond string, names map[string]string) error {
		_, err := g.Put(ctx, 3, &dynamodb.PutItemInput{TableName: aws.String(table), Item: sink("sink#esc", "by", "three"),
			ConditionExpression: aws.String(cond), ExpressionAttributeNames: names})
		return err
	}
	update := func(cond string, names map[string]string) error {
		if names == nil {
			names = map[string]string{}
		}
		names["#by"] = "by"
		_, err := g.Update(ctx, 3, &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: key("sink#esc2"),
			UpdateExpression: aws.String("SET #by = :by"), ConditionExpression: aws.String(cond), ExpressionAttributeNames: names,
			ExpressionAttributeValues: map[string]types.AttributeValue{":by": sAttr("three")}})
		return err
	}
	for _, c := range []struct {
		name, cond string
		names      map[string]string
		says       string
	}{
		{"escape with OR", "attribute_exists(pk)) OR (attribute_exists(pk)", nil, "closes a parenthesis it did not open"},
		{"close first", ") OR (attribute_exists(pk)", nil, "closes a parenthesis it did not open"},
		{"unclosed", "(attribute_exists(pk)", nil, "leaves 1 parenthesis open"},
		{"unclosed twice", "((attribute_exists(pk)", nil, "leaves 2 parentheses open"},
		{"extra close", "attribute_exists(pk))", nil, "closes a parenthesis it did not open"},
		{"balanced but escaping", "attribute_exists(pk)) OR attribute_exists((pk)", nil, "closes a parenthesis it did not open"},
		{"reserved name in the condition", "#ddbleaseFence > :x OR attribute_exists(pk)", nil, "reserves"},
		{"reserved value in the condition", "attribute_exists(pk) OR :ddbleaseToken = :DDBLEASEtoken", nil, "reserves"},
		{"reserved name in the map", "attribute_exists(#ddbleaseMark)", map[string]string{"#ddbleaseMark": "fence"}, "reserved"},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := total(faults.Counts())
			for form, err := range map[string]error{"Put": put(c.cond, c.names), "Update": update(c.cond, c.names)} {
				require.ErrorIs(t, err, ddblease.ErrInvalid, form)
				assert.NotErrorIs(t, err, ddblease.ErrStaleFence, form)
				assert.Contains(t, err.Error(), c.says, form)
			}
			assert.Equal(t, before, total(faults.Counts()), "refused before any request")
		})
	}

	// An update expression cannot lower or remove the mark or the token
	// (minidyn applies a second assignment to the same path; DynamoDB and
	// dynalite refuse it).
	for _, c := range []struct {
		expr  string
		names map[string]string
	}{
		{"SET #by = :by, #x = :low", map[string]string{"#by": "by", "#x": "fence"}},
		{"SET #by = :by REMOVE #x", map[string]string{"#by": "by", "#x": "fence"}},
		{"SET #by = :by REMOVE fence", map[string]string{"#by": "by"}},
		{"SET #by = :by, fence.x = :low", map[string]string{"#by": "by"}},
		{"SET #by = :by REMOVE #t", map[string]string{"#by": "by", "#t": ddblease.DefaultGuardTokenAttribute}},
		{"SET #by = :by, copy = fenceWrite", map[string]string{"#by": "by"}},
	} {
		before := total(faults.Counts())
		in := &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: key("sink#esc2"),
			UpdateExpression: aws.String(c.expr), ExpressionAttributeNames: c.names,
			ExpressionAttributeValues: map[string]types.AttributeValue{":by": sAttr("three")}}
		if strings.Contains(c.expr, ":low") {
			in.ExpressionAttributeValues[":low"] = nAttr("1")
		}
		_, err := g.Update(ctx, 5, in)
		require.ErrorIs(t, err, ddblease.ErrInvalid, c.expr)
		assert.Contains(t, err.Error(), "which the guard keeps", c.expr)
		assert.Equal(t, before, total(faults.Counts()), "refused before any request")
	}
	assert.Equal(t, nAttr("5"), getRaw(t, raw, table, "sink#esc2")["fence"])

	// A guarded transaction cannot act on the lease item it checks.
	before := total(faults.Counts())
	err = g.TransactWrite(ctx, 5, []types.TransactWriteItem{
		{Put: &types.Put{TableName: aws.String(table), Item: sink("sink#tx")}},
		{Update: &types.Update{TableName: aws.String(table), Key: key("lease#billing"), UpdateExpression: aws.String("SET fence = :f"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":f": nAttr("99")}}},
	})
	require.ErrorIs(t, err, ddblease.ErrInvalid)
	assert.Contains(t, err.Error(), "item 1 acts on the job's lease item")
	assert.Equal(t, before, total(faults.Counts()))

	stored := getRaw(t, raw, table, "sink#esc")
	assert.Equal(t, sAttr("five"), stored["by"])
	assert.Equal(t, nAttr("5"), stored["fence"], "the high-water mark was not lowered")
	assert.Equal(t, sAttr("five"), getRaw(t, raw, table, "sink#esc2")["by"])

	// Well-formed conditions, nested or not, are still checked with the
	// fence: refused for fence 3, accepted for fence 5.
	for _, cond := range []string{
		"attribute_exists(pk) OR attribute_not_exists(pk)",
		"(attribute_exists(pk)) AND (attribute_exists(#by) OR attribute_not_exists(nothing))",
		"  ",
	} {
		names := map[string]string{}
		if strings.Contains(cond, "#by") {
			names["#by"] = "by"
		}
		in := &dynamodb.PutItemInput{TableName: aws.String(table), Item: sink("sink#esc", "by", "x"),
			ConditionExpression: aws.String(cond)}
		if len(names) > 0 {
			in.ExpressionAttributeNames = names
		}
		_, err := g.Put(ctx, 3, in)
		staleFence(t, err, 3, 5)
		_, err = g.Put(ctx, 5, in)
		require.NoError(t, err, cond)
	}
	assert.Equal(t, nAttr("5"), getRaw(t, raw, table, "sink#esc")["fence"])
}

// Issue 8, defect 8. Check and Do refuse once the caller's context has
// ended, before or during the read; fn never runs with a dead context.
func TestGuardCheckFailsClosedOnEndedContext(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table, faults, db := tableWithFaults(t)
	l := newLease(t, db, table, "nightly", fast("a"), slowLease)
	fence, err := l.TryAcquire(ctx)
	require.NoError(t, err)
	g, err := ddblease.NewGuard(db, table, "nightly")
	require.NoError(t, err)
	require.NoError(t, g.Check(ctx, fence))
	called := false
	fn := func(context.Context, int64) error { called = true; return nil }

	t.Run("ended before", func(t *testing.T) {
		why := errors.New("shutting down")
		cctx, cancel := context.WithCancelCause(ctx)
		cancel(why)
		before := faults.Count("GetItem")
		err := g.Check(cctx, fence)
		require.ErrorIs(t, err, why)
		require.ErrorIs(t, err, context.Canceled)
		assert.NotErrorIs(t, err, ddblease.ErrStaleFence)
		require.ErrorIs(t, g.Do(cctx, fence, fn), why)
		assert.Equal(t, before, faults.Count("GetItem"), "no read with a dead context")
	})

	t.Run("ended during the read", func(t *testing.T) {
		for _, act := range []ddbtest.Action{ddbtest.Pass, ddbtest.DropResponse} {
			cctx, cancel := context.WithCancel(ctx)
			faults.Set(func(op string) ddbtest.Action {
				if op == "GetItem" {
					cancel()
					return act
				}
				return ddbtest.Pass
			})
			require.ErrorIs(t, g.Check(cctx, fence), context.Canceled)
			require.ErrorIs(t, g.Do(cctx, fence, fn), context.Canceled)
			faults.Set(nil)
		}
	})
	assert.False(t, called, "fn was never called")
	require.NoError(t, g.Do(ctx, fence, fn))
	assert.True(t, called)
}
