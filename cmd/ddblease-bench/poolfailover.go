package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/reqcount"
)

// This file holds the pool-beside-leases crash failover figure: the same
// jobs run as separate Leases and as one Pool, in two processes each, the
// one holding them SIGKILLed at a random phase of its heartbeat. The child
// (role "pfchild") runs either; the parent measures, per job, the time
// from the kill to the survivor leading it.

// runPFChild is one process of the figure: cfg.n jobs named
// cfg.job-00000…, each a Lease of its own driven by Run (cfg.pfMode
// "leases"), or all of them one Pool named cfg.job (cfg.pfMode "pool").
// It runs until SIGTERM and prints:
//
//	CALL                           once every job's Run (or the pool's) was called
//	LEAD job=… fence=…             as fn starts leading a job
//	END job=…                      as fn returns
//	COUNTS <op>=<n> …              every cfg.report: the requests sent so far, by operation
//
// and, for a pool:
//
//	VIEW live=<n> members=a,b      when the live members it last read change
//	MCALL op=… ok=… done=<ns>      at the send of each membership request: a renewal of its
//	                               member item (UpdateItem) or a read of the members (Query)
func runPFChild(cfg config) error {
	emit("START", time.Now(), fmt.Sprintf("pid=%d", os.Getpid()))
	wire := &detached{base: newTransport(16)}
	defer wire.wait(10 * time.Second)
	counter := reqcount.New(wire)
	db := newClient(cfg.endpoint, counter)
	jobs := jobNames(cfg.job, cfg.n)
	pool := cfg.pfMode == "pool"
	var api ddblease.DynamoDBAPI = db
	if pool {
		api = memberCalls{db}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	fn := func(lctx context.Context, job string, fence int64) error {
		emit("LEAD", time.Now(), "job="+job, fmt.Sprintf("fence=%d", fence))
		<-lctx.Done()
		emit("END", time.Now(), "job="+job)
		return nil
	}

	quit := make(chan struct{})
	var bg sync.WaitGroup
	bg.Go(func() {
		t := time.NewTicker(cfg.report)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case now := <-t.C:
				emit("COUNTS", now, counter.Snapshot().String())
			}
		}
	})

	var err error
	switch cfg.pfMode {
	case "leases":
		errs := make([]error, len(jobs))
		var wg sync.WaitGroup
		for i, job := range jobs {
			l, nerr := ddblease.New(api, cfg.table, job, cfg.leaseOptions)
			if nerr != nil {
				close(quit)
				bg.Wait()
				return nerr
			}
			wg.Go(func() {
				errs[i] = l.Run(ctx, func(lctx context.Context, fence int64) error { return fn(lctx, job, fence) })
			})
		}
		emit("CALL", time.Now())
		wg.Wait()
		for _, e := range errs {
			if e != nil {
				err = e
				break
			}
		}
	case "pool":
		p, nerr := ddblease.NewPool(api, cfg.table, cfg.job, jobs, cfg.leaseOptions)
		if nerr != nil {
			close(quit)
			bg.Wait()
			return nerr
		}
		bg.Go(func() {
			last := ""
			t := time.NewTicker(10 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-quit:
					return
				case <-t.C:
				}
				m := p.Members()
				if s := strings.Join(m, ","); s != last {
					last = s
					emit("VIEW", time.Now(), fmt.Sprintf("live=%d", len(m)), "members="+s)
				}
			}
		})
		emit("CALL", time.Now())
		err = p.Run(ctx, fn)
	default:
		err = fmt.Errorf("-pf-mode %q: want leases or pool", cfg.pfMode)
	}
	close(quit)
	bg.Wait()
	emit("COUNTS", time.Now(), counter.Snapshot().String())
	status := "ok"
	if err != nil {
		status = "error"
		fmt.Fprintln(os.Stderr, "pfchild:", err)
	}
	emit("EXIT", time.Now(), "err="+status)
	return err
}

// memberCalls prints an MCALL event for each request of a pool's
// membership: an UpdateItem of a member item, and every Query (an idle
// pool's only one is the read of its members).
type memberCalls struct {
	ddblease.DynamoDBAPI
}

func mcall(op string, sent time.Time, err error) {
	emit("MCALL", sent, "op="+op, fmt.Sprintf("ok=%t", err == nil), fmt.Sprintf("done=%d", time.Now().UnixNano()))
}

