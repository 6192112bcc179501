// Command pool is one replica of a service whose report jobs are shared out
// by a ddblease pool: each replica that runs it leads its share of the jobs,
// each job runs once per slot on its leader, with the job's fence, and a
// replica that stops (SIGTERM, Ctrl-C) resigns its jobs to the others. It
// prints the members it sees and the jobs it leads whenever they change,
// and each run.
//
//	go run .                                  # alone, on an in-process server
//	go run . -endpoint http://127.0.0.1:8000  # a replica on `ddblease local`'s server
//	go run . -region eu-west-1                # on AWS, with your usual credentials
//
// Two replicas: serve a table with `ddblease local` in one terminal, run
// `go run . -endpoint http://127.0.0.1:8000` in two more (or export the lines
// `ddblease local` prints and run `go run .`), and watch the jobs spread;
// stop one with Ctrl-C and the other takes its jobs.
//
// It checks what it printed, and exits 1 if any of it is wrong: each slot
// ran once here, a job's fences never went down, every run is recorded in
// the table as succeeded under its fence, and once stopped no job still
// names this replica as its holder. -for stops it after a while, as SIGTERM
// would; -expect N also makes it fail unless it led N jobs at once.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/ddbleasetest"
)

// settings are the program's flags.
type settings struct {
	endpoint, region string
	table, pool      string
	owner            string
	jobs             []string
	every, lease     time.Duration
	stopAfter        time.Duration
	expect           int
}

func main() {
	var s settings
	var jobs string
	flag.StringVar(&s.endpoint, "endpoint", "", "a DynamoDB-compatible endpoint, such as http://127.0.0.1:8000 (`ddblease local`)")
	flag.StringVar(&s.region, "region", "", "an AWS region; with neither -endpoint nor -region, an in-process server "+
		"(or the one DDBLEASE_TEST_ENDPOINT names)")
	flag.StringVar(&s.table, "table", "leases", "the lease table (created if missing)")
	flag.StringVar(&s.pool, "pool", "reports", "the pool's name: replicas with the same name share its jobs")
	flag.StringVar(&s.owner, "owner", "", "this replica's name (default: ddblease.DefaultOwner, <host>-<pid>-<random>)")
	flag.StringVar(&jobs, "jobs", "report-acme,report-globex,report-initech,report-umbrella", "the jobs, comma-separated")
	flag.DurationVar(&s.every, "every", 2*time.Second, "each job's schedule: one slot every this long")
	flag.DurationVar(&s.lease, "lease", 3*time.Second,
		"LeaseDuration: a dead replica's jobs wait this long; its sessions are renewed every third of it")
	flag.DurationVar(&s.stopAfter, "for", 0, "stop after this long, as on SIGTERM (0: at SIGTERM or Ctrl-C)")
	flag.IntVar(&s.expect, "expect", 0, "exit 1 unless this replica led this many jobs at once (0: no such check)")
	flag.Parse()
	for _, j := range strings.Split(jobs, ",") {
		if j = strings.TrimSpace(j); j != "" {
			s.jobs = append(s.jobs, j)
		}
	}
	if err := s.check(); err != nil {
		fmt.Fprintln(os.Stderr, "pool:", err)
		os.Exit(2)
	}

	// SIGTERM or Ctrl-C ends ctx: the replica leaves the pool, drains the
	// runs in progress and resigns its jobs, so that the others take them
	// at once.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if s.stopAfter > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.stopAfter)
		defer cancel()
	}
	if err := run(ctx, s, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "pool:", err)
		os.Exit(1)
	}
}

// check says which flag is wrong, if one is.
func (s settings) check() error {
	switch {
	case len(s.jobs) == 0:
		return errors.New("-jobs names no job")
	case s.every <= 0:
		return fmt.Errorf("-every %v: must be positive", s.every)
	case s.stopAfter < 0:
		return fmt.Errorf("-for %v: must not be negative", s.stopAfter)
	case s.expect < 0 || s.expect > len(s.jobs):
		return fmt.Errorf("-expect %d: must be between 0 and the number of jobs (%d)", s.expect, len(s.jobs))
	}
	return nil // the lease, the names: NewPool says what is wrong with them
}

