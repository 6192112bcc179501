package ddblease_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
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

// Held jobs cost nothing each: once the pool is balanced, each replica
// writes its member item once per heartbeat and reads the members once
// then and once every RetryInterval between (a jittered RetryInterval is
// at least three quarters of it), and no lease item is read or written,
// however many jobs it holds.
func TestPoolSessionRenewsEveryJobWithOneWrite(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table := srv.NewTable(t)
	jobs := poolJobs(24)
	w := newPoolWatch(t)
	ca, cb := &opsByItem{}, &opsByItem{}
	a := newPool(t, srv.Client(ca.wrap), table, jobs, fast("a"))
	b := newPool(t, srv.Client(cb.wrap), table, jobs, fast("b"))
	stopA := async(ctx, func(ctx context.Context) error { return a.Run(ctx, w.fn("a")) })
	stopB := async(ctx, func(ctx context.Context) error { return b.Run(ctx, w.fn("b")) })
	eventually(t, "twelve jobs each", func() bool { return assert.ObjectsAreEqual(map[string]int{"a": 12, "b": 12}, w.leads()) })
	time.Sleep(time.Second) // the hand-overs' last writes
	beforeA, beforeB := ca.snapshot(), cb.snapshot()
	const window = 3 * time.Second // six heartbeats
	time.Sleep(window)
	for name, d := range map[string]map[string]int{"a": diff(beforeA, ca.snapshot()), "b": diff(beforeB, cb.snapshot())} {
		assert.Zero(t, d["UpdateItem lease"], "%s wrote lease items while holding its jobs: %v", name, d)
		assert.Zero(t, d["GetItem lease"], "%s read lease items while holding its jobs: %v", name, d)
		renewals := d["UpdateItem other"]
		assert.GreaterOrEqual(t, renewals, 5, "%s renewed its session too rarely: %v", name, d)
		assert.LessOrEqual(t, renewals, 12, "%s renewed more than once a heartbeat: %v", name, d)
		looks := int(window/(3*a.Lease(jobs[0]).Options().RetryInterval/4)) + 1
		assert.LessOrEqual(t, d["Query"], renewals+looks, "%s read the members more than once a RetryInterval: %v", name, d)
		assert.LessOrEqual(t, total(d)-d["Query"], 2*renewals, "%s: %v", name, d)
	}
	assert.Equal(t, map[string]int{"a": 12, "b": 12}, w.leads())
	for _, job := range jobs {
		item := rawLease(t, srv.Client(nil), table, job)
		assert.Equal(t, sAttr("reports"), item["pool"], "job %s", job)
		assert.NotNil(t, item["session"], "job %s is bound to a session", job)
	}
	require.NoError(t, stopA())
	require.NoError(t, stopB())
}

// A replica that finds another's session lapsed ends it before it takes
// any of its jobs: the member item says who ended it, and the dead
// replica's jobs were taken once its tenures had ended (poolWatch fails
// the test on two leaders).
func TestPoolSessionLapsedIsEndedThenItsJobsTaken(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, faults, faulty := tableWithFaults(t)
	jobs := poolJobs(6)
	w := newPoolWatch(t)
	a := newPool(t, srv.Client(nil), table, jobs, fast("a"))
	b := newPool(t, faulty, table, jobs, fast("b"))
	stopA := async(ctx, func(ctx context.Context) error { return a.Run(ctx, w.fn("a")) })
	stopB := async(ctx, func(ctx context.Context) error { return b.Run(ctx, w.fn("b")) })
	eventually(t, "three jobs each", func() bool { return assert.ObjectsAreEqual(map[string]int{"a": 3, "b": 3}, w.leads()) })
	sid := poolMembers(t, srv.Client(nil), table)["b"]["sid"]
	require.NotNil(t, sid)
	faults.Set(blackholeAll)
	eventually(t, "a leads every job", func() bool { return assert.ObjectsAreEqual(map[string]int{"a": 6}, w.leads()) })
	if m := poolMembers(t, srv.Client(nil), table)["b"]; m != nil {
		assert.Equal(t, sid, m["sid"], "b's session")
		assert.Equal(t, sAttr("a"), m["ended"], "b's lapsed session was ended by a")
	}
	require.NoError(t, stopA())
	_ = stopB()
}

