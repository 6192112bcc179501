package ddblease_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
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

// firstN returns a fault rule that applies act to the first n requests of
// op and passes everything else. Rules run under the Faults' lock.
func firstN(op string, n int, act ddbtest.Action) func(string) ddbtest.Action {
	seen := 0
	return func(o string) ddbtest.Action {
		if o != op {
			return ddbtest.Pass
		}
		seen++
		if seen <= n {
			return act
		}
		return ddbtest.Pass
	}
}

// Issue 8, defect 6. A guarded write whose first attempt was applied and
// whose answer was lost is reported as applied (and applied once), not as
// the failure of the SDK's retry; on both servers (dynalite returns no item
// with a failed condition: the guard reads it).
func TestGuardWriteLandedAnswerLost(t *testing.T) {
	t.Parallel()
	caps := srv.Caps(t)
	ctx := withTimeout(t, 30*time.Second)
	table := srv.NewTable(t)
	faults := ddbtest.NewFaults(nil)
	db := srv.Client(faults.Wrap)
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
				Item:                item("pk", "invoice#2026-11", "amount", "42"),
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
			Item: item("pk", "invoice#2026-11"), ConditionExpression: aws.String("attribute_not_exists(pk)")})
		var ccf *types.ConditionalCheckFailedException
		require.ErrorAs(t, err, &ccf)
		assert.NotErrorIs(t, err, ddblease.ErrStaleFence)
	})

	t.Run("unconditional Put", func(t *testing.T) {
		faults.Set(firstN("PutItem", 1, ddbtest.DropResponse))
		defer faults.Set(nil)
		_, err := g.Put(ctx, 1, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item("pk", "sink#plain", "v", "a")})
		require.NoError(t, err)
		assert.Equal(t, sAttr("a"), getRaw(t, raw, table, "sink#plain")["v"])
	})

	t.Run("every answer lost", func(t *testing.T) {
		faults.Set(func(op string) ddbtest.Action {
			if op == "PutItem" {
				return ddbtest.DropResponse
			}
			return ddbtest.Pass
		})
		defer faults.Set(nil)
		var n map[string]int
		n = requests(func() {
			_, err = g.Put(ctx, 1, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item("pk", "sink#lost", "v", "b"),
				ConditionExpression: aws.String("attribute_not_exists(pk)")})
		})
		require.NoError(t, err, "the read-back finds the write's token")
		assert.Greater(t, n["PutItem"], 1)
		assert.Equal(t, 1, n["GetItem"])
		assert.Equal(t, sAttr("b"), getRaw(t, raw, table, "sink#lost")["v"])
	})

	t.Run("nothing applied", func(t *testing.T) {
		faults.Set(func(op string) ddbtest.Action {
			if op == "PutItem" {
				return ddbtest.Reset
			}
			return ddbtest.Pass
		})
		defer faults.Set(nil)
		_, err := g.Put(ctx, 1, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item("pk", "sink#never")})
		require.Error(t, err)
		assert.NotErrorIs(t, err, ddblease.ErrStaleFence)
		assert.Contains(t, err.Error(), "not applied as far as a consistent read shows")
		assert.Empty(t, getRaw(t, raw, table, "sink#never"))
	})

	t.Run("refused outright: no read-back", func(t *testing.T) {
		var err error
		n := requests(func() {
			_, err = g.Put(ctx, 1, &dynamodb.PutItemInput{TableName: aws.String(table + "-missing"), Item: item("pk", "x")})
		})
		require.Error(t, err)
		assert.Equal(t, map[string]int{"PutItem": 1}, n)
	})

	t.Run("conflicts with transactions are retried", func(t *testing.T) {
		faults.Set(firstN("PutItem", 2, ddbtest.Conflict))
		n := requests(func() {
			_, err = g.Put(ctx, 1, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item("pk", "sink#conflict", "v", "c")})
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
		faults.Set(func(op string) ddbtest.Action {
			if op == "PutItem" {
				return ddbtest.Conflict
			}
			return ddbtest.Pass
		})
		defer faults.Set(nil)
		_, err = gShort.Put(ctx, 1, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item("pk", "sink#conflict2")})
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
		_, err := g.Put(ctx, 3, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item("pk", "sink#plain")})
		require.NoError(t, err)
		faults.Set(firstN("PutItem", 1, ddbtest.DropResponse))
		defer faults.Set(nil)
		_, err = g.Put(ctx, 2, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item("pk", "sink#plain")})
		staleFence(t, err, 2, 3)
	})

	t.Run("the token attribute is configurable and reserved", func(t *testing.T) {
		g2, err := ddblease.NewGuard(db, table, "billing", func(o *ddblease.GuardOptions) { o.TokenAttribute = "tok" })
		require.NoError(t, err)
		_, err = g2.Put(ctx, 1, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item("pk", "sink#tok")})
		require.NoError(t, err)
		assert.Contains(t, getRaw(t, raw, table, "sink#tok"), "tok")
		_, err = g2.Put(ctx, 1, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item("pk", "sink#tok", "tok", "mine")})
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
	table := srv.NewTable(t)
	faults := ddbtest.NewFaults(nil)
	db := srv.Client(faults.Wrap)
	raw := srv.Client(nil)
	g, err := ddblease.NewGuard(db, table, "billing")
	require.NoError(t, err)
	_, err = g.Put(ctx, 5, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item("pk", "sink#esc", "by", "five")})
	require.NoError(t, err)
	_, err = g.Update(ctx, 5, &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: key("sink#esc2"),
		UpdateExpression: aws.String("SET #by = :by"), ExpressionAttributeNames: map[string]string{"#by": "by"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":by": sAttr("five")}})
	require.NoError(t, err)

	put := func(cond string, names map[string]string) error {
		_, err := g.Put(ctx, 3, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item("pk", "sink#esc", "by", "three"),
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
		{Put: &types.Put{TableName: aws.String(table), Item: item("pk", "sink#tx")}},
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
		in := &dynamodb.PutItemInput{TableName: aws.String(table), Item: item("pk", "sink#esc", "by", "x"),
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
	table := srv.NewTable(t)
	faults := ddbtest.NewFaults(nil)
	db := srv.Client(faults.Wrap)
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

// tokens records the ClientRequestToken of every TransactWriteItems request
// on its way to the fault transport.
type tokens struct {
	next http.RoundTripper
	mu   sync.Mutex
	seen []string
}

func (tk *tokens) RoundTrip(r *http.Request) (*http.Response, error) {
	if ddbtest.Op(r) == "TransactWriteItems" && r.Body != nil {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		var in struct{ ClientRequestToken string }
		_ = json.Unmarshal(body, &in)
		tk.mu.Lock()
		tk.seen = append(tk.seen, in.ClientRequestToken)
		tk.mu.Unlock()
	}
	return tk.next.RoundTrip(r)
}

// take returns the tokens seen since the last call.
func (tk *tokens) take() []string {
	tk.mu.Lock()
	defer tk.mu.Unlock()
	s := tk.seen
	tk.seen = nil
	return s
}

func allSame(t *testing.T, s []string, n int) {
	t.Helper()
	require.Len(t, s, n)
	for _, v := range s {
		assert.NotEmpty(t, v)
		assert.Equal(t, s[0], v, "every attempt carries the same ClientRequestToken")
	}
}

// Issue 8, defect 15. DynamoDB cancels a transaction whose items another
// transaction or write is using (the lease item, while a heartbeat renews
// it). Guarded transactions, Commit and Claim send it again under the same
// ClientRequestToken until it goes through, and fail closed with a clear
// error when the conflict outlasts their deadline.
func TestGuardedTransactionsRetryConflicts(t *testing.T) {
	t.Parallel()
	caps := srv.Caps(t)
	srv.Require(t, caps.Transactions, "TransactWriteItems")
	ctx := withTimeout(t, 30*time.Second)
	table := srv.NewTable(t)
	faults := ddbtest.NewFaults(nil)
	tk := &tokens{}
	db := srv.Client(func(rt http.RoundTripper) http.RoundTripper { tk.next = faults.Wrap(rt); return tk })
	raw := srv.Client(nil)
	l := newLease(t, db, table, "billing", fast("a"), slowLease)
	fence, err := l.TryAcquire(ctx)
	require.NoError(t, err)
	var mu sync.Mutex
	var events []ddblease.Event
	g, err := ddblease.NewGuard(db, table, "billing", func(o *ddblease.GuardOptions) {
		o.CallTimeout = 2 * time.Second
		o.Observer = func(e ddblease.Event) { mu.Lock(); events = append(events, e); mu.Unlock() }
	})
	require.NoError(t, err)
	put := func(pk string) []types.TransactWriteItem {
		return []types.TransactWriteItem{{Put: &types.Put{TableName: aws.String(table), Item: item("pk", pk)}}}
	}

	t.Run("TransactWrite", func(t *testing.T) {
		faults.Set(firstN("TransactWriteItems", 3, ddbtest.Conflict))
		defer faults.Set(nil)
		tk.take()
		require.NoError(t, g.TransactWrite(ctx, fence, put("sink#tx")))
		allSame(t, tk.take(), 4)
		assert.NotEmpty(t, getRaw(t, raw, table, "sink#tx"))
		mu.Lock()
		defer mu.Unlock()
		var outcomes []ddblease.CallOutcome
		for _, e := range events {
			if e.Kind == ddblease.EventCall && e.Op == "TransactWriteItems" {
				outcomes = append(outcomes, e.Outcome)
			}
		}
		assert.Equal(t, []ddblease.CallOutcome{ddblease.CallError, ddblease.CallError, ddblease.CallError, ddblease.CallOK}, outcomes)
	})

	slot := time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC)
	var run *ddblease.JobRun
	t.Run("Claim", func(t *testing.T) {
		faults.Set(firstN("TransactWriteItems", 2, ddbtest.Conflict))
		defer faults.Set(nil)
		tk.take()
		run, err = l.Claim(ctx, slot)
		require.NoError(t, err)
		allSame(t, tk.take(), 3)
	})

	t.Run("Commit", func(t *testing.T) {
		require.NotNil(t, run)
		faults.Set(firstN("TransactWriteItems", 2, ddbtest.Conflict))
		defer faults.Set(nil)
		tk.take()
		require.NoError(t, run.Commit(ctx, put("sink#commit")))
		allSame(t, tk.take(), 3)
		assert.NotEmpty(t, getRaw(t, raw, table, "sink#commit"))
		runs, err := l.ListRuns(ctx, oneSlot(slot), slot, slot)
		require.NoError(t, err)
		require.Len(t, runs, 1)
		assert.Equal(t, ddblease.RunSucceeded, runs[0].Status)
	})

	t.Run("a conflict beyond the deadline fails closed", func(t *testing.T) {
		faults.Set(func(op string) ddbtest.Action {
			if op == "TransactWriteItems" {
				return ddbtest.Conflict
			}
			return ddbtest.Pass
		})
		defer faults.Set(nil)
		conflictErr := func(t *testing.T, err error) {
			t.Helper()
			require.Error(t, err)
			assert.NotErrorIs(t, err, ddblease.ErrStaleFence)
			assert.Contains(t, err.Error(), "kept conflicting with other writes")
			var tce *types.TransactionCanceledException
			require.ErrorAs(t, err, &tce, "the SDK's error stays in the chain")
			assert.Equal(t, "TransactionConflict", aws.ToString(tce.CancellationReasons[0].Code))
		}
		gShort, err := ddblease.NewGuard(db, table, "billing", func(o *ddblease.GuardOptions) { o.CallTimeout = 300 * time.Millisecond })
		require.NoError(t, err)
		tk.take()
		conflictErr(t, gShort.TransactWrite(ctx, fence, put("sink#never")))
		assert.Greater(t, len(tk.take()), 1, "retried before giving up")
		assert.Empty(t, getRaw(t, raw, table, "sink#never"))

		// The caller's context ends first.
		short, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
		defer cancel()
		err = g.TransactWrite(short, fence, put("sink#never"))
		conflictErr(t, err)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Empty(t, getRaw(t, raw, table, "sink#never"))

		late := slot.Add(24 * time.Hour)
		_, err = l.Claim(ctx, late)
		conflictErr(t, err)
		runs, err := l.ListRuns(ctx, oneSlot(late), late, late)
		require.NoError(t, err)
		assert.Empty(t, runs, "no run claimed")

		faults.Set(nil)
		run2, err := l.Claim(ctx, late)
		require.NoError(t, err)
		faults.Set(func(op string) ddbtest.Action {
			if op == "TransactWriteItems" {
				return ddbtest.Conflict
			}
			return ddbtest.Pass
		})
		conflictErr(t, run2.Commit(ctx, put("sink#never2")))
		assert.Empty(t, getRaw(t, raw, table, "sink#never2"))
		runs, err = l.ListRuns(ctx, oneSlot(late), late, late)
		require.NoError(t, err)
		require.Len(t, runs, 1)
		assert.Equal(t, ddblease.RunRunning, runs[0].Status, "the run stays running")
	})

	t.Run("a plain write gets TransactionConflictException", func(t *testing.T) {
		faults.Set(firstN("UpdateItem", 1, ddbtest.Conflict))
		defer faults.Set(nil)
		_, err := db.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: key("sink#plain"),
			UpdateExpression: aws.String("SET v = :v"), ExpressionAttributeValues: map[string]types.AttributeValue{":v": nAttr("1")}})
		var tce *types.TransactionConflictException
		require.ErrorAs(t, err, &tce)
		assert.Contains(t, tce.ErrorMessage(), "Transaction is ongoing for the item")
	})
}

