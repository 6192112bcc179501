package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/ddblease/ddblease"
)

// Kinds of violation. Each names an invariant judged from what the users
// observed (see doc.go).
const (
	VFenceOrder  = "fence-order"  // fences handed to fn did not grow
	VFenceDup    = "fence-dup"    // one fence handed to two leader contexts
	VStaleLeader = "stale-leader" // a leader context outlived a newer fence by more than a lease
	VOverlap     = "overlap"      // two live leader contexts at once (clocks within bound)
	VTwoLeaders  = "two-leaders"  // IsLeader true on two replicas at once (clocks within bound)
	VGuardOrder  = "guard-order"  // a guard accepted a fence lower than one it had accepted
	VTwoEffects  = "two-effects"  // a slot has two effects
	VFnTwice     = "fn-twice"     // fn called twice for a slot under NeverRerun
	VRunReturned = "run-returned" // Run returned while its context was live (nothing silent)
	VShutdown    = "run-shutdown" // Run returned an error after a clean shutdown
	VRunHang     = "run-hang"     // Run did not return after its context ended
	VNoLeader    = "no-leader"    // no leader LiveBound after the faults ended
	VGap         = "gap"          // a leaderless gap after the faults ended longer than GapBound
	VSlotMissed  = "slot-missed"  // a slot due after the faults ended never fired
	VRunning     = "run-running"  // a run left running for ever
	VMissedCount = "missed-count" // RunRecord.Missed is wrong while marked known
	VBusyLoop    = "busy-loop"    // a replica sent requests in a loop without waiting
	// The operator's calls (Admin: Trigger, Pause, Resume, ForceRelease).
	VTriggerFinal = "trigger-final" // a triggered run left running after the quiet period
	VTriggerLost  = "trigger-lost"  // a trigger never claimed though replicas led long after it
	VTriggerFence = "trigger-fence" // a triggered run's fn saw a fence its finished item does not hold, or ran twice under NeverRerun
	VRunFence     = "run-fence"     // a slot's fn saw a fence its finished item does not hold (NeverRerun)
	VPauseRespect = "pause-respect" // a slot's fn was called while the job was paused
	VCatchUpOnce  = "catch-up-once" // more than one run after a Resume with catchUp of the slots the pause covered
	VSpread       = "spread"        // a pool's jobs not led as Assign splits them over the live replicas, once settled
	VNoteLost     = "note-lost"     // an operator's note merged into one the holder had handled: deleted unread
	VLeak         = "leak"          // a goroutine outlived the run (synctest deadlock)
	VSetup        = "setup"
)

// knownNote starts a note of a known defect that a check excused.
const knownNote = "known defect:"

type checker struct {
	s       *sim
	p       *Plan
	ops     []opCall
	out     []string
	crashAt map[int]time.Duration
	checkAt time.Duration
	job     string // under a pool, the job being judged (named in each violation)
}

func (c *checker) fail(kind, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if c.p.Pool && c.job != "" {
		msg = "job " + c.job + ": " + msg
	}
	c.out = append(c.out, kind+": "+msg)
}

// liveBound and gapBound are the plan's, or its pool's.
func (c *checker) liveBound() time.Duration {
	if c.p.Pool {
		return c.p.poolLiveBound()
	}
	return c.p.liveBound()
}

func (c *checker) gapBound() time.Duration {
	if c.p.Pool {
		return c.p.poolGapBound()
	}
	return c.p.gapBound()
}

// pauseWithin returns how much of [a, b) rep spent paused.
func (c *checker) pauseWithin(rep int, a, b time.Duration) time.Duration {
	var d time.Duration
	for _, w := range c.s.reps[rep].pauses {
		lo, hi := max(a, w.From), min(b, w.To)
		if hi > lo {
			d += hi - lo
		}
	}
	return d
}

// live returns the parts of [a, b) in which rep was running (not paused).
func (c *checker) live(rep int, a, b time.Duration) []window {
	out := []window{{a, b}}
	for _, p := range c.s.reps[rep].pauses {
		var next []window
		for _, w := range out {
			if p.To <= w.From || p.From >= w.To {
				next = append(next, w)
				continue
			}
			if p.From > w.From {
				next = append(next, window{w.From, p.From})
			}
			if p.To < w.To {
				next = append(next, window{p.To, w.To})
			}
		}
		out = next
	}
	return out
}

func (c *checker) paused(rep int, t time.Duration) bool {
	return c.s.reps[rep].pausedUntil(t) != 0
}

// settled is when the gap checks start: the end of the faults, or later
// if a replica crashed near it, since a lease write it had in flight may
// land after the crash (after the faults ended, even) and hold the lease
// for a whole lease with no one to renew or resign it.
func (c *checker) settled() time.Duration {
	p := c.p
	at := p.FaultEnd
	var delay time.Duration
	for _, f := range p.Faults {
		delay = max(delay, f.Delay)
	}
	for _, t := range c.crashAt {
		at = max(at, t+delay+p.CallTimeout+p.Lease+2*p.Skew)
	}
	// A forced release keeps the recorded expiry: no one leads until it
	// is MaxClockSkew old (the plan makes releases early enough that this
	// is before the faults end).
	for _, o := range c.ops {
		if o.kind == OpRelease {
			at = max(at, o.called+p.Lease+2*p.Skew+p.Heartbeat+p.Retry+2*p.CallTimeout+delay)
		}
	}
	return at
}

func (c *checker) alive(rep int, t time.Duration) bool {
	at, ok := c.crashAt[rep]
	return !ok || t < at
}

