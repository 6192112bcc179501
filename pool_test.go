package ddblease_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
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

// Every job goes to one replica, each replica gets its share rounded down
// or up, every replica computes the same assignment whatever the order it
// lists the replicas in, and a replica that joins takes about its share and
// little more from the others.
func TestAssignShares(t *testing.T) {
	for _, n := range []int{1, 7, 30, 1000} {
		jobs := make([]string, n)
		for i := range jobs {
			jobs[i] = fmt.Sprintf("job-%04d", i)
		}
		for m := 1; m <= 7; m++ {
			reps := make([]string, m)
			for i := range reps {
				reps[i] = fmt.Sprintf("replica-%d", i)
			}
			got := ddblease.Assign(jobs, reps)
			seen := map[string]string{}
			for r, js := range got {
				assert.Contains(t, reps, r)
				assert.True(t, len(js) == n/m || len(js) == (n+m-1)/m, "n=%d m=%d: %s has %d jobs", n, m, r, len(js))
				for _, j := range js {
					assert.Empty(t, seen[j], "n=%d m=%d: job %s assigned twice", n, m, j)
					seen[j] = r
				}
			}
			assert.Len(t, seen, n, "n=%d m=%d: every job assigned", n, m)
			rev := slices.Clone(reps)
			slices.Reverse(rev)
			assert.Equal(t, got, ddblease.Assign(jobs, rev), "n=%d m=%d: the same from any order", n, m)

			joined := ddblease.Assign(jobs, append(slices.Clone(reps), "replica-new"))
			moved := 0
			for r, js := range joined {
				for _, j := range js {
					if seen[j] != r {
						moved++
					}
				}
			}
			share := (n + m) / (m + 1)
			assert.LessOrEqual(t, moved, 2*share+m, "n=%d m=%d: jobs moved when one replica joined", n, m)
		}
	}
	assert.Empty(t, ddblease.Assign([]string{"a"}, nil))
}

// poolWatch records, for the replicas of one pool, which replica's fn leads
// each job, and fails when two lead one job at once or a fence goes down.
type poolWatch struct {
	t      *testing.T
	mu     sync.Mutex
	active map[string]string // job -> replica whose fn runs
	fence  map[string]int64
	count  map[string]int // replica -> jobs its fn runs
}

func newPoolWatch(t *testing.T) *poolWatch {
	return &poolWatch{t: t, active: map[string]string{}, fence: map[string]int64{}, count: map[string]int{}}
}

func (w *poolWatch) fn(replica string) func(context.Context, string, int64) error {
	return func(ctx context.Context, job string, fence int64) error {
		w.mu.Lock()
		if other := w.active[job]; other != "" {
			w.t.Errorf("job %s: %s leads while %s's fn still runs", job, replica, other)
		}
		if fence <= w.fence[job] {
			w.t.Errorf("job %s: fence %d handed to %s after %d", job, fence, replica, w.fence[job])
		}
		w.active[job], w.fence[job] = replica, fence
		w.count[replica]++
		w.mu.Unlock()
		<-ctx.Done()
		w.mu.Lock()
		w.active[job] = ""
		w.count[replica]--
		w.mu.Unlock()
		return nil
	}
}

// leads returns how many jobs each replica's fn leads now.
func (w *poolWatch) leads() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]int{}
	for r, n := range w.count {
		if n > 0 {
			out[r] = n
		}
	}
	return out
}

func poolJobs(n int) []string {
	jobs := make([]string, n)
	for i := range jobs {
		jobs[i] = fmt.Sprintf("tenant-%02d", i)
	}
	return jobs
}

func newPool(t *testing.T, db ddblease.DynamoDBAPI, table string, jobs []string, opts ...func(*ddblease.Options)) *ddblease.Pool {
	t.Helper()
	p, err := ddblease.NewPool(db, table, "reports", jobs, opts...)
	require.NoError(t, err)
	return p
}