// The guard tells its observer of every request and of every stale fence
// it refuses.
func TestGuardObserver(t *testing.T) {
	t.Parallel()
	caps := srv.Caps(t)
	ctx := withTimeout(t, 20*time.Second)
	table := srv.NewTable(t)
	faults := ddbtest.NewFaults(nil)
	db := srv.Client(faults.Wrap)
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

	_, err = g.Put(ctx, 2, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item("pk", "sink#obs")})
	require.NoError(t, err)
	cs, _ = calls(take())
	assert.Equal(t, []call{{"PutItem", ddblease.CallOK}}, cs)

	_, err = g.Put(ctx, 1, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item("pk", "sink#obs")})
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

	faults.Set(func(op string) ddbtest.Action {
		if op == "UpdateItem" {
			return ddbtest.Reset
		}
		return ddbtest.Pass
	})
	_, err = g.Update(ctx, 2, &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: key("sink#obs"),
		UpdateExpression: aws.String("SET v = :v"), ExpressionAttributeValues: map[string]types.AttributeValue{":v": nAttr("1")}})
	require.Error(t, err)
	faults.Set(nil)
	cs, _ = calls(take())
	assert.Equal(t, []call{{"UpdateItem", ddblease.CallInDoubt}, {"GetItem", ddblease.CallOK}}, cs)

	if caps.Transactions {
		staleFence(t, g.TransactWrite(ctx, 1, []types.TransactWriteItem{{Put: &types.Put{TableName: aws.String(table),
			Item: item("pk", "sink#obs#tx")}}}), 1, 2)
		cs, stale = calls(take())
		assert.Equal(t, []call{{"TransactWriteItems", ddblease.CallConditionFailed}}, cs)
		require.Len(t, stale, 1)
		assert.Equal(t, "TransactWrite", stale[0].Op)
	}
}

