package ddblease_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
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

// leader returns the replica whose fn leads job, "" if none.
func (w *poolWatch) leader(job string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.active[job]
}

// A deploy that changes the job list runs replicas with two lists at once.
// Each job of either list has a leader all along, even a job that the
// replica with the new list would assign to one running the old list (which
// does not know the job), and a job that the old list assigns to the
// replica with the new list (which no longer runs it).
func TestPoolJobListsThatDifferLeaveNoJobUnled(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	common := poolJobs(4)
	// added: a job of the new list only, which the new list assigns to a
	// (the old list's replica); removed: a job of the old list only, which
	// the old list assigns to b (the new list's replica).
	var added, removed string
	for i := 0; added == "" || removed == ""; i++ {
		if c := fmt.Sprintf("new-%d", i); added == "" && slices.Contains(ddblease.Assign(append(slices.Clone(common), c), []string{"a", "b"})["a"], c) {
			added = c
		}
		if c := fmt.Sprintf("old-%d", i); removed == "" && slices.Contains(ddblease.Assign(append(slices.Clone(common), c), []string{"a", "b"})["b"], c) {
			removed = c
		}
	}
	oldList, newList := append(slices.Clone(common), removed), append(slices.Clone(common), added)
	w := newPoolWatch(t)
	a := newPool(t, db, table, oldList, fast("a"))
	b := newPool(t, db, table, newList, fast("b"))
	stopA := async(ctx, func(ctx context.Context) error { return a.Run(ctx, w.fn("a")) })
	stopB := async(ctx, func(ctx context.Context) error { return b.Run(ctx, w.fn("b")) })
	all := append(slices.Clone(common), added, removed)
	everyJobLed := func() bool {
		for _, job := range all {
			if w.leader(job) == "" {
				return false
			}
		}
		return true
	}
	eventually(t, "every job of either list led", everyJobLed)
	for range 8 { // four heartbeats: it stays so
		time.Sleep(250 * time.Millisecond)
		assert.True(t, everyJobLed(), "a job without a leader: %v", w.leads())
	}
	assert.Equal(t, "b", w.leader(added), "only b runs %s", added)
	assert.Equal(t, "a", w.leader(removed), "only a runs %s", removed)
	require.NoError(t, stopA())
	// The deploy ends: b alone runs the new list, and leads all of it.
	eventually(t, "b leads the new list", func() bool {
		return assert.ObjectsAreEqual(map[string]int{"b": len(newList)}, w.leads())
	})
	require.NoError(t, stopB())
}

// twoReplicas runs two replicas a and b of a pool of four jobs on table
// (each Run stopped, with no error, when the test ends), and returns once
// each leads two.
func twoReplicas(t *testing.T, ctx context.Context, db *dynamodb.Client, table string, opts ...func(*ddblease.Options)) (a, b *ddblease.Pool, w *poolWatch) {
	t.Helper()
	jobs := poolJobs(4)
	w = newPoolWatch(t)
	a = newPool(t, db, table, jobs, append([]func(*ddblease.Options){fast("a")}, opts...)...)
	b = newPool(t, db, table, jobs, append([]func(*ddblease.Options){fast("b")}, opts...)...)
	stopA := async(ctx, func(ctx context.Context) error { return a.Run(ctx, w.fn("a")) })
	stopB := async(ctx, func(ctx context.Context) error { return b.Run(ctx, w.fn("b")) })
	t.Cleanup(func() { assert.NoError(t, stopB()) })
	t.Cleanup(func() { assert.NoError(t, stopA()) })
	eventually(t, "two jobs each", func() bool { return assert.ObjectsAreEqual(map[string]int{"a": 2, "b": 2}, w.leads()) })
	return a, b, w
}

