package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/reqcount"
)

type handoverTrial struct {
	Handover   float64 // SIGTERM sent → standby leads, s
	FromReturn float64 // leader's function returned → standby leads, s
	Fence      int64   // the standby's fence
}

type failoverTrial struct {
	Failover float64 // SIGKILL sent → standby leads, s
	Age      float64 // age of the last heartbeat at kill time, s
	Bound    float64 // lease − age + retry, s
	Slack    float64 // Failover − Bound, s
	Requests int     // requests the standby made before it led (cumulative)
}

type coldTrial struct {
	FromSpawn float64 // parent's exec → leads, s
	FromStart float64 // child's main → leads, s
	FromCall  float64 // first call (Run) → leads, s
	Requests  int     // requests made before leading
	SinceKill float64 // time between the kill (or forged kill) and the spawn, s
	Forged    bool
}

type costResult struct {
	Window      float64                    // s
	PerHour     map[string]reqcount.Counts // role → requests per hour, by op
	RCU, WCU    map[string]float64         // role → units per hour
	StandbyRCUs []float64                  // each standby's read units per hour
}

type overheadResult struct {
	N                                  int
	AcquireOurs, AcquireRaw            float64 // median, ms
	HeartbeatOurs, HeartbeatRaw        float64 // median, ms
	AcquireRatio, HeartbeatRatio       float64 // of medians
	AcquireMeanRatio, HeartbeatMeanRat float64 // of trimmed means (10%)
}

type results struct {
	Server   string
	Machine  string
	Started  time.Time
	Finished time.Time
	Args     []string
	Handover map[string][]handoverTrial
	Drain    map[string][]handoverTrial
	Failover map[string][]failoverTrial
	Cold     map[string][]coldTrial
	Cost     map[string]costResult
	Overhead *overheadResult
	Scale    []map[string]string
	Spread   *spreadResult
	Sessions *sessionsResult
	// PoolFailover is the crash failover of a pool beside leases.
	PoolFailover *poolFailoverResult
	Reads        []readsResult
	// ReadsItems is the run items of the reads figure's tables.
	ReadsItems int
	Errors     []string
	DrainFor   float64
	Settings   map[string]string
}

type runner struct {
	cfg         config
	sets        []settings
	only        map[string]bool
	server      string
	dynalitePid int
	log         *os.File
	runID       string
	serverDead  chan struct{} // closed if the dynalite we started exits

	mu  sync.Mutex
	res results
}

func (r *runner) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func (r *runner) fail(what string, err error) {
	if r.dead() {
		err = fmt.Errorf("%w (dynalite exited; see its log)", err)
	}
	r.logf("%s: %v", what, err)
	r.mu.Lock()
	r.res.Errors = append(r.res.Errors, what+": "+err.Error())
	r.mu.Unlock()
}

func (r *runner) spawn(name, job string, s settings, extra ...string) (*proc, error) {
	return spawn(name, r.log, r.cfg.childArgs("contender", job, s, extra...)...)
}

