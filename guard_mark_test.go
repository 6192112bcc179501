package ddblease_test

import (
	"bytes"
	"context"
	"encoding/json"
	"hash/crc32"
	"io"
	"net/http"
	"strconv"
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

// The forms a sink can write one item with, each writing {pk, v} where v
// names the writer: Guard.Put, Guard.Update, and a Put or an Update action
// of Guard.TransactWrite or of JobRun.Commit.
type writeForm struct {
	name  string
	write func(ctx context.Context, s *mixedSink, fence int64, pk, v string) error
}

// mixedSink is a job deposed once: fence 1 (a, still believing it leads,
// with a run claimed) and fence 2 (b, with a run claimed), and a guard.
type mixedSink struct {
	table string
	g     *ddblease.Guard
	runs  map[int64]*ddblease.JobRun
}

func newMixedSink(t *testing.T, ctx context.Context, db *dynamodb.Client, table string) *mixedSink {
	t.Helper()
	job := "billing-" + ddbtest.RandomID()
	slot := time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)
	s := &mixedSink{table: table, runs: map[int64]*ddblease.JobRun{}}
	_, b := deposedPair(t, db, db, table, job, func(a *ddblease.Lease) {
		run, err := a.Claim(ctx, slot)
		require.NoError(t, err)
		s.runs[1] = run
	})
	run, err := b.Claim(ctx, slot.Add(time.Hour))
	require.NoError(t, err)
	s.runs[2] = run
	s.g, err = ddblease.NewGuard(db, table, job)
	require.NoError(t, err)
	return s
}

// writeForms returns every form of writing an item.
func writeForms() []writeForm {
	put := func(s *mixedSink, pk, v string) *types.Put {
		return &types.Put{TableName: aws.String(s.table), Item: sink(pk, "v", v)}
	}
	update := func(s *mixedSink, pk, v string) *types.Update {
		return &types.Update{TableName: aws.String(s.table), Key: key(pk), UpdateExpression: aws.String("SET v = :v"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":v": sAttr(v)}}
	}
	return []writeForm{
		{"Put", func(ctx context.Context, s *mixedSink, fence int64, pk, v string) error {
			_, err := s.g.Put(ctx, fence, &dynamodb.PutItemInput{TableName: aws.String(s.table), Item: sink(pk, "v", v)})
			return err
		}},
		{"Update", func(ctx context.Context, s *mixedSink, fence int64, pk, v string) error {
			u := update(s, pk, v)
			_, err := s.g.Update(ctx, fence, &dynamodb.UpdateItemInput{TableName: u.TableName, Key: u.Key,
				UpdateExpression: u.UpdateExpression, ExpressionAttributeValues: u.ExpressionAttributeValues})
			return err
		}},
		{"TransactWrite Put", func(ctx context.Context, s *mixedSink, fence int64, pk, v string) error {
			return s.g.TransactWrite(ctx, fence, []types.TransactWriteItem{{Put: put(s, pk, v)}})
		}},
		{"TransactWrite Update", func(ctx context.Context, s *mixedSink, fence int64, pk, v string) error {
			return s.g.TransactWrite(ctx, fence, []types.TransactWriteItem{{Update: update(s, pk, v)}})
		}},
		{"Commit Put", func(ctx context.Context, s *mixedSink, fence int64, pk, v string) error {
			return s.runs[fence].Commit(ctx, []types.TransactWriteItem{{Put: put(s, pk, v)}})
		}},
		{"Commit Update", func(ctx context.Context, s *mixedSink, fence int64, pk, v string) error {
			return s.runs[fence].Commit(ctx, []types.TransactWriteItem{{Update: update(s, pk, v)}})
		}},
	}
}