// Commit's items cannot act on the lease item its check reads, nor on the
// run item it finishes.
func TestCommitRefusesLeaseAndRunItems(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table := srv.NewTable(t)
	faults := ddbtest.NewFaults(nil)
	db := srv.Client(faults.Wrap)
	l := newLease(t, db, table, "billing", fast("a"), slowLease)
	_, err := l.TryAcquire(ctx)
	require.NoError(t, err)
	slot := time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC)
	run, err := l.Claim(ctx, slot)
	require.NoError(t, err)
	before := total(faults.Counts())
	for pk, says := range map[string]string{
		"lease#billing":                       "acts on the job's lease item",
		"jobrun#billing#2026-11-30T02:00:00Z": "acts on the run's own item",
	} {
		err := run.Commit(ctx, []types.TransactWriteItem{
			{Put: &types.Put{TableName: aws.String(table), Item: item("pk", "sink#ok")}},
			{Delete: &types.Delete{TableName: aws.String(table), Key: key(pk)}},
		})
		require.ErrorIs(t, err, ddblease.ErrInvalid)
		assert.Contains(t, err.Error(), "item 1 "+says)
	}
	assert.Equal(t, before, total(faults.Counts()), "refused before any request")
}

// Issue 8, defect 13: what the README says each form refuses. After a
// takeover, a stale leader's Put of an item that no newer tenure wrote is
// accepted (the item's high-water mark is all Put knows), while
// TransactWrite, which checks the lease item, refuses it.
func TestGuardFormsRefuseWhatTheySay(t *testing.T) {
	t.Parallel()
	caps := srv.Caps(t)
	ctx := withTimeout(t, 20*time.Second)
	table := srv.NewTable(t)
	db := srv.Client(nil)
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

	_, err = g.Put(ctx, old, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item("pk", "invoice#untouched")})
	require.NoError(t, err, "no newer fence wrote this item: Put accepts the stale fence")
	_, err = g.Put(ctx, cur, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item("pk", "invoice#touched")})
	require.NoError(t, err)
	_, err = g.Put(ctx, old, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item("pk", "invoice#touched")})
	staleFence(t, err, old, cur)
	staleFence(t, g.Check(ctx, old), old, cur)
	t.Run("TransactWrite", func(t *testing.T) {
		srv.Require(t, caps.Transactions, "TransactWriteItems")
		staleFence(t, g.TransactWrite(ctx, old, []types.TransactWriteItem{{Put: &types.Put{TableName: aws.String(table),
			Item: item("pk", "invoice#untouched-tx")}}}), old, cur)
		assert.Empty(t, getRaw(t, db, table, "invoice#untouched-tx"))
	})
}