func (r *runner) run() error {
	var err error
	if r.log, err = os.Create(filepath.Join(r.cfg.out, "children.log")); err != nil {
		return err
	}
	defer r.log.Close()
	r.runID = strconv.FormatInt(time.Now().Unix()%1e6, 36)
	r.res = results{
		Server: r.server, Machine: machine(), Started: time.Now(), Args: os.Args[1:],
		Handover: map[string][]handoverTrial{}, Drain: map[string][]handoverTrial{},
		Failover: map[string][]failoverTrial{}, Cold: map[string][]coldTrial{},
		Cost: map[string]costResult{}, DrainFor: r.cfg.drainFor.Seconds(), Settings: map[string]string{},
	}
	for _, s := range r.sets {
		r.res.Settings[s.name] = s.String()
	}
	r.logf("server: %s; children's log: %s", r.server, r.log.Name())

	timed := func() {
		for _, s := range r.sets {
			if r.only["handover"] {
				r.handover(s, 0, r.cfg.handover, r.res.Handover)
			}
			if r.only["drain"] {
				r.handover(s, r.cfg.drainFor, r.cfg.drainTrials, r.res.Drain)
			}
		}
		if r.only["overhead"] {
			r.overhead()
		}
	}
	slow := func() {
		var wg sync.WaitGroup
		// wait waits for what was started, except in a quick run, where
		// failovers, cold starts and request counts all run at once.
		wait := func() {
			if !r.cfg.quick {
				wg.Wait()
			}
		}
		for _, s := range r.sets {
			if r.only["failover"] {
				if r.cfg.quick {
					wg.Go(func() { r.failover(s) })
				} else {
					r.failover(s)
				}
			}
		}
		wait()
		for _, s := range r.sets {
			if r.only["cold"] {
				wg.Go(func() { r.coldStart(s) })
			}
		}
		wait()
		if r.only["cost"] {
			for _, s := range r.sets {
				wg.Go(func() { r.cost(s) })
			}
		}
		wg.Wait()
	}
	if r.cfg.quick {
		// Timings of a quick run are not figures: overlap everything.
		var wg sync.WaitGroup
		wg.Go(slow)
		timed()
		wg.Wait()
	} else {
		timed()
		slow()
	}
	if r.only["scale"] {
		r.scaleAll()
	}
	if r.only["spread"] {
		r.spread()
	}
	if r.only["sessions"] {
		r.sessions()
	}
	if r.only["poolfail"] {
		r.poolFailover()
	}
	if r.only["reads"] {
		r.reads()
	}
	r.res.Finished = time.Now()

	b, _ := json.MarshalIndent(r.res, "", "  ")
	_ = os.WriteFile(filepath.Join(r.cfg.out, "results.json"), b, 0o644)
	table := r.table()
	_ = os.WriteFile(filepath.Join(r.cfg.out, "table.md"), []byte(table), 0o644)
	fmt.Print(table)
	if len(r.res.Errors) > 0 {
		return fmt.Errorf("%d errors (listed above the table)", len(r.res.Errors))
	}
	return nil
}

// dead reports whether the dynalite this program started has exited.
func (r *runner) dead() bool {
	if r.serverDead == nil {
		return false
	}
	select {
	case <-r.serverDead:
		return true
	default:
		return false
	}
}

func secs(d time.Duration) float64 { return d.Seconds() }

func jitter(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rand.Int64N(int64(hi-lo)+1))
}

// handover measures SIGTERM to leader → standby leads, as a rolling deploy:
// each trial's standby is the next trial's leader.
func (r *runner) handover(s settings, drain time.Duration, trials int, into map[string][]handoverTrial) {
	if trials <= 0 {
		return
	}
	what := fmt.Sprintf("hand-over %v drain %v", s, drain)
	r.logf("%s: %d trials", what, trials)
	job := fmt.Sprintf("handover-%s-%dms-%s", s.name, drain.Milliseconds(), r.runID)
	extra := []string{"-drain", drain.String()}
	leader, err := r.spawn("leader", job, s, extra...)
	if err != nil {
		r.fail(what, err)
		return
	}
	defer func() { _ = leader.stop(30 * time.Second) }()
	if _, err := leader.first("LEADS", 30*time.Second); err != nil {
		r.fail(what, err)
		return
	}
	for i := range trials {
		standby, err := r.spawn("standby", job, s, extra...)
		if err != nil {
			r.fail(what, err)
			return
		}
		if _, err := standby.first("CALL", 10*time.Second); err != nil {
			r.fail(what, err)
			_ = standby.stop(10 * time.Second)
			return
		}
		// Past its first poll, at a random phase of its polling.
		time.Sleep(jitter(s.retry+200*time.Millisecond, 2*s.retry+200*time.Millisecond))
		lf, _ := leader.first("LEADS", time.Second)
		t0, err := leader.signal(syscall.SIGTERM)
		if err != nil {
			r.fail(what, err)
			return
		}
		leads, err := standby.first("LEADS", 30*time.Second+drain)
		if err != nil {
			r.fail(what, err)
			_ = standby.stop(10 * time.Second)
			return
		}
		ret, err := leader.first("RETURNED", 10*time.Second)
		if err != nil {
			r.fail(what, err)
		}
		if err := leader.wait(30 * time.Second); err != nil {
			r.fail(what, err)
		}
		if ex, err := leader.first("EXIT", time.Second); err != nil || ex.fields["err"] != "ok" {
			r.fail(what, fmt.Errorf("leader exit: %v %v", ex.fields, err))
		}
		fence, _ := strconv.ParseInt(leads.fields["fence"], 10, 64)
		prev, _ := strconv.ParseInt(lf.fields["fence"], 10, 64)
		if fence != prev+1 {
			r.fail(what, fmt.Errorf("trial %d: standby fence %d after leader fence %d", i, fence, prev))
		}
		t := handoverTrial{Handover: secs(leads.at.Sub(t0)), FromReturn: secs(leads.at.Sub(ret.at)), Fence: fence}
		r.mu.Lock()
		into[s.name] = append(into[s.name], t)
		r.mu.Unlock()
		r.logf("%s #%d: %.3fs (%.3fs after the leader's function returned)", what, i+1, t.Handover, t.FromReturn)
		leader = standby
	}
}

