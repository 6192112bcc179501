package ddblease_test

import (
	"bytes"
	"context"
	"encoding/json"
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
		return []types.TransactWriteItem{{Put: &types.Put{TableName: aws.String(table), Item: sink(pk)}}}
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
		faults.Set(every("TransactWriteItems", ddbtest.Conflict))
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
		faults.Set(every("TransactWriteItems", ddbtest.Conflict))
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

// Commit's items cannot act on the lease item its check reads, nor on the
// run item it finishes.
func TestCommitRefusesLeaseAndRunItems(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 20*time.Second)
	table, faults, db := tableWithFaults(t)
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
			{Put: &types.Put{TableName: aws.String(table), Item: sink("sink#ok")}},
			{Delete: &types.Delete{TableName: aws.String(table), Key: key(pk)}},
		})
		require.ErrorIs(t, err, ddblease.ErrInvalid)
		assert.Contains(t, err.Error(), "item 1 "+says)
	}
	assert.Equal(t, before, total(faults.Counts()), "refused before any request")
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
		Item: sink("sink#commit")}}}), "the commit landed: the run is succeeded")
	assert.NotEmpty(t, getRaw(t, raw, table, "sink#commit"))

	g, err := ddblease.NewGuard(db, table, "billing")
	require.NoError(t, err)
	mm.arm()
	before := faults.Count("TransactWriteItems")
	err = g.TransactWrite(ctx, fence, []types.TransactWriteItem{{Put: &types.Put{TableName: aws.String(table),
		Item: sink("sink#tx")}}})
	var ipm *types.IdempotentParameterMismatchException
	require.ErrorAs(t, err, &ipm)
	assert.Contains(t, err.Error(), "was used before with other parameters")
	assert.Equal(t, 1, faults.Count("TransactWriteItems")-before, "not retried")
}