func check(s *sim, admin *dynamodb.Client, checkAt time.Duration) []string {
	p := s.p
	s.h.mu.Lock()
	c := &checker{s: s, p: p, crashAt: map[int]time.Duration{}, checkAt: checkAt}
	for k, v := range s.h.crashAt {
		c.crashAt[k] = v
	}
	var ctxs []ctxRec
	for _, r := range s.h.ctxs {
		x := *r
		if x.end < 0 {
			x.end = checkAt
		}
		if at, ok := c.crashAt[x.rep]; ok {
			if x.start >= at {
				continue
			}
			x.end = min(x.end, at)
		}
		ctxs = append(ctxs, x)
	}
	var samples []sample
	for _, sm := range s.h.samples {
		if c.alive(sm.rep, sm.at) {
			samples = append(samples, sm)
		}
	}
	calls := slices.Clone(s.h.calls)
	returns := slices.Clone(s.h.returns)
	c.ops = slices.Clone(s.h.ops)
	resigns, shutdown := s.h.resigns, s.h.shutdown
	s.h.mu.Unlock()
	s.w.mu.Lock()
	applied := slices.Clone(s.w.applied)
	lost := slices.Clone(s.w.lostNotes)
	s.w.mu.Unlock()
	sort.SliceStable(ctxs, func(i, j int) bool { return ctxs[i].start < ctxs[j].start })
	perJob := func(j string) ([]ctxRec, []sample) {
		var xs []ctxRec
		var ys []sample
		for _, x := range ctxs {
			if x.job == j {
				xs = append(xs, x)
			}
		}
		for _, y := range samples {
			if y.job == j {
				ys = append(ys, y)
			}
		}
		return xs, ys
	}
	for _, j := range p.jobs() {
		c.job = j
		c.leaders(perJob(j))
	}
	c.job = ""

	// Guards: fences accepted only grow, per item for Put/Update, per job
	// for the transactional forms.
	perItem := map[string]int64{}
	txnMax := map[string]int64{} // per lease item: a pool's jobs have fences of their own
	effects := map[string]int{}
	idem := map[string]int{}
	for _, a := range applied {
		if a.guard && !a.txn {
			if a.wf < perItem[a.pk] {
				c.fail(VGuardOrder, "guarded %s of %s accepted fence %d at %v after fence %d", a.op, a.pk, a.wf, a.at, perItem[a.pk])
			}
			perItem[a.pk] = max(perItem[a.pk], a.wf)
		}
		if a.guard && a.txn {
			if a.wf < txnMax[a.lease] {
				c.fail(VGuardOrder, "guarded transaction (%s, %s) accepted fence %d at %v after fence %d", a.pk, a.lease, a.wf, a.at, txnMax[a.lease])
			}
			txnMax[a.lease] = max(txnMax[a.lease], a.wf)
		}
		if a.slot != "" {
			effects[a.slot]++
		}
		if len(a.pk) > 5 && a.pk[:5] == "idem#" {
			idem[a.pk]++
		}
	}
	for slot, n := range effects {
		if n > 1 {
			c.fail(VTwoEffects, "slot %s committed %d effects", slot, n)
		}
	}
	for k, n := range idem {
		if n > 1 {
			c.fail(VTwoEffects, "idempotency key %s written %d times", k, n)
		}
	}
	if p.Schedule && !p.Rerun {
		per := map[string][]fnCall{}
		for _, x := range calls {
			if x.trigger == "" { // triggers: see c.triggers
				per[x.slot] = append(per[x.slot], x)
			}
		}
		for slot, xs := range per {
			if len(xs) > 1 {
				c.fail(VFnTwice, "fn called %d times for slot %s under NeverRerun (first r%d fence %d at %v, then r%d fence %d at %v)",
					len(xs), slot, xs[0].rep, xs[0].fence, xs[0].at, xs[1].rep, xs[1].fence, xs[1].at)
			}
		}
	}

	// What Run returned.
	for _, r := range returns {
		if _, ok := c.crashAt[r.rep]; ok {
			continue
		}
		if errors.Is(r.err, ddblease.ErrInvalid) && strings.Contains(r.err.Error(), "another Run or RunSchedule is active") {
			continue // a second campaign on one handle is refused at once, as documented
		}
		sd, ok := shutdown[r.rep]
		if ok && r.called >= sd && errors.Is(r.err, context.Canceled) {
			// A supervisor woken at the shutdown's instant called Run
			// again with the ended context: documented to return an error
			// wrapping ctx.Err().
			continue
		}
		if ok && r.at >= sd {
			if r.err != nil {
				c.fail(VShutdown, "r%d call %d: returned %q after a clean shutdown", r.rep, r.call, r.err)
			}
			continue
		}
		if r.panicked {
			continue
		}
		if s.panicked[r.rep] && r.err != nil {
			continue // the library reported fn's panic as an error
		}
		if at, ok := resigns[r.rep]; ok && at <= r.at && r.err != nil {
			continue // stopped by the user's Resign, and said so
		}

		cause := "no leader context"
		for _, x := range ctxs {
			if x.rep == r.rep && x.call == r.call && x.start <= r.at {
				cause = fmt.Sprintf("last leader context (fence %d) ended at %v: %s", x.fence, x.end, x.cause)
			}
		}
		c.fail(VRunReturned, "r%d call %d: returned %v at %v while its context was live (%s)", r.rep, r.call, r.err, r.at, cause)
	}

	for _, n := range lost {
		c.fail(VNoteLost, "the operator's note on %s, added to %s at %v while a note on it that a renewal had returned awaited its deletion, merged with it: the renewal's DELETE takes both, and the holder never reads the change",
			n.job, n.member, n.at)
	}

	for _, r := range append(slices.Clone(s.reps), s.op) {
		r.mu.Lock()
		if r.busy != "" {
			c.fail(VBusyLoop, "%s", r.busy)
		}
		r.mu.Unlock()
	}
	if !p.wild() {
		for _, j := range p.jobs() {
			c.job = j
			xs, ys := perJob(j)
			c.handover(xs, shutdown)
			c.liveness(ys, shutdown)
		}
		c.job = ""
		if p.Pool {
			c.spread(samples, shutdown)
		}
		if p.Schedule {
			for _, j := range p.jobs() {
				c.job = j
				c.runs(admin, callsOf(calls, j))
			}
			c.job = ""
		}
	}
	if p.Schedule {
		// Every job's triggered runs are judged (a job the operator never
		// triggered has none); the pause names the operator's job.
		for _, j := range p.jobs() {
			c.job = j
			if p.Pool {
				c.triggers(admin, callsOf(calls, j), samplesOf(samples, j), shutdown)
			} else {
				c.triggers(admin, calls, samples, shutdown)
			}
		}
		c.job = p.OpJob
		c.pauses(callsOf(calls, p.opJob()))
		c.job = ""
	}
	return c.out
}