// A replica restarted under its predecessor's Owner (a StatefulSet's pod
// keeps its name; a service may set Owner to its host's name) takes the
// jobs its predecessor held, once its own session has replaced the
// predecessor's in their member item: a LeaseDuration after a member read
// showed it, and never while the predecessor may still lead. Here the
// predecessor dies (every request unanswered) while it leads, and its
// successor starts at once.
func TestPoolReplicaRestartedUnderTheSameOwnerTakesItsPredecessorsJobs(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, faults, faulty := tableWithFaults(t)
	jobs := poolJobs(3)
	w := newPoolWatch(t) // fails the test if a job's fn starts while another's runs
	before := newPool(t, faulty, table, jobs, fast("worker-0"))
	stopBefore := async(ctx, func(ctx context.Context) error { return before.Run(ctx, w.fn("before")) })
	eventually(t, "the first process leads every job", func() bool { return w.leads()["before"] == 3 })
	faults.Set(blackholeAll) // the first process dies

	after := newPool(t, srv.Client(nil), table, jobs, fast("worker-0"))
	stopAfter := async(ctx, func(ctx context.Context) error { return after.Run(ctx, w.fn("after")) })
	eventually(t, "the restarted process leads every job", func() bool { return w.leads()["after"] == 3 })
	for _, job := range jobs {
		rec, err := after.Lease(job).Holder(ctx)
		require.NoError(t, err)
		assert.Equal(t, int64(2), rec.Fence, "job %s", job)
	}
	require.NoError(t, stopAfter())
	_ = stopBefore()
}

// Two live processes given the same Owner share one member item: each
// replaces the other's session there. They say so, and no job has two
// leaders at once.
func TestPoolTwoProcessesWithOneOwnerWarn(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	jobs := poolJobs(4)
	w := newPoolWatch(t) // fails the test if a job's fn starts while another's runs
	logs := [2]*logCapture{newLogCapture(), newLogCapture()}
	var stops []func() error
	for i, name := range []string{"first", "second"} {
		p := newPool(t, db, table, jobs, fast("billing-service"), func(o *ddblease.Options) { o.Logger = slog.New(logs[i]) })
		stops = append(stops, async(ctx, func(ctx context.Context) error { return p.Run(ctx, w.fn(name)) }))
		if i == 0 {
			eventually(t, "the first process leads every job", func() bool { return w.leads()["first"] == 4 })
		}
	}
	warned := func(c *logCapture) bool {
		for _, r := range c.all() {
			if r.level == slog.LevelWarn && strings.Contains(r.msg, "under this replica's Owner") {
				return true
			}
		}
		return false
	}
	eventually(t, "both processes warn", func() bool { return warned(logs[0]) && warned(logs[1]) })
	for _, stop := range stops {
		_ = stop()
	}
}

// A session that another replica ended is never renewed again: its
// holder's next renewal is refused, every job bound to it stops at once
// (its leader context ends with a cause wrapping ErrLost), and the
// replica starts a new session and takes its jobs back.
func TestPoolSessionEndedStopsEveryJobBoundToIt(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	jobs := poolJobs(3)
	causes := make(chan error, 10)
	p := newPool(t, db, table, jobs, fast("a"))
	stop := async(ctx, func(ctx context.Context) error {
		return p.Run(ctx, func(ctx context.Context, job string, fence int64) error {
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return nil
		})
	})
	eventually(t, "a leads every job", func() bool { return len(leaders(p, jobs)) == 3 })
	old := poolMembers(t, db, table)["a"]["sid"]
	_, err := db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(table), Key: map[string]types.AttributeValue{"pk": sAttr("pool#reports"), "sk": sAttr("member#a")},
		UpdateExpression:          aws.String("SET #e = :x"),
		ExpressionAttributeNames:  map[string]string{"#e": "ended"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":x": sAttr("x")},
	})
	require.NoError(t, err)
	ended := time.Now()
	for range jobs {
		cause := receive(t, (<-chan error)(causes), "a job's end")
		assert.ErrorIs(t, cause, ddblease.ErrLost)
		assert.ErrorContains(t, cause, "the pool session was ended by another replica")
	}
	assert.Less(t, time.Since(ended), 2*time.Second, "the jobs ended at the next renewal, not at the deadline")
	eventually(t, "a leads every job again", func() bool { return len(leaders(p, jobs)) == 3 })
	assert.NotEqual(t, old, poolMembers(t, db, table)["a"]["sid"], "a new session")
	require.NoError(t, stop())
}