// Issue 19, item 1. Whatever form the current fence wrote an item with,
// and whatever form a stale fence then uses on it, the stale write is
// refused with a *StaleFenceError and the newer write survives; every form
// leaves the fence high-water mark on the item.
func TestGuardMarkMixedForms(t *testing.T) {
	t.Parallel()
	srv.Require(t, srv.Caps(t).Transactions, "TransactWriteItems")
	ctx := withTimeout(t, 120*time.Second)
	table, db := tableAndClient(t)
	for _, newer := range writeForms() {
		for _, stale := range writeForms() {
			t.Run(newer.name+" by fence 2, then "+stale.name+" by fence 1", func(t *testing.T) {
				s := newMixedSink(t, ctx, db, table)
				pk := "invoice#" + ddbtest.RandomID()
				require.NoError(t, newer.write(ctx, s, 2, pk, "newer"), "the current fence is accepted")
				stored := getRaw(t, db, table, pk)
				assert.Equal(t, nAttr("2"), stored[ddblease.DefaultGuardFenceAttribute], "the item carries the mark")
				staleFence(t, stale.write(ctx, s, 1, pk, "stale"), 1, 2)
				assert.Equal(t, sAttr("newer"), getRaw(t, db, table, pk)["v"], "the newer write survives")
			})
		}
	}
}

// Issue 19, item 1, the other way round: a guarded transaction or a
// commit whose fence is current for its job does not write over an item
// whose mark is higher (here another job's guard wrote it with fence 2,
// while this job's current fence is 1). A Delete action is refused too.
func TestGuardTransactionKeepsHigherMark(t *testing.T) {
	t.Parallel()
	srv.Require(t, srv.Caps(t).Transactions, "TransactWriteItems")
	ctx := withTimeout(t, 30*time.Second)
	table, db := tableAndClient(t)
	ledger := newLease(t, db, table, "ledger", fast("l"), slowLease)
	_, err := ledger.TryAcquire(ctx)
	require.NoError(t, err)
	require.NoError(t, ledger.Resign(ctx))
	f, err := ledger.TryAcquire(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(2), f)
	billing := newLease(t, db, table, "billing", fast("b"), slowLease)
	f, err = billing.TryAcquire(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), f)
	run, err := billing.Claim(ctx, time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC))
	require.NoError(t, err)
	gl, err := ddblease.NewGuard(db, table, "ledger")
	require.NoError(t, err)
	gb, err := ddblease.NewGuard(db, table, "billing")
	require.NoError(t, err)

	_, err = gl.Put(ctx, 2, &dynamodb.PutItemInput{TableName: aws.String(table), Item: sink("shared#1", "v", "ledger")})
	require.NoError(t, err)
	for name, it := range map[string]types.TransactWriteItem{
		"Put":    {Put: &types.Put{TableName: aws.String(table), Item: sink("shared#1", "v", "billing")}},
		"Update": {Update: &types.Update{TableName: aws.String(table), Key: key("shared#1"), UpdateExpression: aws.String("SET v = :v"), ExpressionAttributeValues: map[string]types.AttributeValue{":v": sAttr("billing")}}},
		"Delete": {Delete: &types.Delete{TableName: aws.String(table), Key: key("shared#1")}},
	} {
		t.Run("TransactWrite "+name, func(t *testing.T) {
			staleFence(t, gb.TransactWrite(ctx, 1, []types.TransactWriteItem{it}), 1, 2)
			stored := getRaw(t, db, table, "shared#1")
			assert.Equal(t, sAttr("ledger"), stored["v"])
			assert.Equal(t, nAttr("2"), stored["fence"])
		})
		t.Run("Commit "+name, func(t *testing.T) {
			staleFence(t, run.Commit(ctx, []types.TransactWriteItem{it}), 1, 2)
			stored := getRaw(t, db, table, "shared#1")
			assert.Equal(t, sAttr("ledger"), stored["v"])
			assert.Equal(t, nAttr("2"), stored["fence"])
		})
	}
	runs, err := billing.ListRuns(ctx, oneSlot(run.Slot()), run.Slot(), run.Slot())
	require.NoError(t, err)
	require.Len(t, runs, 1)
	assert.Equal(t, ddblease.RunRunning, runs[0].Status, "a refused commit leaves the run running")

	// The caller's own condition failing is not a stale fence.
	err = gb.TransactWrite(ctx, 1, []types.TransactWriteItem{{Put: &types.Put{TableName: aws.String(table),
		Item: sink("fresh#1"), ConditionExpression: aws.String("attribute_exists(pk)")}}})
	var tce *types.TransactionCanceledException
	require.ErrorAs(t, err, &tce)
	assert.NotErrorIs(t, err, ddblease.ErrStaleFence)
	// A Delete at the current mark goes through.
	require.NoError(t, gl.TransactWrite(ctx, 2, []types.TransactWriteItem{{Delete: &types.Delete{TableName: aws.String(table), Key: key("shared#1")}}}))
	assert.Nil(t, getRaw(t, db, table, "shared#1"))
}

