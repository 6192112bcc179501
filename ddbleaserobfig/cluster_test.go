package ddbleaserobfig_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	"github.com/ddblease/ddblease/ddbleaserobfig"
	"github.com/ddblease/ddblease/ddbleasetest"
	"github.com/robfig/cron/v3"
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

const jobName = "sweep"

var secondsParser = cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

var quiet = slog.New(slog.NewTextHandler(discard{}, nil))

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

type cluster struct {
	t     *testing.T
	table string
	sink  string
	spec  string
	slots ddblease.Schedule // the slots the runs are claimed for
	opts  ddblease.Options
	reps  []*replica

	mu          sync.Mutex
	invocations map[time.Time][]invocation
	accepted    []int64
	errs        []error
	blockNext   *replica
	inside      chan time.Time
	release     chan struct{}
	sinkMu      sync.Mutex
	work        time.Duration // how long a run works before its write
	// deaf makes runs write with a context that is never cancelled, as a
	// job that ignores its context (or is paused) would: only the guard
	// stops its stale writes.
	deaf    bool
	refused int // writes refused with ErrStaleFence
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
	faults *ddbleasetest.Faults
	guard  *ddblease.Guard
	w      *ddbleaserobfig.Wrapper
	c      *cron.Cron
	cancel context.CancelFunc
	waited bool
}

func newCluster(t *testing.T, spec string, slots ddblease.Schedule, skew time.Duration) *cluster {
	// The sink is written with Guard.TransactWrite.
	requireTransactions(t)
	c := &cluster{
		t: t, table: srv.NewTable(t), sink: srv.NewKeyTable(t, "pk"), spec: spec, slots: slots,
		opts: ddblease.Options{
			LeaseDuration: 2 * time.Second, HeartbeatInterval: 600 * time.Millisecond,
			RetryInterval: 150 * time.Millisecond, CallTimeout: 500 * time.Millisecond,
			MaxClockSkew: skew, DrainTimeout: time.Second, Logger: quiet,
		},
		invocations: map[time.Time][]invocation{},
		failedWrite: map[time.Time]bool{},
	}
	t.Cleanup(func() {
		for _, r := range c.reps {
			if !r.waited {
				<-r.c.Stop().Done()
				r.cancel()
				_ = r.w.Wait()
			}
		}
	})
	return c
}