// A forced release of a job of a pool reaches its holder through its
// session's member item: the tenure ends within a heartbeat or two, the
// holder frees the item (no other replica could take it while the session
// lives), and the job is led again under a higher fence.
func TestPoolSessionForcedReleaseEndsTheTenure(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	jobs := poolJobs(2)
	causes := make(chan error, 10)
	fences := make(chan int64, 10)
	p := newPool(t, db, table, jobs, fast("a"))
	stop := async(ctx, func(ctx context.Context) error {
		return p.Run(ctx, func(ctx context.Context, job string, fence int64) error {
			if job == jobs[0] {
				fences <- fence
			}
			<-ctx.Done()
			if job == jobs[0] {
				causes <- context.Cause(ctx)
			}
			return nil
		})
	})
	first := receive(t, (<-chan int64)(fences), "the first tenure")
	admin := newAdmin(t, db, table)
	st, err := admin.Job(ctx, jobs[0])
	require.NoError(t, err)
	assert.WithinDuration(t, time.Now().Add(2*time.Second), st.Lease.ExpiresAt, time.Second, "the session's expiry")
	released := time.Now()
	_, err = admin.ForceRelease(ctx, jobs[0], first)
	require.NoError(t, err)
	cause := receive(t, (<-chan error)(causes), "the released tenure's end")
	assert.ErrorIs(t, cause, ddblease.ErrLost)
	assert.Less(t, time.Since(released), 1500*time.Millisecond, "ended at the session's next renewal")
	next := receive(t, (<-chan int64)(fences), "the next tenure")
	assert.Equal(t, first+2, next, "released (+1), then taken again (+1)")
	assert.True(t, p.Lease(jobs[1]).IsLeader(), "the other job is untouched")
	require.NoError(t, stop())
}

// A lease of its own never takes a job bound to a pool session, however
// old the expiry written at the job's acquisition: only the session rules
// free it.
func TestPlainLeaseCannotTakeAJobBoundToASession(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	jobs := poolJobs(1)
	w := newPoolWatch(t)
	p := newPool(t, db, table, jobs, fast("a"))
	stop := async(ctx, func(ctx context.Context) error { return p.Run(ctx, w.fn("a")) })
	eventually(t, "a leads", func() bool { return assert.ObjectsAreEqual(map[string]int{"a": 1}, w.leads()) })
	// The item's own expiry is long past by the other's clock: only the
	// session says the job is held.
	exp, err := strconv.ParseInt(rawLease(t, db, table, jobs[0])["expiresAt"].(*types.AttributeValueMemberN).Value, 10, 64)
	require.NoError(t, err)
	ahead := time.Until(time.UnixMilli(exp)) + time.Minute
	other := newLease(t, db, table, jobs[0], fast("x"), offset(ahead))
	_, err = other.TryAcquire(ctx)
	var held *ddblease.HeldError
	require.True(t, errors.As(err, &held), "TryAcquire: %v", err)
	assert.Equal(t, "a", held.Owner)
	assert.Equal(t, map[string]int{"a": 1}, w.leads())
	require.NoError(t, stop())
}

func leaders(p *ddblease.Pool, jobs []string) []string {
	var out []string
	for _, j := range jobs {
		if p.Lease(j).IsLeader() {
			out = append(out, j)
		}
	}
	return out
}

func blackholeAll(string) ddbtest.Action { return ddbtest.Blackhole }

// afterRead decorates a pool's client: once armed, it calls hook after the
// skip+1-th strongly consistent read of a lease item has been answered.
type afterRead struct {
	ddblease.DynamoDBAPI
	mu   sync.Mutex
	skip int
	hook func()
}

func (c *afterRead) GetItem(ctx context.Context, in *dynamodb.GetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	out, err := c.DynamoDBAPI.GetItem(ctx, in, optFns...)
	if sk, _ := in.Key[ddblease.DefaultSortKey].(*types.AttributeValueMemberS); err == nil && sk != nil && sk.Value == "lease" && aws.ToBool(in.ConsistentRead) {
		c.mu.Lock()
		hook := c.hook
		if c.skip > 0 {
			c.skip, hook = c.skip-1, nil
		} else {
			c.hook = nil
		}
		c.mu.Unlock()
		if hook != nil {
			hook()
		}
	}
	return out, err
}