// A sink whose guards keep the mark under other attribute names gives
// Commit the same names; the stale Put is refused. Bad names, and items
// that would touch the guard's attributes, are refused before any request.
func TestGuardMarkAttributeNames(t *testing.T) {
	t.Parallel()
	srv.Require(t, srv.Caps(t).Transactions, "TransactWriteItems")
	ctx := withTimeout(t, 30*time.Second)
	table, faults, db := tableWithFaults(t)
	slot := time.Date(2026, 11, 30, 4, 0, 0, 0, time.UTC)
	var run1 *ddblease.JobRun
	_, b := deposedPair(t, db, db, table, "payout", func(a *ddblease.Lease) {
		var err error
		run1, err = a.Claim(ctx, slot)
		require.NoError(t, err)
	})
	run2, err := b.Claim(ctx, slot.Add(time.Hour))
	require.NoError(t, err)
	g, err := ddblease.NewGuard(db, table, "payout", func(o *ddblease.GuardOptions) { o.FenceAttribute, o.TokenAttribute = "hw", "hwTok" })
	require.NoError(t, err)
	names := func(o *ddblease.CommitOptions) { o.FenceAttribute, o.TokenAttribute = "hw", "hwTok" }

	before := total(faults.Counts())
	for name, c := range map[string]struct {
		opts  func(*ddblease.CommitOptions)
		items []types.TransactWriteItem
	}{
		"same names": {func(o *ddblease.CommitOptions) { o.FenceAttribute, o.TokenAttribute = "x", "x" },
			[]types.TransactWriteItem{{Put: &types.Put{TableName: aws.String(table), Item: sink("p#1")}}}},
		"token attribute in the item": {names,
			[]types.TransactWriteItem{{Put: &types.Put{TableName: aws.String(table), Item: sink("p#1", "hwTok", "x")}}}},
		"update of the mark": {names,
			[]types.TransactWriteItem{{Update: &types.Update{TableName: aws.String(table), Key: key("p#1"), UpdateExpression: aws.String("REMOVE #h"),
				ExpressionAttributeNames: map[string]string{"#h": "hw"}}}}},
		"reserved placeholder": {names,
			[]types.TransactWriteItem{{Delete: &types.Delete{TableName: aws.String(table), Key: key("p#1"), ConditionExpression: aws.String("#ddbleaseFence > :v")}}}},
		"unbalanced condition": {names,
			[]types.TransactWriteItem{{Put: &types.Put{TableName: aws.String(table), Item: sink("p#1"), ConditionExpression: aws.String("a) OR (b")}}}},
	} {
		t.Run(name, func(t *testing.T) {
			require.ErrorIs(t, run2.Commit(ctx, c.items, c.opts), ddblease.ErrInvalid)
			if name != "same names" {
				require.ErrorIs(t, g.TransactWrite(ctx, 2, c.items), ddblease.ErrInvalid)
			}
		})
	}
	assert.Equal(t, before, total(faults.Counts()), "no request for bad input")

	require.NoError(t, run2.Commit(ctx, []types.TransactWriteItem{{Put: &types.Put{TableName: aws.String(table), Item: sink("payout#1", "v", "newer")}}}, names))
	stored := getRaw(t, db, table, "payout#1")
	assert.Equal(t, nAttr("2"), stored["hw"])
	assert.NotContains(t, stored, "fence")
	_, err = g.Put(ctx, 1, &dynamodb.PutItemInput{TableName: aws.String(table), Item: sink("payout#1", "v", "stale")})
	staleFence(t, err, 1, 2)
	staleFence(t, run1.Commit(ctx, []types.TransactWriteItem{{Put: &types.Put{TableName: aws.String(table), Item: sink("payout#1", "v", "stale")}}}, names), 1, 2)
	assert.Equal(t, sAttr("newer"), getRaw(t, db, table, "payout#1")["v"])
}