// leaders judges the leader contexts and IsLeader samples of one job:
// fence-order, fence-dup, stale-leader (every run); overlap and
// two-leaders (clocks within the bound, no wall step beyond it).
func (c *checker) leaders(ctxs []ctxRec, samples []sample) {
	p := c.p
	timed := !p.wild() && !p.stepped()

	// Fences handed to fn.
	last := map[[2]int]int64{}
	byFence := map[int64]ctxRec{}
	var maxSoFar int64
	for _, x := range ctxs {
		k := [2]int{x.rep, x.call}
		if f, ok := last[k]; ok && x.fence <= f {
			c.fail(VFenceOrder, "r%d call %d: fn got fence %d at %v after fence %d in an earlier tenure", x.rep, x.call, x.fence, x.start, f)
		}
		last[k] = x.fence
		if y, ok := byFence[x.fence]; ok {
			c.fail(VFenceDup, "fence %d handed to two leader contexts: r%d call %d at %v and r%d call %d at %v",
				x.fence, y.rep, y.call, y.start, x.rep, x.call, x.start)
		} else {
			byFence[x.fence] = x
		}
		if timed && x.fence < maxSoFar {
			c.fail(VFenceOrder, "r%d got fence %d at %v after fence %d was handed to fn", x.rep, x.fence, x.start, maxSoFar)
		}
		maxSoFar = max(maxSoFar, x.fence)
	}
	// No one believes it leads long after a newer fence reached fn (every run).
	for _, a := range ctxs {
		for _, b := range ctxs {
			if b.fence <= a.fence || b.start >= a.end {
				continue
			}
			// A tenure ends LeaseDuration - margin after its last confirmed
			// write was sent, by the runtime's clock or sooner by the
			// replica's, whatever its rate.
			allowed := time.Duration(float64(p.Lease)*0.9) + c.pauseWithin(a.rep, b.start, a.end) + time.Millisecond
			if a.end-b.start > allowed {
				c.fail(VStaleLeader, "r%d's leader context (fence %d) was live until %v, %v after r%d's fn got fence %d (allowed %v)",
					a.rep, a.fence, a.end, a.end-b.start, b.rep, b.fence, allowed)
			}
		}
	}
	if timed {
		// No two live leader contexts at once.
		for i, a := range ctxs {
			for _, b := range ctxs[i+1:] {
				if b.start >= a.end {
					continue
				}
				for _, wa := range c.live(a.rep, a.start, a.end) {
					for _, wb := range c.live(b.rep, b.start, b.end) {
						if lo, hi := max(wa.From, wb.From), min(wa.To, wb.To); hi > lo {
							c.fail(VOverlap, "r%d call %d (fence %d, [%v, %v)) and r%d call %d (fence %d, [%v, %v)) both led for %v from %v (a ended: %s)",
								a.rep, a.call, a.fence, a.start, a.end, b.rep, b.call, b.fence, b.start, b.end, hi-lo, lo, a.cause)
						}
					}
				}
			}
		}
		// IsLeader true on two replicas in one snapshot (one moment).
		snaps := map[int][]int{}
		for _, sm := range samples {
			if sm.snap > 0 && sm.leader && !c.paused(sm.rep, sm.at) {
				snaps[sm.snap] = append(snaps[sm.snap], sm.rep)
			}
		}
		for _, sm := range samples {
			if reps := snaps[sm.snap]; sm.snap > 0 && len(reps) > 1 {
				c.fail(VTwoLeaders, "IsLeader true on replicas %v at %v (snapshot %d)", reps, sm.at, sm.snap)
				delete(snaps, sm.snap)
			}
		}
		// IsLeader true on one replica while another's leader context was
		// live: strictly after the instant it began (events at one
		// virtual instant run in some real order within it, which
		// virtual time does not tell; a snapshot does, above).
		for _, sm := range samples {
			if !sm.leader || c.paused(sm.rep, sm.at) {
				continue
			}
			for _, x := range ctxs {
				if x.rep != sm.rep && sm.at > x.start && sm.at < x.end && !c.paused(x.rep, sm.at) {
					c.fail(VTwoLeaders, "IsLeader true on r%d at %v while r%d's leader context (fence %d) was live", sm.rep, sm.at, x.rep, x.fence)
				}
			}
		}
	}

}