// An operator's change made while the job's holder handles the note of an
// earlier one (after it read the lease item, before its next renewal
// deletes the note it handled) reaches the holder too: here a second
// trigger, noted once the holder has read the item for the first (the
// note's read, then the schedule's read of the controls). Both run.
func TestPoolSessionNoteDuringHandlingIsNotLost(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	jobs := poolJobs(1)
	client := &afterRead{DynamoDBAPI: db}
	p := newPool(t, client, table, jobs, fast("a"))
	ran := make(chan string, 4)
	stop := async(ctx, func(ctx context.Context) error {
		return p.RunSchedule(ctx, ddblease.AllJobs(ddblease.Every(time.Hour)), func(_ context.Context, _ string, run *ddblease.JobRun) error {
			if run.Trigger() != "" {
				ran <- run.Trigger()
			}
			return nil
		})
	})
	eventually(t, "a leads", p.Lease(jobs[0]).IsLeader)
	admin := newAdmin(t, db, table)
	second := make(chan ddblease.Trigger, 1)
	client.mu.Lock()
	client.skip = 1
	client.hook = func() {
		tr, err := admin.Trigger(context.WithoutCancel(ctx), jobs[0])
		assert.NoError(t, err)
		second <- tr
	}
	client.mu.Unlock()
	first, err := admin.Trigger(ctx, jobs[0])
	require.NoError(t, err)
	tr2 := receive(t, (<-chan ddblease.Trigger)(second), "the second trigger, made as the holder read the item")
	for _, tr := range []ddblease.Trigger{first, tr2} {
		rec, err := admin.WaitRun(ctx, tr, 50*time.Millisecond)
		require.NoError(t, err, "trigger %s", tr.ID)
		assert.Equal(t, ddblease.RunSucceeded, rec.Status)
	}
	require.NoError(t, stop())
}

// A failed renewal of the session is tried again after a RetryInterval, as
// a lease's heartbeat is, not a whole HeartbeatInterval later: two renewals
// that go unanswered (each until CallTimeout) then cost the replica
// nothing, where waiting a heartbeat after each would let the session's
// deadline pass and every job it holds be lost and taken again with a new
// fence.
func TestPoolSessionRenewalRetriedAfterARetryInterval(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, faults, faulty := tableWithFaults(t)
	var events eventLog
	p := newPool(t, faulty, table, poolJobs(3), fast("a"), events.option)
	w := newPoolWatch(t)
	stop := async(ctx, func(ctx context.Context) error { return p.Run(ctx, w.fn("a")) })
	eventually(t, "a leads every job", func() bool { return assert.ObjectsAreEqual(map[string]int{"a": 3}, w.leads()) })
	before := w.fences()
	renewals := faults.Count("UpdateItem")
	faults.Fail("UpdateItem", ddbtest.Blackhole, 2) // idle held jobs write nothing: these are the session's renewals
	// Two renewals unanswered, then four answered: past the deadline the
	// session would have had without the retry.
	eventually(t, "six renewals", func() bool { return faults.Count("UpdateItem") >= renewals+6 })
	require.NoError(t, stop())
	assert.Nil(t, events.find(ddblease.EventLost), "a tenure lost")
	assert.Equal(t, before, w.fences(), "the jobs were taken again")
}

// A held pool job's lease item is not rewritten while it is held: its
// session is. Its renewal age and deadline, as the handle's health check
// and State and as an operator's Admin.Job and Admin.Jobs report them,
// are its session's: over several heartbeats of an idle job, the last
// renewal is never much more than a heartbeat old, and the deadline
// stays about a lease ahead, as for a lease of its own.
func TestPoolJobRenewalAgeIsItsSessions(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	jobs := poolJobs(2)
	p := newPool(t, db, table, jobs, fast("a"))
	stop := async(ctx, func(ctx context.Context) error {
		return p.Run(ctx, func(ctx context.Context, _ string, _ int64) error { <-ctx.Done(); return nil })
	})
	eventually(t, "a leads every job", func() bool { return len(leaders(p, jobs)) == 2 })
	admin := newAdmin(t, db, table)
	o := p.Lease(jobs[0]).Options()
	// A renewal every heartbeat, each confirmed within a round trip: the
	// last one sent is at most a heartbeat and the slack old.
	const slack = 400 * time.Millisecond
	bound := o.HeartbeatInterval + slack
	for end := time.Now().Add(6 * o.HeartbeatInterval); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		assert.NoError(t, p.CheckHealth(slack), "the health check")
		assert.Less(t, time.Since(p.Lease(jobs[0]).State().RenewedAt), bound, "State().RenewedAt")
		st, err := admin.Job(ctx, jobs[0])
		require.NoError(t, err)
		assert.Less(t, time.Since(st.Lease.RenewedAt), bound, "Admin.Job's RenewedAt")
		assert.Greater(t, time.Until(st.Lease.ExpiresAt), o.LeaseDuration-bound, "Admin.Job's ExpiresAt")
		all, err := admin.Jobs(ctx)
		require.NoError(t, err)
		require.Len(t, all, 2)
		for _, js := range all {
			assert.Less(t, time.Since(js.Lease.RenewedAt), bound, "Admin.Jobs' RenewedAt of %s", js.Job)
			assert.Greater(t, time.Until(js.Lease.ExpiresAt), o.LeaseDuration-bound, "Admin.Jobs' ExpiresAt of %s", js.Job)
		}
	}
	require.NoError(t, stop())
}