func (m memberCalls) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	sent := time.Now()
	out, err := m.DynamoDBAPI.UpdateItem(ctx, in, optFns...)
	if itemClass(in.Key) == "member" {
		mcall("UpdateItem", sent, err)
	}
	return out, err
}

func (m memberCalls) Query(ctx context.Context, in *dynamodb.QueryInput, optFns ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error) {
	sent := time.Now()
	out, err := m.DynamoDBAPI.Query(ctx, in, optFns...)
	mcall("Query", sent, err)
	return out, err
}

// pfTrial is one trial of one side of the figure.
type pfTrial struct {
	Held     int       // jobs the killed process held at the kill
	Others   int       // jobs the survivor held at the kill
	PerJob   []float64 // SIGKILL → the survivor leads, s, per held job, sorted
	Median   float64
	Max      float64
	Phase    float64 // the random sleep before the kill, s
	Window   float64 // the idle hold over which requests were counted, s
	Requests reqcount.Counts
	// A pool only: the age of the holder's last membership renewal at
	// the kill, and the times from the kill to the survivor's first read
	// of the members that no longer showed the holder, and to its first
	// and last lead of a held job, s (-1 if not seen).
	RenewalAge, ViewDropped float64
	// A pool only, from the kill, s: the send of the survivor's first
	// read of the members after the holder's last renewal landed (the
	// first to see its final version; negative if before the kill), and
	// of the read after which its view no longer showed the holder.
	SawFinal, DropRead float64
}

// pfSide is one side of the figure: leases or a pool.
type pfSide struct {
	Trials []pfTrial
}

// poolFailoverResult is the figure: the same jobs as separate Leases and
// as one Pool, side by side.
type poolFailoverResult struct {
	Jobs                  int
	Settings              string
	Lease, Heartbeat, Try float64 // s
	Leases, Pool          pfSide
}

// pfSettings are the figure's timings.
func (r *runner) pfSettings() settings {
	return settings{"pool-failover", r.cfg.pfLease, r.cfg.pfHB, r.cfg.pfRetry}
}

// poolFailover measures crash failover of cfg.pfJobs jobs held by one of
// two processes, as separate Leases and as one Pool, a trial of each in
// turn so that the machine's load falls on both alike.
func (r *runner) poolFailover() {
	s, n := r.pfSettings(), r.cfg.pfJobs
	what := fmt.Sprintf("crash failover, pool beside leases: %d jobs %v", n, s)
	res := &poolFailoverResult{Jobs: n, Settings: fmt.Sprintf("%v/%v/%v", s.lease, s.hb, s.retry),
		Lease: s.lease.Seconds(), Heartbeat: s.hb.Seconds(), Try: s.retry.Seconds()}
	defer func() {
		r.mu.Lock()
		r.res.PoolFailover = res
		r.mu.Unlock()
	}()
	if n <= 0 || r.cfg.pfTrials <= 0 {
		return
	}
	r.logf("%s: %d trials of each, idle hold %v", what, r.cfg.pfTrials, r.cfg.pfWindow)
	for i := range r.cfg.pfTrials {
		var wg sync.WaitGroup
		for _, mode := range []string{"leases", "pool"} {
			one := func() {
				t, err := r.pfTrial(mode, i, s)
				if err != nil {
					r.fail(fmt.Sprintf("%s: %s #%d", what, mode, i+1), err)
					return
				}
				r.mu.Lock()
				if mode == "pool" {
					res.Pool.Trials = append(res.Pool.Trials, t)
				} else {
					res.Leases.Trials = append(res.Leases.Trials, t)
				}
				r.mu.Unlock()
				extra := ""
				if mode == "pool" {
					extra = fmt.Sprintf("; holder's last renewal %+.2f s, survivor's first read after it %+.2f s, the read that dropped it %+.2f s, its view without it %+.2f s",
						-t.RenewalAge, t.SawFinal, t.DropRead, t.ViewDropped)
				}
				r.logf("%s: %s #%d: %d jobs held (survivor %d), median %.3f s, max %.3f s (phase %.2f s)%s",
					what, mode, i+1, t.Held, t.Others, t.Median, t.Max, t.Phase, extra)
			}
			// A quick run's timings are not figures: both sides at once.
			if r.cfg.quick {
				wg.Go(one)
			} else {
				one()
			}
		}
		wg.Wait()
	}
}