// run runs the replica until ctx ends, printing to out, then checks what it
// printed against the table.
func run(ctx context.Context, s settings, out io.Writer) error {
	db, done, err := client(ctx, s.endpoint, s.region, out)
	if err != nil {
		return err
	}
	defer done()
	if err := ddblease.CreateTable(ctx, db, s.table); err != nil { // returns at once if it exists
		return err
	}
	pool, err := ddblease.NewPool(db, s.table, s.pool, s.jobs, func(o *ddblease.Options) {
		o.Owner = s.owner // "": ddblease.DefaultOwner
		o.LeaseDuration = s.lease
	})
	if err != nil {
		return err
	}
	owner := pool.Lease(s.jobs[0]).Owner()
	fmt.Fprintf(out, "replica %s: pool %q of %d jobs in table %q, one slot every %s\n",
		owner, s.pool, len(s.jobs), s.table, s.every)

	r := &replica{pool: pool, jobs: s.jobs, out: out, fences: map[string]int64{}, runs: map[string][]ran{}}
	watchCtx, stopWatch := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() { defer close(watched); r.watch(watchCtx) }()

	sched := ddblease.Every(s.every)
	err = pool.RunSchedule(ctx, ddblease.AllJobs(sched), r.report,
		func(o *ddblease.JobOptions) { o.CatchUpWindow = s.every }) // a start runs at most the slot just past
	stopWatch()
	<-watched
	if err != nil {
		return err
	}
	r.show() // what the stop left: no job led here
	fmt.Fprintln(out, "stopped: left the pool and resigned every job")
	return r.verify(context.Background(), sched, owner, s.expect)
}

// ran is a run this replica made.
type ran struct {
	slot  time.Time
	fence int64
}

// replica is what this process saw and did.
type replica struct {
	pool *ddblease.Pool
	jobs []string
	out  io.Writer

	mu       sync.Mutex
	members  string // as last printed
	leading  []string
	mostLed  int
	fences   map[string]int64 // per job, the highest fence a run had
	runs     map[string][]ran
	problems []string
}

// report is each job's scheduled work: only the job's leader gets here,
// once per slot, with the job's fence. A real service writes the report
// here, through a guard with run.Fence() (docs/guard.md).
func (r *replica) report(ctx context.Context, job string, run *ddblease.JobRun) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.showLocked() // the line that says this replica leads job comes first
	for _, prev := range r.runs[job] {
		if prev.slot.Equal(run.Slot()) {
			r.problems = append(r.problems, fmt.Sprintf("%s: slot %s ran twice here", job, hms(run.Slot())))
		}
	}
	if run.Fence() < r.fences[job] {
		r.problems = append(r.problems, fmt.Sprintf("%s: slot %s ran with fence %d, after a run with fence %d",
			job, hms(run.Slot()), run.Fence(), r.fences[job]))
	}
	r.fences[job] = max(r.fences[job], run.Fence())
	r.runs[job] = append(r.runs[job], ran{run.Slot(), run.Fence()})
	fmt.Fprintf(r.out, "  %s: slot %s, fence %d\n", job, hms(run.Slot()), run.Fence())
	return nil // recorded as the run's outcome
}

// watch prints the members and the jobs this replica leads each time they
// change, until ctx ends.
func (r *replica) watch(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		r.show()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// show prints the members and the jobs led if they changed since the last
// time.
func (r *replica) show() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.showLocked()
}

// showLocked is show, with r.mu held.
func (r *replica) showLocked() {
	if members := strings.Join(r.pool.Members(), ", "); members != r.members && members != "" {
		r.members = members
		fmt.Fprintf(r.out, "members: %s\n", members)
	}
	var leading []string
	for _, job := range r.jobs {
		if r.pool.Lease(job).IsLeader() {
			leading = append(leading, job)
		}
	}
	if !slices.Equal(leading, r.leading) {
		r.leading = leading
		r.mostLed = max(r.mostLed, len(leading))
		if len(leading) == 0 {
			fmt.Fprintf(r.out, "leading 0 of %d\n", len(r.jobs))
		} else {
			fmt.Fprintf(r.out, "leading %d of %d: %s\n", len(leading), len(r.jobs), strings.Join(leading, " "))
		}
	}
}

