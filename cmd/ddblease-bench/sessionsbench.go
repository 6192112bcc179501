package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// sessionsResult is what the sessions figure measured: a pool of
// scheduled jobs (Pool.RunSchedule) whose held jobs are kept by one
// session per replica.
type sessionsResult struct {
	Jobs, Replicas int
	Every          string
	Settings       string
	Heartbeat      float64 // s

	// Idle is the one process holding IdleJobs idle scheduled jobs
	// (runSchedIdle's IDLE event); IdleSmall the same with a quarter of
	// them, run first, so that the cost of each further job (the slope
	// between the two) stands apart from what does not grow with the jobs
	// (the runtime's partly filled spans, the pool's own state).
	IdleJobs  int
	Idle      map[string]string
	IdleSmall map[string]string

	Phases []spreadPhase

	// Over the steady window, summed over the replicas: items written
	// per hour by class (itemClasses), runs started per hour, items read
	// per hour.
	Window      float64 // s
	PerHour     map[string]float64
	RunsPerHour float64
	ReadPerHour float64

	// The SIGKILL of one replica: the jobs it led, the time from the
	// signal until every one of them was led by another replica, and
	// until the survivors were balanced.
	KilledJobs int
	Failover   float64 // s; -1 if not every job was taken within the wait
	KillBound  float64 // lease + heartbeat + retry + 2 call timeouts, s

	// Over the whole run: moments at which two replicas led one job (from
	// their State readings, LEAD–END); a fence of a job seen by two
	// replicas; slots due while the pool ran, and how many of them ran
	// never or more than once.
	Overlaps, SharedFences            int
	SlotsDue, SlotsMissed, SlotsTwice int
	Missed                            []string // the first few missed or repeated slots, job@slot
}

// sessions measures a pool of cfg.sessJobs scheduled jobs over
// cfg.sessReplicas replica processes: one process holding cfg.sessIdle
// idle jobs first, then staggered starts, a steady window of request
// counts, a rolling restart, and a SIGKILL of one replica, with settings
// (b). A quick run uses short timings and restarts one replica.
func (r *runner) sessions() {
	s, restarts := setB, r.cfg.sessReplicas
	if r.cfg.quick {
		s, restarts = settings{"quick", 4 * time.Second, time.Second, 250 * time.Millisecond}, 1
	}
	n, m := r.cfg.sessJobs, r.cfg.sessReplicas
	what := fmt.Sprintf("sessions: %d scheduled jobs (%v) over %d replicas %v", n, r.cfg.sessEvery, m, s)
	res := &sessionsResult{Jobs: n, Replicas: m, Every: r.cfg.sessEvery.String(), Settings: s.String(), Heartbeat: s.hb.Seconds(),
		IdleJobs: r.cfg.sessIdle, PerHour: map[string]float64{}, Failover: -1,
		KillBound: (s.lease + s.hb + s.retry + s.hb).Seconds()}
	defer func() {
		r.mu.Lock()
		r.res.Sessions = res
		r.mu.Unlock()
	}()
	if r.cfg.sessIdle > 0 {
		if err := r.sessionsIdle(res, s); err != nil {
			r.fail(what+": idle jobs", err)
		}
	}
	pl := &poolProcs{r: r, n: n, s: s, live: map[*proc]bool{}}
	defer pl.stopAll()
	pl.args = func(seq int) []string {
		return r.cfg.childArgs("sched", "sessions-"+r.runID, s, "-n", strconv.Itoa(n), "-every", r.cfg.sessEvery.String(),
			"-owner", fmt.Sprintf("replica-%d", seq), "-conns", "16", "-report", "5s", "-sample", "100ms")
	}
	r.logf("%s: starting the replicas %v apart", what, r.cfg.spreadStagger)
	first, last, err := pl.startStaggered(m, r.cfg.spreadStagger)
	if err != nil {
		r.fail(what, err)
		return
	}
	res.Phases = append(res.Phases, pl.phase(fmt.Sprintf("%d replicas started %v apart", m, r.cfg.spreadStagger), last, first))

	t0 := time.Now()
	time.Sleep(r.cfg.sessWindow)
	r.steadyCounts(res, pl.liveProcs(), t0, time.Now())
	r.logf("%s: over %.0f s: %v items written per hour, %.0f runs per hour", what, res.Window, res.PerHour, res.RunsPerHour)

	if err := pl.rollingRestart(restarts, func(ph spreadPhase) { res.Phases = append(res.Phases, ph) }); err != nil {
		r.fail(what, err)
		return
	}
	r.sessionsKill(res, pl)
	// A slot or two more on the survivors, then a clean stop.
	time.Sleep(r.cfg.sessEvery + s.hb)
	stopAt := time.Now()
	pl.stopAll()
	r.sessionsJudge(res, pl.procs, last, stopAt.Add(-5*time.Second))
	r.logf("%s: %d overlaps, %d shared fences; %d slots due, %d missed, %d run twice", what,
		res.Overlaps, res.SharedFences, res.SlotsDue, res.SlotsMissed, res.SlotsTwice)
}