// A guarded transaction whose answer was lost, retried by the SDK, is
// applied once and reported as applied, also on a server that ignores the
// ClientRequestToken (minidyn): the retry fails the token condition, and
// the token on the item shows the transaction landed.
func TestGuardTransactionLandedAnswerLost(t *testing.T) {
	t.Parallel()
	srv.Require(t, srv.Caps(t).Transactions, "TransactWriteItems")
	ctx := withTimeout(t, 30*time.Second)
	table, faults, db := tableWithFaults(t)
	l := newLease(t, db, table, "billing", fast("a"), slowLease)
	fence, err := l.TryAcquire(ctx)
	require.NoError(t, err)
	g, err := ddblease.NewGuard(db, table, "billing")
	require.NoError(t, err)
	faults.Set(firstN("TransactWriteItems", 1, ddbtest.DropResponse))
	defer faults.Set(nil)
	before := faults.Counts()
	require.NoError(t, g.TransactWrite(ctx, fence, []types.TransactWriteItem{{Update: &types.Update{TableName: aws.String(table),
		Key: key("counter#1"), UpdateExpression: aws.String("ADD n :one"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":one": nAttr("1")}}}}))
	assert.Equal(t, 2, diff(before, faults.Counts())["TransactWriteItems"], "the SDK retried the transaction whose answer was lost")
	assert.Equal(t, nAttr("1"), getRaw(t, db, table, "counter#1")["n"], "applied once")
}

// The mark is the attribute in which lease and job-run items keep their
// fence: no guarded write may act on such an item of the lease table, of
// any job, or it would write over that fence.
func TestGuardRefusesLibraryItems(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table, faults, db := tableWithFaults(t)
	l := newLease(t, db, table, "billing", fast("a"), slowLease)
	fence, err := l.TryAcquire(ctx)
	require.NoError(t, err)
	other := newLease(t, db, table, "ledger", fast("b"), slowLease)
	_, err = other.TryAcquire(ctx)
	require.NoError(t, err)
	slot := time.Date(2026, 11, 30, 2, 0, 0, 0, time.UTC)
	run, err := l.Claim(ctx, slot)
	require.NoError(t, err)
	g, err := ddblease.NewGuard(db, table, "billing")
	require.NoError(t, err)
	before := total(faults.Counts())
	for _, pk := range []string{"lease#ledger", "jobrun#ledger#2026-11-30T02:00:00Z", "jobrun#billing#2026-11-30T03:00:00Z"} {
		t.Run(pk, func(t *testing.T) {
			_, err := g.Put(ctx, fence, &dynamodb.PutItemInput{TableName: aws.String(table), Item: key(pk)})
			require.ErrorIs(t, err, ddblease.ErrInvalid)
			_, err = g.Update(ctx, fence, &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: key(pk), UpdateExpression: aws.String("SET v = :v"),
				ExpressionAttributeValues: map[string]types.AttributeValue{":v": sAttr("x")}})
			require.ErrorIs(t, err, ddblease.ErrInvalid)
			items := []types.TransactWriteItem{{Update: &types.Update{TableName: aws.String(table), Key: key(pk), UpdateExpression: aws.String("SET v = :v"),
				ExpressionAttributeValues: map[string]types.AttributeValue{":v": sAttr("x")}}}}
			require.ErrorIs(t, g.TransactWrite(ctx, fence, items), ddblease.ErrInvalid)
			require.ErrorIs(t, run.Commit(ctx, items), ddblease.ErrInvalid)
		})
	}
	assert.Equal(t, before, total(faults.Counts()), "refused before any request")
	assert.Equal(t, nAttr("1"), rawLease(t, db, table, "ledger")["fence"])
}