// An operator's resign request on a pool job moves it to another replica
// within a heartbeat or two of the resignation, and it stays there; the
// shares stay even.
func TestPoolResignRequestMovesTheJob(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	a, _, w := twoReplicas(t, ctx, db, table)
	job := a.Assigned()[0]
	require.True(t, a.Lease(job).IsLeader())
	_, err := newAdmin(t, db, table).RequestResign(ctx, job, a.Lease(job).State().Fence)
	require.NoError(t, err)
	eventually(t, "b leads "+job, func() bool { return w.leader(job) == "b" })
	eventually(t, "two jobs each again", func() bool { return assert.ObjectsAreEqual(map[string]int{"a": 2, "b": 2}, w.leads()) })
	for range 12 { // longer than a lease: a does not take it back
		time.Sleep(250 * time.Millisecond)
		assert.Equal(t, "b", w.leader(job))
	}
	assert.NotContains(t, a.Assigned(), job)
	pools, err := newAdmin(t, db, table).Pools(ctx)
	require.NoError(t, err)
	require.Len(t, pools, 1)
	declined := map[string][]string{}
	for _, m := range pools[0].Members {
		declined[m.Owner] = m.Declined
	}
	assert.Equal(t, map[string][]string{"a": {job}, "b": nil}, declined, "what an operator sees of the decline")
	for _, m := range pools[0].Members {
		assert.Equal(t, pools[0].JobListHash, m.JobListHash, "%s runs the pool's job list", m.Owner)
		assert.False(t, m.RenewedAt.IsZero(), "%s's last renewal", m.Owner)
		assert.False(t, m.Leaving)
		assert.Empty(t, m.EndedBy)
	}
	one, ok, err := newAdmin(t, db, table).Pool(ctx, pools[0].Name)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, pools[0].Name, one.Name)
	assert.Equal(t, pools[0].Jobs, one.Jobs)
	assert.Equal(t, pools[0].JobListHash, one.JobListHash)
	assert.Len(t, one.Members, 2)
	_, ok, err = newAdmin(t, db, table).Pool(ctx, "no-such-pool")
	require.NoError(t, err)
	assert.False(t, ok, "an unknown pool")
}

// A pool whose membership cannot be renewed for a reason retrying cannot
// mend stops at once, with an error naming the table and the member item.
func TestPoolStopsOnAnErrorRetryingCannotMend(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 30*time.Second)
	db := srv.Client(nil)
	called := atomic.Bool{}
	p := newPool(t, db, "no-such-table", poolJobs(2), fast("a"))
	err := p.Run(ctx, func(context.Context, string, int64) error { called.Store(true); return nil })
	require.Error(t, err)
	assert.Contains(t, err.Error(), `"no-such-table"`)
	assert.Contains(t, err.Error(), "pool#reports/member#a")
	assert.Contains(t, err.Error(), "not found")
	assert.False(t, called.Load())
	require.ErrorIs(t, p.CheckHealth(0), ddblease.ErrUnhealthy)
	assert.Contains(t, p.CheckHealth(0).Error(), "Run stopped with an error")
}

// A membership renewal that keeps failing (here the read of the members)
// is reported to the observer as EventRetry with Op "membership", and
// fails CheckHealth (and a HealthHandler given the pool) once it has
// lasted longer than the tolerance; a renewal that succeeds again clears
// it.
func TestPoolMembershipFailuresReported(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, faults, db := tableWithFaults(t)
	var mu sync.Mutex
	var retries []ddblease.Event
	p := newPool(t, db, table, poolJobs(2), fast("a"), func(o *ddblease.Options) {
		o.Observer = func(e ddblease.Event) {
			if e.Kind == ddblease.EventRetry && e.Op == "membership" {
				mu.Lock()
				retries = append(retries, e)
				mu.Unlock()
			}
		}
	})
	w := newPoolWatch(t)
	stop := async(ctx, func(ctx context.Context) error { return p.Run(ctx, w.fn("a")) })
	defer func() { assert.NoError(t, stop()) }()
	eventually(t, "a leads both jobs", func() bool { return assert.ObjectsAreEqual(map[string]int{"a": 2}, w.leads()) })
	h := ddblease.HealthHandler(300*time.Millisecond, p)
	code, body := probe(t, h)
	require.Equal(t, http.StatusOK, code, body)

	faults.Fail("Query", ddbtest.ServerError, -1) // the members' read: only the membership uses Query
	eventually(t, "the pool unhealthy", func() bool { code, _ := probe(t, h); return code == http.StatusServiceUnavailable })
	_, body = probe(t, h)
	assert.Contains(t, body, `pool "reports": the membership's renewals have failed for`)
	mu.Lock()
	require.NotEmpty(t, retries)
	e := retries[0]
	mu.Unlock()
	assert.Equal(t, "reports", e.Pool)
	assert.Equal(t, "a", e.Owner)
	assert.Empty(t, e.Job)
	assert.Contains(t, e.Err.Error(), "StatusCode: 500")

	faults.Clear()
	eventually(t, "healthy again", func() bool { return p.CheckHealth(300*time.Millisecond) == nil })
}

