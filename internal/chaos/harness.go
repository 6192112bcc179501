package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
)

// ReplicaEnv is the environment variable that makes the suite's binary run
// as a replica; it holds the ReplicaConfig as JSON.
const ReplicaEnv = "DDBLEASE_CHAOS_REPLICA"

// Harness runs plans against a server.
type Harness struct {
	Binary string          // re-executed with ReplicaEnv set
	Server *ddbtest.Server // the server under test
	Dir    string          // histories and replicas' stderr go here
	Timing Timing
}

// Result is what one run did and what the checker found.
type Result struct {
	Plan       *Plan
	Violations []string
	Faults     map[string]int // injected, by kind (proxy faults and signals)
	Stats      Stats
	// Transactions: the server has them, so TransactWrite and Commit ran;
	// without them their slots used Update.
	Transactions bool
}

type proc struct {
	name   string
	cmd    *exec.Cmd
	proxy  *Proxy
	stderr string
	done   chan struct{}
	err    error
	paused bool
	killed bool
	termed bool

	// What the checker needs to know of the process's life, in real time.
	started, killedAt, termedAt, exitedAt time.Time
	pauses, netFaults                     []Interval
}

type pending struct {
	at time.Time
	do func()
}

// Run executes one plan and checks its history.
func (h *Harness) Run(ctx context.Context, plan *Plan) (*Result, error) {
	db := h.Server.Client(nil)
	table := fmt.Sprintf("chaos-%d-%s", plan.Seed, ddbtest.RandomID())
	sink := table + "-sink"
	if err := ddblease.CreateTable(ctx, db, table); err != nil {
		return nil, fmt.Errorf("create table %s: %w", table, err)
	}
	if err := ddbtest.CreateRawTable(ctx, db, sink, "pk", types.ScalarAttributeTypeS); err != nil {
		return nil, fmt.Errorf("create table %s: %w", sink, err)
	}
	timing := plan.Timing(h.Timing)
	jobs := plan.JobNames()
	pool := ""
	if plan.Pool {
		pool = "chaos"
	}
	res := &Result{Plan: plan, Faults: map[string]int{}}
	txn := probeTransactions(ctx, db, sink)
	res.Transactions = txn
	var procs []*proc
	var proxies []*Proxy
	defer func() {
		for _, p := range procs {
			if p.cmd.Process != nil && !exited(p) {
				_ = p.cmd.Process.Kill()
				<-p.done
			}
		}
		for _, px := range proxies {
			px.Close()
		}
	}()
	seq := 0
	start := func() (*proc, error) {
		seq++
		px, err := NewProxy(h.Server.URL, plan.Seed*1000+uint64(seq))
		if err != nil {
			return nil, err
		}
		proxies = append(proxies, px)
		px.WatchSlow(timing.Call)
		off, drift := plan.Clock(h.Timing)
		t := timing
		name := "replica-" + strconv.Itoa(seq)
		cfg := ReplicaConfig{
			Name: name, Endpoint: px.URL(), Table: table, Sink: sink, Job: jobs[0], Pool: pool, Jobs: jobs,
			Lease: t.Lease, Heartbeat: t.Heartbeat, Retry: t.Retry, Skew: t.Skew, Drain: t.Drain, Call: t.Call,
			Slot: t.Slot, Work: t.Work, Offset: off, DriftPPM: drift,
			Events:       filepath.Join(h.Dir, name+".events"),
			Transactions: txn,
		}
		js, _ := json.Marshal(cfg)
		p := &proc{name: name, proxy: px, stderr: filepath.Join(h.Dir, name+".stderr"), done: make(chan struct{})}
		errf, err := os.Create(p.stderr)
		if err != nil {
			return nil, err
		}
		p.cmd = exec.Command(h.Binary, "-test.run=^$")
		p.cmd.Env = append(os.Environ(), ReplicaEnv+"="+string(js))
		p.cmd.Stdout, p.cmd.Stderr = errf, errf
		if err := p.cmd.Start(); err != nil {
			errf.Close()
			return nil, err
		}
		p.started = time.Now()
		go func() {
			p.err = p.cmd.Wait()
			p.exitedAt = time.Now()
			errf.Close()
			close(p.done)
		}()
		procs = append(procs, p)
		return p, nil
	}
	running := func() []*proc {
		var out []*proc
		for _, p := range procs {
			if !exited(p) && !p.killed && !p.termed && !p.paused {
				out = append(out, p)
			}
		}
		return out
	}
	// pick chooses a step's target: the leader for even targets (as the
	// table names it; in a pool, the leader of one of its jobs, by the
	// target), else any running replica.
	pick := func(target int) (*proc, int) {
		live := running()
		if len(live) == 0 {
			return nil, 0
		}
		if target%2 == 0 {
			if out, err := db.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), ConsistentRead: aws.Bool(true),
				Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "job#" + jobs[target/2%len(jobs)]},
					"sk": &types.AttributeValueMemberS{Value: "lease"}}}); err == nil {
				if o, ok := out.Item["owner"].(*types.AttributeValueMemberS); ok {
					for _, p := range live {
						if p.name == o.Value {
							return p, len(live)
						}
					}
				}
			}
		}
		return live[target/2%len(live)], len(live)
	}
	for range plan.Replicas {
		if _, err := start(); err != nil {
			return nil, err
		}
	}
	t0 := time.Now()
	stalls := watchStalls()
	var queue []pending
	for _, s := range plan.Steps {
		queue = append(queue, pending{at: t0.Add(s.At), do: h.stepFunc(s, pick, start, &queue, res)})
	}
	var quietFrom time.Time
	queue = append(queue, pending{at: t0.Add(plan.Faulty), do: func() {
		for _, p := range procs {
			p.proxy.Set(Faults{})
			endNet(p)
			if p.paused {
				resume(p)
			}
		}
		for len(running()) < 2 {
			if _, err := start(); err != nil {
				res.Violations = append(res.Violations, "could not start a replica: "+err.Error())
				return
			}
		}
		quietFrom = time.Now()
	}})
	for len(queue) > 0 {
		sort.SliceStable(queue, func(i, j int) bool { return queue[i].at.Before(queue[j].at) })
		next := queue[0]
		queue = queue[1:]
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Until(next.at)):
		}
		next.do()
	}
	time.Sleep(time.Until(quietFrom.Add(plan.Quiet)))
	end := time.Now()

	// Stop every replica gracefully; each must exit on its own.
	for _, p := range procs {
		if !exited(p) {
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
			if !p.termed {
				p.termed, p.termedAt = true, time.Now()
			}
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, p := range procs {
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			res.Violations = append(res.Violations, p.name+" did not exit within 15s of SIGTERM")
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	var slow []Interval
	for _, px := range proxies {
		for k, v := range px.Counts() {
			res.Faults[k] += v
		}
		slow = append(slow, px.Slow()...)
	}

	in := CheckInput{Timing: timing, Wild: plan.Wild, Pool: plan.Pool, QuietFrom: quietFrom, End: end, Race: RaceEnabled, Stalls: stalls(), Slow: slow}
	for _, p := range procs {
		evs, err := ReadEvents(filepath.Join(h.Dir, p.name+".events"))
		if err != nil && !os.IsNotExist(err) {
			res.Violations = append(res.Violations, err.Error())
		}
		in.Events = append(in.Events, evs...)
		stderr, _ := os.ReadFile(p.stderr)
		in.Procs = append(in.Procs, ProcExit{Name: p.name, Killed: p.killed, Err: p.err, Stderr: string(stderr),
			Started: p.started, KilledAt: p.killedAt, TermedAt: p.termedAt, ExitedAt: p.exitedAt, Pauses: p.pauses, NetFaults: p.netFaults,
			Slow: p.proxy.Slow()})
	}
	// Slots come from the replicas' clocks, which a wild plan offsets by up
	// to five leases, and a catch-up may fire one from before the start.
	margin := 10*timing.Lease + 4*timing.Slot
	for _, job := range jobs {
		jh := JobHistory{Job: job}
		var err error
		if jh.Sink, err = readSink(ctx, db, sink, job); err != nil {
			return nil, err
		}
		if jh.Runs, err = readRuns(ctx, db, table, job, timing.Slot, t0.Add(-margin), end.Add(margin)); err != nil {
			return nil, err
		}
		if !plan.Pool {
			in.Sink, in.Runs = jh.Sink, jh.Runs
			break
		}
		in.Jobs = append(in.Jobs, jh)
	}
	v, stats := Check(in)
	res.Violations = append(res.Violations, v...)
	res.Stats = stats
	return res, nil
}

// watchStalls starts watching the suite's own process for stalls: a
// ticker every 5 ms arriving more than 250 ms late means that the process
// (the server and the proxies run in it) or the whole machine did not run
// for that long. The returned function stops the watch and lists them.
func watchStalls() func() []Interval {
	var (
		mu     sync.Mutex
		stalls []Interval
	)
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				now = time.Now()
				if now.Sub(last) > 250*time.Millisecond {
					mu.Lock()
					stalls = append(stalls, Interval{From: last, To: now})
					mu.Unlock()
				}
				last = now
			}
		}
	}()
	return func() []Interval {
		close(done)
		<-finished
		mu.Lock()
		defer mu.Unlock()
		return stalls
	}
}