// pfTrial runs one trial: the holder takes every job, the survivor joins
// (and, for a pool, takes its share), both hold for the idle window, then
// the holder is SIGKILLed a random 0..heartbeat later.
func (r *runner) pfTrial(mode string, i int, s settings) (pfTrial, error) {
	n := r.cfg.pfJobs
	job := fmt.Sprintf("pf-%s-%d-%s", mode, i, r.runID)
	args := func(owner string) []string {
		return r.cfg.childArgs("pfchild", job, s, "-pf-mode", mode, "-n", strconv.Itoa(n),
			"-owner", fmt.Sprintf("%s-%d-%s", owner, i, r.runID), "-report", "250ms")
	}
	holder, err := spawn(mode+"-holder", r.log, args("holder")...)
	if err != nil {
		return pfTrial{}, err
	}
	defer func() { _ = holder.stop(10 * time.Second) }()
	if _, err := holder.nth("LEAD", n, 10*s.lease+30*time.Second); err != nil {
		return pfTrial{}, err
	}
	survivor, err := spawn(mode+"-survivor", r.log, args("survivor")...)
	if err != nil {
		return pfTrial{}, err
	}
	defer func() { _ = survivor.stop(30 * time.Second) }()
	call, err := survivor.first("CALL", 10*time.Second)
	if err != nil {
		return pfTrial{}, err
	}
	// Settled: every job led by one of the two (a pool hands the survivor
	// its share: each leads some), and no change for a heartbeat and two
	// polls since then and since the survivor's call.
	settle := s.hb + 2*s.retry
	deadline := time.Now().Add(10*s.lease + 30*time.Second)
	for {
		if t, ok := pfSettled([]*proc{holder, survivor}, n, mode == "pool"); ok && time.Since(t) >= settle && time.Since(call.at) >= settle {
			break
		}
		if time.Now().After(deadline) {
			return pfTrial{}, fmt.Errorf("the two processes did not settle on %d jobs within %v: holder %d, survivor %d",
				n, 10*s.lease+30*time.Second, len(openLeads(holder)), len(openLeads(survivor)))
		}
		time.Sleep(50 * time.Millisecond)
	}
	w0 := time.Now()
	time.Sleep(r.cfg.pfWindow)
	w1 := time.Now()
	phase := jitter(0, s.hb)
	time.Sleep(phase)
	held, others := openLeads(holder), openLeads(survivor)
	if len(held) == 0 {
		return pfTrial{}, fmt.Errorf("the holder held no job at the kill (survivor %d)", len(others))
	}
	killAt, err := holder.signal(syscall.SIGKILL)
	if err != nil {
		return pfTrial{}, err
	}
	if err := holder.wait(10 * time.Second); err != nil {
		return pfTrial{}, err
	}
	t := pfTrial{Held: len(held), Others: len(others), Phase: phase.Seconds(), RenewalAge: -1, ViewDropped: -1}

	// Requests of both processes over the idle window.
	t.Requests = reqcount.Counts{}
	for _, p := range []*proc{holder, survivor} {
		a, b := firstAfter(p.all("COUNTS"), w0), lastBefore(p.all("COUNTS"), w1)
		if a == nil || b == nil || !b.at.After(a.at) {
			return pfTrial{}, fmt.Errorf("%s printed no counts over the idle window", p.name)
		}
		ca, _ := reqcount.Parse(a.fields["counts"])
		cb, _ := reqcount.Parse(b.fields["counts"])
		// Both processes' counts are scaled to the same window.
		scale := w1.Sub(w0).Seconds() / b.at.Sub(a.at).Seconds()
		for k, v := range cb.Sub(ca) {
			t.Requests[k] += int64(float64(v)*scale + 0.5)
		}
	}
	t.Window = w1.Sub(w0).Seconds()

	wait := 4*s.lease + 30*time.Second
	end := time.Now().Add(wait)
	for {
		if _, ok := allTakenAfter([]*proc{survivor}, holder, held, killAt); ok {
			break
		}
		if time.Now().After(end) {
			return pfTrial{}, fmt.Errorf("the survivor did not lead all %d jobs of the killed holder within %v; its events: %s", len(held), wait, survivor.history())
		}
		time.Sleep(50 * time.Millisecond)
	}
	first := map[string]time.Time{}
	for _, ev := range survivor.all("LEAD") {
		j := ev.fields["job"]
		if _, ok := first[j]; !ok && ev.at.After(killAt) {
			first[j] = ev.at
		}
	}
	for _, j := range held {
		t.PerJob = append(t.PerJob, first[j].Sub(killAt).Seconds())
	}
	slices.Sort(t.PerJob)
	t.Median, t.Max = medianOf(t.PerJob), t.PerJob[len(t.PerJob)-1]

	if mode == "pool" {
		t.SawFinal, t.DropRead = -99, -99
		var reads []event
		for _, ev := range survivor.all("MCALL") {
			if ev.fields["op"] == "Query" && ev.fields["ok"] == "true" {
				reads = append(reads, ev)
			}
		}
		done := func(ev event) time.Time {
			ns, _ := strconv.ParseInt(ev.fields["done"], 10, 64)
			return time.Unix(0, ns)
		}
		if ev := lastBefore(pfRenewals(holder), killAt); ev != nil {
			t.RenewalAge = killAt.Sub(ev.at).Seconds()
			landed := done(*ev)
			if rd := firstAfter(reads, landed); rd != nil {
				t.SawFinal = rd.at.Sub(killAt).Seconds()
			}
		}
		holderName := fmt.Sprintf("holder-%d-%s", i, r.runID)
		for _, ev := range survivor.all("VIEW") {
			if ev.at.After(killAt) && !slices.Contains(strings.Split(ev.fields["members"], ","), holderName) {
				t.ViewDropped = ev.at.Sub(killAt).Seconds()
				var last *event
				for k := range reads {
					if !done(reads[k]).After(ev.at) {
						last = &reads[k]
					}
				}
				if last != nil {
					t.DropRead = last.at.Sub(killAt).Seconds()
				}
				break
			}
		}
	}
	return t, nil
}

