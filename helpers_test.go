package ddblease_test

// The helpers of the package's tests: one per need, used by every test file.

import (
	"context"
	"io"
	"log/slog"
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

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// fast are short timings for tests that wait for expiry in real time, with
// room for a loaded machine (the race detector, the fault suite's processes
// running beside these tests).
func fast(owner string) func(*ddblease.Options) {
	return func(o *ddblease.Options) {
		o.Owner = owner
		o.LeaseDuration = 2 * time.Second
		o.HeartbeatInterval = 500 * time.Millisecond
		o.RetryInterval = 50 * time.Millisecond
		o.MaxClockSkew = 150 * time.Millisecond
		o.CallTimeout = 400 * time.Millisecond
		o.DrainTimeout = 2 * time.Second
		o.Logger = quiet
	}
}

// offset shifts a lease's clock by d.
func offset(d time.Duration) func(*ddblease.Options) {
	return func(o *ddblease.Options) { o.Now = func() time.Time { return time.Now().Add(d) } }
}

// newLease returns a lease handle on job, failing the test on error.
func newLease(t *testing.T, db ddblease.DynamoDBAPI, table, job string, opts ...func(*ddblease.Options)) *ddblease.Lease {
	t.Helper()
	l, err := ddblease.New(db, table, job, opts...)
	require.NoError(t, err)
	return l
}

// tableAndClient returns a new table on the test server and a client
// without faults.
func tableAndClient(t testing.TB) (string, *dynamodb.Client) {
	t.Helper()
	return srv.NewTable(t), srv.Client(nil)
}

// withTimeout returns a context that ends after d or with the test.
func withTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// rawLease reads the lease item of job as stored.
func rawLease(t *testing.T, db *dynamodb.Client, table, job string) map[string]types.AttributeValue {
	t.Helper()
	return getRaw(t, db, table, "lease#"+job)
}

// async runs run in a goroutine until stop, which cancels its context and
// returns what it returned (stop may be called more than once).
func async(ctx context.Context, run func(context.Context) error) (stop func() error) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	var err error
	return func() error {
		once.Do(func() { cancel(); err = <-done })
		return err
	}
}

// runAsync runs l.Run(fn) until stop.
func runAsync(ctx context.Context, l *ddblease.Lease, fn func(context.Context, int64) error) (stop func() error) {
	return async(ctx, func(ctx context.Context) error { return l.Run(ctx, fn) })
}

// receive returns the next value of ch, failing the test after 15s.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(15 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// newAdmin returns an Admin of table, operator "ops@test".
func newAdmin(t *testing.T, db ddblease.AdminAPI, table string) *ddblease.Admin {
	t.Helper()
	a, err := ddblease.NewAdmin(db, table, func(o *ddblease.AdminOptions) { o.Operator = "ops@test" })
	require.NoError(t, err)
	return a
}

// eventually polls cond every 20ms until it holds or 15s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// getRawOK reads the item under pk as stored, with a strongly consistent
// read, and reports whether there is one.
func getRawOK(t *testing.T, db *dynamodb.Client, table, pk string) (map[string]types.AttributeValue, bool) {
	t.Helper()
	out, err := db.GetItem(context.Background(), &dynamodb.GetItemInput{
		TableName: aws.String(table), Key: key(pk), ConsistentRead: aws.Bool(true)})
	require.NoError(t, err)
	return out.Item, len(out.Item) > 0
}

// runScheduleAsync runs l.RunSchedule(sched, fn) until stop.
func runScheduleAsync(ctx context.Context, l *ddblease.Lease, sched ddblease.Schedule, fn func(context.Context, *ddblease.JobRun) error) (stop func() error) {
	return async(ctx, func(ctx context.Context) error { return l.RunSchedule(ctx, sched, fn) })
}

// putRaw writes item as it is.
func putRaw(t *testing.T, db *dynamodb.Client, table string, item map[string]types.AttributeValue) {
	t.Helper()
	_, err := db.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: aws.String(table), Item: item})
	require.NoError(t, err)
}

// getRaw reads the item under pk as stored (nil if there is none).
func getRaw(t *testing.T, db *dynamodb.Client, table, pk string) map[string]types.AttributeValue {
	t.Helper()
	item, _ := getRawOK(t, db, table, pk)
	return item
}

// sAttr and nAttr build string and number attributes.
func sAttr(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }

func nAttr(s string) types.AttributeValue { return &types.AttributeValueMemberN{Value: s} }

// staleFence asserts that err is a *StaleFenceError refusing fence, with
// current as the fence found.
func staleFence(t *testing.T, err error, fence, current int64) {
	t.Helper()
	require.ErrorIs(t, err, ddblease.ErrStaleFence)
	var sfe *ddblease.StaleFenceError
	require.ErrorAs(t, err, &sfe)
	assert.Equal(t, fence, sfe.Fence, "refused fence")
	assert.Equal(t, current, sfe.Current, "current fence")
}

// item builds an item of string attributes from name, value pairs.
func item(kv ...string) map[string]types.AttributeValue {
	m := map[string]types.AttributeValue{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = sAttr(kv[i+1])
	}
	return m
}

// key is the key of the item under pk.
func key(pk string) map[string]types.AttributeValue { return item("pk", pk) }

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

// runLease runs l until the test ends (or stop), with fn waiting for its
// context.
func runLease(t *testing.T, l *ddblease.Lease) (stop func() error) {
	stop = runAsync(context.Background(), l, func(ctx context.Context, _ int64) error { <-ctx.Done(); return nil })
	t.Cleanup(func() { _ = stop() })
	return stop
}
