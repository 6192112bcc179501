package main

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// peer holds the peer's figures from PEERS.md (cirello.io/dynamolock/v5
// v5.0.0, dynalite 4.0.0, 2 cores, Go 1.26.8), by settings name.
var peer = map[string]map[string]string{
	"a": {
		"handover":  "0.60 / 1.00 (40)",
		"failover":  "17.8 / 20.5 (20)",
		"failover2": "26.8 / 36.3 (18)",
		"cold":      "20.04 / 20.04 (20)",
		"leader":    "720 UpdateItem = 720 WCU",
		"standby":   "3,600 GetItem (consistent)",
		"rcu":       "3,600",
	},
	"b": {
		"handover":  "0.42 / 1.00 (40)",
		"failover":  "25.3 / 30.2 (20)",
		"failover2": "37.1 / 50.9 (18)",
		"cold":      "30.05 / 30.06 (20)",
		"leader":    "360 UpdateItem = 360 WCU",
		"standby":   "3,600 GetItem (consistent)",
		"rcu":       "3,600",
	},
}

func machine() string {
	model := ""
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	return fmt.Sprintf("%d CPUs (%s), %s %s/%s", runtime.NumCPU(), model, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

func splitComma(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// medMax formats the median and maximum of xs, with the trial count.
func medMax(xs []float64, prec int) string {
	if len(xs) == 0 {
		return "—"
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return fmt.Sprintf("%.*f / %.*f (%d)", prec, med, prec, s[len(s)-1], len(s))
}

func maxOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return slices.Max(xs)
}

func pluck[T any](ts []T, f func(T) float64) []float64 {
	out := make([]float64, len(ts))
	for i, t := range ts {
		out[i] = f(t)
	}
	return out
}

func thousands(x float64) string {
	s := strconv.FormatInt(int64(x+0.5), 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func counts(c map[string]int64) string {
	if len(c) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, thousands(float64(c[k]))+" "+k)
	}
	return strings.Join(parts, " + ")
}

func verdict(ok bool, have bool) string {
	switch {
	case !have:
		return "not measured"
	case ok:
		return "**met**"
	}
	return "**missed**"
}

// table renders the results as Markdown.
func (r *runner) table() string {
	res := &r.res
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	names := []string{}
	for _, s := range r.sets {
		names = append(names, s.name)
	}
	w("\nServer: %s. Machine: %s. Started %s, took %s.\n\n", res.Server, res.Machine,
		res.Started.UTC().Format("2006-01-02 15:04 MST"), res.Finished.Sub(res.Started).Round(1e9))
	w("Times in seconds, median / max (trials). Ours and the peer's (from PEERS.md) side by side; (a) = lease 20s / heartbeat 5s / retry 1s, (b) = 30s / 10s / 1s.\n\n")
	w("| figure |")
	for _, s := range r.sets {
		w(" ours %v | peer (%s) |", s, s.name)
	}
	w("\n|---|")
	for range r.sets {
		w("---|---|")
	}
	w("\n")
	row := func(label string, ours func(string) string, peerKey string) {
		w("| %s |", label)
		for _, n := range names {
			p := "—"
			if peerKey != "" {
				p = peer[n][peerKey]
			}
			w(" %s | %s |", ours(n), p)
		}
		w("\n")
	}
	row("hand-over: SIGTERM to leader → standby leads", func(n string) string {
		return medMax(pluck(res.Handover[n], func(t handoverTrial) float64 { return t.Handover }), 3)
	}, "handover")
	row(fmt.Sprintf("hand-over, leader drains %gs: SIGTERM → standby leads", res.DrainFor), func(n string) string {
		return medMax(pluck(res.Drain[n], func(t handoverTrial) float64 { return t.Handover }), 3)
	}, "")
	row(fmt.Sprintf("hand-over, leader drains %gs: its function returned → standby leads", res.DrainFor), func(n string) string {
		return medMax(pluck(res.Drain[n], func(t handoverTrial) float64 { return t.FromReturn }), 3)
	}, "")
	row("crash failover: SIGKILL to leader → standby leads", func(n string) string {
		return medMax(pluck(res.Failover[n], func(t failoverTrial) float64 { return t.Failover }), 2)
	}, "failover")
	row("crash failover, standby re-calling AcquireLock (peer's CLI)", func(string) string { return "n/a (Run never gives up)" }, "failover2")
	row("crash failover − (lease − age of last heartbeat + retry)", func(n string) string {
		return medMax(pluck(res.Failover[n], func(t failoverTrial) float64 { return t.Slack }), 3)
	}, "")
	row("age of the last heartbeat at the kill", func(n string) string {
		return medMax(pluck(res.Failover[n], func(t failoverTrial) float64 { return t.Age }), 2)
	}, "")
	coldLabel := "cold start: lease left by a process killed 2 × lease ago; exec of a fresh process → leads"
	if r.cfg.coldForge {
		coldLabel += " (item forged as a killed process leaves it)"
	}
	row(coldLabel, func(n string) string {
		return medMax(pluck(res.Cold[n], func(t coldTrial) float64 { return t.FromSpawn }), 3)
	}, "cold")
	row("cold start: first call (Run) → leads", func(n string) string {
		return medMax(pluck(res.Cold[n], func(t coldTrial) float64 { return t.FromCall }), 4)
	}, "")
	row("cold start: requests sent before leading", func(n string) string {
		return medMax(pluck(res.Cold[n], func(t coldTrial) float64 { return float64(t.Requests) }), 0)
	}, "")
	row("leader: requests per hour", func(n string) string {
		c, ok := res.Cost[n]
		if !ok {
			return "—"
		}
		return fmt.Sprintf("%s = %s WCU", counts(c.PerHour["leader"]), thousands(c.WCU["leader"]))
	}, "leader")
	row("each standby: requests per hour", func(n string) string {
		c, ok := res.Cost[n]
		if !ok {
			return "—"
		}
		return counts(c.PerHour["standby"])
	}, "standby")
	row("each standby: read units per hour", func(n string) string {
		c, ok := res.Cost[n]
		if !ok {
			return "—"
		}
		var parts []string
		for _, x := range c.StandbyRCUs {
			parts = append(parts, thousands(x))
		}
		return strings.Join(parts, ", ") + fmt.Sprintf(" (%.0fs window)", c.Window)
	}, "rcu")
	w("\n")

	if o := res.Overhead; o != nil {
		w("Overhead against a raw UpdateItem with the same expression on the same server, %d interleaved calls each (median ms; ratio of medians, ratio of 10%%-trimmed means):\n\n", o.N)
		w("| call | ours | raw UpdateItem | ratio (medians) | ratio (trimmed means) |\n|---|---|---|---|---|\n")
		w("| TryAcquire (free lease) | %.3f | %.3f | %.3f | %.3f |\n", o.AcquireOurs, o.AcquireRaw, o.AcquireRatio, o.AcquireMeanRatio)
		w("| Heartbeat | %.3f | %.3f | %.3f | %.3f |\n\n", o.HeartbeatOurs, o.HeartbeatRaw, o.HeartbeatRatio, o.HeartbeatMeanRat)
	}

	if len(res.Scale) > 0 {
		w("Scale: one process holding N leases (one job each, each its own Lease and Run; retry 1 s), one SDK client with 64 connections; measured over %d heartbeat rounds after one round of warm-up:\n\n", r.cfg.scaleRounds)
		w("| leases | server | lease / heartbeat | led | RSS (base) | Go heap in use (base) | goroutines (stacks) | CPU per heartbeat round | renewals seen / expected | renewal gap p50 / p99 / max | gaps > interval + 1 s | leadership lost | UpdateItem p50 / p99 / max | server CPU (cores) | shutdown: wall, CPU (the same N resignations sent raw, at once) | per lease: RSS, goroutines, writes at shutdown |\n")
		w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, m := range res.Scale {
			mb := func(k string) string { v, _ := strconv.ParseFloat(m[k], 64); return fmt.Sprintf("%.0f MB", v/1e6) }
			num := func(k string) float64 { v, _ := strconv.ParseFloat(m[k], 64); return v }
			n := max(num("n"), 1)
			perLease := fmt.Sprintf("%.1f KB, %.2f, %.2f", (num("rss")-num("rss_base"))/n/1e3, (num("goroutines")-num("goroutines_base"))/n,
				num("shutdown_writes")/n)
			stop := fmt.Sprintf("%s s, %s s (%s s, %s s", m["shutdown_s"], m["shutdown_cpu_s"], m["raw_resign_s"], m["raw_resign_cpu_s"])
			if e := m["raw_resign_errors"]; e != "" && e != "0" {
				stop += ", " + e + " failed"
			}
			stop += ")"
			w("| %s | %s | %s | %s | %s (%s) | %s (%s) | %s (%s) | %s s | %s / %s | %s / %s / %s ms | %s | %s | %s / %s / %s ms | %s | %s | %s |\n",
				m["n"], m["server"], m["settings"], m["led"], mb("rss"), mb("rss_base"), mb("heap"), mb("heap_base"), m["goroutines"], mb("stack"), m["cpu_per_round_s"],
				m["renewals"], m["renewals_expected"], m["gap_p50_ms"], m["gap_p99_ms"], m["gap_max_ms"],
				m["late_1s"], m["lost_total"], m["upd_p50_ms"], m["upd_p99_ms"], m["upd_max_ms"], m["server_cpu_share"], stop, perLease)
		}
		w("\n")
	}

	if sp := res.Spread; sp != nil {
		w("Spread: a pool of %d jobs over %d replica processes %v, each process's function leading a job until it is handed over; then a rolling restart (SIGTERM to one, a new one started, in turn). Balanced: every live replica leads within ±5 %% of its share; gap: the longest a job that had a leader went without one (bound %.1f s: heartbeat + retry + 2 call timeouts); overlaps: moments at which two replicas' functions led one job:\n\n",
			sp.Jobs, sp.Replicas, sp.Settings, sp.Bound)
		w("| phase | live replicas | balanced after | hand-overs | longest gap | overlaps |\n|---|---|---|---|---|---|\n")
		for _, ph := range sp.Phases {
			bal := "not within 10 heartbeats"
			if ph.Balanced >= 0 {
				bal = fmt.Sprintf("%.2f s", ph.Balanced)
			}
			w("| %s | %d | %s | %d | %.2f s | %d |\n", ph.What, ph.Live, bal, ph.HandOvers, ph.MaxGap, ph.Overlaps)
		}
		w("\n")
	}

	if ss := res.Sessions; ss != nil {
		r.sessionsTable(w, ss)
	}

	if pf := res.PoolFailover; pf != nil {
		r.poolFailoverTable(w, pf)
	}

	if len(res.Reads) > 0 {
		w("Reads: the items each operator read examines (the server's ScannedCount; the items a GetItem or BatchGetItem returned), on a table of %d jobs and %d run items (one a minute per job), through ddblease.Admin as the command calls it:\n\n",
			readsJobs, res.ReadsItems)
		w("| read | returned | examined (requests) | read units (where the server reports them) |\n|---|---|---|---|\n")
		for _, rd := range res.Reads {
			w("| %s | %d | %d (%d) | %g |\n", rd.Read, rd.Returned, rd.NewExamined, rd.NewRequests, rd.NewUnits)
		}
		w("\n")
	}

	w("Aims (issue 5):\n\n")
	all := func(f func(n string) (ok, have bool)) (bool, bool) {
		ok, have := true, false
		for _, n := range names {
			o, h := f(n)
			if h {
				have = true
				ok = ok && o
			}
		}
		return ok, have
	}
	ok, have := all(func(n string) (bool, bool) {
		h := res.Handover[n]
		c, okc := res.Cost[n]
		if len(h) == 0 {
			return false, false
		}
		fine := maxOf(pluck(h, func(t handoverTrial) float64 { return t.Handover })) <= 1.0
		if okc {
			fine = fine && maxOf(c.StandbyRCUs) <= 3600
		}
		return fine, true
	})
	w("- hand-over max ≤ 1.0 s at a 1 s poll, with ≤ 3,600 standby read units/h: %s\n", verdict(ok, have))
	ok, have = all(func(n string) (bool, bool) {
		d := res.Drain[n]
		return maxOf(pluck(d, func(t handoverTrial) float64 { return t.FromReturn })) <= 0.25, len(d) > 0
	})
	w("- hand-over max ≤ 0.25 s after a %gs drain (from the leader's function returning): %s\n", res.DrainFor, verdict(ok, have))
	ok, have = all(func(n string) (bool, bool) {
		f := res.Failover[n]
		return maxOf(pluck(f, func(t failoverTrial) float64 { return t.Slack })) <= 0, len(f) > 0
	})
	w("- crash failover ≤ lease − age of last heartbeat + one retry interval (every trial): %s\n", verdict(ok, have))
	ok, have = all(func(n string) (bool, bool) {
		c := res.Cold[n]
		return maxOf(pluck(c, func(t coldTrial) float64 { return float64(t.Requests) })) == 1, len(c) > 0
	})
	w("- cold start = one round trip (one request from the first call to leading): %s\n", verdict(ok, have))
	ok, have = all(func(n string) (bool, bool) {
		c, okc := res.Cost[n]
		return maxOf(c.StandbyRCUs) <= 1800, okc
	})
	w("- standby read units ≤ half the peer's (≤ 1,800/h at a 1 s poll): %s\n", verdict(ok, have))
	if o := res.Overhead; o != nil {
		w("- overhead ratio ≤ 1.05 (TryAcquire ×%.3f, Heartbeat ×%.3f, medians): %s\n", o.AcquireRatio, o.HeartbeatRatio,
			verdict(o.AcquireRatio <= 1.05 && o.HeartbeatRatio <= 1.05, true))
	} else {
		w("- overhead ratio ≤ 1.05: not measured\n")
	}
	found := false
	for _, m := range res.Scale {
		if m["n"] == "10000" {
			found = true
			ok := m["late_1s"] == "0" && m["lost_total"] == "0" && m["led"] == "10000"
			w("- heartbeats of 10,000 leases in one process all on time (%s, %s): %s\n", m["server"], m["settings"], verdict(ok, true))
		}
	}
	if !found {
		w("- heartbeats of 10,000 leases in one process all on time: not measured\n")
	}
	if ss := res.Sessions; ss != nil && ss.Idle != nil {
		f := idleOf(ss.Idle)
		at := fmt.Sprintf("%.2f KB at %s jobs", f.heap/f.n/1e3, ss.Idle["n"])
		if heap, _, _, ok := ss.idleSlope(); ok {
			at += fmt.Sprintf("; %.2f KB each further job", heap/1e3)
		}
		w("- Go heap in use per idle held scheduled pool job ≤ 2 KB (%s): %s\n", at, verdict(f.heap/f.n <= 2000, true))
	} else {
		w("- Go heap in use per idle held scheduled pool job ≤ 2 KB: not measured\n")
	}
	if len(res.Errors) > 0 {
		w("\nErrors during the run:\n\n")
		for _, e := range res.Errors {
			w("- %s\n", e)
		}
	}
	return b.String()
}