// A replica that joins takes its share from the one that led every job,
// which hands it over drained and resigned; a third makes three shares; one
// that stops hands its jobs to the others. No job has two leaders at once.
func TestPoolSpreadsJobsAcrossReplicas(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	jobs := poolJobs(12)
	w := newPoolWatch(t)
	start := func(owner string) (stop func() error) {
		p := newPool(t, db, table, jobs, fast(owner))
		return async(ctx, func(ctx context.Context) error { return p.Run(ctx, w.fn(owner)) })
	}
	shares := func(want map[string]int) func() bool {
		return func() bool { return assert.ObjectsAreEqual(want, w.leads()) }
	}
	stopA := start("a")
	eventually(t, "a leads every job", shares(map[string]int{"a": 12}))
	stopB := start("b")
	eventually(t, "a and b lead six each", shares(map[string]int{"a": 6, "b": 6}))
	stopC := start("c")
	eventually(t, "a, b and c lead four each", shares(map[string]int{"a": 4, "b": 4, "c": 4}))
	require.NoError(t, stopB())
	eventually(t, "a and c take b's jobs", shares(map[string]int{"a": 6, "c": 6}))
	require.NoError(t, stopA())
	require.NoError(t, stopC())
	assert.Empty(t, w.leads())
}

// A replica hands a job over only to a replica that acts on the same view
// of the pool (its entry in the pool's item says which), so that the job's
// new replica does campaign for it: a replica that has not yet seen the
// others as the one handing over sees them might leave the job without a
// leader. Here b is an entry written by the test, with a view of its own
// until the test writes a's.
func TestPoolHandsOverOnlyToAReplicaOnTheSameView(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	p := newPool(t, db, table, poolJobs(4), fast("a"))
	w := newPoolWatch(t)
	stop := async(ctx, func(ctx context.Context) error { return p.Run(ctx, w.fn("a")) })
	defer func() { assert.NoError(t, stop()) }()
	eventually(t, "a leads every job", func() bool { return assert.ObjectsAreEqual(map[string]int{"a": 4}, w.leads()) })
	viewOf := func(member string) string { return poolView(t, db, table, member) }
	alone := viewOf("a")
	writeB := func(view string) { writeFakeMember(ctx, t, db, table, "b", view) }
	writeB("another view")
	eventually(t, "a acts on a view with b", func() bool {
		return slices.Equal(p.Members(), []string{"a", "b"}) && viewOf("a") != alone
	})
	for range 8 { // four heartbeats; b renews its entry, as a live replica does
		assert.Equal(t, map[string]int{"a": 4}, w.leads(), "a handed jobs over to b, which acts on another view")
		time.Sleep(250 * time.Millisecond)
		writeB("another view")
	}
	writeB(viewOf("a"))
	eventually(t, "a hands b its share", func() bool { return assert.ObjectsAreEqual(map[string]int{"a": 2}, w.leads()) })
}

// A replica whose wall clock was far ahead when it last renewed its entry,
// then died, wrote an expiry an hour out: the others count it gone once
// they have read its entry unchanged for a LeaseDuration, take its share
// back, and remove its entry.
func TestPoolReplicaGoneWithAnExpiryFarAheadLosesItsShare(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	p := newPool(t, db, table, poolJobs(4), fast("a"))
	w := newPoolWatch(t)
	stop := async(ctx, func(ctx context.Context) error { return p.Run(ctx, w.fn("a")) })
	defer func() { assert.NoError(t, stop()) }()
	eventually(t, "a leads every job", func() bool { return assert.ObjectsAreEqual(map[string]int{"a": 4}, w.leads()) })
	members := func() map[string]map[string]types.AttributeValue { return poolMembers(t, db, table) }
	viewOf := func(member string) string { return poolView(t, db, table, member) }
	alone := viewOf("a")
	writeB := func(view string) { writeFakeMember(ctx, t, db, table, "b", view) }
	writeB("a view")
	eventually(t, "a acts on a view with b", func() bool {
		return slices.Equal(p.Members(), []string{"a", "b"}) && viewOf("a") != alone
	})
	writeB(viewOf("a")) // b's last renewal
	eventually(t, "a hands b its share", func() bool { return assert.ObjectsAreEqual(map[string]int{"a": 2}, w.leads()) })
	eventually(t, "a counts b gone", func() bool { return slices.Equal(p.Members(), []string{"a"}) })
	eventually(t, "a leads every job again", func() bool { return assert.ObjectsAreEqual(map[string]int{"a": 4}, w.leads()) })
	eventually(t, "b's entry removed", func() bool { _, ok := members()["b"]; return !ok })
}