// handover: a leader context that ends after the faults ended, other than
// by shutdown, is followed by another within GapBound (plus a slot interval
// for RunSchedule, whose fn first sees a tenure at its first slot, and
// the size of any forward wall step, which runs slots early).
func (c *checker) handover(ctxs []ctxRec, shutdown map[int]time.Duration) {
	p := c.p
	end := c.checkAt
	for _, t := range shutdown {
		end = min(end, t)
	}
	bound := c.gapBound()
	if p.Schedule {
		bound += p.Interval + p.Work
		// A wall step forward by By fires the slots it passes up to By
		// early (documented); the next tenure's fn first sees it at the
		// first slot not yet run, up to By later. IsLeader samples
		// (liveness) and slot-missed still judge such runs.
		for _, st := range p.Steps {
			if st.By > 0 {
				bound += st.By
			}
		}
	}
	settled := c.settled()
	for _, a := range ctxs {
		if a.end < settled || a.end >= end {
			continue
		}
		if at, ok := c.crashAt[a.rep]; ok && a.end >= at {
			continue
		}
		if superseded(a, ctxs) {
			continue
		}
		next := end
		for _, b := range ctxs {
			switch {
			case b.start >= a.end && b.start < next:
				next = b.start
			case b.rep != a.rep && b.start < a.end && b.end > a.end:
				next = a.end // another replica already led
			}
		}
		if next-a.end > bound {
			c.fail(VGap, "r%d's tenure (fence %d) ended at %v (%s) and no leader followed for %v (faults ended at %v, bound %v)",
				a.rep, a.fence, a.end, a.cause, next-a.end, p.FaultEnd, bound)
		}
	}
}

// superseded reports whether a newer fence led a's job before a ended: a
// replica paused past its deadline sees its tenure end when it resumes,
// after another has taken the lease from it (seed 921956). That end hands
// nothing over; the job's leaderless time, if any, began when the newer
// tenure ended, and liveness judges it.
func superseded(a ctxRec, ctxs []ctxRec) bool {
	for _, b := range ctxs {
		if b.fence > a.fence && b.start < a.end {
			return true
		}
	}
	return false
}

// liveness: once the faults end, a leader within LiveBound and no gap
// longer than GapBound.
func (c *checker) liveness(samples []sample, shutdown map[int]time.Duration) {
	p := c.p
	end := c.checkAt
	for _, t := range shutdown {
		end = min(end, t)
	}
	nAlive := func(t time.Duration) int {
		n := 0
		for i := range p.N {
			if c.alive(i, t) {
				n++
			}
		}
		return n
	}
	byT := map[time.Duration][]sample{}
	for _, sm := range samples {
		if sm.at >= p.FaultEnd && sm.at < end {
			byT[sm.at] = append(byT[sm.at], sm)
		}
	}
	var ts []time.Duration
	for t, xs := range byT {
		reps := map[int]bool{}
		for _, x := range xs {
			reps[x.rep] = true
		}
		if len(reps) == nAlive(t) {
			ts = append(ts, t)
		}
	}
	slices.Sort(ts)
	hadLeader, gapFrom, reported := false, time.Duration(-1), false
	for _, t := range ts {
		led := false
		for _, x := range byT[t] {
			led = led || x.leader
		}
		// No leader yet since the faults ended. A later pause between
		// tenures (a panic, a resignation) is judged as a gap.
		if !led && !hadLeader && t >= p.FaultEnd+c.liveBound() && !reported {
			c.fail(VNoLeader, "no replica led at %v (faults ended at %v, bound %v)", t, p.FaultEnd, c.liveBound())
			reported = true
		}
		switch {
		case !led && hadLeader && gapFrom < 0:
			gapFrom = t
		case led && gapFrom >= 0:
			if t-gapFrom > c.gapBound() && gapFrom >= c.settled() {
				c.fail(VGap, "no leader from %v to %v (%v) though the faults ended at %v (bound %v)", gapFrom, t, t-gapFrom, p.FaultEnd, c.gapBound())
			}
			gapFrom = -1
		}
		if led {
			hadLeader = true
		}
	}
}

// spreadFrom is when a pool's jobs are led as Assign splits them: every
// live replica has renewed its membership after the faults (a CallTimeout
// and a heartbeat) and a crashed one's has lapsed (settled), every view
// shows it (a view lag), the moves it makes are done (poolGapBound), and
// every job is led (poolLiveBound).
func (c *checker) spreadFrom() time.Duration {
	p := c.p
	return max(max(c.settled(), p.FaultEnd+p.CallTimeout+p.Heartbeat)+p.viewLag()+p.poolGapBound(), p.FaultEnd+p.poolLiveBound())
}