// noReasonItems drops the items from the cancellation reasons of every
// refused TransactWriteItems, as a server that ignores
// ReturnValuesOnConditionCheckFailure would.
type noReasonItems struct{ next http.RoundTripper }

func (n noReasonItems) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := n.next.RoundTrip(r)
	if err != nil || ddbtest.Op(r) != "TransactWriteItems" || resp.StatusCode == http.StatusOK {
		return resp, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if json.Unmarshal(body, &m) == nil {
		if reasons, ok := m["CancellationReasons"].([]any); ok {
			for _, r := range reasons {
				if r, ok := r.(map[string]any); ok {
					delete(r, "Item")
				}
			}
			body, _ = json.Marshal(m)
		}
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
	resp.Header.Set("X-Amz-Crc32", strconv.FormatUint(uint64(crc32.ChecksumIEEE(body)), 10))
	return resp, nil
}

// Where the server returns no item with a refused action, the guard reads
// the item (learning a Put's key from the table's schema) to tell a mark
// above the fence from the caller's own condition.
func TestGuardTransactionReadsRefusedItems(t *testing.T) {
	t.Parallel()
	srv.Require(t, srv.Caps(t).Transactions, "TransactWriteItems")
	ctx := withTimeout(t, 30*time.Second)
	table := srv.NewTable(t)
	faults := ddbtest.NewFaults(nil)
	db := srv.Client(func(rt http.RoundTripper) http.RoundTripper { return faults.Wrap(noReasonItems{rt}) })
	ledger := newLease(t, db, table, "ledger", fast("l"), slowLease)
	_, err := ledger.TryAcquire(ctx)
	require.NoError(t, err)
	require.NoError(t, ledger.Resign(ctx))
	_, err = ledger.TryAcquire(ctx)
	require.NoError(t, err)
	billing := newLease(t, db, table, "billing", fast("b"), slowLease)
	fence, err := billing.TryAcquire(ctx)
	require.NoError(t, err)
	run, err := billing.Claim(ctx, time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC))
	require.NoError(t, err)
	gl, err := ddblease.NewGuard(db, table, "ledger")
	require.NoError(t, err)
	gb, err := ddblease.NewGuard(db, table, "billing")
	require.NoError(t, err)
	_, err = gl.Put(ctx, 2, &dynamodb.PutItemInput{TableName: aws.String(table), Item: sink("shared#1", "v", "ledger")})
	require.NoError(t, err)

	put := []types.TransactWriteItem{{Put: &types.Put{TableName: aws.String(table), Item: sink("shared#1", "v", "billing")}}}
	before := faults.Counts()
	staleFence(t, gb.TransactWrite(ctx, fence, put), 1, 2)
	n := diff(before, faults.Counts())
	assert.Equal(t, 1, n["DescribeTable"], "the Put's key is learnt from the table")
	assert.Equal(t, 1, n["GetItem"], "the refused item is read")
	staleFence(t, run.Commit(ctx, put), 1, 2)
	assert.Equal(t, sAttr("ledger"), getRaw(t, db, table, "shared#1")["v"])

	cond := []types.TransactWriteItem{{Put: &types.Put{TableName: aws.String(table), Item: sink("fresh#1"),
		ConditionExpression: aws.String("attribute_exists(pk)")}}}
	var tce *types.TransactionCanceledException
	err = gb.TransactWrite(ctx, fence, cond)
	require.ErrorAs(t, err, &tce)
	assert.NotErrorIs(t, err, ddblease.ErrStaleFence)
	err = run.Commit(ctx, cond)
	require.ErrorAs(t, err, &tce)
	assert.NotErrorIs(t, err, ddblease.ErrStaleFence)
}
