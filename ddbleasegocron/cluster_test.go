package ddbleasegocron_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/ddbleasegocron"
	"github.com/ddblease/ddblease/ddbleasetest"
	"github.com/go-co-op/gocron/v2"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

var srv *ddbleasetest.Server

func TestMain(m *testing.M) {
	srv = ddbleasetest.Start()
	code := m.Run()
	srv.Close()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreCurrent()); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// offsetClock is the system clock shifted by off: gocron fires by it, as
// a replica whose wall clock is off by that much would.
type offsetClock struct {
	clockwork.Clock
	off time.Duration
}

func (c offsetClock) Now() time.Time                  { return c.Clock.Now().Add(c.off) }
func (c offsetClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
func (c offsetClock) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }

const (
	jobName = "sweep"
	crontab = "* * * * * *" // every second, gocron's seconds field
)

type mode int

const (
	withElector mode = iota
	withLocker
)

// cluster is three replicas, each with its own SDK client, lease handles
// and gocron scheduler, sharing one lease table and one sink table.
type cluster struct {
	t     *testing.T
	mode  mode
	table string
	sink  string
	sched ddblease.Schedule
	opts  ddblease.Options
	reps  []*replica
	start time.Time

	mu          sync.Mutex
	invocations map[time.Time][]invocation // by slot
	accepted    []int64                    // fences the sink accepted, in order
	refused     int                        // writes refused with ErrStaleFence
	inDoubt     map[string]bool            // sink keys of writes abandoned mid-flight: they may have landed
	otherErrs   []error
	blockNext   *replica      // the replica whose next run blocks after its write
	work        time.Duration // how long a run works before its write
	inside      chan time.Time
	release     chan struct{}

	sinkMu sync.Mutex // one sink write at a time, so that accepted is in commit order

	// overlaps lists, for each acquisition, the other replicas that still
	// believed they led at that moment (an Observer on EventAcquired reads
	// their IsLeader then).
	overlaps [][]string

	failedWrite map[time.Time]bool // slots whose write was refused or abandoned: their runs are recorded failed
}

type invocation struct {
	replica string
	fence   int64
}

type replica struct {
	name   string
	off    time.Duration
	faults *ddbleasetest.Faults
	db     *dynamodb.Client
	guard  *ddblease.Guard
	el     *ddbleasegocron.Elector
	lk     *ddbleasegocron.Locker
	s      gocron.Scheduler
	cancel context.CancelFunc
	waited bool
}

func newCluster(t *testing.T, m mode, skew time.Duration) *cluster {
	// The sink is written with Guard.TransactWrite.
	requireTransactions(t)
	sched, err := ddbleasegocron.CronSchedule(crontab, true, time.UTC)
	require.NoError(t, err)
	c := &cluster{
		t: t, mode: m, table: srv.NewTable(t), sink: srv.NewKeyTable(t, "pk"), sched: sched,
		opts: ddblease.Options{
			LeaseDuration: 2 * time.Second, HeartbeatInterval: 600 * time.Millisecond,
			RetryInterval: 150 * time.Millisecond, CallTimeout: 500 * time.Millisecond,
			MaxClockSkew: skew, DrainTimeout: time.Second,
		},
		invocations: map[time.Time][]invocation{},
		failedWrite: map[time.Time]bool{},
		start:       time.Now(),
	}
	t.Cleanup(c.stopAll)
	return c
}

func (c *cluster) now(r *replica) time.Time { return time.Now().Add(r.off) }