// spread: from spreadFrom until the shutdown, at every instant at which
// every live replica sampled every job, each job is led by one replica,
// the one ddblease.Assign gives it over the replicas alive (not crashed)
// at the end; each then leads its share, rounded down or up.
func (c *checker) spread(samples []sample, shutdown map[int]time.Duration) {
	p := c.p
	end := c.checkAt
	for _, t := range shutdown {
		end = min(end, t)
	}
	var alive []string
	for i := range p.N {
		if _, ok := c.crashAt[i]; !ok {
			alive = append(alive, fmt.Sprintf("r%d", i))
		}
	}
	want := ddblease.Assign(p.Jobs, alive)
	owner := map[string]string{}
	for r, js := range want {
		for _, j := range js {
			owner[j] = r
		}
	}
	from := c.spreadFrom()
	byT := map[time.Duration][]sample{}
	for _, sm := range samples {
		if sm.at >= from && sm.at < end && c.alive(sm.rep, sm.at) {
			byT[sm.at] = append(byT[sm.at], sm)
		}
	}
	var ts []time.Duration
	for t, xs := range byT {
		seen := map[string]bool{} // fn samples its job too, at its own instants
		for _, x := range xs {
			seen[fmt.Sprintf("%d/%s", x.rep, x.job)] = true
		}
		if len(seen) == len(alive)*len(p.Jobs) {
			ts = append(ts, t)
		}
	}
	if len(ts) == 0 {
		c.fail(VSpread, "no instant from %v to the shutdown at %v at which every live replica sampled every job", from, end)
		return
	}
	slices.Sort(ts)
	lo, hi := len(p.Jobs)/len(alive), (len(p.Jobs)+len(alive)-1)/len(alive)
	// A forced release that applied moves its job: the released replica
	// declines it for the rest of its Run (docs/pool.md), and another job
	// may move to it in its place. The split is then Assign's with
	// declines, which the checker does not follow: only one leader per
	// job and the even shares are judged.
	declines := slices.ContainsFunc(c.ops, func(o opCall) bool { return o.kind == OpRelease && o.err == nil })
	for _, t := range ts {
		led := map[string][]string{}
		byRep := map[string][]string{}
		for _, x := range byT[t] {
			r := fmt.Sprintf("r%d", x.rep)
			if x.leader && !slices.Contains(led[x.job], r) {
				led[x.job] = append(led[x.job], r)
				byRep[r] = append(byRep[r], x.job)
			}
		}
		ok := true
		for _, j := range p.Jobs {
			ok = ok && len(led[j]) == 1 && (declines || led[j][0] == owner[j])
		}
		for _, r := range alive {
			ok = ok && (!declines || len(byRep[r]) >= lo && len(byRep[r]) <= hi)
		}
		if ok {
			continue
		}
		var parts []string
		shares := true
		for _, r := range alive {
			js := byRep[r]
			slices.Sort(js)
			shares = shares && len(js) >= lo && len(js) <= hi
			parts = append(parts, fmt.Sprintf("%s leads %v (Assign: %v)", r, js, want[r]))
		}
		what := "not as Assign splits them"
		if !shares {
			what = fmt.Sprintf("not %d or %d each", lo, hi)
		}
		c.fail(VSpread, "at %v the jobs were led %s over the live replicas %v: %s (faults ended at %v, spread due from %v)",
			t, what, alive, strings.Join(parts, "; "), p.FaultEnd, from)
		return
	}
}