// A pool's fn that returns nil on its own, while it leads, resigns the
// job; the pool campaigns for it again at its next membership renewal, and
// fn is called again with a higher fence.
func TestPoolFnReturningNilIsCalledAgain(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	p := newPool(t, db, table, []string{"only"}, fast("a"))
	var mu sync.Mutex
	var fences []int64
	stop := async(ctx, func(ctx context.Context) error {
		return p.Run(ctx, func(ctx context.Context, job string, fence int64) error {
			mu.Lock()
			fences = append(fences, fence)
			n := len(fences)
			mu.Unlock()
			if n < 3 {
				return nil
			}
			<-ctx.Done()
			return nil
		})
	})
	eventually(t, "fn called three times", func() bool { mu.Lock(); defer mu.Unlock(); return len(fences) == 3 })
	require.NoError(t, stop())
	assert.True(t, slices.IsSorted(fences) && fences[0] < fences[2], "fences %v", fences)
}

// A member item whose declined jobs are not a JSON array is malformed:
// ignored, and removed.
func TestPoolMalformedMemberIgnored(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	p := newPool(t, db, table, poolJobs(2), fast("a"))
	w := newPoolWatch(t)
	stop := async(ctx, func(ctx context.Context) error { return p.Run(ctx, w.fn("a")) })
	defer func() { assert.NoError(t, stop()) }()
	eventually(t, "a leads both jobs", func() bool { return assert.ObjectsAreEqual(map[string]int{"a": 2}, w.leads()) })
	_, err := db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: map[string]types.AttributeValue{
		"pk": sAttr("pool#reports"), "sk": sAttr("member#b"),
		"exp":  nAttr(strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10)),
		"view": sAttr("some view"), "list": sAttr("x"), "declined": sAttr("not json"),
	}})
	require.NoError(t, err)
	for range 4 {
		time.Sleep(250 * time.Millisecond)
		assert.Equal(t, []string{"a"}, p.Members())
	}
	eventually(t, "b's item removed", func() bool { _, ok := poolMembers(t, db, table)["b"]; return !ok })
	assert.False(t, errors.Is(p.CheckHealth(0), ddblease.ErrUnhealthy))
	assert.False(t, strings.Contains(fmt.Sprint(w.leads()), "b"))
}

// moveTimings are a pool's timings for the tests that time a job's move
// in heartbeats: a lease of three heartbeats.
func moveTimings(o *ddblease.Options) {
	o.LeaseDuration = 3 * time.Second
	o.HeartbeatInterval = time.Second
}

// An operator's forced release of a pool job its holder leads moves the
// job, as a resign request does: the holder learns of it at its
// session's next renewal, frees the item and declines the job, and the
// other replica leads it within a heartbeat or two, under a higher fence,
// rather than the job waiting a lease with no leader and going back to
// its holder. It stays with the other replica. No job has two leaders
// at once (poolWatch).
func TestPoolForceReleaseMovesTheJob(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	a, b, w := twoReplicas(t, ctx, db, table, moveTimings)
	job := a.Assigned()[0]
	fence := a.Lease(job).State().Fence
	require.True(t, a.Lease(job).IsLeader())
	o := a.Lease(job).Options()

	released := time.Now()
	_, err := newAdmin(t, db, table).ForceRelease(ctx, job, fence)
	require.NoError(t, err)
	eventually(t, "b leads "+job, func() bool { return w.leader(job) == "b" })
	moved := time.Since(released)
	t.Logf("led by the other replica %v (%.1f heartbeats) after the release", moved, moved.Seconds()/o.HeartbeatInterval.Seconds())
	assert.Less(t, moved, o.LeaseDuration, "the job moved within a heartbeat or two, not after a lease")
	assert.Equal(t, fence+2, b.Lease(job).State().Fence, "released (+1), then taken (+1)")
	for end := time.Now().Add(o.LeaseDuration + o.HeartbeatInterval); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		require.Equal(t, "b", w.leader(job), "a does not take it back")
	}
	assert.NotContains(t, a.Assigned(), job)
	eventually(t, "two jobs each again", func() bool { return assert.ObjectsAreEqual(map[string]int{"a": 2, "b": 2}, w.leads()) })
}