// add starts a replica whose clocks (the lease's and gocron's) are off by
// off.
func (c *cluster) add(name string, off time.Duration) *replica {
	t := c.t
	r := &replica{name: name, off: off, faults: ddbleasetest.NewFaults()}
	r.db = srv.Client(r.faults.Wrap)
	opt := func(o *ddblease.Options) {
		*o = c.opts
		o.Owner = name
		o.Now = func() time.Time { return time.Now().Add(off) }
		o.Observer = func(ev ddblease.Event) {
			if ev.Kind == ddblease.EventAcquired {
				c.acquired(r)
			}
		}
	}
	var err error
	r.guard, err = ddblease.NewGuard(r.db, c.table, jobName)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	sopts := []gocron.SchedulerOption{gocron.WithClock(offsetClock{clockwork.NewRealClock(), off}), gocron.WithLocation(time.UTC)}
	jopts := []gocron.JobOption{gocron.WithName(jobName)}
	switch c.mode {
	case withElector:
		r.el, err = ddbleasegocron.NewElector(r.db, c.table, jobName, opt)
		require.NoError(t, err)
		require.NoError(t, r.el.Start(ctx))
		sopts = append(sopts, gocron.WithDistributedElector(r.el))
	case withLocker:
		r.lk, err = ddbleasegocron.NewLocker(r.db, c.table, opt)
		require.NoError(t, err)
		require.NoError(t, r.lk.Add(jobName, ddbleasegocron.Job{Schedule: c.sched, Tolerance: 400 * time.Millisecond}))
		require.NoError(t, r.lk.Start(ctx))
		sopts = append(sopts, gocron.WithDistributedLocker(r.lk))
		jopts = append(jopts, gocron.WithEventListeners(gocron.AfterJobRunsWithError(r.lk.RecordError)))
	}
	r.s, err = gocron.NewScheduler(sopts...)
	require.NoError(t, err)
	_, err = r.s.NewJob(gocron.CronJob(crontab, true), gocron.NewTask(c.job(r)), jopts...)
	require.NoError(t, err)
	r.s.Start()
	c.mu.Lock()
	c.reps = append(c.reps, r)
	c.mu.Unlock()
	return r
}

// acquired records which other replicas believe they lead as r acquires.
func (c *cluster) acquired(r *replica) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var others []string
	for _, o := range c.reps {
		if o != r && c.lease(o).IsLeader() {
			others = append(others, o.name)
		}
	}
	c.overlaps = append(c.overlaps, others)
}

// overlapping returns the acquisitions made while another replica believed
// it led.
func (c *cluster) overlapping() (n int, all [][]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, o := range c.overlaps {
		if len(o) > 0 {
			n++
		}
	}
	return n, slices.Clone(c.overlaps)
}

// job is the gocron task of replica r: it finds its fence and slot, and
// writes the slot's effect into the sink through the guard.
func (c *cluster) job(r *replica) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		var fence int64
		var slot time.Time
		switch c.mode {
		case withElector:
			f, err := r.el.Fence()
			if err != nil {
				return err // lost between IsLeader and here
			}
			fence = f
			if slot, err = ddblease.MatchSlot(c.sched, c.now(r), 400*time.Millisecond); err != nil {
				c.fail(fmt.Errorf("%s: %w", r.name, err))
				return err
			}
		case withLocker:
			run, ok := r.lk.Run(jobName)
			if !ok {
				err := fmt.Errorf("%s: no run in flight inside the job", r.name)
				c.fail(err)
				return err
			}
			fence, slot = run.Fence(), run.Slot()
		}
		c.mu.Lock()
		c.invocations[slot] = append(c.invocations[slot], invocation{r.name, fence})
		work := c.work
		block := c.blockNext == r
		if block {
			c.blockNext = nil
		}
		c.mu.Unlock()
		time.Sleep(work)
		err := c.write(ctx, r, slot, fence)
		if block {
			c.inside <- slot
			<-c.release
		}
		return err
	}
}