// runs judges the job-run items: due slots fired, none left running,
// missed counts right.
func (c *checker) runs(admin *dynamodb.Client, calls []fnCall) {
	p := c.p
	lh, err := ddblease.New(admin, table, c.jobName())
	if err != nil {
		c.fail(VSetup, "%v", err)
		return
	}
	sched := ddblease.Every(p.Interval)
	start := c.s.w.start
	window := p.Window
	if window == 0 {
		window = ddblease.DefaultCatchUpWindow
	}
	from := start.Add(-2*p.Interval - 4*p.Lease) // no slot long before the start is ever claimed
	to := start.Add(c.checkAt)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	var recs []ddblease.RunRecord
	for a := from; a.Before(to); {
		b := a.Add(p.Interval * (ddblease.MaxListSlots - 1))
		if b.After(to) {
			b = to
		}
		rs, err := lh.ListRuns(ctx, sched, a, b)
		if err != nil {
			c.fail(VSetup, "ListRuns: %v", err)
			return
		}
		recs = append(recs, rs...)
		a = b.Add(time.Nanosecond)
	}
	bySlot := map[time.Time]ddblease.RunRecord{}
	for _, r := range recs {
		bySlot[r.Slot] = r
	}
	// A finished slot's fn saw the fence its item holds (NeverRerun: every
	// call; Rerun: the latest claim's call).
	perSlot := map[time.Time][]fnCall{}
	for _, x := range calls {
		if x.trigger == "" {
			perSlot[x.slotAt.UTC()] = append(perSlot[x.slotAt.UTC()], x)
		}
	}
	for slot, xs := range perSlot {
		r, ok := bySlot[slot]
		if !ok || r.Status != ddblease.RunSucceeded && r.Status != ddblease.RunFailed {
			continue
		}
		var top int64
		for _, x := range xs {
			top = max(top, x.fence)
			if !p.Rerun && x.fence != r.Fence {
				c.fail(VRunFence, "slot %v is %s with fence %d (%s), but r%d's fn ran it with fence %d at %v (returned %s)",
					slot.Sub(start), r.Status, r.Fence, r.Owner, x.rep, x.fence, x.at, x.result)
			}
		}
		if p.Rerun && top != r.Fence {
			c.fail(VRunFence, "slot %v is %s with fence %d (%s), but the latest fence its fn ran with is %d (%s)",
				slot.Sub(start), r.Status, r.Fence, r.Owner, top, describeCalls(xs))
		}
	}
	// Every slot due after the leader came back fired.
	end := c.checkAt
	for _, t := range c.s.h.shutdown {
		end = min(end, t)
	}
	// Slots are due by the leader's wall clock, which may run ahead of or
	// behind the simulation's time as a whole (clocks within the bound of
	// each other, all far from true time): the window starts late by the
	// clock furthest ahead and ends early by the one furthest behind.
	loAt := p.FaultEnd + c.liveBound() + p.Interval + p.Skew
	if p.Pool {
		// A pool's jobs move until the split settles; a slot due while
		// its job moved is caught up only if it is the latest.
		loAt = max(loAt, c.spreadFrom()+p.Interval+p.Skew)
	}
	hiAt := end - p.Interval - 2*p.Skew - 2*p.CallTimeout - p.Work
	ahead, behind := p.Clocks[0].offsetAt(loAt), p.Clocks[0].offsetAt(hiAt)
	for _, k := range p.Clocks[1:] {
		ahead, behind = max(ahead, k.offsetAt(loAt)), min(behind, k.offsetAt(hiAt))
	}
	lo := start.Add(loAt + max(ahead, 0))
	hi := start.Add(hiAt + min(behind, 0))
	// A slot fired early while the faults lasted (by a wall clock ahead),
	// whose outcome the faults kept from being recorded, is abandoned, and
	// fired once all the same.
	firedEarly := func(s time.Time) bool {
		for _, x := range perSlot[s.UTC()] {
			if !x.dead && x.at < p.FaultEnd {
				return true
			}
		}
		return false
	}
	// A slot that came due by a wall clock stepped ahead while the faults
	// lasted (a step is beyond the bound) was claimed then, early; its
	// claim, given up to the faults, leaves it abandoned without fn being
	// called, and it is not claimed again (NeverRerun; Rerun reclaims only
	// a running run).
	steppedOver := func(s time.Time) bool {
		for _, st := range p.Steps {
			if st.By <= 0 || st.At >= p.FaultEnd {
				continue
			}
			var ahead time.Duration
			for _, k := range p.Clocks {
				ahead = max(ahead, k.offsetAt(st.At+st.Dur))
			}
			from := start.Add(st.At + st.By - p.Skew)
			to := start.Add(st.At + st.Dur + st.By + ahead + p.Skew)
			if !s.Before(from) && !s.After(to) {
				return true
			}
		}
		return false
	}
	missing, first := 0, time.Time{}
	for s := sched.Next(lo); !s.After(hi); s = sched.Next(s) {
		r, ok := bySlot[s.UTC()]
		if ok && r.Status == ddblease.RunAbandoned && (firedEarly(s) || steppedOver(s)) {
			continue
		}
		if !ok || (r.Status != ddblease.RunSucceeded && r.Status != ddblease.RunFailed) {
			if missing == 0 {
				first = s
			}
			missing++
		}
	}
	if missing > 0 {
		c.fail(VSlotMissed, "%d slots due after %v never fired, the first %v (faults ended at %v)",
			missing, lo.Sub(start), first.Sub(start), p.FaultEnd)
	}
	// No run left running, unless no later tenure fired within the catch-up
	// window of its slot.
	for _, r := range recs {
		if r.Status != ddblease.RunRunning {
			continue
		}
		excused := true
		for _, o := range recs {
			if o.Fence > r.Fence && !o.StartedAt.After(r.Slot.Add(window-2*p.Skew)) {
				excused = false
			}
		}
		if !excused {
			c.fail(VRunning, "slot %v (fence %d, %s) left running; later tenures fired within its catch-up window",
				r.Slot.Sub(start), r.Fence, r.Owner)
		}
	}
	// Missed counts, when marked known.
	if p.stepped() {
		return
	}
	for i, r := range recs {
		if r.MissedUnknown || r.Claims > 1 || r.Status == ddblease.RunAbandoned {
			continue
		}
		// The latest run before it that existed when it was claimed: a run
		// with a higher fence was claimed later (claims are fenced), and a
		// later tenure on a clock behind may fire a slot before one its
		// predecessor already ran.
		// A run claimed more than once (a skip record a resumption's
		// catch-up claimed again, an orphan re-run) had an earlier claim,
		// perhaps of a lower fence: it may have existed then too. A run of
		// the same tenure claimed after it (a resumption's catch-up of an
		// earlier slot) did not; one claimed at the same millisecond may
		// have come before or after it. Runs that may have existed bound
		// the count from below (prevLo), runs that surely did from above.
		var prevLo, prevHi time.Time
		for _, o := range recs[:i] {
			surely := o.Fence < r.Fence || o.Fence == r.Fence && o.StartedAt.Before(r.StartedAt)
			maybe := surely || o.Fence == r.Fence && o.StartedAt.Equal(r.StartedAt) || o.Claims > 1
			if surely && o.Slot.After(prevHi) {
				prevHi = o.Slot
			}
			if maybe && o.Slot.After(prevLo) {
				prevLo = o.Slot
			}
		}
		count := func(floor, prev time.Time) int {
			if floor.Before(prev) {
				floor = prev
			}
			n := 0
			for s := sched.Next(floor); s.Before(r.Slot); s = sched.Next(s) {
				n++
			}
			return n
		}
		tol := 2*p.Skew + p.Lease + p.Interval
		// The catch-up takes its window's floor before it reads the
		// skipped slots back (up to three tries of a read the plan may
		// delay), and the claim that follows is sent after that.
		var delay time.Duration
		for _, f := range p.Faults {
			delay = max(delay, f.Delay)
		}
		read := 3*(p.CallTimeout+delay) + 2*p.Retry
		loFloor, hiFloor := r.StartedAt.Add(-window+tol), r.StartedAt.Add(-window-tol-read)
		first := r.Fence == 1
		for _, o := range recs {
			first = first && !(o.Fence == 1 && o.StartedAt.Before(r.StartedAt))
		}
		if first {
			// The job's first tenure counts no slot before its acquisition
			// (sent between tol before its first run's claim and that claim).
			loFloor, hiFloor = later(loFloor, r.StartedAt), later(hiFloor, r.StartedAt.Add(-tol))
		}
		lo, hi := count(loFloor, prevLo), count(hiFloor, prevHi)
		if r.Missed < lo || r.Missed > hi {
			c.fail(VMissedCount, "slot %v (%s, fence %d): Missed=%d marked known, but %d to %d slots before it have no run (counted from %v and %v; the latest earlier run that may have existed: %v, that surely did: %v)",
				r.Slot.Sub(start), r.Status, r.Fence, r.Missed, lo, hi, loFloor.Sub(start), hiFloor.Sub(start), prevLo.Sub(start), prevHi.Sub(start))
		}
	}
}