// A job released by force from each replica in turn is declined by
// every one of them: the assignment gives it to one of them anyway, and
// that replica leads it (it stayed unled while the pool ran).
func TestPoolJobEveryReplicaDeclinesIsStillLed(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	a, b, w := twoReplicas(t, ctx, db, table, moveTimings)
	job := a.Assigned()[0]
	admin := newAdmin(t, db, table)
	_, err := admin.ForceRelease(ctx, job, a.Lease(job).State().Fence)
	require.NoError(t, err)
	eventually(t, "b leads "+job, func() bool { return w.leader(job) == "b" && b.Lease(job).IsLeader() })
	fb := b.Lease(job).State().Fence
	_, err = admin.ForceRelease(ctx, job, fb)
	require.NoError(t, err)
	// Released (+1), then taken (+1) by a tenure after the release.
	ledAgain := func() bool {
		for _, p := range []*ddblease.Pool{a, b} {
			if st := p.Lease(job).State(); st.Leader && st.Fence >= fb+2 {
				return true
			}
		}
		return false
	}
	eventually(t, job+" led again though both replicas decline it", ledAgain)
	for end := time.Now().Add(a.Lease(job).Options().LeaseDuration); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		require.True(t, ledAgain(), "%s stays led", job)
	}
	assert.Equal(t, 4, len(a.Assigned())+len(b.Assigned()), "every job assigned: a %v, b %v", a.Assigned(), b.Assigned())
}

// A forced release with HolderDead of a job whose replica died (every
// request of it unanswered) hands the job to a surviving replica at its
// next renewal, which leads it at once, well before the dead replica's
// membership lapses: the survivors no longer assign it to the dead
// replica. The dead replica's fence is refused, and the survivor's is
// higher than the release's.
func TestPoolForceReleaseHolderDeadMovesTheJobAtOnce(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, faults, faulty := tableWithFaults(t)
	db := srv.Client(nil)
	jobs := poolJobs(4)
	// A lease of six heartbeats: the dead replica's membership lapses
	// six heartbeats after its last renewal.
	slowLapse := func(o *ddblease.Options) {
		o.LeaseDuration = 6 * time.Second
		o.HeartbeatInterval = time.Second
	}
	wa, wb := newPoolWatch(t), newPoolWatch(t) // the dead replica's fn runs on: it is cut off, not stopped
	a := newPool(t, faulty, table, jobs, fast("a"), slowLapse)
	b := newPool(t, db, table, jobs, fast("b"), slowLapse)
	stopA := async(ctx, func(ctx context.Context) error { return a.Run(ctx, wa.fn("a")) })
	stopB := async(ctx, func(ctx context.Context) error { return b.Run(ctx, wb.fn("b")) })
	defer func() { assert.NoError(t, stopB()) }()
	eventually(t, "two jobs each", func() bool { return wa.leads()["a"] == 2 && wb.leads()["b"] == 2 })
	job := a.Assigned()[0]
	fence := a.Lease(job).State().Fence
	require.NotZero(t, fence)
	o := a.Lease(job).Options()

	faults.Set(blackholeAll) // a dies
	released := time.Now()
	rec, err := newAdmin(t, db, table).ForceRelease(ctx, job, 0, func(o *ddblease.ReleaseOptions) { o.HolderDead = true })
	require.NoError(t, err)
	assert.Equal(t, fence+1, rec.Fence)
	eventually(t, "b leads "+job, func() bool { return wb.leader(job) == "b" })
	moved := time.Since(released)
	t.Logf("led by the survivor %v (%.1f heartbeats) after the release", moved, moved.Seconds()/o.HeartbeatInterval.Seconds())
	assert.Less(t, moved, o.LeaseDuration/2, "led at the survivor's next renewal, long before the dead replica's membership lapses")
	assert.Equal(t, fence+2, b.Lease(job).State().Fence)
	g, err := ddblease.NewGuard(db, table, job)
	require.NoError(t, err)
	assert.ErrorIs(t, g.Check(ctx, fence), ddblease.ErrStaleFence, "the dead holder's fence is refused")
	faults.Clear()
	_ = stopA()
}