// write puts the slot's effect into the sink, guarded by fence.
func (c *cluster) write(ctx context.Context, r *replica, slot time.Time, fence int64) error {
	c.sinkMu.Lock()
	defer c.sinkMu.Unlock()
	err := r.guard.TransactWrite(ctx, fence, []types.TransactWriteItem{{Put: &types.Put{
		TableName: aws.String(c.sink),
		Item: map[string]types.AttributeValue{
			"pk":    &types.AttributeValueMemberS{Value: slot.UTC().Format(time.RFC3339Nano)},
			"fence": &types.AttributeValueMemberN{Value: strconv.FormatInt(fence, 10)},
			"by":    &types.AttributeValueMemberS{Value: r.name},
		},
		ConditionExpression: aws.String("attribute_not_exists(pk)"),
	}}})
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case err == nil:
		c.accepted = append(c.accepted, fence)
	case errors.Is(err, ddblease.ErrStaleFence):
		c.refused++
		c.failedWrite[slot] = true
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		// gocron's Shutdown cancels a running job's context: the write
		// was abandoned, not refused, and the run is recorded failed.
		// The transaction may still have landed (its answer was lost).
		c.failedWrite[slot] = true
		if c.inDoubt == nil {
			c.inDoubt = map[string]bool{}
		}
		c.inDoubt[slot.UTC().Format(time.RFC3339Nano)] = true
	default:
		c.otherErrs = append(c.otherErrs, fmt.Errorf("%s slot %s fence %d: %w", r.name, slot.Format(time.TimeOnly), fence, err))
	}
	return err
}

func (c *cluster) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.otherErrs = append(c.otherErrs, err)
}

func (c *cluster) lease(r *replica) *ddblease.Lease {
	if r.el != nil {
		return r.el.Lease()
	}
	return r.lk.Elector(jobName).Lease()
}

func (c *cluster) leader() *replica {
	for _, r := range c.reps {
		if !r.waited && c.lease(r).IsLeader() {
			return r
		}
	}
	return nil
}

func (c *cluster) ran() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.invocations)
}