// A replica that dies (its network black-holed: no renewal of its leases
// or of its membership lands) loses its jobs to the others once its leases
// and its membership expire; they never lead a job while its fn still
// does.
func TestPoolReplicaThatDiesLosesItsJobs(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, faults, faulty := tableWithFaults(t)
	jobs := poolJobs(8)
	w := newPoolWatch(t)
	var dead atomic.Bool
	faults.Set(func(op string) ddbtest.Action {
		if dead.Load() {
			return ddbtest.Blackhole
		}
		return ddbtest.Pass
	})
	a := newPool(t, srv.Client(nil), table, jobs, fast("a"))
	b := newPool(t, faulty, table, jobs, fast("b"))
	stopA := async(ctx, func(ctx context.Context) error { return a.Run(ctx, w.fn("a")) })
	stopB := async(ctx, func(ctx context.Context) error { return b.Run(ctx, w.fn("b")) })
	eventually(t, "four jobs each", func() bool { return assert.ObjectsAreEqual(map[string]int{"a": 4, "b": 4}, w.leads()) })
	dead.Store(true)
	eventually(t, "a leads every job", func() bool { return assert.ObjectsAreEqual(map[string]int{"a": 8}, w.leads()) })
	assert.Equal(t, []string{"a"}, a.Members())
	require.NoError(t, stopA())
	// b, cut off, still fails to reach the table as it stops: its Run
	// reports that (as Run does when it stops while failing).
	_ = stopB()
}

// A replica whose wall clock ran an hour ahead when it last renewed its
// session, then died, left the session's expiry an hour out, and a job
// bound to it: the others end the session once they have read its
// version unchanged for a LeaseDuration (docs/sessions.md, rule 3: its
// member item bears the end mark, and is not merely removed), then take
// the job with the next fence.
func TestPoolEndsTheLapsedSessionOfADeadReplicaWithAClockAhead(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	jobs := poolJobs(4)
	p := newPool(t, db, table, jobs, fast("a"))
	w := newPoolWatch(t)
	stop := async(ctx, func(ctx context.Context) error { return p.Run(ctx, w.fn("a")) })
	defer func() { assert.NoError(t, stop()) }()
	eventually(t, "a leads every job", func() bool { return assert.ObjectsAreEqual(map[string]int{"a": 4}, w.leads()) })
	writeFakeMember(ctx, t, db, table, "b", "a view")
	eventually(t, "a acts on a view with b", func() bool { return slices.Equal(p.Members(), []string{"a", "b"}) })
	writeFakeMember(ctx, t, db, table, "b", poolView(t, db, table, "a")) // b's last renewal
	eventually(t, "a hands b its share", func() bool { return assert.ObjectsAreEqual(map[string]int{"a": 2}, w.leads()) })
	var job string
	for _, j := range jobs {
		if !p.Lease(j).IsLeader() {
			job = j
		}
	}
	// b takes the job, binding it to its session, and dies.
	_, err := db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(table), Key: map[string]types.AttributeValue{"pk": sAttr("job#" + job), "sk": sAttr("lease")},
		UpdateExpression: aws.String("SET #o = :b, #s = :sid, #p = :pool, #f = #f + :one, #x = :far, #rv = :rv"),
		ExpressionAttributeNames: map[string]string{"#o": "owner", "#s": "session", "#p": "pool", "#f": "fence",
			"#x": "expiresAt", "#rv": "rv"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":b": sAttr("b"), ":sid": sAttr("fake-session"),
			":pool": sAttr("reports"), ":one": nAttr("1"), ":far": nAttr(strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)),
			":rv": sAttr("taken-by-b")},
	})
	require.NoError(t, err)
	taken := leaseFence(t, db, table, job)
	eventually(t, "a ends b's session", func() bool {
		end, _ := poolMembers(t, db, table)["b"]["ended"].(*types.AttributeValueMemberS)
		return end != nil && end.Value == "a"
	})
	eventually(t, "a leads every job again", func() bool { return assert.ObjectsAreEqual(map[string]int{"a": 4}, w.leads()) })
	assert.Equal(t, taken+1, leaseFence(t, db, table, job), "a took b's job with the next fence")
}

// Replicas whose clocks differ by less than MaxClockSkew see the same
// replicas live and split the jobs evenly.
func TestPoolClocksWithinTheBound(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	jobs := poolJobs(9)
	w := newPoolWatch(t)
	var stops []func() error
	for i, d := range []time.Duration{-70 * time.Millisecond, 0, 70 * time.Millisecond} {
		owner := string(rune('a' + i))
		p := newPool(t, db, table, jobs, fast(owner), offset(d))
		stops = append(stops, async(ctx, func(ctx context.Context) error { return p.Run(ctx, w.fn(owner)) }))
	}
	eventually(t, "three jobs each", func() bool {
		return assert.ObjectsAreEqual(map[string]int{"a": 3, "b": 3, "c": 3}, w.leads())
	})
	// The split holds over several membership renewals.
	time.Sleep(2 * time.Second)
	assert.Equal(t, map[string]int{"a": 3, "b": 3, "c": 3}, w.leads())
	for _, stop := range stops {
		require.NoError(t, stop())
	}
}