// Interval is a span of real time; a zero To means it lasted to the end.
type Interval struct{ From, To time.Time }

// resume sends SIGCONT to a stopped p; the stop ends when the signal is
// about to be sent, as the process may run at once.
func resume(p *proc) {
	p.pauses[len(p.pauses)-1].To = time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	p.paused = false
}

// stoppedAt waits (up to a second) until the process is stopped, as
// /proc reports it, and returns the time it was seen so (or gone); if it
// is not seen stopped, the time after a second.
func stoppedAt(pid int) time.Time {
	path := fmt.Sprintf("/proc/%d/stat", pid)
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		b, err := os.ReadFile(path)
		if err != nil {
			return time.Now() // gone: it runs no more
		}
		// The state follows the command name, which is in parentheses.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && (b[i+2] == 'T' || b[i+2] == 't') {
			return time.Now()
		}
	}
	time.Sleep(time.Second)
	return time.Now()
}

// endNet closes p's open network-fault interval, if any.
func endNet(p *proc) {
	if n := len(p.netFaults); n > 0 && p.netFaults[n-1].To.IsZero() {
		p.netFaults[n-1].To = time.Now()
	}
}

// probeTransactions reports whether the server runs TransactWriteItems.
func probeTransactions(ctx context.Context, db *dynamodb.Client, table string) bool {
	_, err := db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{{
		Put: &types.Put{TableName: aws.String(table), Item: map[string]types.AttributeValue{
			"pk": &types.AttributeValueMemberS{Value: "probe#transactions"}}},
	}}})
	return err == nil
}