// waitFor polls cond every 20ms for up to limit; it fails the test if
// cond never held. The limit is a generous bound against a hang, not a
// measurement.
func (c *cluster) waitFor(what string, limit time.Duration, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("gave up waiting for %s after %v", what, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill stops r as a crash would, mid-run: its next run writes its effect,
// then its transport is black-holed (every request hangs unanswered until
// its timeout, never reaching the server), the run returns (its Unlock
// cannot reach the table), and its scheduler and campaign are stopped
// without a resignation reaching the table.
func (c *cluster) kill(r *replica) time.Time {
	c.mu.Lock()
	c.blockNext, c.inside, c.release = r, make(chan time.Time), make(chan struct{})
	c.mu.Unlock()
	var slot time.Time
	select {
	case slot = <-c.inside:
	case <-time.After(30 * time.Second):
		c.t.Fatalf("%s never ran again", r.name)
	}
	r.faults.Set(func(string) ddbleasetest.Action { return ddbleasetest.Blackhole })
	close(c.release)
	require.NoError(c.t, r.s.Shutdown())
	r.cancel()
	err := c.waitRep(r)
	c.t.Logf("%s killed in slot %s; its campaign returned %v", r.name, slot.Format(time.TimeOnly), err)
	if err != nil && !errors.Is(err, ddblease.ErrNotResigned) {
		c.t.Errorf("killed replica's campaign returned %v", err)
	}
	return slot
}

func (c *cluster) waitRep(r *replica) error {
	r.waited = true
	if r.el != nil {
		return r.el.Wait()
	}
	return r.lk.Wait()
}

// stop shuts every live replica down in order: scheduler first (running
// jobs finish), then its campaign (which resigns).
func (c *cluster) stop() {
	for _, r := range c.reps {
		if r.waited {
			continue
		}
		assert.NoError(c.t, r.s.Shutdown())
		r.cancel()
		assert.NoError(c.t, c.waitRep(r), r.name)
	}
}

func (c *cluster) stopAll() {
	for _, r := range c.reps {
		if !r.waited {
			_ = r.s.Shutdown()
			r.cancel()
			_ = c.waitRep(r)
		}
	}
}

// slots returns the slots invoked, in order.
func (c *cluster) slots() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	var s []time.Time
	for k := range c.invocations {
		s = append(s, k)
	}
	slices.SortFunc(s, func(a, b time.Time) int { return a.Compare(b) })
	return s
}

// checkSink checks that the sink accepted fences in non-decreasing order
// (never a stale one) and holds one item per accepted write, plus at most
// one per write abandoned mid-flight (its answer lost, it may have
// landed).
func (c *cluster) checkSink() {
	t := c.t
	c.mu.Lock()
	accepted := slices.Clone(c.accepted)
	inDoubt := maps.Clone(c.inDoubt)
	c.mu.Unlock()
	assert.True(t, slices.IsSorted(accepted), "the sink accepted a stale fence: %v", accepted)
	out, err := srv.Client(nil).Scan(context.Background(), &dynamodb.ScanInput{TableName: aws.String(c.sink)})
	require.NoError(t, err)
	landed := 0
	for _, it := range out.Items {
		if pk, ok := it["pk"].(*types.AttributeValueMemberS); ok && inDoubt[pk.Value] {
			landed++
		}
	}
	assert.Equal(t, len(accepted), len(out.Items)-landed,
		"sink items (less %d of %d writes abandoned mid-flight that landed) vs accepted writes", landed, len(inDoubt))
}

func slotsBetween(s ddblease.Schedule, from, to time.Time) []time.Time {
	var all []time.Time
	for x := s.Next(from.Add(-time.Nanosecond)); !x.After(to); x = s.Next(x) {
		all = append(all, x.UTC())
	}
	return all
}

// TestClusterWithinBound runs three schedulers on three replicas, started
// at staggered times with clock offsets within MaxClockSkew, kills the
// leader mid-run, and checks that every slot ran once (except those due
// while no one led), with growing fences that the guard accepted.
func TestClusterWithinBound(t *testing.T) {
	t.Parallel()
	for _, m := range []mode{withElector, withLocker} {
		t.Run([]string{"Elector", "Locker"}[m], func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, m, 400*time.Millisecond)
			c.add("r0", 0)
			time.Sleep(1300 * time.Millisecond)
			c.add("r1", 150*time.Millisecond)
			time.Sleep(1700 * time.Millisecond)
			c.add("r2", -150*time.Millisecond)
			c.waitFor("three runs", 60*time.Second, func() bool { return c.ran() >= 4 })
			var victim *replica
			c.waitFor("a leader", 30*time.Second, func() bool { victim = c.leader(); return victim != nil })
			oldFence := c.lease(victim).State().Fence
			killed := c.kill(victim)
			before := c.ran()
			c.waitFor("three runs after the kill", 60*time.Second, func() bool { return c.ran() >= before+3 })
			c.stop()

			c.mu.Lock()
			errs := slices.Clone(c.otherErrs)
			refused := c.refused
			inv := c.invocations
			c.mu.Unlock()
			assert.Empty(t, errs)
			// A write is refused only if its tenure ended while it ran: not
			// by the kill (the victim wrote first), but a lease lost under
			// load would do it.
			t.Logf("writes refused as stale: %d", refused)
			c.checkSink()

			slots := c.slots()
			var fences []int64
			for _, s := range slots {
				assert.Len(t, inv[s], 1, "slot %s ran %d times: %v", s.Format(time.TimeOnly), len(inv[s]), inv[s])
				fences = append(fences, inv[s][0].fence)
			}
			assert.True(t, slices.IsSorted(fences), "fences by slot: %v", fences)
			// Every slot between the first and the last ran, but for those
			// due while no one led (after the kill).
			gap := notRun(t, c.sched, slots, func(s time.Time) (int64, bool) {
				if i := inv[s]; len(i) > 0 {
					return i[0].fence, true
				}
				return 0, false
			})
			t.Logf("slots run %d, fences %v, killed %s (fence %d), not run %v", len(slots), fences, killed.Format(time.TimeOnly), oldFence, gap)
			n, acqs := c.overlapping()
			assert.Zero(t, n, "within the bound no acquisition overlaps a tenure: %v", acqs)
			after := fences[len(fences)-1]
			assert.Greater(t, after, oldFence, "the new leader's fence")

			if m == withLocker {
				c.checkRuns(slots, killed)
			}
		})
	}
}