// Bad input gets an error naming what was wrong.
func TestNewPoolBadInput(t *testing.T) {
	table, db := tableAndClient(t)
	for _, c := range []struct {
		name, pool string
		jobs       []string
		want       string
	}{
		{"no jobs", "p", nil, "has no jobs"},
		{"a job twice", "p", []string{"a", "b", "a"}, `job "a" is listed twice`},
		{"an empty pool name", "", []string{"a"}, "pool name"},
		{"an empty job name", "p", []string{""}, "job name"},
	} {
		_, err := ddblease.NewPool(db, table, c.pool, c.jobs)
		assert.ErrorIs(t, err, ddblease.ErrInvalid, c.name)
		assert.ErrorContains(t, err, c.want, c.name)
	}
	p := newPool(t, db, table, []string{"a"}, fast("x"))
	assert.ErrorIs(t, p.Run(context.Background(), nil), ddblease.ErrInvalid)
	assert.Nil(t, p.Lease("nope"))
	assert.NotNil(t, p.Lease("a"))
}

// An error fn returns while it leads a job stops the pool on this replica,
// as it stops Run: the other jobs are handed over, and Run returns the
// error, naming the job.
func TestPoolStopsOnFnError(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table, db := tableAndClient(t)
	p := newPool(t, db, table, poolJobs(3), fast("a"))
	boom := errors.New("boom")
	err := p.Run(ctx, func(ctx context.Context, job string, fence int64) error {
		if job == "tenant-01" {
			return boom
		}
		<-ctx.Done()
		return nil
	})
	require.ErrorIs(t, err, boom)
	assert.ErrorContains(t, err, `job "tenant-01"`)
	for _, job := range poolJobs(3) {
		assert.False(t, p.Lease(job).IsLeader(), job)
		rec, err := p.Lease(job).Holder(ctx)
		require.NoError(t, err)
		assert.True(t, rec.ExpiresAt.IsZero(), "%s resigned", job)
	}
}

// The pool's partition forgets replicas long gone (dead, or whose leave
// failed), and a malformed member item is ignored, not fatal.
func TestPoolForgetsDeadMembers(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table, db := tableAndClient(t)
	old := time.Now().Add(-time.Hour).UnixMilli()
	putRaw(t, db, table, map[string]types.AttributeValue{
		"pk": sAttr("pool#reports"), "sk": sAttr("member#gone"),
		"exp": nAttr(strconv.FormatInt(old, 10)), "view": sAttr(""),
	})
	putRaw(t, db, table, map[string]types.AttributeValue{
		"pk": sAttr("pool#reports"), "sk": sAttr("member#malformed"), "exp": sAttr("not a number"),
	})
	p := newPool(t, db, table, poolJobs(2), fast("a"))
	w := newPoolWatch(t)
	stop := async(ctx, func(ctx context.Context) error { return p.Run(ctx, w.fn("a")) })
	eventually(t, "a leads both jobs", func() bool { return assert.ObjectsAreEqual(map[string]int{"a": 2}, w.leads()) })
	assert.Equal(t, []string{"a"}, p.Members())
	eventually(t, "the gone members removed", func() bool {
		m := poolMembers(t, db, table)
		_, gone := m["gone"]
		_, bad := m["malformed"]
		_, me := m["a"]
		return !gone && !bad && me
	})
	require.NoError(t, stop())
	_, me := poolMembers(t, db, table)["a"]
	assert.False(t, me, "a left the pool when it stopped")
}

