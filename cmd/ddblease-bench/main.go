// Command ddblease-bench measures ddblease the way PEERS.md measured the
// peer: leader, standby and fresh replicas are separate OS processes (this
// program re-executed with -role), shut down with real SIGTERM and killed
// with real SIGKILL, against dynalite on loopback. It prints one table with
// our figures beside the peer's.
//
// Usage:
//
//	go build -o /tmp/ddblease-bench ./cmd/ddblease-bench
//	/tmp/ddblease-bench            # full run (about 30 minutes)
//	/tmp/ddblease-bench -quick     # 2-3 trials of each, about a minute
//
// It starts dynalite from testservers/dynalite (npm ci there installs it) unless
// -endpoint names a running server. Run it from the repository root.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ddblease/ddblease"
)

// settings are the timings of one column of the table.
type settings struct {
	name             string
	lease, hb, retry time.Duration
}

var (
	setA = settings{"a", 20 * time.Second, 5 * time.Second, time.Second}  // the peer's defaults
	setB = settings{"b", 30 * time.Second, 10 * time.Second, time.Second} // ours
)

func (s settings) String() string {
	return fmt.Sprintf("(%s) %v/%v/%v", s.name, s.lease, s.hb, s.retry)
}

// config holds the flags of every role.
type config struct {
	role     string
	endpoint string
	table    string
	job      string
	owner    string
	set      settings
	drain    time.Duration
	report   time.Duration
	renewals bool

	// scale role
	n, rounds, warmup, conns int
	ramp                     time.Duration
	cpuprofile               string
	memprofile               string
	stopprofile              string
	scaleHeap                bool

	// spread
	spreadJobs, spreadReplicas int
	spreadStagger              time.Duration

	// reads
	readsRuns int

	// sessions (and its children: every, sample)
	sessJobs, sessReplicas, sessIdle int
	sessEvery, sessWindow            time.Duration
	every, sample                    time.Duration

	// pool beside leases (and its child: pfMode)
	pfJobs, pfTrials       int
	pfLease, pfHB, pfRetry time.Duration
	pfWindow               time.Duration
	pfMode                 string

	// parent
	dynalite    string
	out         string
	quick       bool
	only        string
	setNames    string
	handover    int
	drainTrials int
	failover    int
	cold        int
	coldForge   bool
	costWindow  time.Duration
	overhead    int
	scale       string
	scaleRounds int
	parallel    int
	drainFor    time.Duration
}