// add starts a replica whose clock is off by off. robfig's cron reads
// the system clock, so its schedule is shifted instead: it fires a slot at
// the real instant the replica's clock would show it.
func (c *cluster) add(name string, off time.Duration) *replica {
	t := c.t
	r := &replica{name: name, faults: ddbleasetest.NewFaults()}
	db := srv.Client(r.faults.Wrap)
	var err error
	r.guard, err = ddblease.NewGuard(db, c.table, jobName)
	require.NoError(t, err)
	r.w, err = ddbleaserobfig.New(db, c.table, func(o *ddblease.Options) {
		*o = c.opts
		o.Owner = name
		o.Now = func() time.Time { return time.Now().Add(off) }
		o.Observer = func(ev ddblease.Event) {
			if ev.Kind == ddblease.EventAcquired {
				c.acquired(r)
			}
		}
	})
	require.NoError(t, err)
	sched, err := secondsParser.Parse(c.spec)
	require.NoError(t, err)
	job, err := r.w.Job(jobName, sched, func(ctx context.Context, run *ddblease.JobRun) error {
		return c.run(ctx, r, run)
	}, ddbleaserobfig.JobOptions{Tolerance: 400 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	require.NoError(t, r.w.Start(ctx))
	r.c = cron.New(cron.WithLocation(time.UTC), cron.WithParser(secondsParser))
	r.c.Schedule(shifted{sched, off}, job)
	r.c.Start()
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
		if o != r && o.w.Lease(jobName).IsLeader() {
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

func (c *cluster) run(ctx context.Context, r *replica, run *ddblease.JobRun) error {
	c.mu.Lock()
	c.invocations[run.Slot()] = append(c.invocations[run.Slot()], invocation{r.name, run.Fence()})
	block := c.blockNext == r
	if block {
		c.blockNext = nil
	}
	work := c.work
	if c.deaf {
		ctx = context.WithoutCancel(ctx)
	}
	c.mu.Unlock()
	time.Sleep(work)
	c.sinkMu.Lock()
	err := r.guard.TransactWrite(ctx, run.Fence(), []types.TransactWriteItem{{Put: &types.Put{
		TableName: aws.String(c.sink),
		Item: map[string]types.AttributeValue{
			"pk":    &types.AttributeValueMemberS{Value: run.IdempotencyKey()},
			"fence": &types.AttributeValueMemberN{Value: strconv.FormatInt(run.Fence(), 10)},
		},
		ConditionExpression: aws.String("attribute_not_exists(pk)"),
	}}})
	c.mu.Lock()
	switch {
	case err == nil:
		c.accepted = append(c.accepted, run.Fence())
	case errors.Is(err, ddblease.ErrStaleFence):
		c.refused++
		c.failedWrite[run.Slot()] = true
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		// The tenure ended (shutdown, or lost) and the write was abandoned.
		c.failedWrite[run.Slot()] = true
	default:
		c.errs = append(c.errs, fmt.Errorf("%s slot %s: %w", r.name, run.Slot().Format(time.TimeOnly), err))
	}
	c.mu.Unlock()
	c.sinkMu.Unlock()
	if block {
		c.inside <- run.Slot()
		<-c.release
	}
	return err
}

func (c *cluster) ran() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.invocations)
}

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

// TestClusterWithinBound: three crons on three replicas, started at
// staggered times, lease clocks offset within MaxClockSkew, the leader
// killed mid-run (transport black-holed, cron and campaign stopped without
// a resignation reaching the table). Every slot runs once but for those
// due while no one led, with growing fences the guard accepted; the run
// items agree.
func TestClusterWithinBound(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, spec string
		slots      ddblease.Schedule
	}{
		{"spec", "* * * * * *", mustParse(t, "* * * * * *")},
		// @every is anchored at each cron's start: the firings are matched
		// to the multiples of the delay since the epoch.
		{"every", "@every 1s", ddblease.Every(time.Second)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, tc.spec, tc.slots, 400*time.Millisecond)
			c.add("r0", 0)
			time.Sleep(1300 * time.Millisecond)
			c.add("r1", 150*time.Millisecond)
			time.Sleep(1700 * time.Millisecond)
			c.add("r2", -150*time.Millisecond)
			c.waitFor("four runs", 60*time.Second, func() bool { return c.ran() >= 4 })
			var victim *replica
			c.waitFor("a leader", 30*time.Second, func() bool {
				for _, r := range c.reps {
					if r.w.Lease(jobName).IsLeader() {
						victim = r
						return true
					}
				}
				return false
			})
			oldFence := victim.w.Lease(jobName).State().Fence
			killed := c.kill(victim)
			before := c.ran()
			c.waitFor("three runs after the kill", 60*time.Second, func() bool { return c.ran() >= before+3 })
			c.stop()

			c.mu.Lock()
			inv, accepted, errs, failed := c.invocations, slices.Clone(c.accepted), slices.Clone(c.errs), c.failedWrite
			c.mu.Unlock()
			assert.Empty(t, errs)
			assert.True(t, slices.IsSorted(accepted), "the sink accepted a stale fence: %v", accepted)
			var slots []time.Time
			for s := range inv {
				slots = append(slots, s)
			}
			slices.SortFunc(slots, func(a, b time.Time) int { return a.Compare(b) })
			var fences []int64
			for _, s := range slots {
				assert.Len(t, inv[s], 1, "slot %s ran %v", s.Format(time.TimeOnly), inv[s])
				fences = append(fences, inv[s][0].fence)
			}
			assert.True(t, slices.IsSorted(fences), "fences by slot: %v", fences)
			assert.Greater(t, fences[len(fences)-1], oldFence)
			n, acqs := c.overlapping()
			assert.Zero(t, n, "within the bound no acquisition overlaps a tenure: %v", acqs)
			// Every slot between the first and the last ran, but for those
			// due while no one led (after the kill).
			gap := notRun(t, tc.slots, slots, func(s time.Time) (int64, bool) {
				if i := inv[s]; len(i) > 0 {
					return i[0].fence, true
				}
				return 0, false
			})
			t.Logf("slots run %d, fences %v, not run %v", len(slots), fences, gap)

			l, err := ddblease.New(srv.Client(nil), c.table, jobName)
			require.NoError(t, err)
			runs, err := l.ListRuns(context.Background(), tc.slots, slots[0], slots[len(slots)-1])
			require.NoError(t, err)
			assert.Len(t, runs, len(slots))
			out, err := srv.Client(nil).Scan(context.Background(), &dynamodb.ScanInput{TableName: aws.String(c.sink)})
			require.NoError(t, err)
			assert.Len(t, out.Items, len(accepted))
			for _, r := range runs {
				want := ddblease.RunSucceeded
				switch {
				case r.Slot.Equal(killed):
					want = ddblease.RunRunning
				case failed[r.Slot]:
					want = ddblease.RunFailed // its write refused or abandoned
				}
				assert.Equal(t, want, r.Status, "slot %s: %s", r.Slot.Format(time.TimeOnly), r.Error)
				if i := inv[r.Slot]; assert.NotEmpty(t, i) {
					assert.Equal(t, i[0].fence, r.Fence)
					assert.Equal(t, i[0].replica, r.Owner)
				}
			}
		})
	}
}

