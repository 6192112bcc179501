package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"syscall"
	"time"

	"github.com/ddblease/ddblease"
)

// runPoolReplica is one replica of a pool of cfg.n jobs named cfg.job: it
// runs Pool.Run until SIGTERM, and prints LEAD job=… fence=… when its
// function starts leading a job and END job=… when that function returns.
// The replicas share the machine's clock, so that the parent can order the
// events of all of them.
func runPoolReplica(cfg config) error {
	emit("START", time.Now(), fmt.Sprintf("pid=%d", os.Getpid()))
	wire := &detached{base: newTransport(cfg.conns)}
	defer wire.wait(30 * time.Second)
	db := newClient(cfg.endpoint, wire)
	jobs := make([]string, cfg.n)
	for i := range jobs {
		jobs[i] = fmt.Sprintf("%s-%05d", cfg.job, i)
	}
	p, err := ddblease.NewPool(db, cfg.table, cfg.job, jobs, cfg.leaseOptions)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	err = p.Run(ctx, func(lctx context.Context, job string, fence int64) error {
		emit("LEAD", time.Now(), "job="+job, fmt.Sprintf("fence=%d", fence))
		<-lctx.Done()
		emit("END", time.Now(), "job="+job)
		return nil
	})
	status := "ok"
	if err != nil {
		status = "error"
		fmt.Fprintln(os.Stderr, "pool replica:", err)
	}
	emit("EXIT", time.Now(), "err="+status)
	return err
}

// spreadPhase is one step of the spread bench: replicas started (or one
// restarted) and the time until every live replica led its share.
type spreadPhase struct {
	What      string
	Live      int
	Balanced  float64 // s from the phase's start until every live replica led within ±5 % of its share; -1 if not within the wait
	HandOvers int     // leaderships that began during the phase on a job already led before it
	MaxGap    float64 // longest time a job went without a leader during the phase, s
	Overlaps  int     // moments at which a job had two leaders
}

// spreadResult is what the spread bench measured.
type spreadResult struct {
	Jobs, Replicas int
	Settings       string
	Bound          float64 // the hand-over bound: heartbeat + retry + 2 × call timeout (heartbeat / 2), s
	Phases         []spreadPhase
}

// spread measures a pool of cfg.spreadJobs jobs over cfg.spreadReplicas
// replica processes started cfg.spreadStagger apart, then a rolling
// restart of every replica (SIGTERM, then a new one), with settings (a).
// A quick run uses short timings and restarts one replica.
func (r *runner) spread() {
	s := setA
	restarts := r.cfg.spreadReplicas
	if r.cfg.quick {
		s, restarts = settings{"quick", 4 * time.Second, time.Second, 250 * time.Millisecond}, 1
	}
	n, m := r.cfg.spreadJobs, r.cfg.spreadReplicas
	what := fmt.Sprintf("spread %d jobs over %d replicas %v", n, m, s)
	pool := "spread-" + r.runID
	// A replica that joins or leaves is seen by the others at their next
	// membership renewal (a jittered heartbeat); the job's new leader
	// polls every retry interval, and each step takes a request.
	res := &spreadResult{Jobs: n, Replicas: m, Settings: s.String(),
		Bound: (s.hb + s.retry + 2*(s.hb/2)).Seconds()}
	pl := &poolProcs{r: r, n: n, s: s, live: map[*proc]bool{}}
	defer pl.stopAll()
	pl.args = func(seq int) []string {
		return r.cfg.childArgs("pool", pool, s, "-n", strconv.Itoa(n), "-owner", fmt.Sprintf("replica-%d", seq), "-conns", "16")
	}
	r.logf("%s: starting the replicas %v apart", what, r.cfg.spreadStagger)
	first, last, err := pl.startStaggered(m, r.cfg.spreadStagger)
	if err != nil {
		r.fail(what, err)
		return
	}
	res.Phases = append(res.Phases, pl.phase(fmt.Sprintf("%d replicas started %v apart", m, r.cfg.spreadStagger), last, first))
	if err := pl.rollingRestart(restarts, func(ph spreadPhase) { res.Phases = append(res.Phases, ph) }); err != nil {
		r.fail(what, err)
		return
	}
	r.mu.Lock()
	r.res.Spread = res
	r.mu.Unlock()
}

// mark is one LEAD or END event of a pool replica.
type mark struct {
	at    time.Time
	lead  bool
	job   string
	owner *proc
}

// marks returns the LEAD and END events of every process, in time order.
func marks(procs []*proc) []mark {
	var out []mark
	for _, p := range procs {
		p.mu.Lock()
		for _, ev := range p.events {
			if ev.kind == "LEAD" || ev.kind == "END" {
				out = append(out, mark{ev.at, ev.kind == "LEAD", ev.fields["job"], p})
			}
		}
		p.mu.Unlock()
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out
}

// balanced reports the first instant from from on at which every live
// process led within ±5 % of its share of n jobs, and no other process led
// any.
func balanced(procs []*proc, live map[*proc]bool, n int, from time.Time) (time.Time, bool) {
	share := float64(n) / float64(len(live))
	count := map[*proc]int{}
	ok := func() bool {
		for _, p := range procs {
			k := float64(count[p])
			if live[p] && (k < 0.95*share || k > 1.05*share) || !live[p] && k != 0 {
				return false
			}
		}
		return true
	}
	checked := false
	for _, mk := range marks(procs) {
		if mk.at.After(from) && !checked {
			if ok() {
				return from, true
			}
			checked = true
		}
		if mk.lead {
			count[mk.owner]++
		} else {
			count[mk.owner]--
		}
		if checked && ok() {
			return mk.at, true
		}
	}
	if !checked && ok() {
		return from, true
	}
	return time.Time{}, false
}

// judge replays every job's leaderships up to to: from from on, the
// hand-overs (a leadership that began on a job led before), the longest
// time a job that had been led went without a leader, and the moments at
// which two processes led one job.
func judge(procs []*proc, from, to time.Time) (handOvers int, maxGap float64, overlaps int) {
	type state struct {
		leaders   map[*proc]bool
		ledBefore bool
		since     time.Time // when the job last lost its leader; zero while it has one
	}
	jobs := map[string]*state{}
	for _, mk := range marks(procs) {
		if mk.at.After(to) {
			break
		}
		st := jobs[mk.job]
		if st == nil {
			st = &state{leaders: map[*proc]bool{}}
			jobs[mk.job] = st
		}
		if !mk.lead {
			delete(st.leaders, mk.owner)
			if len(st.leaders) == 0 {
				st.since = mk.at
			}
			continue
		}
		if mk.at.After(from) && st.ledBefore {
			handOvers++
			if !st.since.IsZero() {
				maxGap = max(maxGap, mk.at.Sub(later(st.since, from)).Seconds())
			}
		}
		st.leaders[mk.owner] = true
		if len(st.leaders) > 1 {
			overlaps++
		}
		st.since, st.ledBefore = time.Time{}, true
	}
	for _, st := range jobs {
		if len(st.leaders) == 0 && st.ledBefore {
			maxGap = max(maxGap, to.Sub(later(st.since, from)).Seconds())
		}
	}
	return handOvers, maxGap, overlaps
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