// pfSettled reports whether every one of n jobs is led by exactly one of
// procs (and, if spread, each of procs leads one or more), and since when
// the jobs each leads last changed.
func pfSettled(procs []*proc, n int, spread bool) (time.Time, bool) {
	led := map[string]int{}
	var since time.Time
	some := true
	for _, p := range procs {
		open := openLeads(p)
		some = some && len(open) > 0
		for _, j := range open {
			led[j]++
		}
		for _, kind := range []string{"LEAD", "END"} {
			if evs := p.all(kind); len(evs) > 0 && evs[len(evs)-1].at.After(since) {
				since = evs[len(evs)-1].at
			}
		}
	}
	if len(led) != n || spread && !some {
		return since, false
	}
	for _, c := range led {
		if c != 1 {
			return since, false
		}
	}
	return since, true
}

// pfRenewals are a pool process's membership renewals (its UpdateItems
// of its member item) that succeeded.
func pfRenewals(p *proc) []event {
	var out []event
	for _, ev := range p.all("MCALL") {
		if ev.fields["op"] == "UpdateItem" && ev.fields["ok"] == "true" {
			out = append(out, ev)
		}
	}
	return out
}

func firstAfter(evs []event, t time.Time) *event {
	for i := range evs {
		if !evs[i].at.Before(t) {
			return &evs[i]
		}
	}
	return nil
}

func medianOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

// summary is the median of the trials' medians and the max of their maxes.
func (sd pfSide) summary() (med, mx float64, ok bool) {
	if len(sd.Trials) == 0 {
		return 0, 0, false
	}
	return medianOf(pluck(sd.Trials, func(t pfTrial) float64 { return t.Median })),
		maxOf(pluck(sd.Trials, func(t pfTrial) float64 { return t.Max })), true
}

// perJobMinute is the requests of both processes over the trials' idle
// windows, per job per minute: all, reads and writes.
func (sd pfSide) perJobMinute(jobs int) (all, reads, writes float64) {
	var window float64
	var total reqcount.Counts = reqcount.Counts{}
	for _, t := range sd.Trials {
		window += t.Window
		for k, v := range t.Requests {
			total[k] += v
		}
	}
	if window == 0 || jobs == 0 {
		return 0, 0, 0
	}
	per := func(v int64) float64 { return float64(v) / float64(jobs) / (window / 60) }
	for k, v := range total {
		switch {
		case strings.HasPrefix(k, "GetItem"), k == "Query", k == "BatchGetItem", k == "Scan":
			reads += per(v)
		default:
			writes += per(v)
		}
	}
	return per(total.Total()), reads, writes
}