func exited(p *proc) bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stepFunc turns a plan step into an action on the replicas.
func (h *Harness) stepFunc(s Step, pick func(int) (*proc, int), start func() (*proc, error), queue *[]pending, res *Result) func() {
	return func() {
		p, live := pick(s.Target)
		if p == nil {
			return
		}
		switch s.Action {
		case ActKill:
			if live < 2 {
				return
			}
			_ = p.cmd.Process.Kill()
			p.killed, p.killedAt = true, time.Now()
			res.Faults["sigkill"]++
			*queue = append(*queue, pending{at: time.Now().Add(s.Dur), do: func() { _, _ = start() }})
		case ActDeploy:
			if _, err := start(); err != nil {
				res.Violations = append(res.Violations, "could not start a replica: "+err.Error())
				return
			}
			p.termed, p.termedAt = true, time.Now()
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			res.Faults["sigterm"]++
		case ActPause:
			if live < 2 {
				return
			}
			_ = p.cmd.Process.Signal(syscall.SIGSTOP)
			p.paused = true
			// The stop counts from when the process is seen stopped: it
			// may run a little after the signal is sent.
			p.pauses = append(p.pauses, Interval{From: stoppedAt(p.cmd.Process.Pid)})
			res.Faults["sigstop"]++
			*queue = append(*queue, pending{at: time.Now().Add(s.Dur), do: func() {
				if p.paused {
					resume(p)
				}
			}})
		case ActNet:
			endNet(p)
			p.netFaults = append(p.netFaults, Interval{From: time.Now()})
			p.proxy.Set(s.Faults)
			res.Faults["net-phase"]++
			*queue = append(*queue, pending{at: time.Now().Add(s.Dur), do: func() { p.proxy.Set(Faults{}); endNet(p) }})
		}
	}
}

// SinkEntry is one side effect the sink accepted, in order.
type SinkEntry struct {
	Fence   int64
	Slot    string
	Replica string
	Form    string
}

func readSink(ctx context.Context, db *dynamodb.Client, sink, job string) ([]SinkEntry, error) {
	out, err := db.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(sink), Key: SinkKey(job), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return nil, err
	}
	l, ok := out.Item["log"].(*types.AttributeValueMemberL)
	if !ok {
		return nil, nil
	}
	var entries []SinkEntry
	for _, v := range l.Value {
		m, ok := v.(*types.AttributeValueMemberM)
		if !ok {
			return nil, fmt.Errorf("sink log entry %v is not a map", v)
		}
		var e SinkEntry
		if n, ok := m.Value["fence"].(*types.AttributeValueMemberN); ok {
			f, err := strconv.ParseFloat(n.Value, 64)
			if err != nil {
				return nil, err
			}
			e.Fence = int64(f)
		}
		if s, ok := m.Value["slot"].(*types.AttributeValueMemberS); ok {
			e.Slot = s.Value
		}
		if s, ok := m.Value["replica"].(*types.AttributeValueMemberS); ok {
			e.Replica = s.Value
		}
		if s, ok := m.Value["form"].(*types.AttributeValueMemberS); ok {
			e.Form = s.Value
		}
		entries = append(entries, e)
	}
	return entries, nil
}

func readRuns(ctx context.Context, db *dynamodb.Client, table, job string, slot time.Duration, from, to time.Time) ([]ddblease.RunRecord, error) {
	l, err := ddblease.New(db, table, job, func(o *ddblease.Options) { o.Owner = "checker" })
	if err != nil {
		return nil, err
	}
	return l.ListRuns(ctx, ddblease.Every(slot), from, to)
}

// Describe summarises a result in one line.
func (r *Result) Describe() string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "seed %d wild=%v", r.Plan.Seed, r.Plan.Wild)
	if r.Plan.Pool {
		fmt.Fprintf(&b, " pool of %d jobs", r.Plan.Jobs)
	}
	fmt.Fprintf(&b, ": %+v faults=%v", r.Stats, r.Faults)
	if !r.Transactions {
		b.WriteString(" (the server has no transactions: TransactWrite and Commit skipped, their slots used Update)")
	}
	return b.String()
}