// leaseItem reads the lease item of job with a consistent read.
func (r *runner) leaseItem(ctx context.Context, job string) (renewedMs, expiresMs int64, err error) {
	db := newClient(r.cfg.endpoint, newTransport(2))
	out, err := db.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String(r.cfg.table), ConsistentRead: aws.Bool(true),
		Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "job#" + job},
			"sk": &types.AttributeValueMemberS{Value: "lease"}},
	})
	if err != nil {
		return 0, 0, err
	}
	n := func(name string) int64 {
		v, _ := out.Item[name].(*types.AttributeValueMemberN)
		if v == nil {
			return 0
		}
		i, _ := strconv.ParseInt(v.Value, 10, 64)
		return i
	}
	return n("renewedAt"), n("expiresAt"), nil
}

// failover measures SIGKILL to leader → standby leads, with the standby
// polling since before the kill.
func (r *runner) failover(s settings) {
	what := fmt.Sprintf("crash failover %v", s)
	r.logf("%s: %d trials, %d at once", what, r.cfg.failover, r.cfg.parallel)
	sem := make(chan struct{}, max(r.cfg.parallel, 1))
	var wg sync.WaitGroup
	for i := range r.cfg.failover {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			job := fmt.Sprintf("failover-%s-%d-%s", s.name, i, r.runID)
			t, err := r.failoverTrial(job, s)
			if err != nil {
				r.fail(fmt.Sprintf("%s #%d", what, i+1), err)
				return
			}
			r.mu.Lock()
			r.res.Failover[s.name] = append(r.res.Failover[s.name], t)
			r.mu.Unlock()
			r.logf("%s #%d: %.3fs; heartbeat age %.3fs; lease-age+retry %.3fs; slack %+.3fs", what, i+1, t.Failover, t.Age, t.Bound, t.Slack)
		})
	}
	wg.Wait()
}