func main() {
	start := time.Now()
	var c config
	fs := flag.NewFlagSet("ddblease-bench", flag.ExitOnError)
	fs.StringVar(&c.role, "role", "", "internal: contender, scale, pool, sched, schedidle, pfchild or minidyn (child processes)")
	fs.StringVar(&c.pfMode, "pf-mode", "", "internal: leases or pool, the jobs of a pfchild")
	fs.StringVar(&c.endpoint, "endpoint", "", "DynamoDB endpoint; empty starts dynalite on a free loopback port")
	fs.StringVar(&c.table, "table", "ddblease-bench", "table name (created if missing)")
	fs.StringVar(&c.job, "job", "", "internal: job name")
	fs.StringVar(&c.owner, "owner", "", "internal: owner id")
	fs.DurationVar(&c.set.lease, "lease", setB.lease, "internal: lease duration")
	fs.DurationVar(&c.set.hb, "hb", setB.hb, "internal: heartbeat interval")
	fs.DurationVar(&c.set.retry, "retry", setB.retry, "internal: retry interval")
	fs.DurationVar(&c.drain, "drain", 0, "internal: how long the leader's function runs on after its context ends")
	fs.DurationVar(&c.report, "report", 0, "internal: print request counts this often")
	fs.BoolVar(&c.renewals, "renewals", false, "internal: print every renewal")
	fs.IntVar(&c.n, "n", 1000, "internal: leases held by the scale process")
	fs.IntVar(&c.rounds, "rounds", 3, "internal: heartbeat rounds measured by the scale process")
	fs.IntVar(&c.warmup, "warmup", 1, "internal: heartbeat rounds before the scale measurement")
	fs.IntVar(&c.conns, "conns", 64, "internal: HTTP connections of the scale process")
	fs.StringVar(&c.cpuprofile, "cpuprofile", "", "internal: CPU profile of the scale process's measurement window")
	fs.StringVar(&c.stopprofile, "stopprofile", "", "internal: CPU profile of the scale process's shutdown (SIGTERM to all resigned)")
	fs.StringVar(&c.memprofile, "memprofile", "", "internal: heap profile of the scale process, taken as its measurement begins")
	fs.DurationVar(&c.ramp, "ramp", 0, "internal: time over which the scale process starts its leases (default: one heartbeat interval)")

	fs.StringVar(&c.dynalite, "dynalite", "", "dynalite executable (default: testservers/dynalite/node_modules/.bin/dynalite above the working directory)")
	fs.StringVar(&c.out, "out", "bench-out", "directory for logs and raw results")
	fs.BoolVar(&c.quick, "quick", false, "2-3 trials of each figure, short windows, for CI")
	fs.StringVar(&c.only, "only", "handover,drain,failover,cold,cost,overhead,scale,spread,sessions,poolfail,reads", "figures to measure")
	fs.StringVar(&c.setNames, "settings", "a,b", "settings columns: a (20s/5s/1s), b (30s/10s/1s)")
	fs.IntVar(&c.handover, "handover", 30, "hand-over trials per setting")
	fs.IntVar(&c.drainTrials, "drain-trials", 30, "hand-over trials with a draining leader per setting")
	fs.DurationVar(&c.drainFor, "drain-for", 2*time.Second, "how long the draining leader drains")
	fs.IntVar(&c.failover, "failover", 10, "crash failover trials per setting")
	fs.IntVar(&c.parallel, "parallel", 1, "crash failover trials run at once (each its own job and processes)")
	fs.IntVar(&c.cold, "cold", 10, "cold start trials per setting")
	fs.BoolVar(&c.coldForge, "cold-forge", false, "cold start: write the item a killed process leaves instead of killing one and waiting 2 x lease")
	fs.DurationVar(&c.costWindow, "cost-window", 3*time.Minute, "window over which requests are counted")
	fs.IntVar(&c.overhead, "overhead", 1000, "interleaved calls per kind for the overhead ratio")
	fs.StringVar(&c.scale, "scale", "1000,10000,10000/minidyn,10000/dynalite/120s/40s",
		"leases held by one process: N[/server[/lease/heartbeat]], server dynalite (the run's) or minidyn (a separate process); settings (b) unless given")
	fs.IntVar(&c.scaleRounds, "scale-rounds", 3, "heartbeat rounds measured at scale")
	fs.IntVar(&c.spreadJobs, "spread-jobs", 1000, "jobs of the pool the spread bench runs")
	fs.IntVar(&c.spreadReplicas, "spread-replicas", 5, "replica processes of the spread bench")
	fs.DurationVar(&c.spreadStagger, "spread-stagger", 3*time.Second, "time between the starts of the spread bench's replicas")
	fs.IntVar(&c.sessJobs, "sess-jobs", 1000, "scheduled jobs of the pool the sessions bench runs")
	fs.IntVar(&c.sessReplicas, "sess-replicas", 5, "replica processes of the sessions bench (started -spread-stagger apart)")
	fs.IntVar(&c.sessIdle, "sess-idle", 10000, "idle scheduled jobs held by one process in the sessions bench (0: none)")
	fs.DurationVar(&c.sessEvery, "sess-every", time.Minute, "the schedule of each job of the sessions bench (Every)")
	fs.DurationVar(&c.sessWindow, "sess-window", 3*time.Minute, "window over which the sessions bench counts writes")
	fs.DurationVar(&c.every, "every", time.Minute, "internal: the schedule of a sched replica's jobs")
	fs.DurationVar(&c.sample, "sample", 100*time.Millisecond, "internal: how often a sched replica reads its jobs' State")
	fs.IntVar(&c.pfJobs, "pf-jobs", 20, "jobs of the pool-beside-leases crash failover (poolfail)")
	fs.IntVar(&c.pfTrials, "pf-trials", 7, "poolfail trials of each side (leases, pool)")
	fs.DurationVar(&c.pfLease, "pf-lease", 3*time.Second, "poolfail lease duration")
	fs.DurationVar(&c.pfHB, "pf-hb", time.Second, "poolfail heartbeat interval")
	fs.DurationVar(&c.pfRetry, "pf-retry", 200*time.Millisecond, "poolfail retry interval")
	fs.DurationVar(&c.pfWindow, "pf-window", 5*time.Second, "poolfail idle hold before the kill, over which requests are counted")
	fs.IntVar(&c.readsRuns, "reads-runs", 20000, "run items in the table of the reads figure (over 10 jobs)")
	fs.BoolVar(&c.scaleHeap, "scale-heap", false, "write a heap profile of each scale process (every allocation sampled: its memory figures grow)")
	_ = fs.Parse(os.Args[1:])
	if c.ramp == 0 {
		c.ramp = c.set.hb
	}

	var err error
	switch c.role {
	case "contender":
		err = runContender(c, start)
	case "scale":
		err = runScale(c)
	case "pool":
		err = runPoolReplica(c)
	case "sched":
		err = runSchedReplica(c)
	case "schedidle":
		err = runSchedIdle(c)
	case "pfchild":
		err = runPFChild(c)
	case "minidyn":
		err = runMinidyn()
	case "":
		if c.quick {
			quickDefaults(&c, fs)
		}
		err = runParent(c)
	default:
		err = fmt.Errorf("unknown role %q", c.role)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ddblease-bench:", err)
		os.Exit(1)
	}
}