// sessionsIdle runs the process holding idle scheduled jobs, with a
// quarter of them first (when there are at least 8), then with all.
func (r *runner) sessionsIdle(res *sessionsResult, s settings) error {
	if n := r.cfg.sessIdle / 4; n >= 2 {
		small, err := r.idleProcess(s, n)
		if err != nil {
			return err
		}
		res.IdleSmall = small
	}
	all, err := r.idleProcess(s, r.cfg.sessIdle)
	res.Idle = all
	return err
}

// idleProcess runs one process holding n idle scheduled jobs and returns
// its IDLE event's fields.
func (r *runner) idleProcess(s settings, n int) (map[string]string, error) {
	rounds := 3
	if r.cfg.quick {
		rounds = 2
	}
	p, err := spawn("sched-idle", r.log, r.cfg.childArgs("schedidle", fmt.Sprintf("idle-%d-%s", n, r.runID), s,
		"-n", strconv.Itoa(n), "-rounds", strconv.Itoa(rounds), "-conns", "16")...)
	if err != nil {
		return nil, err
	}
	defer func() { _ = p.stop(time.Minute) }()
	ev, err := p.first("IDLE", 10*s.lease+time.Duration(rounds+2)*s.hb+2*time.Minute)
	if err != nil {
		return nil, err
	}
	r.logf("sessions: %s idle jobs in one process: %v", ev.fields["n"], ev.fields)
	return ev.fields, p.wait(time.Minute)
}

// idleFigures are the memory figures of an idle process (runSchedIdle):
// per job, the Go heap in use and the live heap, against its base.
type idleFigures struct{ n, heap, live float64 }

func idleOf(m map[string]string) idleFigures {
	num := func(k string) float64 { v, _ := strconv.ParseFloat(m[k], 64); return v }
	return idleFigures{n: max(num("n"), 1), heap: num("heap") - num("heap_base"), live: num("live") - num("live_base")}
}

// idleSlope returns what each further idle job adds, heap in use and
// live (bytes), and the heap in use that does not grow with the jobs,
// from the two sizes; ok is false without the smaller one.
func (ss *sessionsResult) idleSlope() (heap, live, fixed float64, ok bool) {
	if ss.Idle == nil || ss.IdleSmall == nil {
		return 0, 0, 0, false
	}
	a, b := idleOf(ss.IdleSmall), idleOf(ss.Idle)
	if b.n <= a.n {
		return 0, 0, 0, false
	}
	heap, live = (b.heap-a.heap)/(b.n-a.n), (b.live-a.live)/(b.n-a.n)
	return heap, live, b.heap - heap*b.n, true
}

// steadyCounts sums, over the replicas, the items written and read and
// the runs started between each one's first report at or after from and
// its last at or before to, as rates per hour.
func (r *runner) steadyCounts(res *sessionsResult, procs []*proc, from, to time.Time) {
	res.Window = to.Sub(from).Seconds()
	for _, p := range procs {
		var in []event
		for _, ev := range p.all("WRITES") {
			if !ev.at.Before(from) && !ev.at.After(to) {
				in = append(in, ev)
			}
		}
		if len(in) < 2 {
			continue
		}
		a, b := in[0], in[len(in)-1]
		perHour := 3600 / b.at.Sub(a.at).Seconds()
		delta := func(k string) float64 {
			x, _ := strconv.ParseFloat(a.fields[k], 64)
			y, _ := strconv.ParseFloat(b.fields[k], 64)
			return y - x
		}
		for _, k := range itemClasses {
			res.PerHour[k] += delta("w_"+k) * perHour
		}
		res.ReadPerHour += delta("read_items") * perHour
		runs := 0
		for _, ev := range p.all("RUN") {
			if ev.at.After(a.at) && !ev.at.After(b.at) {
				runs++
			}
		}
		res.RunsPerHour += float64(runs) * perHour
	}
}