func (r *runner) failoverTrial(job string, s settings) (failoverTrial, error) {
	leader, err := r.spawn("leader", job, s)
	if err != nil {
		return failoverTrial{}, err
	}
	defer func() { _ = leader.stop(10 * time.Second) }()
	if _, err := leader.first("LEADS", 30*time.Second); err != nil {
		return failoverTrial{}, err
	}
	standby, err := r.spawn("standby", job, s)
	if err != nil {
		return failoverTrial{}, err
	}
	defer func() { _ = standby.stop(30 * time.Second) }()
	if _, err := standby.first("CALL", 10*time.Second); err != nil {
		return failoverTrial{}, err
	}
	// A random age of the last heartbeat at the kill.
	time.Sleep(s.retry + 500*time.Millisecond + jitter(0, s.hb))
	t0, err := leader.signal(syscall.SIGKILL)
	if err != nil {
		return failoverTrial{}, err
	}
	if err := leader.wait(10 * time.Second); err != nil {
		return failoverTrial{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	renewed, expires, err := r.leaseItem(ctx, job)
	cancel()
	if err != nil {
		return failoverTrial{}, err
	}
	leads, err := standby.first("LEADS", 2*s.lease+10*time.Second)
	if err != nil {
		return failoverTrial{}, err
	}
	kill := float64(t0.UnixNano()) / 1e9
	t := failoverTrial{
		Failover: secs(leads.at.Sub(t0)),
		Age:      kill - float64(renewed)/1e3,
		Bound:    float64(expires)/1e3 - kill + s.retry.Seconds(),
	}
	t.Slack = t.Failover - t.Bound
	t.Requests, _ = strconv.Atoi(leads.fields["requests"])
	return t, nil
}

// coldStart measures a fresh process taking a lease left unreleased by a
// process killed 2 × lease ago.
func (r *runner) coldStart(s settings) {
	n := r.cfg.cold
	if n <= 0 {
		return
	}
	what := fmt.Sprintf("cold start %v", s)
	jobs := make([]string, n)
	kills := make([]time.Time, n)
	for i := range jobs {
		jobs[i] = fmt.Sprintf("cold-%s-%d-%s", s.name, i, r.runID)
	}
	if r.cfg.coldForge {
		r.logf("%s: %d trials on forged items", what, n)
		for i := range jobs {
			kills[i] = time.Now().Add(-2 * s.lease)
			if err := r.forge(jobs[i], s, kills[i]); err != nil {
				r.fail(what, err)
				return
			}
		}
	} else {
		r.logf("%s: %d leaders, killed, then fresh processes 2 x %v later", what, n, s.lease)
		leaders := make([]*proc, n)
		for i := range jobs {
			p, err := r.spawn("leader", jobs[i], s)
			if err != nil {
				r.fail(what, err)
				return
			}
			defer func() { _ = p.stop(10 * time.Second) }()
			leaders[i] = p
		}
		for _, p := range leaders {
			if _, err := p.first("LEADS", 30*time.Second); err != nil {
				r.fail(what, err)
				return
			}
		}
		for i, p := range leaders {
			time.Sleep(jitter(100*time.Millisecond, 600*time.Millisecond))
			var err error
			if kills[i], err = p.signal(syscall.SIGKILL); err != nil {
				r.fail(what, err)
				return
			}
		}
		for _, p := range leaders {
			_ = p.wait(10 * time.Second)
		}
	}
	for i, job := range jobs {
		time.Sleep(time.Until(kills[i].Add(2 * s.lease)))
		p, err := r.spawn("fresh", job, s)
		if err != nil {
			r.fail(what, err)
			return
		}
		leads, err := p.first("LEADS", 2*s.lease)
		if err != nil {
			r.fail(what, err)
			_ = p.stop(10 * time.Second)
			continue
		}
		start, _ := p.first("START", time.Second)
		call, _ := p.first("CALL", time.Second)
		t := coldTrial{
			FromSpawn: secs(leads.at.Sub(p.spawnedAt)),
			FromStart: secs(leads.at.Sub(start.at)),
			FromCall:  secs(leads.at.Sub(call.at)),
			SinceKill: secs(p.spawnedAt.Sub(kills[i])),
			Forged:    r.cfg.coldForge,
		}
		t.Requests, _ = strconv.Atoi(leads.fields["requests"])
		if err := p.stop(10 * time.Second); err != nil {
			r.fail(what, err)
		}
		r.mu.Lock()
		r.res.Cold[s.name] = append(r.res.Cold[s.name], t)
		r.mu.Unlock()
		r.logf("%s #%d: %.3fs from exec, %.3fs from the first call, %d request(s); killed %.1fs before", what, i+1, t.FromSpawn, t.FromCall, t.Requests, t.SinceKill)
	}
}

// forge writes the lease item that a leader killed at kill, right after a
// heartbeat, leaves behind.
func (r *runner) forge(job string, s settings, kill time.Time) error {
	db := newClient(r.cfg.endpoint, newTransport(2))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n := func(t int64) types.AttributeValue {
		return &types.AttributeValueMemberN{Value: strconv.FormatInt(t, 10)}
	}
	_, err := db.PutItem(ctx, &dynamodb.PutItemInput{
		TableName: aws.String(r.cfg.table),
		Item: map[string]types.AttributeValue{
			"pk":         &types.AttributeValueMemberS{Value: "job#" + job},
			"sk":         &types.AttributeValueMemberS{Value: "lease"},
			"listed":     &types.AttributeValueMemberBOOL{Value: true},
			"owner":      &types.AttributeValueMemberS{Value: "killed-" + r.runID},
			"fence":      n(7),
			"expiresAt":  n(kill.Add(s.lease).UnixMilli()),
			"rv":         &types.AttributeValueMemberS{Value: "forged" + strconv.Itoa(rand.IntN(1e6))},
			"leaseMs":    n(s.lease.Milliseconds()),
			"acquiredAt": n(kill.Add(-time.Hour).UnixMilli()),
			"renewedAt":  n(kill.UnixMilli()),
			"draining":   &types.AttributeValueMemberBOOL{Value: false},
		},
	})
	return err
}

// cost counts the requests of a leader and two standbys over a window.
func (r *runner) cost(s settings) {
	what := fmt.Sprintf("request cost %v", s)
	r.logf("%s: window %v", what, r.cfg.costWindow)
	job := fmt.Sprintf("cost-%s-%s", s.name, r.runID)
	extra := []string{"-report", "1s"}
	leader, err := r.spawn("leader", job, s, extra...)
	if err != nil {
		r.fail(what, err)
		return
	}
	defer func() { _ = leader.stop(10 * time.Second) }()
	if _, err := leader.first("LEADS", 30*time.Second); err != nil {
		r.fail(what, err)
		return
	}
	procs := map[string]*proc{"leader": leader}
	for _, name := range []string{"standby1", "standby2"} {
		p, err := r.spawn(name, job, s, extra...)
		if err != nil {
			r.fail(what, err)
			return
		}
		defer func() { _ = p.stop(10 * time.Second) }()
		procs[name] = p
	}
	time.Sleep(3 * time.Second)
	t0 := time.Now()
	time.Sleep(r.cfg.costWindow)
	t1 := time.Now()
	time.Sleep(1500 * time.Millisecond)
	res := costResult{PerHour: map[string]reqcount.Counts{}, RCU: map[string]float64{}, WCU: map[string]float64{}, Window: secs(t1.Sub(t0))}
	for name, p := range procs {
		a, b := lastBefore(p.all("COUNTS"), t0), lastBefore(p.all("COUNTS"), t1)
		if a == nil || b == nil {
			r.fail(what, fmt.Errorf("%s printed no counts", name))
			return
		}
		ca, _ := reqcount.Parse(a.fields["counts"])
		cb, _ := reqcount.Parse(b.fields["counts"])
		d := cb.Sub(ca)
		hours := b.at.Sub(a.at).Hours()
		ph := reqcount.Counts{}
		for k, v := range d {
			ph[k] = int64(float64(v)/hours + 0.5)
		}
		rcu, wcu := d.Units()
		role := name
		if name != "leader" {
			role = "standby"
			res.StandbyRCUs = append(res.StandbyRCUs, rcu/hours)
		}
		if name == "leader" || name == "standby1" {
			res.PerHour[role] = ph
			res.RCU[role] = rcu / hours
			res.WCU[role] = wcu / hours
		}
	}
	r.mu.Lock()
	r.res.Cost[s.name] = res
	r.mu.Unlock()
	r.logf("%s: leader %v; standby %v; standby read units/h %.0f", what, res.PerHour["leader"], res.PerHour["standby"], res.StandbyRCUs)
}

func lastBefore(evs []event, t time.Time) *event {
	var last *event
	for i := range evs {
		if !evs[i].at.After(t) {
			last = &evs[i]
		}
	}
	return last
}

// scaleSpec is one scale measurement: N leases on a server, with settings.
type scaleSpec struct {
	n      int
	server string // "dynalite" (the run's server) or "minidyn" (a separate process)
	set    settings
}

// parseScale reads entries N[/server[/lease/heartbeat]], comma-separated.
func parseScale(s string) ([]scaleSpec, error) {
	var out []scaleSpec
	for _, f := range splitComma(s) {
		parts := strings.Split(f, "/")
		n, err := strconv.Atoi(parts[0])
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("scale entry %q: bad count", f)
		}
		sp := scaleSpec{n: n, server: "dynalite", set: setB}
		if len(parts) > 1 {
			sp.server = parts[1]
		}
		if len(parts) == 4 {
			lease, err1 := time.ParseDuration(parts[2])
			hb, err2 := time.ParseDuration(parts[3])
			if err1 != nil || err2 != nil {
				return nil, fmt.Errorf("scale entry %q: bad durations", f)
			}
			sp.set = settings{name: "custom", lease: lease, hb: hb, retry: time.Second}
		} else if len(parts) != 1 && len(parts) != 2 {
			return nil, fmt.Errorf("scale entry %q: want N[/server[/lease/heartbeat]]", f)
		}
		if sp.server != "dynalite" && sp.server != "minidyn" {
			return nil, fmt.Errorf("scale entry %q: server is dynalite or minidyn", f)
		}
		out = append(out, sp)
	}
	return out, nil
}

func (r *runner) scaleAll() {
	specs, err := parseScale(r.cfg.scale)
	if err != nil {
		r.fail("scale", err)
		return
	}
	for _, sp := range specs {
		r.scaleOne(sp)
	}
}

func (r *runner) scaleOne(sp scaleSpec) {
	s, n := sp.set, sp.n
	what := fmt.Sprintf("scale %d leases on %s %v", n, sp.server, s)
	endpoint, serverPid := r.cfg.endpoint, r.dynalitePid
	serverName := r.server
	if sp.server == "minidyn" {
		md, err := spawn("minidyn", r.log, "-role", "minidyn")
		if err != nil {
			r.fail(what, err)
			return
		}
		defer func() { _ = md.stop(10 * time.Second) }()
		ready, err := md.first("READY", 10*time.Second)
		if err != nil {
			r.fail(what, err)
			return
		}
		endpoint, serverPid = ready.fields["url"], md.cmd.Process.Pid
		serverName = "minidyn v0.8.2 (separate process)"
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = ddblease.CreateTable(ctx, newClient(endpoint, newTransport(2)), r.cfg.table)
		cancel()
		if err != nil {
			r.fail(what, err)
			return
		}
	}
	// dynalite takes some 7 ms per acquisition (a new item): spread them.
	ramp := max(s.hb, time.Duration(n)*10*time.Millisecond)
	if sp.server == "minidyn" {
		ramp = s.hb
	}
	warm := 1
	if r.cfg.quick {
		ramp, warm = 2*time.Second, 0
	}
	r.logf("%s: ramp %v, measuring %d rounds", what, ramp, r.cfg.scaleRounds)
	job := fmt.Sprintf("scale-%d-%s", n, r.runID)
	cfg := r.cfg
	cfg.endpoint = endpoint
	prof := filepath.Join(r.cfg.out, fmt.Sprintf("scale-%d-%s-%s.pprof", n, sp.server, s.hb))
	args := []string{"-n", strconv.Itoa(n), "-rounds", strconv.Itoa(r.cfg.scaleRounds), "-warmup", strconv.Itoa(warm),
		"-ramp", ramp.String(), "-cpuprofile", prof, "-stopprofile", strings.TrimSuffix(prof, ".pprof") + ".stop.pprof"}
	if r.cfg.scaleHeap {
		args = append(args, "-memprofile", strings.TrimSuffix(prof, ".pprof")+".heap.pprof")
	}
	p, err := spawn("scale", r.log, cfg.childArgs("scale", job, s, args...)...)
	if err != nil {
		r.fail(what, err)
		return
	}
	defer func() { _ = p.stop(time.Minute) }()
	cpu0 := procCPU(serverPid)
	t0 := time.Now()
	ev, err := p.first("SCALE", ramp+s.lease+s.hb*time.Duration(warm+r.cfg.scaleRounds)+5*time.Minute)
	if err != nil {
		r.fail(what, err)
		return
	}
	ev.fields["server_cpu_share"] = ""
	if serverPid != 0 {
		ev.fields["server_cpu_share"] = fmt.Sprintf("%.2f", (procCPU(serverPid)-cpu0).Seconds()/time.Since(t0).Seconds())
	}
	ev.fields["server"] = serverName
	ev.fields["settings"] = fmt.Sprintf("%v/%v/%v", s.lease, s.hb, s.retry)
	ev.fields["hb_ms"] = strconv.FormatInt(s.hb.Milliseconds(), 10)
	ev.fields["profile"] = prof
	r.mu.Lock()
	r.res.Scale = append(r.res.Scale, ev.fields)
	r.mu.Unlock()
	r.logf("%s: %v", what, ev.fields)
}

func splitInts(s string) []int {
	var out []int
	for _, f := range splitComma(s) {
		if n, err := strconv.Atoi(f); err == nil && n > 0 {
			out = append(out, n)
		}
	}
	return out
}