// quickDefaults lowers the counts for -quick, except flags set explicitly.
func quickDefaults(c *config, fs *flag.FlagSet) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	def := func(name string, apply func()) {
		if !set[name] {
			apply()
		}
	}
	def("handover", func() { c.handover = 3 })
	def("drain-trials", func() { c.drainTrials = 2 })
	def("failover", func() { c.failover = 2 })
	def("parallel", func() { c.parallel = 2 })
	def("cold", func() { c.cold = 2 })
	def("cold-forge", func() { c.coldForge = true })
	def("cost-window", func() { c.costWindow = 12 * time.Second })
	def("overhead", func() { c.overhead = 100 })
	def("scale", func() { c.scale = "300/dynalite/6s/2s" }) // rounds of 2 s, not (b)'s 10 s
	def("scale-rounds", func() { c.scaleRounds = 1 })
	def("spread-jobs", func() { c.spreadJobs = 100 })
	def("spread-replicas", func() { c.spreadReplicas = 3 })
	def("spread-stagger", func() { c.spreadStagger = time.Second })
	def("sess-jobs", func() { c.sessJobs = 100 })
	def("sess-replicas", func() { c.sessReplicas = 3 })
	def("sess-idle", func() { c.sessIdle = 4000 }) // with fewer, the fixed heap (about 700 KB) weighs on the figure per job
	def("sess-every", func() { c.sessEvery = 5 * time.Second })
	def("sess-window", func() { c.sessWindow = 8 * time.Second })
	def("reads-runs", func() { c.readsRuns = 2000 })
	def("pf-trials", func() { c.pfTrials = 2 })
	def("pf-window", func() { c.pfWindow = 2 * time.Second })
}

// childArgs are the flags of a child process on job with settings s.
func (c config) childArgs(role, job string, s settings, extra ...string) []string {
	args := []string{
		"-role", role, "-endpoint", c.endpoint, "-table", c.table, "-job", job,
		"-lease", s.lease.String(), "-hb", s.hb.String(), "-retry", s.retry.String(),
	}
	return append(args, extra...)
}

// findDynalite looks for testservers/dynalite/node_modules/.bin/dynalite
// in the working directory and its parents.
func findDynalite() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, "testservers", "dynalite", "node_modules", ".bin", "dynalite")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("testservers/dynalite/node_modules/.bin/dynalite not found (run npm ci in testservers/dynalite, or give -dynalite or -endpoint)")
		}
		dir = parent
	}
}

// startDynalite starts dynalite on a free loopback port, as
// .ci/start-dynalite does, and waits until it answers.
func startDynalite(bin, logPath string) (*exec.Cmd, string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	log, err := os.Create(logPath)
	if err != nil {
		return nil, "", err
	}
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--host", "127.0.0.1",
		"--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	for range 120 {
		resp, err := http.Post(url, "application/x-amz-json-1.0", strings.NewReader("{}"))
		if err == nil {
			_ = resp.Body.Close()
			return cmd, url, nil
		}
		time.Sleep(250 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	return nil, "", fmt.Errorf("dynalite did not answer on %s within 30s; see %s", url, logPath)
}

func runParent(c config) error {
	if err := os.MkdirAll(c.out, 0o755); err != nil {
		return err
	}
	var sets []settings
	for _, n := range strings.Split(c.setNames, ",") {
		switch strings.TrimSpace(n) {
		case "a":
			sets = append(sets, setA)
		case "b":
			sets = append(sets, setB)
		case "":
		default:
			return fmt.Errorf("unknown settings %q (a or b)", n)
		}
	}
	r := &runner{cfg: c, sets: sets, only: map[string]bool{}}
	for _, f := range strings.Split(c.only, ",") {
		r.only[strings.TrimSpace(f)] = true
	}
	server := c.endpoint
	if c.endpoint == "" {
		bin := c.dynalite
		if bin == "" {
			var err error
			if bin, err = findDynalite(); err != nil {
				return err
			}
		}
		cmd, url, err := startDynalite(bin, filepath.Join(c.out, "dynalite.log"))
		if err != nil {
			return err
		}
		exited := make(chan struct{})
		r.serverDead = exited
		go func() {
			_ = cmd.Wait()
			close(exited)
		}()
		defer func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			<-exited
		}()
		r.cfg.endpoint = url
		r.dynalitePid = cmd.Process.Pid
		server = "dynalite " + dynaliteVersion(bin) + " at " + url
	}
	r.server = server
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := ddblease.CreateTable(ctx, newClient(r.cfg.endpoint, newTransport(8)), c.table); err != nil {
		return fmt.Errorf("create table: %w", err)
	}
	return r.run()
}

// dynaliteVersion reads the version from dynalite's package.json.
func dynaliteVersion(bin string) string {
	real, err := filepath.EvalSymlinks(bin)
	if err != nil {
		return "?"
	}
	b, err := os.ReadFile(filepath.Join(filepath.Dir(real), "package.json"))
	if err != nil {
		return "?"
	}
	s := string(b)
	i := strings.Index(s, `"version"`)
	if i < 0 {
		return "?"
	}
	s = s[i+len(`"version"`):]
	s = s[strings.IndexByte(s, '"')+1:]
	return s[:strings.IndexByte(s, '"')]
}
