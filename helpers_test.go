package ddblease_test

// The helpers of the package's tests: one per need, used by every test file.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
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

// steppedClock sets a lease's clock to the real one shifted by *step, which
// a test changes to step the wall clock as NTP would.
func steppedClock(step *atomic.Int64) func(*ddblease.Options) {
	return func(o *ddblease.Options) {
		o.Now = func() time.Time { return time.Now().Add(time.Duration(step.Load())) }
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

// tableWithFaults returns a new table on the test server, a fault injector
// and a client whose transport it decorates.
func tableWithFaults(t testing.TB) (string, *ddbtest.Faults, *dynamodb.Client) {
	t.Helper()
	faults := ddbtest.NewFaults(nil)
	return srv.NewTable(t), faults, srv.Client(faults.Wrap)
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
func newAdmin(t *testing.T, db ddblease.DynamoDBAPI, table string) *ddblease.Admin {
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

// key is the key of the item that id names in a table of the default
// Layout: "lease#JOB" is JOB's lease item, "jobrun#JOB#RUNID" the item of
// that run of JOB (RUNID as JobRun.ID, or a trigger's RunID), and any
// other id an item of the test's own (sort key "item", as sink makes).
func key(id string) map[string]types.AttributeValue {
	if job, ok := strings.CutPrefix(id, "lease#"); ok {
		return sink("job#"+job, "sk", "lease")
	}
	if rest, ok := strings.CutPrefix(id, "jobrun#"); ok {
		job, runID, _ := strings.Cut(rest, "#")
		return sink("job#"+job, "sk", runSortKey(runID))
	}
	return sink(id, "sk", "item")
}

// listing is the UpdateItem a job's first acquisition adds: after writing
// the job's directory entry (a PutItem), it marks the lease item listed.
const listing = 1

// withKey adds the key of the item that id names (key) to attrs, and
// returns attrs.
func withKey(id string, attrs map[string]types.AttributeValue) map[string]types.AttributeValue {
	maps.Copy(attrs, key(id))
	return attrs
}

// runSortKey is the sort key of the run item of runID, as Layout
// documents it: run#, the slot in UTC with nine fractional digits, and
// #trigger-<id> for a triggered run.
func runSortKey(runID string) string {
	slot, trigger, _ := strings.Cut(runID, "#trigger-")
	t, err := time.Parse(time.RFC3339Nano, slot)
	if err != nil {
		panic("runSortKey: " + runID)
	}
	sk := "run#" + t.UTC().Format("2006-01-02T15:04:05.000000000Z")
	if trigger != "" {
		sk += "#trigger-" + trigger
	}
	return sk
}

// sink builds an item of the test's own in the lease table, under the
// partition key pk (sort key "item"), with string attributes from name,
// value pairs.
func sink(pk string, kv ...string) map[string]types.AttributeValue {
	return item(append([]string{"pk", pk, "sk", "item"}, kv...)...)
}

// every returns a fault rule that applies act to every request of op and
// passes everything else.
func every(op string, act ddbtest.Action) func(string) ddbtest.Action {
	return func(o string) ddbtest.Action {
		if o == op {
			return act
		}
		return ddbtest.Pass
	}
}

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

// slowLease gives a lease a long tenure, for a holder that must still
// believe it leads after another has taken over (with offset).
func slowLease(o *ddblease.Options) {
	o.LeaseDuration = 20 * time.Second
	o.HeartbeatInterval = 5 * time.Second
	o.CallTimeout = 2 * time.Second
}

// deposedPair returns two handles on job: a, which acquired fence 1 with a
// clock an hour slow and still believes it leads, and b, which took over
// at once with fence 2 (a's expiry looks an hour old to b). before runs
// while a leads, before b takes over.
func deposedPair(t *testing.T, dbA, dbB ddblease.DynamoDBAPI, table, job string, before func(a *ddblease.Lease)) (a, b *ddblease.Lease) {
	t.Helper()
	ctx := withTimeout(t, 10*time.Second)
	a = newLease(t, dbA, table, job, fast("a"), slowLease, offset(-time.Hour))
	b = newLease(t, dbB, table, job, fast("b"))
	fa, err := a.TryAcquire(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), fa)
	if before != nil {
		before(a)
	}
	fb, err := b.TryAcquire(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(2), fb)
	require.True(t, a.IsLeader(), "a must still believe it leads")
	return a, b
}

// oneSlot is a schedule with a single slot.
func oneSlot(slot time.Time) ddblease.Schedule {
	return ddblease.ScheduleFunc(func(t time.Time) time.Time {
		if t.Before(slot) {
			return slot
		}
		return time.Time{}
	})
}

// listSlots is a schedule with the given slots, in increasing order.
func listSlots(slots ...time.Time) ddblease.Schedule {
	return ddblease.ScheduleFunc(func(t time.Time) time.Time {
		for _, s := range slots {
			if s.After(t) {
				return s
			}
		}
		return time.Time{}
	})
}

func runsBySlot(runs []ddblease.RunRecord) map[time.Time]ddblease.RunRecord {
	m := make(map[time.Time]ddblease.RunRecord, len(runs))
	for _, r := range runs {
		m[r.Slot] = r
	}
	return m
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func diff(before, after map[string]int) map[string]int {
	d := map[string]int{}
	for k, v := range after {
		if v != before[k] {
			d[k] = v - before[k]
		}
	}
	return d
}

// opsByItem counts requests by operation and, for single-item operations,
// the kind of item (by its sort key): "UpdateItem lease", "UpdateItem
// jobrun", "PutItem other", "TransactWriteItems", "BatchGetItem".
type opsByItem struct {
	base   http.RoundTripper
	mu     sync.Mutex
	counts map[string]int
}

func (c *opsByItem) wrap(rt http.RoundTripper) http.RoundTripper {
	c.base, c.counts = rt, map[string]int{}
	return c
}

func (c *opsByItem) RoundTrip(r *http.Request) (*http.Response, error) {
	name := ddbtest.Op(r)
	if r.Body != nil && (name == "GetItem" || name == "UpdateItem" || name == "PutItem") {
		b, err := io.ReadAll(r.Body)
		_ = r.Body.Close()
		if err != nil {
			return nil, err
		}
		var in struct {
			Key, Item struct{ Sk struct{ S string } }
		}
		_ = json.Unmarshal(b, &in)
		sk := in.Key.Sk.S + in.Item.Sk.S
		switch kind, _, _ := strings.Cut(sk, "#"); kind {
		case "lease":
			name += " lease"
		case "run":
			name += " jobrun"
		default:
			name += " other" // a directory entry, a member item
		}
		r = r.Clone(r.Context())
		r.Body = io.NopCloser(bytes.NewReader(b))
	}
	c.mu.Lock()
	c.counts[name]++
	c.mu.Unlock()
	return c.base.RoundTrip(r)
}

func (c *opsByItem) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := make(map[string]int, len(c.counts))
	for k, v := range c.counts {
		m[k] = v
	}
	return m
}

// tenureLog records the tenures Run hands to fn.
type tenureLog struct {
	mu      sync.Mutex
	fences  []int64
	causes  []error
	started chan int64
}

func newTenureLog() *tenureLog { return &tenureLog{started: make(chan int64, 16)} }

// fn leads until its context ends, then records the cause.
func (r *tenureLog) fn(ctx context.Context, fence int64) error {
	r.mu.Lock()
	r.fences = append(r.fences, fence)
	r.mu.Unlock()
	r.started <- fence
	<-ctx.Done()
	r.mu.Lock()
	r.causes = append(r.causes, context.Cause(ctx))
	r.mu.Unlock()
	return ctx.Err()
}

func (r *tenureLog) cause(i int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i >= len(r.causes) {
		return nil
	}
	return r.causes[i]
}

// farSchedule's one slot is in the year 9000: no slot falls due while a
// test runs, at any time of day (a daily schedule's midnight slot is due
// in the first CatchUpWindow of every UTC day).
var farSchedule = ddblease.ScheduleFunc(func(t time.Time) time.Time {
	if slot := time.Date(9000, 1, 1, 0, 0, 0, 0, time.UTC); t.Before(slot) {
		return slot
	}
	return time.Time{}
})