// A dead replica's member item is ended before it is removed, so that a
// replica which reads it only afterwards (one that joined late, say)
// takes the dead replica's jobs at once on the end mark, instead of a
// lease after a read that found the item gone (simulation seed 1022224).
func TestPoolEndsDeadMembersBeforeRemovingThem(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table, db := tableAndClient(t)
	lapsed := time.Now().Add(-3 * time.Second).UnixMilli() // 1.5 leases ago
	putRaw(t, db, table, map[string]types.AttributeValue{
		"pk": sAttr("pool#reports"), "sk": sAttr("member#dead"),
		"exp": nAttr(strconv.FormatInt(lapsed, 10)), "view": sAttr(""), "list": sAttr(""), "declined": sAttr("[]"),
		"sid": sAttr("s-dead"), "sv": sAttr("v-1"), "ended": sAttr("-"), "leaving": &types.AttributeValueMemberBOOL{},
	})
	p := newPool(t, db, table, poolJobs(2), fast("a"))
	w := newPoolWatch(t)
	stop := async(ctx, func(ctx context.Context) error { return p.Run(ctx, w.fn("a")) })
	eventually(t, "the dead member ended by a", func() bool {
		m, ok := poolMembers(t, db, table)["dead"]
		return ok && assert.ObjectsAreEqual(sAttr("a"), m["ended"])
	})
	eventually(t, "the ended member removed once its expiry is three leases old", func() bool {
		_, ok := poolMembers(t, db, table)["dead"]
		return !ok
	})
	assert.GreaterOrEqual(t, time.Now().UnixMilli(), lapsed+3*2000, "removed before its expiry was three leases old")
	require.NoError(t, stop())
}

// A panic in fn ends the pool on this replica like an error, returned as a
// *PanicError naming its job: nothing else could recover it.
func TestPoolFnPanicIsReturned(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	table, db := tableAndClient(t)
	p := newPool(t, db, table, poolJobs(2), fast("a"))
	err := p.Run(ctx, func(ctx context.Context, job string, fence int64) error {
		if job == "tenant-01" {
			panic("tenant bug")
		}
		<-ctx.Done()
		return nil
	})
	var pe *ddblease.PanicError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, "tenant bug", pe.Value)
	assert.ErrorContains(t, err, `job "tenant-01"`)
}

// poolMembers returns the member items of pool "reports" as stored, by
// member.
func poolMembers(t *testing.T, db *dynamodb.Client, table string) map[string]map[string]types.AttributeValue {
	t.Helper()
	out, err := db.Query(context.Background(), &dynamodb.QueryInput{
		TableName:                 aws.String(table),
		KeyConditionExpression:    aws.String("pk = :pk"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": sAttr("pool#reports")},
		ConsistentRead:            aws.Bool(true),
	})
	require.NoError(t, err)
	members := map[string]map[string]types.AttributeValue{}
	for _, item := range out.Items {
		sk, _ := item["sk"].(*types.AttributeValueMemberS)
		require.NotNil(t, sk)
		members[strings.TrimPrefix(sk.Value, "member#")] = item
	}
	return members
}

// poolView returns the view member's entry in pool "reports" names.
func poolView(t *testing.T, db *dynamodb.Client, table, member string) string {
	t.Helper()
	e := poolMembers(t, db, table)[member]
	require.NotNil(t, e, "the member item of %s", member)
	v, _ := e["view"].(*types.AttributeValueMemberS)
	require.NotNil(t, v, "the view of %s", member)
	return v.Value
}

// writeFakeMember writes an entry for member in pool "reports", expiring
// in an hour, acting on view, with a's job list and no job declined: a
// replica that runs no pool.
func writeFakeMember(ctx context.Context, t *testing.T, db *dynamodb.Client, table, member, view string) {
	t.Helper()
	a := poolMembers(t, db, table)["a"]
	require.NotNil(t, a, "a's member item")
	_, err := db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: map[string]types.AttributeValue{
		"pk": sAttr("pool#reports"), "sk": sAttr("member#" + member),
		"exp":  nAttr(strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)),
		"view": sAttr(view), "list": a["list"], "declined": sAttr("[]"),
		"sid": sAttr("fake-session"), "sv": sAttr(view + "@" + strconv.FormatInt(time.Now().UnixNano(), 10)),
	}})
	require.NoError(t, err)
}

// leaseFence reads job's fence from its lease item.
func leaseFence(t *testing.T, db *dynamodb.Client, table, job string) int64 {
	t.Helper()
	out, err := db.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String(table),
		Key: map[string]types.AttributeValue{"pk": sAttr("job#" + job), "sk": sAttr("lease")}, ConsistentRead: aws.Bool(true)})
	require.NoError(t, err)
	f, _ := out.Item["fence"].(*types.AttributeValueMemberN)
	require.NotNil(t, f, "the fence of %s", job)
	n, err := strconv.ParseInt(f.Value, 10, 64)
	require.NoError(t, err)
	return n
}

// fences returns the fence each job's fn was last handed.
func (w *poolWatch) fences() map[string]int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.fence)
}