// A forced release with HolderDead of a pool job whose holder is in fact
// alive reaches that holder too, as ReleaseOptions.HolderDead promises:
// its tenure ends at its session's next renewal (its leader context's
// cause says an operator released it), though the release unbound the
// item from its session; the job goes to the other replica.
func TestPoolForceReleaseHolderDeadReachesALiveHolder(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	jobs := poolJobs(2)
	causes := make(chan error, 4)
	fences := map[string]chan int64{"a": make(chan int64, 4), "b": make(chan int64, 4)}
	var job atomic.Pointer[string]
	fn := func(replica string) func(context.Context, string, int64) error {
		return func(ctx context.Context, j string, fence int64) error {
			if p := job.Load(); p != nil && *p == j {
				fences[replica] <- fence
			}
			<-ctx.Done()
			if p := job.Load(); p != nil && *p == j && replica == "a" {
				causes <- context.Cause(ctx)
			}
			return nil
		}
	}
	a := newPool(t, db, table, jobs, fast("a"), moveTimings)
	b := newPool(t, db, table, jobs, fast("b"), moveTimings)
	stopA := async(ctx, func(ctx context.Context) error { return a.Run(ctx, fn("a")) })
	stopB := async(ctx, func(ctx context.Context) error { return b.Run(ctx, fn("b")) })
	defer func() { assert.NoError(t, stopB()) }()
	defer func() { assert.NoError(t, stopA()) }()
	eventually(t, "one job each", func() bool { return len(leaders(a, jobs)) == 1 && len(leaders(b, jobs)) == 1 })
	j := leaders(a, jobs)[0]
	job.Store(&j)
	fence := a.Lease(j).State().Fence
	released := time.Now()
	_, err := newAdmin(t, db, table).ForceRelease(ctx, j, fence, func(o *ddblease.ReleaseOptions) { o.HolderDead = true })
	require.NoError(t, err)
	cause := receive(t, (<-chan error)(causes), "the live holder's tenure ends")
	ended := time.Since(released)
	assert.ErrorIs(t, cause, ddblease.ErrLost)
	assert.ErrorContains(t, cause, "released by force")
	o := a.Lease(j).Options()
	assert.Less(t, ended, o.LeaseDuration, "ended at the holder's next renewal")
	assert.False(t, a.Lease(j).IsLeader())
	assert.Equal(t, fence+2, receive(t, (<-chan int64)(fences["b"]), "b leads the job"))
}

// A pool logs its changes of assignment, not each job's: a replica that
// starts, leads 200 jobs and stops writes a few Info lines, however many
// jobs it holds, and each job's acquisition and resignation at Debug.
func TestPoolLogsOneLinePerChangeOfAssignment(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	jobs := poolJobs(200)
	logs := newLogCapture()
	p := newPool(t, db, table, jobs, fast("a"), func(o *ddblease.Options) { o.Logger = slog.New(logs) })
	w := newPoolWatch(t)
	stop := async(ctx, func(ctx context.Context) error { return p.Run(ctx, w.fn("a")) })
	eventually(t, "a leads every job", func() bool { return w.leads()["a"] == len(jobs) })
	require.NoError(t, stop())
	count := func(level slog.Level, msg string) int {
		n := 0
		for _, r := range logs.all() {
			if r.level == level && strings.Contains(r.msg, msg) {
				n++
			}
		}
		return n
	}
	var info []string
	for _, r := range logs.all() {
		if r.level >= slog.LevelInfo {
			info = append(info, r.line())
		}
	}
	shown := info[:min(len(info), 20)]
	assert.LessOrEqual(t, len(info), 6, "%d Info lines and above, the first:\n%s", len(info), strings.Join(shown, "\n"))
	assert.Positive(t, count(slog.LevelInfo, "assignment"), "the change of assignment at Info:\n%s", strings.Join(shown, "\n"))
	assert.Equal(t, len(jobs), count(slog.LevelDebug, "acquired the lease"), "each job's acquisition at Debug")
	assert.Equal(t, len(jobs), count(slog.LevelDebug, "resigning the lease"), "each job's resignation at Debug")
}