// kill stops r as a crash would, mid-run: its next run writes its effect,
// then its transport is black-holed (every request hangs unanswered until
// its timeout, never reaching the server), the run returns (its outcome
// cannot be recorded), and its cron and campaign are stopped without a
// resignation reaching the table. It returns the slot of that run.
func (c *cluster) kill(r *replica) time.Time {
	c.mu.Lock()
	c.blockNext, c.inside, c.release = r, make(chan time.Time), make(chan struct{})
	c.mu.Unlock()
	var killed time.Time
	select {
	case killed = <-c.inside:
	case <-time.After(30 * time.Second):
		c.t.Fatalf("%s never ran again", r.name)
	}
	r.faults.Set(func(string) ddbleasetest.Action { return ddbleasetest.Blackhole })
	close(c.release)
	<-r.c.Stop().Done()
	r.cancel()
	r.waited = true
	err := r.w.Wait()
	c.t.Logf("%s killed in slot %s: %v", r.name, killed.Format(time.TimeOnly), err)
	if err != nil {
		assert.ErrorIs(c.t, err, ddblease.ErrNotResigned)
	}
	return killed
}

// stop shuts the live replicas down: the cron first, then the campaign,
// which drains the running firing and resigns.
func (c *cluster) stop() {
	for _, r := range c.reps {
		if !r.waited {
			<-r.c.Stop().Done()
			r.cancel()
			r.waited = true
			assert.NoError(c.t, r.w.Wait(), r.name)
		}
	}
}

func mustParse(t *testing.T, spec string) cron.Schedule {
	s, err := secondsParser.Parse(spec)
	require.NoError(t, err)
	return s
}

// shifted is a schedule as a cron whose clock is off by off fires it: the
// slot s at the real instant s-off.
type shifted struct {
	cron.Schedule
	off time.Duration
}

func (s shifted) Next(t time.Time) time.Time {
	n := s.Schedule.Next(t.Add(s.off))
	if n.IsZero() {
		return n
	}
	return n.Add(-s.off)
}

// TestClusterBeyondBound: one replica's clock 3s ahead while MaxClockSkew
// is 300ms. What the docs say breaks, breaks: it takes the lease while its
// holder still believes it leads (two leaders for a while), slots fire by
// the leader's clock (those its jump passes over are not run), and after it
// is killed the others take over only once they have watched the lease
// unchanged for a whole lease. What holds: each slot runs at most once
// (claims are transactions that check the lease's fence), and the guarded
// sink never accepts a stale fence.
func TestClusterBeyondBound(t *testing.T) {
	t.Parallel()
	c := newCluster(t, "* * * * * *", mustParse(t, "* * * * * *"), 300*time.Millisecond)
	c.work, c.deaf = 300*time.Millisecond, true
	c.add("r0", 0)
	c.waitFor("r0 to lead", 30*time.Second, func() bool { return c.reps[0].w.Lease(jobName).IsLeader() })
	c.add("r1", 100*time.Millisecond)
	c.waitFor("two runs", 60*time.Second, func() bool { return c.ran() >= 2 })
	ahead := c.add("r2", 3*time.Second)
	c.waitFor("r2 to lead", 30*time.Second, func() bool { return ahead.w.Lease(jobName).IsLeader() })
	overlap, acqs := c.overlapping()
	before := c.ran()
	c.waitFor("r2 to run", 60*time.Second, func() bool { return c.ran() >= before+2 })
	killed := c.kill(ahead)
	before = c.ran()
	c.waitFor("three runs after the kill", 60*time.Second, func() bool { return c.ran() >= before+3 })
	c.stop()

	c.mu.Lock()
	inv, accepted, errs, refused := c.invocations, slices.Clone(c.accepted), slices.Clone(c.errs), c.refused
	c.mu.Unlock()
	var slots []time.Time
	for s := range inv {
		slots = append(slots, s)
	}
	slices.SortFunc(slots, func(a, b time.Time) int { return a.Compare(b) })
	gap, dup := 0, 0
	for x := c.slots.Next(slots[0]); x.Before(slots[len(slots)-1]); x = c.slots.Next(x) {
		if _, ok := inv[x.UTC()]; !ok {
			gap++
		}
	}
	for _, s := range slots {
		if len(inv[s]) > 1 {
			dup++
		}
	}
	t.Logf("acquisitions (and who else believed it led) %v; slots run %d, twice %d, not run %d; refused as stale %d; killed %s",
		acqs, len(slots), dup, gap, refused, killed.Format(time.TimeOnly))
	assert.Positive(t, overlap, "a clock beyond the bound lets a replica take the lease while its holder believes it leads")
	assert.Positive(t, gap, "the slots the leader's clock jumped over are not run")
	assert.Zero(t, dup, "a slot runs at most once even beyond the bound")
	assert.Empty(t, errs)
	assert.True(t, slices.IsSorted(accepted), "the sink accepted a stale fence: %v", accepted)
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