// ofJob returns the elements of xs (calls of fn, IsLeader samples) whose
// job, as job reads it, is j.
func ofJob[T any](xs []T, job func(T) string, j string) []T {
	var out []T
	for _, x := range xs {
		if job(x) == j {
			out = append(out, x)
		}
	}
	return out
}

// callsOf returns the calls of fn for job j.
func callsOf(calls []fnCall, j string) []fnCall {
	return ofJob(calls, func(x fnCall) string { return x.job }, j)
}

// samplesOf returns the IsLeader samples of job j.
func samplesOf(samples []sample, j string) []sample {
	return ofJob(samples, func(x sample) string { return x.job }, j)
}

// jobName is the job being judged: the pool's job, or the one job.
func (c *checker) jobName() string {
	if c.job != "" {
		return c.job
	}
	return job
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func describeCalls(xs []fnCall) string {
	if len(xs) == 0 {
		return "fn never called"
	}
	var b strings.Builder
	b.WriteString("fn calls:")
	for _, x := range xs {
		fmt.Fprintf(&b, " r%d fence %d at %v", x.rep, x.fence, x.at)
		if x.dead {
			b.WriteString(" (its context already ended)")
		}
		fmt.Fprintf(&b, " returned %s;", x.result)
	}
	return strings.TrimSuffix(b.String(), ";")
}

// triggers judges the triggered runs, from what Admin reports of them at
// the end: a run claimed is not left running (trigger-final; clocks
// within the bound), a trigger is claimed once replicas led long enough
// after it (trigger-lost), and a finished run's fn saw the fence its item
// holds, once under NeverRerun (trigger-fence, every run).
func (c *checker) triggers(admin *dynamodb.Client, calls []fnCall, samples []sample, shutdown map[int]time.Duration) {
	p := c.p
	j := c.jobName()
	start := c.s.w.start
	adm, err := ddblease.NewAdmin(admin, table, func(o *ddblease.AdminOptions) { o.Operator = "checker" })
	if err != nil {
		c.fail(VSetup, "%v", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	type trig struct {
		t         ddblease.Trigger
		requested time.Duration // when the operator's Trigger returned it; -1 if it did not
		calls     []fnCall
	}
	byID := map[string]*trig{}
	var ids []string
	get := func(t ddblease.Trigger) *trig {
		if x, ok := byID[t.ID]; ok {
			return x
		}
		x := &trig{t: t, requested: -1}
		byID[t.ID] = x
		ids = append(ids, t.ID)
		return x
	}
	for _, o := range c.ops {
		if o.kind == OpTrigger && o.err == nil && o.trigger.Job == j {
			get(o.trigger).requested = o.returned
		}
	}
	for _, x := range calls {
		if x.trigger != "" {
			t := get(ddblease.Trigger{Job: j, ID: x.trigger, At: x.slotAt.UTC()})
			t.calls = append(t.calls, x)
		}
	}
	// Runs the operator's Trigger did not return (its answer lost) and fn
	// never saw: Admin.Runs lists every triggered run.
	all, err := adm.Runs(ctx, j, ddblease.RunRange{})
	if err != nil {
		c.fail(VSetup, "Admin.Runs: %v", err)
	}
	for _, r := range all {
		if r.Trigger != "" {
			get(ddblease.Trigger{Job: j, ID: r.Trigger, At: r.Slot})
		}
	}
	st, err := adm.Job(ctx, j)
	if err != nil {
		c.fail(VSetup, "Admin.Job: %v", err)
	}
	end := c.checkAt
	for _, t := range shutdown {
		end = min(end, t)
	}
	for _, id := range ids {
		x := byID[id]
		rec, ok, err := adm.TriggerRun(ctx, x.t)
		if err != nil {
			c.fail(VSetup, "Admin.TriggerRun %s: %v", x.t.RunID(), err)
			continue
		}
		name := fmt.Sprintf("trigger %s (slot %v)", id, x.t.At.Sub(start))
		if x.requested >= 0 {
			name += fmt.Sprintf(", requested at %v,", x.requested)
		}
		if !ok {
			if len(x.calls) > 0 {
				c.fail(VTriggerFence, "%s has no run item, but %s", name, describeCalls(x.calls))
				continue
			}
			if x.requested < 0 || p.wild() {
				continue
			}
			// Claimed by a leader that led for a heartbeat, a look at the
			// controls and a claim, after the request and after the
			// faults ended.
			from := max(x.requested, c.settled())
			need := 2*p.Heartbeat + 4*p.CallTimeout + 2*p.Retry + p.Work + p.Lease/2
			first, lastLed := time.Duration(-1), time.Duration(-1)
			for _, sm := range samples {
				if sm.leader && sm.at >= from && sm.at < end {
					if first < 0 || sm.at < first {
						first = sm.at
					}
					lastLed = max(lastLed, sm.at)
				}
			}
			if first >= 0 && lastLed-first >= need {
				c.fail(VTriggerLost, "%s was never claimed, though replicas led from %v to %v after it (faults ended at %v; %d requests pending in the lease item)",
					name, first, lastLed, p.FaultEnd, st.Lease.Control.Triggers)
			}
			continue
		}
		switch rec.Status {
		case ddblease.RunRunning:
			if !p.wild() {
				c.fail(VTriggerFinal, "%s left running: its item holds fence %d (%s, claims %d, started %v), the lease's fence is %d; %s",
					name, rec.Fence, rec.Owner, rec.Claims, rec.StartedAt.Sub(start), st.Lease.Fence, describeCalls(x.calls))
			}
		case ddblease.RunSucceeded, ddblease.RunFailed:
			// Under Rerun a later tenure may run it again: its latest
			// call is the one recorded.
			var top int64
			for _, y := range x.calls {
				top = max(top, y.fence)
				if !p.Rerun && y.fence != rec.Fence {
					c.fail(VTriggerFence, "%s is %s with fence %d (%s), but r%d's fn ran it with fence %d at %v (returned %s)",
						name, rec.Status, rec.Fence, rec.Owner, y.rep, y.fence, y.at, y.result)
				}
			}
			if p.Rerun && len(x.calls) > 0 && top != rec.Fence {
				c.fail(VTriggerFence, "%s is %s with fence %d (%s), but the latest fence its fn ran with is %d; %s",
					name, rec.Status, rec.Fence, rec.Owner, top, describeCalls(x.calls))
			}
		}
		if !p.Rerun && len(x.calls) > 1 {
			c.fail(VTriggerFence, "%s: fn called %d times under NeverRerun (item %s, fence %d); %s",
				name, len(x.calls), rec.Status, rec.Fence, describeCalls(x.calls))
		}
	}
}

// pauses judges the slots against the operator's Pause and Resume, by
// virtual time: from the first Pause that returned without error to the
// first Resume call made after it, no slot of that window (with a margin
// of MaxClockSkew each side; clocks within the bound of each other and of
// virtual time) gets fn called
// before the Resume, nor after it unless the Resume asked for the
// catch-up; no slot gets fn called, whatever its instant, once the pause
// has been in the table longer than a control read and a claim take
// (every run); and after a Resume with catchUp, the slots of the window
// get at most one fn call (catch-up-once; under Rerun, again by newer
// tenures when an older one left it running).
func (c *checker) pauses(calls []fnCall) {
	p := c.p
	start := c.s.w.start
	paused, resumed := time.Duration(-1), time.Duration(-1)
	catchUp := false
	for _, o := range c.ops {
		switch {
		case o.kind == OpPause && o.err == nil && paused < 0:
			paused = o.returned
		case o.kind == OpResume && paused >= 0 && resumed < 0:
			resumed, catchUp = o.called, o.catchUp
		}
	}
	if paused < 0 {
		return
	}
	if resumed < 0 {
		resumed = c.checkAt
	}
	var delay time.Duration
	for _, f := range p.Faults {
		delay = max(delay, f.Delay)
	}
	timed := !p.wild() && !p.stepped() && !p.offTrue()
	lo, hi := start.Add(paused+p.Skew), start.Add(resumed-p.Skew)
	late := paused + 2*p.CallTimeout + p.Skew + delay
	var after []fnCall
	for _, x := range calls {
		if x.trigger != "" {
			continue // triggers run while the job is paused (documented)
		}
		if at, ok := c.crashAt[x.rep]; ok && x.at >= at {
			continue
		}
		inWindow := x.slotAt.After(lo) && x.slotAt.Before(hi)
		switch {
		case x.at > late && x.at < resumed:
			c.fail(VPauseRespect, "slot %v fired on r%d (fence %d) at %v, %v after the Pause returned at %v (Resume called at %v): the pause was missed",
				x.slotAt.Sub(start), x.rep, x.fence, x.at, x.at-paused, paused, resumed)
		case inWindow && timed && x.at < resumed:
			c.fail(VPauseRespect, "slot %v fired on r%d (fence %d) at %v: the job was paused from %v (Pause returned) until %v (Resume called)",
				x.slotAt.Sub(start), x.rep, x.fence, x.at, paused, resumed)
		case inWindow && timed && !catchUp:
			c.fail(VPauseRespect, "slot %v, due while the job was paused (Pause returned at %v, Resume called at %v without catch-up), fired on r%d (fence %d) at %v",
				x.slotAt.Sub(start), paused, resumed, x.rep, x.fence, x.at)
		case inWindow && timed:
			after = append(after, x)
		}
	}
	if p.Rerun && len(after) > 1 {
		// Under Rerun, a newer tenure runs again a run an older one left
		// running (its outcome was not recorded): one slot, by rising
		// fences, is still one catch-up.
		again := true
		for i := 1; i < len(after); i++ {
			again = again && after[i].slotAt.Equal(after[0].slotAt) && after[i].fence > after[i-1].fence
		}
		if again {
			after = after[:1]
		}
	}
	if len(after) > 1 {
		c.fail(VCatchUpOnce, "after the Resume with catch-up at %v, %d runs of slots the pause covered: %s", resumed, len(after), describeSlots(after, start))
	}
}

func describeSlots(xs []fnCall, start time.Time) string {
	var parts []string
	for _, x := range xs {
		parts = append(parts, fmt.Sprintf("slot %v on r%d fence %d at %v", x.slotAt.Sub(start), x.rep, x.fence, x.at))
	}
	return strings.Join(parts, "; ")
}