// checkRuns checks the job-run items against the invocations: one run per
// slot invoked, with its fence; succeeded but for the killed one, left
// running.
func (c *cluster) checkRuns(slots []time.Time, killed time.Time) {
	t := c.t
	l, err := ddblease.New(srv.Client(nil), c.table, jobName)
	require.NoError(t, err)
	runs, err := l.ListRuns(context.Background(), c.sched, slots[0].Add(-time.Minute), slots[len(slots)-1])
	require.NoError(t, err)
	bySlot := map[time.Time]ddblease.RunRecord{}
	for _, r := range runs {
		bySlot[r.Slot] = r
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	assert.Len(t, runs, len(slots), "a run item per slot invoked")
	for _, s := range slots {
		r, ok := bySlot[s]
		if !assert.True(t, ok, "slot %s has no run item", s) {
			continue
		}
		assert.Equal(t, c.invocations[s][0].fence, r.Fence, "slot %s", s)
		assert.Equal(t, c.invocations[s][0].replica, r.Owner, "slot %s", s)
		want := ddblease.RunSucceeded
		switch {
		case s.Equal(killed):
			want = ddblease.RunRunning
		case c.failedWrite[s]:
			want = ddblease.RunFailed // its write refused, or cancelled by Shutdown
		}
		assert.Equal(t, want, r.Status, "slot %s: %s", s, r.Error)
	}

}

// TestClusterBeyondBound runs the same cluster with one replica's clock
// 3s ahead while MaxClockSkew is 300ms. What the docs say breaks, breaks:
// that replica takes the lease while its holder still believes it leads
// (two leaders for a while), slots fire by the leader's clock (the ones its
// jump passes over are not run), and, after it is killed, the others do
// not take over until they have watched the lease unchanged for a whole
// lease. What holds: the guarded sink never accepts a stale fence, and with
// the Locker (whose claims are transactions checking the lease's fence)
// each slot still runs at most once.
func TestClusterBeyondBound(t *testing.T) {
	t.Parallel()
	for _, m := range []mode{withElector, withLocker} {
		t.Run([]string{"Elector", "Locker"}[m], func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, m, 300*time.Millisecond)
			c.work = 300 * time.Millisecond
			c.add("r0", 0)
			c.waitFor("r0 to lead", 30*time.Second, func() bool { return c.lease(c.reps[0]).IsLeader() })
			c.add("r1", 100*time.Millisecond)
			c.waitFor("two runs", 60*time.Second, func() bool { return c.ran() >= 2 })
			ahead := c.add("r2", 3*time.Second)
			// Seen from outside too: the first time r2 is seen leading
			// (within a 20ms poll of its acquisition), does another
			// replica still believe it leads? The observer's sample at
			// the acquisition can come after the old holder has already
			// learnt of its loss on a loaded machine.
			seen := 0
			c.waitFor("r2 to lead", 30*time.Second, func() bool {
				if !c.lease(ahead).IsLeader() {
					return false
				}
				c.mu.Lock()
				reps := slices.Clone(c.reps)
				c.mu.Unlock()
				for _, o := range reps {
					if o != ahead && c.lease(o).IsLeader() {
						seen++
					}
				}
				return true
			})
			overlap, acqs := c.overlapping()
			before := c.ran()
			c.waitFor("r2 to run", 60*time.Second, func() bool { return c.ran() >= before+2 })
			// A write refused as stale before the kill is a run of a
			// holder that still believed it led after r2 took the lease:
			// the same overlap, seen by the sink when the samples above
			// came too late (a loaded machine delays them).
			c.mu.Lock()
			staleBeforeKill := c.refused
			c.mu.Unlock()
			killed := c.kill(ahead)
			before = c.ran()
			c.waitFor("three runs after the kill", 60*time.Second, func() bool { return c.ran() >= before+3 })
			c.stop()

			c.mu.Lock()
			errs, refused, inv := slices.Clone(c.otherErrs), c.refused, c.invocations
			c.mu.Unlock()
			c.checkSink()
			slots := c.slots()
			var gap []time.Time
			for _, s := range slotsBetween(c.sched, slots[0], slots[len(slots)-1]) {
				if _, ok := inv[s]; !ok {
					gap = append(gap, s)
				}
			}
			dup := 0
			for _, s := range slots {
				if len(inv[s]) > 1 {
					dup++
				}
			}
			t.Logf("acquisitions (and who else believed it led) %v; slots run %d, twice %d, not run %d; writes refused as stale %d; other write errors %d; killed %s",
				acqs, len(slots), dup, len(gap), refused, len(errs), killed.Format(time.TimeOnly))
			assert.Positive(t, overlap+seen+staleBeforeKill, "a clock beyond the bound lets a replica take the lease while its holder believes it leads (at its acquisition %v, when it was first seen leading: %d, or by a stale write: %d)", acqs, seen, staleBeforeKill)
			assert.NotEmpty(t, gap, "the slots the leader's clock jumped over are not run")
			if m == withLocker {
				assert.Zero(t, dup, "with the Locker a slot runs at most once even beyond the bound")
				assert.Empty(t, errs)
			}
			for _, err := range errs {
				// The Elector's only other failures: a slot the sink
				// already has, run again by a replica whose clock is
				// behind (the sink's attribute_not_exists refuses it).
				var tce *types.TransactionCanceledException
				assert.True(t, errors.As(err, &tce), "unexpected write error: %v", err)
			}
		})
	}
}