// sessionsKill SIGKILLs one live replica and measures how long its jobs
// went unled, and how long until the survivors were balanced.
func (r *runner) sessionsKill(res *sessionsResult, pl *poolProcs) {
	victim := pl.liveProcs()[0]
	held := openLeads(victim)
	res.KilledJobs = len(held)
	killAt, err := victim.signal(syscall.SIGKILL)
	if err != nil {
		r.fail("sessions: SIGKILL", err)
		return
	}
	_ = victim.wait(time.Minute)
	// A killed replica leads nothing from the moment it is killed.
	for _, job := range held {
		victim.add(event{kind: "END", at: killAt, fields: map[string]string{"job": job}})
	}
	delete(pl.live, victim)
	deadline := time.Now().Add(10 * pl.s.lease)
	for time.Now().Before(deadline) {
		if t, ok := allTakenAfter(pl.procs, victim, held, killAt); ok {
			res.Failover = t.Sub(killAt).Seconds()
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	res.Phases = append(res.Phases, pl.phase("SIGKILL of one replica (its jobs taken by the others)", killAt, killAt))
	r.logf("sessions: SIGKILL of a replica leading %d jobs: all led again after %.2f s (bound %.1f s)", len(held), res.Failover, res.KillBound)
}

// openLeads are the jobs p's last events show it leading.
func openLeads(p *proc) []string {
	open := map[string]bool{}
	for _, mk := range marks([]*proc{p}) {
		open[mk.job] = mk.lead
	}
	var jobs []string
	for job, on := range open {
		if on {
			jobs = append(jobs, job)
		}
	}
	slices.Sort(jobs)
	return jobs
}

// allTakenAfter reports when the last of jobs was first led, after at, by
// a process other than gone.
func allTakenAfter(procs []*proc, gone *proc, jobs []string, at time.Time) (time.Time, bool) {
	want := map[string]bool{}
	for _, j := range jobs {
		want[j] = true
	}
	var last time.Time
	for _, mk := range marks(procs) {
		if mk.lead && mk.owner != gone && mk.at.After(at) && want[mk.job] {
			delete(want, mk.job)
			last = mk.at
		}
	}
	return last, len(want) == 0
}

// sessionsJudge counts, over the whole run, the overlaps, the fences of a
// job seen by two replicas, and the slots due from from to until that ran
// never or more than once.
func (r *runner) sessionsJudge(res *sessionsResult, procs []*proc, from, until time.Time) {
	_, _, res.Overlaps = judge(procs, from.Add(-time.Hour), until.Add(time.Hour))
	type jf struct {
		job   string
		fence string
	}
	seenBy := map[jf]*proc{}
	runs := map[string]int{}
	for _, p := range procs {
		for _, ev := range append(p.all("LEAD"), p.all("RUN")...) {
			k := jf{ev.fields["job"], ev.fields["fence"]}
			if q, ok := seenBy[k]; ok && q != p {
				res.SharedFences++
			}
			seenBy[k] = p
			if ev.kind == "RUN" {
				runs[ev.fields["job"]+"@"+ev.fields["slot"]]++
			}
		}
	}
	every := r.cfg.sessEvery
	for _, job := range jobNames("sessions-"+r.runID, res.Jobs) {
		for slot := from.Truncate(every).Add(every); !slot.After(until); slot = slot.Add(every) {
			res.SlotsDue++
			k := job + "@" + strconv.FormatInt(slot.UnixNano(), 10)
			switch c := runs[k]; {
			case c == 0:
				res.SlotsMissed++
			case c > 1:
				res.SlotsTwice++
			default:
				continue
			}
			if len(res.Missed) < 10 {
				res.Missed = append(res.Missed, fmt.Sprintf("%s ran %d times", k, runs[k]))
			}
		}
	}
	for k, c := range runs {
		if c > 1 && len(res.Missed) < 20 {
			r.logf("sessions: %s ran %d times", k, c)
		}
	}
}

// poolProcs are the replica processes of a pool bench (spread, sessions)
// and which of them are live.
type poolProcs struct {
	r     *runner
	n     int // the pool's jobs
	s     settings
	args  func(seq int) []string
	seq   int
	procs []*proc
	live  map[*proc]bool
}

func (pl *poolProcs) start() (*proc, error) {
	pl.seq++
	p, err := spawn(fmt.Sprintf("replica-%d", pl.seq), pl.r.log, pl.args(pl.seq)...)
	if err != nil {
		return nil, err
	}
	pl.procs = append(pl.procs, p)
	pl.live[p] = true
	return p, nil
}

// startStaggered starts m replicas stagger apart and returns the times of
// the first start and the last.
func (pl *poolProcs) startStaggered(m int, stagger time.Duration) (first, last time.Time, err error) {
	for i := 0; i < m; i++ {
		if _, err := pl.start(); err != nil {
			return first, last, err
		}
		last = time.Now()
		if i == 0 {
			first = last
		}
		if i < m-1 {
			time.Sleep(stagger)
		}
	}
	return first, last, nil
}

func (pl *poolProcs) liveProcs() []*proc {
	var out []*proc
	for _, p := range pl.procs {
		if pl.live[p] {
			out = append(out, p)
		}
	}
	return out
}

// phase waits up to 10 heartbeats for the live replicas to be balanced
// (from from on), lets the phase's hand-overs settle, and judges the
// phase's leaderships from countFrom on.
func (pl *poolProcs) phase(what string, from, countFrom time.Time) spreadPhase {
	s := pl.s
	deadline := time.Now().Add(10 * s.hb)
	ph := spreadPhase{What: what, Live: len(pl.live), Balanced: -1}
	for time.Now().Before(deadline) {
		if t, ok := balanced(pl.procs, pl.live, pl.n, from); ok {
			ph.Balanced = t.Sub(from).Seconds()
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(s.hb + 2*s.retry)
	ph.HandOvers, ph.MaxGap, ph.Overlaps = judge(pl.procs, countFrom, time.Now())
	pl.r.logf("%s: %d live, balanced after %.2f s, %d hand-overs, longest gap %.2f s, %d overlaps",
		ph.What, ph.Live, ph.Balanced, ph.HandOvers, ph.MaxGap, ph.Overlaps)
	return ph
}

// rollingRestart stops the first k replicas in turn (SIGTERM), starting a
// new one after each, and reports each step's phase.
func (pl *poolProcs) rollingRestart(k int, report func(spreadPhase)) error {
	for i, p := range slices.Clone(pl.procs)[:min(k, len(pl.procs))] {
		from := time.Now()
		if err := p.stop(time.Minute); err != nil {
			return err
		}
		delete(pl.live, p)
		if _, err := pl.start(); err != nil {
			return err
		}
		report(pl.phase(fmt.Sprintf("rolling restart %d of %d (SIGTERM, a new replica)", i+1, k), from, from))
	}
	return nil
}

func (pl *poolProcs) stopAll() {
	for _, p := range pl.procs {
		if pl.live[p] {
			_ = p.stop(time.Minute)
			delete(pl.live, p)
		}
	}
}

// sessionsTable renders the sessions figure.
func (r *runner) sessionsTable(w func(string, ...any), ss *sessionsResult) {
	if small := ss.IdleSmall; small != nil {
		f := idleOf(small)
		w("Sessions, idle, a quarter of the jobs first: %s held of %s, %.2f KB of Go heap in use per job (%.2f KB live).\n\n",
			small["held"], small["n"], f.heap/f.n/1e3, f.live/f.n/1e3)
	}
	if m := ss.Idle; m != nil {
		num := func(k string) float64 { v, _ := strconv.ParseFloat(m[k], 64); return v }
		n := max(num("n"), 1)
		hour := 3600 / max(num("window_s"), 1)
		w("Sessions, idle: one process holding %s scheduled jobs of one pool (Pool.RunSchedule, no slot due for a day), %s, held after %s s; per held job against the process before the pool was made (its client's connections open; the heap in use against the process before them in brackets), the live heap (the objects alive after a collection; the heap in use is their spans), and the items written per hour once all were held (%s s window):\n\n",
			m["n"], ss.Settings, m["held_s"], m["window_s"])
		w("| jobs held | RSS per job | Go heap in use per job | live heap per job | goroutines per job (all; the library's) | items written per hour: session, lease, run, other | shutdown (every job resigned) |\n|---|---|---|---|---|---|---|\n")
		var writes []string
		for _, k := range []string{"member", "lease", "run"} {
			writes = append(writes, thousands((num("after_w_"+k)-num("before_w_"+k))*hour))
		}
		other := 0.0
		for _, k := range []string{"check", "directory", "other"} {
			other += num("after_w_"+k) - num("before_w_"+k)
		}
		writes = append(writes, thousands(other*hour))
		w("| %s of %s | %.2f KB | %.2f KB (%.2f KB) | %.2f KB | %.4f; %.4f | %s | %s s, %s writes |\n\n", m["held"], m["n"],
			(num("rss")-num("rss_base"))/n/1e3, (num("heap")-num("heap_base"))/n/1e3, (num("heap")-num("heap_cold_base"))/n/1e3,
			(num("live")-num("live_base"))/n/1e3,
			(num("goroutines")-num("goroutines_base"))/n, num("goroutines_library")/n,
			strings.Join(writes, ", "), m["shutdown_s"], thousands(num("final_w_lease")-num("after_w_lease")))
		if heap, live, fixed, ok := ss.idleSlope(); ok {
			w("Between the two sizes, each further idle job adds %.2f KB of Go heap in use (%.2f KB live); %.0f KB does not grow with the jobs (the runtime's partly filled spans, the pool's own state), so the figure per job above is the slope plus %.2f KB at this size.\n\n",
				heap/1e3, live/1e3, fixed/1e3, fixed/n/1e3)
		}
	}
	if len(ss.Phases) == 0 {
		return
	}
	w("Sessions over processes: a pool of %d jobs, each on Every(%s), over %d replica processes %s, each job's fn returning at once; leadership read from each job's State every 100 ms (LEAD at the first reading that finds a replica leading, END at the last):\n\n",
		ss.Jobs, ss.Every, ss.Replicas, ss.Settings)
	w("| phase | live replicas | balanced after | hand-overs | longest gap | overlaps |\n|---|---|---|---|---|---|\n")
	for _, ph := range ss.Phases {
		bal := "not within 10 heartbeats"
		if ph.Balanced >= 0 {
			bal = fmt.Sprintf("%.2f s", ph.Balanced)
		}
		w("| %s | %d | %s | %d | %.2f s | %d |\n", ph.What, ph.Live, bal, ph.HandOvers, ph.MaxGap, ph.Overlaps)
	}
	renewals := float64(ss.Replicas) * 3600 / max(ss.Heartbeat, 1e-9)
	w("\nItems written per hour over a %.0f s steady window, all replicas: %s session renewals (one per replica per heartbeat: %s), %s lease items, %s run items and %s fence checks for %s runs (a claim and a finish each), %s directory, %s other; %s items read.\n\n",
		ss.Window, thousands(ss.PerHour["member"]), thousands(renewals), thousands(ss.PerHour["lease"]), thousands(ss.PerHour["run"]),
		thousands(ss.PerHour["check"]), thousands(ss.RunsPerHour), thousands(ss.PerHour["directory"]), thousands(ss.PerHour["other"]), thousands(ss.ReadPerHour))
	fo := "not every job within 10 leases"
	if ss.Failover >= 0 {
		fo = fmt.Sprintf("%.2f s", ss.Failover)
	}
	w("SIGKILL of a replica leading %d jobs: every one led again after %s (bound %.1f s: lease + heartbeat + retry + 2 call timeouts). Over the whole run: %d overlaps, %d fences seen by two replicas; %d slots due, %d never run, %d run more than once.\n\n",
		ss.KilledJobs, fo, ss.KillBound, ss.Overlaps, ss.SharedFences, ss.SlotsDue, ss.SlotsMissed, ss.SlotsTwice)
	for _, m := range ss.Missed {
		w("- %s\n", m)
	}
	if len(ss.Missed) > 0 {
		w("\n")
	}
}