// poolFailoverTable renders the figure.
func (r *runner) poolFailoverTable(w func(string, ...any), pf *poolFailoverResult) {
	w("Crash failover, a pool beside leases: %d jobs, two processes, lease %s; as %d separate Leases (each its own Run in each process) and as one Pool of the same jobs. The holder takes every job, then the survivor starts (a pool hands it its share); after an idle hold both SIGKILLed at a random 0..heartbeat phase; per job, SIGKILL → the survivor's function leads it. Per trial the median and max over the killed process's jobs; over trials the median of medians and the max of maxes:\n\n",
		pf.Jobs, pf.Settings, pf.Jobs)
	w("| trial | leases: jobs killed, median / max | pool: jobs killed (survivor's share), median / max | pool, from the kill: the holder's last renewal; the survivor's first read of the members after it; the read after which its view lacks the holder; that view |\n|---|---|---|---|\n")
	for i := range max(len(pf.Leases.Trials), len(pf.Pool.Trials)) {
		l, p, d := "—", "—", "—"
		if i < len(pf.Leases.Trials) {
			t := pf.Leases.Trials[i]
			l = fmt.Sprintf("%d, %.3f / %.3f s", t.Held, t.Median, t.Max)
		}
		if i < len(pf.Pool.Trials) {
			t := pf.Pool.Trials[i]
			p = fmt.Sprintf("%d (%d), %.3f / %.3f s", t.Held, t.Others, t.Median, t.Max)
			d = fmt.Sprintf("%+.2f; %+.2f; %+.2f; %+.2f s", -t.RenewalAge, t.SawFinal, t.DropRead, t.ViewDropped)
		}
		w("| %d | %s | %s | %s |\n", i+1, l, p, d)
	}
	lm, lx, lok := pf.Leases.summary()
	pm, px, pok := pf.Pool.summary()
	cell := func(m, x float64, ok bool, n int) string {
		if !ok {
			return "—"
		}
		return fmt.Sprintf("%.3f / %.3f s (%d trials)", m, x, n)
	}
	w("| **all** | %s | %s | |\n\n", cell(lm, lx, lok, len(pf.Leases.Trials)), cell(pm, px, pok, len(pf.Pool.Trials)))
	la, lr, lw := pf.Leases.perJobMinute(pf.Jobs)
	pa, pr, pw := pf.Pool.perJobMinute(pf.Jobs)
	w("| | leases | pool | pool against leases |\n|---|---|---|---|\n")
	if lok && pok {
		w("| failover, median of medians / max of maxes | %.3f / %.3f s | %.3f / %.3f s | ×%.3f; %+.3f s |\n", lm, lx, pm, px, pm/lm, px-lx)
	}
	w("| requests per job per minute over the idle hold, both processes (reads, writes) | %.1f (%.1f, %.1f) | %.1f (%.1f, %.1f) | ×%.3f |\n",
		la, lr, lw, pa, pr, pw, pa/max(la, 1e-9))
	if ss := r.res.Sessions; ss != nil && ss.Idle != nil {
		f := idleOf(ss.Idle)
		w("| Go heap in use (live) per idle scheduled pool job (the sessions figure: %s jobs in one process, %s) | | %.2f KB (%.2f KB) | |\n",
			ss.Idle["n"], ss.Settings, f.heap/f.n/1e3, f.live/f.n/1e3)
		if heap, live, fixed, ok := ss.idleSlope(); ok {
			w("| the same, each further job (from %s to %s jobs), and what does not grow with them | | %.2f KB (%.2f KB); %.0f KB | |\n",
				ss.IdleSmall["n"], ss.Idle["n"], heap/1e3, live/1e3, fixed/1e3)
		}
	} else {
		w("| Go heap per idle scheduled pool job | | not measured in this run (the sessions figure, -only sessions) | |\n")
	}
	w("\n")
	if lok && pok {
		w("Aim (issue 44): the pool's median within ×1.10 of the leases' (×%.3f): %s; its max within 0.5 s of theirs (%+.3f s): %s.\n\n",
			pm/lm, verdict(pm <= 1.10*lm, true), px-lx, verdict(px-lx <= 0.5, true))
	}
}