var (
	txnOnce  sync.Once
	txnSetup error // the probe table could not be made
	txnErr   error // the server refused TransactWriteItems
)

// requireTransactions skips t, naming the server, unless it has
// TransactWriteItems (dynalite has not).
func requireTransactions(t *testing.T) {
	t.Helper()
	txnOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		db := srv.Client()
		table := "ddblease-txn-probe-" + ddbleasetest.RandomID()
		if txnSetup = ddbleasetest.CreateKeyTable(ctx, db, table, "pk", types.ScalarAttributeTypeS); txnSetup != nil {
			return
		}
		_, txnErr = db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{{Put: &types.Put{
			TableName: aws.String(table),
			Item:      map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "probe"}},
		}}}})
		_, _ = db.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(table)})
	})
	require.NoError(t, txnSetup)
	if txnErr != nil {
		t.Skipf("server %s lacks TransactWriteItems, which the sink's guarded writes use: %v", srv.Name, txnErr)
	}
}

// notRun returns the slots of sched between the first and the last slot
// run that did not run, and checks that they lie only where leadership
// changed hands: each stretch of them is followed by a run with a higher
// fence than the run before it (a crash, or a lease lost under load, leaves
// its slots unrun until a new leader fires).
func notRun(t *testing.T, sched ddblease.Schedule, slots []time.Time, fence func(time.Time) (int64, bool)) []time.Time {
	t.Helper()
	var gap, stretch []time.Time
	var last int64
	for x := slots[0]; !x.After(slots[len(slots)-1]); x = sched.Next(x).UTC() {
		f, ok := fence(x)
		if !ok {
			stretch = append(stretch, x)
			continue
		}
		if len(stretch) > 0 {
			assert.Greater(t, f, last, "slots %s to %s did not run, though no new tenure followed",
				stretch[0].Format(time.TimeOnly), stretch[len(stretch)-1].Format(time.TimeOnly))
			gap, stretch = append(gap, stretch...), nil
		}
		last = f
	}
	return gap
}