// mismatchOnce forwards the next TransactWriteItems request, lets the
// server apply it, and answers IdempotentParameterMismatchException
// instead, as DynamoDB does for a client request token it saw within ten
// minutes with other parameters.
type mismatchOnce struct {
	next  http.RoundTripper
	mu    sync.Mutex
	armed bool
}

func (m *mismatchOnce) arm() { m.mu.Lock(); m.armed = true; m.mu.Unlock() }

func (m *mismatchOnce) RoundTrip(r *http.Request) (*http.Response, error) {
	m.mu.Lock()
	fire := m.armed && ddbtest.Op(r) == "TransactWriteItems"
	if fire {
		m.armed = false
	}
	m.mu.Unlock()
	resp, err := m.next.RoundTrip(r)
	if !fire || err != nil {
		return resp, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	body := `{"__type":"com.amazonaws.dynamodb.v20120810#IdempotentParameterMismatchException",` +
		`"message":"Request token already used with different parameters"}`
	return &http.Response{StatusCode: 400, Status: "Bad Request", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"application/x-amz-json-1.0"}},
		Body:          io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body)), Request: r}, nil
}

// A transaction answered IdempotentParameterMismatch is not retried; Claim
// and Commit read their run item to learn whether it landed, and the
// guard reports the error.
func TestTransactionTokenMismatch(t *testing.T) {
	t.Parallel()
	caps := srv.Caps(t)
	srv.Require(t, caps.Transactions, "TransactWriteItems")
	ctx := withTimeout(t, 20*time.Second)
	table := srv.NewTable(t)
	faults := ddbtest.NewFaults(nil)
	mm := &mismatchOnce{}
	db := srv.Client(func(rt http.RoundTripper) http.RoundTripper { mm.next = rt; return faults.Wrap(mm) })
	raw := srv.Client(nil)
	l := newLease(t, db, table, "billing", fast("a"), slowLease)
	fence, err := l.TryAcquire(ctx)
	require.NoError(t, err)
	slot := time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC)

	mm.arm()
	run, err := l.Claim(ctx, slot)
	require.NoError(t, err, "the claim landed: the run item carries its token")
	mm.arm()
	require.NoError(t, run.Commit(ctx, []types.TransactWriteItem{{Put: &types.Put{TableName: aws.String(table),
		Item: item("pk", "sink#commit")}}}), "the commit landed: the run is succeeded")
	assert.NotEmpty(t, getRaw(t, raw, table, "sink#commit"))

	g, err := ddblease.NewGuard(db, table, "billing")
	require.NoError(t, err)
	mm.arm()
	before := faults.Count("TransactWriteItems")
	err = g.TransactWrite(ctx, fence, []types.TransactWriteItem{{Put: &types.Put{TableName: aws.String(table),
		Item: item("pk", "sink#tx")}}})
	var ipm *types.IdempotentParameterMismatchException
	require.ErrorAs(t, err, &ipm)
	assert.Contains(t, err.Error(), "was used before with other parameters")
	assert.Equal(t, 1, faults.Count("TransactWriteItems")-before, "not retried")
}