// verify checks what the replica printed against the table, after it
// stopped: every run recorded as succeeded under its fence, no job held
// here, and, with expect > 0, that it once led expect jobs at once.
func (r *replica) verify(ctx context.Context, sched ddblease.Schedule, owner string, expect int) error {
	r.mu.Lock()
	problems := slices.Clone(r.problems)
	runs, mostLed := r.runs, r.mostLed
	r.mu.Unlock()
	if expect > 0 && mostLed != expect {
		problems = append(problems, fmt.Sprintf("led at most %d jobs at once, not %d (-expect)", mostLed, expect))
	}
	for _, job := range r.jobs {
		lease := r.pool.Lease(job)
		rec, err := lease.Holder(ctx)
		if err != nil {
			return err
		}
		if rec.Owner == owner && !rec.ExpiresAt.IsZero() {
			problems = append(problems, fmt.Sprintf("%s: still held by this replica after the stop (fence %d)", job, rec.Fence))
		}
		mine := runs[job]
		if len(mine) == 0 {
			continue
		}
		// ListRuns reads at most MaxListSlots slots: check the latest ones.
		mine = mine[max(0, len(mine)-ddblease.MaxListSlots/2):]
		recorded, err := lease.ListRuns(ctx, sched, mine[0].slot, mine[len(mine)-1].slot)
		if err != nil {
			return err
		}
		bySlot := map[time.Time]ddblease.RunRecord{}
		for _, rr := range recorded {
			bySlot[rr.Slot] = rr
		}
		for _, m := range mine {
			rr, ok := bySlot[m.slot]
			switch {
			case !ok:
				problems = append(problems, fmt.Sprintf("%s: slot %s ran here but has no run item", job, hms(m.slot)))
			case rr.Owner != owner || rr.Fence != m.fence || rr.Status != ddblease.RunSucceeded:
				problems = append(problems, fmt.Sprintf("%s: slot %s ran here with fence %d, recorded as %s by %s with fence %d",
					job, hms(m.slot), m.fence, rr.Status, rr.Owner, rr.Fence))
			}
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("what this replica showed is wrong:\n  %s", strings.Join(problems, "\n  "))
	}
	n := 0
	for _, m := range runs {
		n += len(m)
	}
	fmt.Fprintf(r.out, "checked: %d runs, each recorded once under its fence; no job left held here\n", n)
	return nil
}

// hms formats a slot as HH:MM:SS.mmm, UTC.
func hms(t time.Time) string { return t.UTC().Format("15:04:05.000") }

// client returns a DynamoDB client for the chosen server, and a function
// that releases it.
func client(ctx context.Context, endpoint, region string, out io.Writer) (*dynamodb.Client, func(), error) {
	if endpoint == "" && region == "" {
		srv := ddbleasetest.Start() // in process, unless DDBLEASE_TEST_ENDPOINT names a server
		if srv.InProcess() {
			fmt.Fprintln(out, "using an in-process DynamoDB-compatible server at", srv.URL, "(this replica alone)")
		} else {
			fmt.Fprintln(out, "using the server DDBLEASE_TEST_ENDPOINT names:", srv.URL)
		}
		return srv.Client(), srv.Close, nil
	}
	if region == "" {
		region = ddbleasetest.Region // any region will do for a local server
	}
	opts := []func(*config.LoadOptions) error{config.WithRegion(region)}
	if endpoint != "" {
		// A local server accepts any credentials; static ones keep the SDK
		// from looking for real ones (and from asking EC2 instance metadata).
		opts = append(opts, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("local", "local", "")))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, nil, err
	}
	if endpoint == "" {
		fmt.Fprintln(out, "using DynamoDB in", region, "(or AWS_ENDPOINT_URL_DYNAMODB if set)")
		return dynamodb.NewFromConfig(cfg), func() {}, nil
	}
	fmt.Fprintln(out, "using the DynamoDB-compatible server at", endpoint)
	return dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
		o.BaseEndpoint = aws.String(endpoint)
	}), func() {}, nil
}
