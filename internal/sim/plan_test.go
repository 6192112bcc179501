package sim

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// FaultKind is what the network does to a request.
type FaultKind int

// The faults applied at a replica's transport.
const (
	FNone       FaultKind = iota
	FBlackHole            // no answer until the request's context ends; not applied
	FDropHang             // applied, then no answer until the context ends
	FDropReset            // applied, then the connection is reset
	FReset                // connection reset before the server saw it
	FDelay                // held Delay before the server sees it
	FSlowAnswer           // applied, answer held Delay
	F500                  // InternalServerError
	F503                  // ServiceUnavailable
	FThrottle             // ProvisionedThroughputExceeded / ThrottlingException
	FConflict             // TransactionConflict (writes only)
	nKinds
)

var kindNames = [...]string{"none", "blackhole", "drop-hang", "drop-reset", "reset", "delay", "slow-answer", "500", "503", "throttle", "txn-conflict"}

func (k FaultKind) String() string { return kindNames[k] }

// leader, as a replica, means the replica that leads when the window opens
// (none if no replica outside Clean leads then).
const leader = -2

// Fault is one fault window: requests of Rep (-1: every replica) whose
// operation matches Op ("" for all; "write" for writes) sent in [From, To)
// get Kind with probability P.
type Fault struct {
	Rep      int
	Op       string
	Kind     FaultKind
	P        float64
	From, To time.Duration
	Delay    time.Duration
}

// Clock is a replica's clock: offset at the start and rate.
type Clock struct {
	Offset time.Duration
	Rate   float64
}

// offsetAt is how far the clock reads from the simulation's time at el.
func (c Clock) offsetAt(el time.Duration) time.Duration {
	return c.Offset + time.Duration(float64(el)*(c.Rate-1))
}

// Step is a wall-clock step of By for Dur from At (monotonic unchanged).
type Step struct {
	Rep     int
	At, Dur time.Duration
	By      time.Duration
}

type window struct{ From, To time.Duration }

// Act is a user action or crash at a time.
type Act struct {
	Rep int
	At  time.Duration
	Dur time.Duration // pauses
}

// OpKind is an operator's call on the job (Admin).
type OpKind string

// The operator's calls.
const (
	OpTrigger OpKind = "trigger" // Admin.Trigger
	OpPause   OpKind = "pause"   // Admin.Pause, tried again on an error
	OpResume  OpKind = "resume"  // Admin.Resume, tried again until it is applied or refused
	OpRelease OpKind = "release" // Admin.Job, then Admin.ForceRelease with the fence read (no HolderDead)
)

// Op is one operator call at a time.
type Op struct {
	Kind    OpKind
	At      time.Duration
	CatchUp bool // OpResume: Resume's catchUp
}

// Plan is everything a seed decides.
type Plan struct {
	Seed     uint64
	N        int  // replicas
	Schedule bool // RunSchedule (else Run)

	Lease, Heartbeat, Retry, Skew, CallTimeout, Drain time.Duration
	Attempts                                          int // SDK RetryMaxAttempts (0: default)

	Interval time.Duration // Every(Interval)
	Window   time.Duration // CatchUpWindow, 0: default
	Rerun    bool
	Work     time.Duration // fn work per slot, or between effects under Run
	Effect   string        // "put", "update", "txn", "do" (Run); "commit", "idem", "slotput" (RunSchedule)
	FnError  float64       // probability a slot's fn returns an error

	Clocks  []Clock
	Steps   []Step
	Faults  []Fault
	Crashes []Act
	Pauses  []Act
	Resigns []Act    // Resign called on the handle while it may lead
	Panics  []Act    // fn panics at its first call after At; a supervisor restarts
	Double  int      // replica whose handle gets two concurrent Run calls; -1 none
	Clean   []int    // replicas kept free of faults (see clean)
	Tags    []string // the scenarios drawn, for the survey

	// The operator (drawOperator): its calls in time order, its clock
	// (Admin's Options.Now) and whether its network is the world's
	// (faults of Rep N and of every replica) or a clean one.
	Ops      []Op
	OpClock  Clock
	OpFaulty bool
	OpJob    string // under a pool of schedules, the job the calls name

	// The pool (drawPool): each replica runs Pool.Run over Jobs instead
	// of Lease.Run on one job; Joins are replicas whose first Run call is
	// made late (At), so that the others hand them their share.
	Pool  bool
	Jobs  []string
	Joins []Act

	FaultEnd time.Duration // every fault, action and wall step is over
	Quiet    time.Duration // fault-free time after FaultEnd before shutdown
}

func (p *Plan) end() time.Duration { return p.FaultEnd + p.Quiet }

// decide picks the fault for the n-th request of rep, op at d, from a hash
// of the seed so that it does not depend on other replicas' requests.
func (p *Plan) decide(rep int, op string, d time.Duration, n uint64, resolve func(fault int) int) Fault {
	u := p.draw(rep, op, n)
	for i, f := range p.Faults {
		if f.Rep == leader {
			f.Rep = resolve(i)
		}
		if f.Rep != -1 && f.Rep != rep || d < f.From || d >= f.To {
			continue
		}
		if f.Op == "write" && op != "PutItem" && op != "UpdateItem" && op != "TransactWriteItems" {
			continue
		}
		if f.Op != "" && f.Op != "write" && f.Op != op {
			continue
		}
		if u < f.P {
			return f
		}
		u = (u - f.P) / (1 - f.P + 1e-12)
	}
	return Fault{}
}

// draw returns a number in [0, 1) for the n-th request of rep, op. FNV-1a
// alone is not enough: the top bits of its hash barely change with the
// last characters hashed, so requests 10 to 99 would all draw about the
// same number. The splitmix64 finalizer spreads every bit of it.
func (p *Plan) draw(rep int, op string, n uint64) float64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%d/%s/%d", p.Seed, rep, op, n)
	z := h.Sum64()
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	z ^= z >> 31
	return float64(z>>11) / (1 << 53)
}

// wild reports whether the clocks ever differ by MaxClockSkew or more, or
// whether a rate is off by more than 2%.
func (p *Plan) wild() bool {
	for _, c := range p.Clocks {
		if c.Rate < 0.98 || c.Rate > 1.02 {
			return true
		}
	}
	end := p.end() + p.Lease*4
	for i, a := range p.Clocks {
		for _, b := range p.Clocks[i+1:] {
			for _, t := range []time.Duration{0, end} {
				da := a.Offset + time.Duration(float64(t)*(a.Rate-1))
				db := b.Offset + time.Duration(float64(t)*(b.Rate-1))
				if (da - db).Abs() >= p.Skew {
					return true
				}
			}
		}
	}
	return false
}

// offTrue reports whether a replica's clock is MaxClockSkew or more from
// virtual time during the run. Wild clocks can be within the bound of each
// other and yet all far from it: the pause checks, which judge the slots'
// instants against the operator's calls by virtual time, then cannot tell
// a slot fired before the pause from one fired in it.
func (p *Plan) offTrue() bool {
	end := p.end() + p.Lease*4
	for _, c := range p.Clocks {
		for _, t := range []time.Duration{0, end} {
			if (c.Offset + time.Duration(float64(t)*(c.Rate-1))).Abs() >= p.Skew {
				return true
			}
		}
	}
	return false
}

// stepped reports whether a wall step beyond MaxClockSkew happens.
func (p *Plan) stepped() bool {
	for _, s := range p.Steps {
		if s.By.Abs() >= p.Skew {
			return true
		}
	}
	return false
}

func pick[T any](r *rand.Rand, xs ...T) T { return xs[r.IntN(len(xs))] }

// newPlan draws a plan from seed.
func newPlan(seed uint64) *Plan {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	p := &Plan{Seed: seed, Double: -1}
	pr := p.poolStream()
	p.N = pick(r, 2, 2, 3, 3, 4)
	p.Schedule = r.Float64() < 0.6
	if p.Pool {
		p.Schedule = false // a pool runs Lease.Run for each job
	}
	p.Lease = pick(r, 1*time.Second, 2*time.Second, 2*time.Second, 5*time.Second, 10*time.Second)
	p.Heartbeat = time.Duration(float64(p.Lease) * pick(r, 1.0/3, 1.0/3, 0.2, 0.45))
	p.CallTimeout = time.Duration(float64(p.Heartbeat) * pick(r, 0.5, 0.5, 0.3, 0.95))
	p.Retry = time.Duration(float64(p.Lease) * pick(r, 0.025, 0.05, 0.1, 0.25))
	p.Skew = time.Duration(float64(p.Lease) * pick(r, 0.05, 0.1, 0.2))
	p.Drain = pick(r, time.Duration(0), p.Lease, 3*p.Lease)
	p.Attempts = pick(r, 0, 0, 1, 5)
	p.Interval = time.Duration(float64(p.Lease) * pick(r, 0.1, 0.25, 0.5, 1, 3))
	p.Window = pick(r, time.Duration(0), time.Duration(0), 20*p.Interval, 3*p.Lease+p.Interval)
	p.Rerun = r.Float64() < 0.3
	if p.Schedule {
		p.Work = time.Duration(float64(p.Interval) * pick(r, 0.0, 0.1, 0.4))
		p.Effect = pick(r, "commit", "commit", "idem", "slotput")
		if r.Float64() < 0.2 {
			p.FnError = 0.1
		}
	} else {
		p.Work = time.Duration(float64(p.Lease) * pick(r, 0.02, 0.1, 0.3))
		p.Effect = pick(r, "put", "update", "txn", "do")
		if p.Pool {
			// As many effects in all as one leader makes, spread over the jobs.
			p.Work *= time.Duration(len(p.Jobs))
		}
	}
	phase := time.Duration(float64(p.Lease) * pick(r, 3.0, 6, 10))

	// Clocks: within the bound (70%), else wild.
	p.Clocks = make([]Clock, p.N)
	wildClocks := r.Float64() < 0.3
	for i := range p.Clocks {
		if wildClocks {
			p.Clocks[i] = Clock{
				Offset: time.Duration((r.Float64()*2 - 1) * float64(pick(r, p.Skew*2, p.Lease, 3*p.Lease))),
				Rate:   pick(r, 1.0, 1.0, 0.9, 1.1, 0.97, 1.03),
			}
		} else {
			p.Clocks[i] = Clock{
				Offset: time.Duration((r.Float64()*2 - 1) * float64(p.Skew) * 0.4),
				Rate:   1 + (r.Float64()*2-1)*pick(r, 0.0, 0.0001, 0.001),
			}
		}
	}

	// Network faults.
	nf := pick(r, 0, 1, 2, 3, 4, 6, 8)
	ops := []string{"", "", "write", "UpdateItem", "GetItem", "TransactWriteItems", "BatchGetItem", "PutItem"}
	for range nf {
		from := time.Duration(r.Float64() * float64(phase))
		dur := time.Duration(float64(p.Lease) * pick(r, 0.1, 0.5, 1, 2, 4))
		f := Fault{
			Rep:  pick(r, -1, r.IntN(p.N), r.IntN(p.N)),
			Op:   pick(r, ops...),
			Kind: FaultKind(1 + r.IntN(int(nKinds)-1)),
			P:    pick(r, 0.1, 0.3, 0.7, 1.0),
			From: from, To: min(from+dur, phase),
		}
		if f.Kind == FDelay || f.Kind == FSlowAnswer {
			f.Delay = time.Duration(float64(p.CallTimeout) * pick(r, 0.1, 0.5, 0.9, 1.5))
		}
		p.Faults = append(p.Faults, f)
	}
	// Targeted shapes an unlucky network produces.
	if r.Float64() < 0.15 { // the leader's writes and reads hang (keeper blocked)
		from := time.Duration(r.Float64() * float64(phase) * 0.7)
		to := from + time.Duration(float64(p.Lease)*pick(r, 1.0, 2, 3))
		rep := pick(r, leader, leader, r.IntN(p.N))
		if r.Float64() < 0.5 {
			p.Faults = append(p.Faults, Fault{Rep: rep, Op: "UpdateItem", Kind: F500, P: 1, From: from, To: from + p.Heartbeat})
			from += p.Heartbeat
		}
		p.Tags = append(p.Tags, "hang")
		p.Faults = append(p.Faults, Fault{Rep: rep, Op: "UpdateItem", Kind: FBlackHole, P: 1, From: from, To: to},
			Fault{Rep: rep, Op: "GetItem", Kind: FBlackHole, P: 1, From: from, To: to})
	}
	if r.Float64() < 0.15 { // heartbeats land unanswered, read-backs slow
		from := time.Duration(r.Float64() * float64(phase) * 0.7)
		to := from + time.Duration(float64(p.Lease)*pick(r, 1.0, 2, 3))
		rep := pick(r, leader, leader, r.IntN(p.N))
		p.Tags = append(p.Tags, "lost-answers")
		p.Faults = append(p.Faults, Fault{Rep: rep, Op: "UpdateItem", Kind: pick(r, FDropHang, FDropReset), P: pick(r, 0.5, 1.0), From: from, To: to},
			Fault{Rep: rep, Op: "GetItem", Kind: FSlowAnswer, P: pick(r, 0.5, 1.0), From: from, To: to,
				Delay: time.Duration(float64(p.CallTimeout) * pick(r, 0.5, 0.9))})
	}
	if r.Float64() < 0.1 { // the leader's heartbeats throttled, frequent and fast, until the faults end
		p.Retry = p.Lease / 200
		p.Heartbeat = p.Lease / 100
		p.CallTimeout = p.Heartbeat / 2
		p.Attempts = 1
		p.Tags = append(p.Tags, "throttle")
		to := phase
		p.Faults = append(p.Faults, Fault{Rep: pick(r, leader, leader, r.IntN(p.N)), Op: "UpdateItem", Kind: FThrottle, P: 1,
			From: to - time.Duration(float64(p.Lease)*pick(r, 0.4, 0.5, 0.6)), To: to})
	}
	if p.Schedule && r.Float64() < 0.1 { // an outage over more than 100 slots
		from := time.Duration(r.Float64() * float64(phase) * 0.4)
		p.Interval = p.Lease / 50
		p.Tags = append(p.Tags, "outage")
		p.Work = min(p.Work, p.Interval/2)
		d := max(time.Duration(pick(r, 110, 150, 250))*p.Interval, 2*p.Lease)
		p.Faults = append(p.Faults, Fault{Rep: -1, Kind: FBlackHole, P: 1, From: from, To: from + d})
		if r.Float64() < 0.7 {
			p.Crashes = append(p.Crashes, Act{Rep: -1, At: max(from-time.Duration(r.Float64()*float64(p.Interval)), 0)})
		}
		phase = max(phase, from+d+p.Lease)
	}

	// Crashes (never all replicas), pauses.
	if r.Float64() < 0.25 {
		p.Crashes = append(p.Crashes, Act{Rep: r.IntN(p.N), At: time.Duration(r.Float64() * float64(phase))})
	}
	if len(p.Crashes) > 0 && len(p.Crashes) >= p.N {
		p.Crashes = p.Crashes[:p.N-1]
	}
	for range pick(r, 0, 0, 1, 2) {
		p.Pauses = append(p.Pauses, Act{Rep: r.IntN(p.N), At: time.Duration(r.Float64() * float64(phase)),
			Dur: time.Duration(float64(p.Lease) * pick(r, 0.2, 0.8, 1.5, 3))})
	}
	// Wall-clock steps.
	if r.Float64() < 0.12 {
		// Late in the faulty phase, so that what the step leaves behind
		// is still there when the faults end.
		dur := time.Duration(float64(p.Lease) * pick(r, 0.15, 0.5, 1))
		if p.Schedule {
			dur = max(dur, 2*p.Interval) // long enough for the runner to wake inside it
		}
		p.Steps = append(p.Steps, Step{Rep: pick(r, leader, leader, r.IntN(p.N)), At: max(phase-dur-time.Duration(r.Float64()*float64(p.Lease)), 0),
			Dur: dur, By: pick(r, 5*time.Second, 3*p.Lease, time.Hour, -3*p.Lease)})
	}
	// Adversarial users.
	if r.Float64() < 0.1 {
		rep := r.IntN(p.N)
		for range 3 {
			p.Resigns = append(p.Resigns, Act{Rep: rep, At: time.Duration(r.Float64() * float64(phase))})
		}
	}
	if r.Float64() < 0.1 {
		p.Panics = append(p.Panics, Act{Rep: r.IntN(p.N), At: time.Duration(r.Float64() * float64(phase))})
	}
	if r.Float64() < 0.08 {
		p.Double = r.IntN(p.N)
	}
	if p.Pool {
		// The pool's jobs are its own: no user of a pool calls Resign on
		// them or runs them twice, and a panic in fn would stop the
		// process (Lease.Run panics again, in the pool's goroutine).
		p.Resigns, p.Panics, p.Double = nil, nil, -1
		p.drawJoins(pr, phase)
		p.drawPoolSchedule(pr)
	}

	// A handle used by two goroutines of the user (Resign, two Run calls)
	// gets no faults: under synctest a goroutine waiting on the handle's
	// mutex, held across a request that waits for virtual time, would stop
	// virtual time for ever.
	for _, a := range p.Resigns {
		p.clean(a.Rep)
	}
	if p.Double >= 0 {
		p.clean(p.Double)
	}

	if len(p.Steps) > 0 {
		p.Tags = append(p.Tags, "step")
	}
	if len(p.Resigns) > 0 {
		p.Tags = append(p.Tags, "resign")
	}
	if len(p.Panics) > 0 {
		p.Tags = append(p.Tags, "panic")
	}
	if p.Double >= 0 {
		p.Tags = append(p.Tags, "double-run")
	}
	if len(p.Crashes) > 0 {
		p.Tags = append(p.Tags, "crash")
	}
	if len(p.Pauses) > 0 {
		p.Tags = append(p.Tags, "pause")
	}
	if p.wild() {
		p.Tags = append(p.Tags, "wild")
	}
	p.FaultEnd = phase
	for _, f := range p.Faults {
		p.FaultEnd = max(p.FaultEnd, f.To+f.Delay)
	}
	for _, a := range p.Pauses {
		p.FaultEnd = max(p.FaultEnd, a.At+a.Dur)
	}
	for _, s := range p.Steps {
		p.FaultEnd = max(p.FaultEnd, s.At+s.Dur)
	}
	p.Quiet = p.liveBound() + 2*p.Lease + 4*max(p.Interval, p.Heartbeat)
	if p.Pool {
		// Long enough for the spread: a crash's lease and membership to
		// lapse (settled), every job led, its moves done (spreadFrom),
		// and half a lease and four heartbeats of the split to judge.
		p.Quiet = p.poolLiveBound() + p.poolGapBound() + p.CallTimeout + p.Lease/2 + 2*p.Skew + 4*p.Heartbeat
		if len(p.Crashes) > 0 {
			p.Quiet += p.maxDelay() + p.CallTimeout + p.Lease + 2*p.Skew
		}
		if p.Schedule {
			// Slots of every job to judge once the jobs have settled.
			p.Quiet += 4*p.Interval + p.Work + 2*p.Skew + 2*p.CallTimeout
		}
		p.Tags = append(p.Tags, "pool")
	}
	p.drawOperator(phase)
	return p
}

// poolStream draws from a stream of its own whether the seed runs a pool
// (about 20% of the seeds, never one of foundSeeds that replays a path
// found in a single lease) and its jobs (3 to 6), so that every other seed
// draws everything as it did before pools existed. It returns the stream
// for the rest of the pool's draws (drawJoins).
func (p *Plan) poolStream() *rand.Rand {
	r := rand.New(rand.NewPCG(p.Seed^0x706f6f6c6a6f6273, p.Seed*0x9fb21c651e98df25+3))
	if r.Float64() >= 0.2 || slices.ContainsFunc(foundSeeds, func(f foundSeed) bool { return f.seed == p.Seed }) {
		return r
	}
	p.Pool = true
	for i := range 3 + r.IntN(4) {
		p.Jobs = append(p.Jobs, fmt.Sprintf("job-%d", i))
	}
	return r
}

// drawPoolSchedule makes half the pools run Pool.RunSchedule, each job
// on Every(Interval), with a schedule's work and effects. A pool's slots
// come no more often than every quarter lease, and a pool under the
// throttle shape (a heartbeat of a hundredth of the lease) runs Pool.Run:
// every job's run items share the table with the pool's member items,
// and the simulated server reads the whole table for each renewal's
// Query of the members, so that short slots or frequent renewals would
// cost a seed seconds to tens of seconds.
func (p *Plan) drawPoolSchedule(r *rand.Rand) {
	if r.Float64() >= 0.5 || p.Heartbeat <= p.Lease/100 {
		return
	}
	p.Schedule = true
	p.Interval = max(p.Interval, p.Lease/4)
	p.Window = pick(r, time.Duration(0), time.Duration(0), 20*p.Interval, 3*p.Lease+p.Interval)
	p.Work = time.Duration(float64(p.Interval) * pick(r, 0.0, 0.1, 0.4))
	p.Effect = pick(r, "commit", "commit", "idem", "slotput")
	p.FnError = 0
	if r.Float64() < 0.2 {
		p.FnError = 0.1
	}
	p.Tags = append(p.Tags, "schedule")
}

// drawJoins makes some replicas of a pool (never r0) call Run late, within
// the first 80% of the faulty phase, so that the ones already running hand
// them their share.
func (p *Plan) drawJoins(r *rand.Rand, phase time.Duration) {
	for i := 1; i < p.N; i++ {
		if r.Float64() < 0.3 {
			p.Joins = append(p.Joins, Act{Rep: i, At: time.Duration(r.Float64() * 0.8 * float64(phase))})
		}
	}
	if len(p.Joins) > 0 {
		p.Tags = append(p.Tags, "join")
	}
}

// jobs returns the jobs the replicas run: the pool's, or the one job.
func (p *Plan) jobs() []string {
	if p.Pool {
		return p.Jobs
	}
	return []string{job}
}

// joinAt returns when rep first calls Run (0 unless it joins late).
func (p *Plan) joinAt(rep int) time.Duration {
	for _, a := range p.Joins {
		if a.Rep == rep {
			return a.At
		}
	}
	return 0
}

// maxDelay is the longest delay of a fault of the plan.
func (p *Plan) maxDelay() time.Duration {
	var d time.Duration
	for _, f := range p.Faults {
		d = max(d, f.Delay)
	}
	return d
}

// opJob is the job the operator's calls name.
func (p *Plan) opJob() string {
	if p.OpJob != "" {
		return p.OpJob
	}
	return job
}

// opRep is the operator's number in the fault plan: its faults have Rep
// opRep; faults of every replica (Rep -1) reach it too when OpFaulty.
func (p *Plan) opRep() int { return p.N }

// drawOperator draws the operator's calls from a stream of its own, so
// that a seed draws everything else as it did before operators existed,
// and a seed without an operator runs as it did then. About 40% of the
// seeds have an operator. Under RunSchedule it triggers runs, pauses and
// resumes the schedule (with or without the catch-up) and sometimes
// releases the lease by force; under Run it releases the lease. Under a
// pool of schedules its calls name one of the jobs (OpJob); a pool of
// Run has no operator. Every
// call is made at least a lease before the phase of faults ends (a
// release two leases before it), and the operator's own faults end
// by then too, so that FaultEnd and the quiet period are the plan's
// as before and a Resume retried after a fault lands before the checks
// of the quiet period start.
func (p *Plan) drawOperator(phase time.Duration) {
	r := rand.New(rand.NewPCG(p.Seed^0x6f70657261746f72, p.Seed*0x2545f4914f6cdd1d+1))
	if r.Float64() >= 0.4 || p.Pool && !p.Schedule {
		return // the operator's calls name one job: under a pool, only of schedules
	}
	if p.Pool {
		p.OpJob = p.Jobs[r.IntN(len(p.Jobs))]
	}
	last := phase - p.Lease
	between := func(lo, hi time.Duration) time.Duration {
		if hi <= lo {
			return lo
		}
		return lo + time.Duration(r.Float64()*float64(hi-lo))
	}
	// Most calls land where the plan already hurts: just after a fault
	// window opens, or just before a crash, so that the run they start
	// meets the faults (lost claims, tenures ending during the run).
	hurt := func(lo, hi time.Duration) time.Duration {
		if r.Float64() < 0.6 && len(p.Faults)+len(p.Crashes) > 0 {
			var t time.Duration
			if i := r.IntN(len(p.Faults) + len(p.Crashes)); i < len(p.Faults) {
				f := p.Faults[i]
				t = f.From + time.Duration(r.Float64()*float64(min(f.To-f.From, p.Lease)))
			} else {
				t = p.Crashes[i-len(p.Faults)].At - time.Duration(r.Float64()*float64(p.Lease))
			}
			if t >= lo && t <= hi {
				return t
			}
		}
		return between(lo, hi)
	}
	p.OpClock = Clock{Offset: time.Duration((r.Float64()*2 - 1) * float64(p.Skew) * 0.4), Rate: 1}
	if p.Schedule {
		for range pick(r, 0, 1, 1, 2, 3) {
			p.Ops = append(p.Ops, Op{Kind: OpTrigger, At: hurt(p.Lease, last)})
		}
		if r.Float64() < 0.6 {
			from := hurt(p.Lease/2, last-p.Lease)
			d := max(time.Duration(pick(r, 2.5, 4, 8)*float64(p.Interval)), p.Lease)
			to := min(from+d, last)
			if to > from {
				p.Ops = append(p.Ops, Op{Kind: OpPause, At: from}, Op{Kind: OpResume, At: to, CatchUp: r.Float64() < 0.5})
			}
		}
	}
	if !p.Schedule || r.Float64() < 0.4 {
		for range pick(r, 1, 1, 2) {
			p.Ops = append(p.Ops, Op{Kind: OpRelease, At: hurt(p.Lease, phase-2*p.Lease)})
		}
	}
	if len(p.Ops) == 0 {
		return
	}
	sortActs(p.Ops, func(o Op) time.Duration { return o.At })
	// Targeted shapes: the leader's claims and finishes (transactions)
	// lose their answers or hang from a trigger on, or from just before a
	// pause, and sometimes its heartbeats too, so that the tenure ends
	// during the run.
	for _, o := range p.Ops {
		if o.Kind != OpTrigger && o.Kind != OpPause || r.Float64() >= 0.5 {
			continue
		}
		from := o.At
		if o.Kind == OpPause {
			from = max(o.At-time.Duration(r.Float64()*float64(p.Interval)), 0)
		}
		to := min(from+time.Duration(float64(p.Lease)*pick(r, 0.5, 1, 2)), last)
		if to <= from {
			continue
		}
		kind := pick(r, FDropHang, FDropReset, FBlackHole, F500)
		p.Faults = append(p.Faults, Fault{Rep: leader, Op: "TransactWriteItems", Kind: kind, P: pick(r, 0.5, 1.0), From: from, To: to})
		if r.Float64() < 0.4 {
			p.Faults = append(p.Faults, Fault{Rep: leader, Op: "UpdateItem", Kind: FBlackHole, P: 1,
				From: from + time.Duration(r.Float64()*float64(p.Heartbeat)), To: to})
		}
		if tag := "op-" + string(o.Kind) + "-hurt"; !slices.Contains(p.Tags, tag) {
			p.Tags = append(p.Tags, tag)
		}
	}
	if r.Float64() < 0.5 {
		p.OpFaulty = true
		for range pick(r, 1, 1, 2) {
			from := between(0, last)
			f := Fault{Rep: p.opRep(), Kind: FaultKind(1 + r.IntN(int(nKinds)-1)), P: pick(r, 0.3, 0.7, 1.0),
				From: from, To: min(from+time.Duration(float64(p.Lease)*pick(r, 0.5, 1, 2)), last)}
			if f.Kind == FDelay || f.Kind == FSlowAnswer {
				f.Delay = min(time.Duration(float64(p.CallTimeout)*pick(r, 0.5, 1.5)), phase-f.To)
			}
			p.Faults = append(p.Faults, f)
		}
	}
	p.Tags = append(p.Tags, "operator")
}

// clean takes rep out of every fault, pause, crash and wall step.
func (p *Plan) clean(rep int) {
	p.Clean = append(p.Clean, rep)
	var fs []Fault
	for _, f := range p.Faults {
		switch f.Rep {
		case rep:
		case -1:
			for i := range p.N {
				if i != rep {
					g := f
					g.Rep = i
					fs = append(fs, g)
				}
			}
		default:
			fs = append(fs, f)
		}
	}
	p.Faults = fs
	drop := func(xs []Act) []Act {
		var out []Act
		for _, a := range xs {
			if a.Rep != rep {
				out = append(out, a)
			}
		}
		return out
	}
	p.Pauses, p.Crashes = drop(p.Pauses), drop(p.Crashes)
	var st []Step
	for _, s := range p.Steps {
		if s.Rep != rep {
			st = append(st, s)
		}
	}
	p.Steps = st
}

// liveBound is how long after the faults end a leader must be leading:
// the lease lapses (LeaseDuration after the last write, which was sent before
// the faults ended), a standby sees it MaxClockSkew old on a clock up to
// MaxClockSkew off, polls within RetryInterval, and its write and read take a
// round trip each (bounded by CallTimeout).
func (p *Plan) liveBound() time.Duration {
	return p.Lease + 2*p.Skew + p.Retry + 2*p.CallTimeout + p.Lease/20
}

// gapBound bounds a leaderless gap that begins after the faults ended: a
// tenure that could not be renewed in time ends at its deadline, a margin
// before its expiry, and a standby takes over as in liveBound.
func (p *Plan) gapBound() time.Duration {
	return p.Lease/10 + 2*p.Skew + p.Retry + 2*p.CallTimeout + p.Lease/20
}

// viewLag bounds, once the faults are over, how long after a change of the
// pool's item (a renewal that lands, a membership whose expiry passes)
// every live replica's view of the members shows it: its next renewal,
// sent a HeartbeatInterval after the last one was sent (as a lease's
// heartbeat), or once that one's answer came, which may have been sent
// into the faults and waited its CallTimeout; and an expiry is judged on
// each reader's clock, up to 2*MaxClockSkew apart from the writer's and
// from each other's.
func (p *Plan) viewLag() time.Duration {
	return p.Heartbeat + p.CallTimeout + 2*p.Skew
}

// poolLiveBound is how long after the faults end each job of a pool must
// be led: the later of two paths.
//   - A tenure lost with its replica's membership (a crash, a replica cut
//     off by the faults, which leads nothing once it could not renew its
//     membership for a lease): the lease lapses as in liveBound, and the
//     membership, renewed no later than the lease, is seen gone by the
//     job's new assignee within a view lag of its expiry, which then takes
//     the lease as a standby.
//   - A replica whose membership lapsed during the faults (or which joined
//     during them) renews within a CallTimeout and a heartbeat of their
//     end; the others see it within a view lag; the former assignee of a
//     job it gets resigns (a CallTimeout), and it takes the lease as a
//     standby (a RetryInterval, a read and a write), with the margin
//     liveBound has (LeaseDuration/20).
//
// Where a replica's wall clock is stepped ahead, the lapse path waits
// twice (seed 332471): a crashed replica whose clock was ahead when it
// last wrote left a membership expiry and lease expiries too far out, so
// the job's new assignee sees the membership gone only by watching it
// unchanged for a lease (as in liveBound), and only then, once the job is
// assigned to it, starts watching its lease as a standby does (docs/pool.md:
// a job waits for its replica to be seen gone, then for its lease).
func (p *Plan) poolLiveBound() time.Duration {
	lapse := p.liveBound() + p.viewLag()
	if p.stepped() {
		lapse += p.liveBound()
	}
	rejoin := p.CallTimeout + p.Heartbeat + p.viewLag() + p.CallTimeout + p.Retry + 2*p.CallTimeout + p.Lease/20
	return max(lapse, rejoin)
}

// poolGapBound bounds a job's leaderless gap after the faults ended: a
// tenure that ends because the pool moved its job (a member joined, left,
// or was seen gone) is resigned (a CallTimeout) and taken by the new
// assignee, whose view may show the move up to a view lag after the
// former's did; a tenure that ends otherwise is followed as in gapBound.
func (p *Plan) poolGapBound() time.Duration {
	return p.gapBound() + p.viewLag() + p.CallTimeout
}

func (p *Plan) String() string {
	var b strings.Builder
	mode := "Run"
	if p.Pool {
		mode = fmt.Sprintf("Pool.Run(%d jobs %v)", len(p.Jobs), p.Jobs)
	}
	if p.Schedule {
		mode = fmt.Sprintf("RunSchedule(Every(%v), window=%v, rerun=%v, fnError=%v)", p.Interval, p.Window, p.Rerun, p.FnError)
		if p.Pool {
			mode = fmt.Sprintf("Pool.RunSchedule(%d jobs %v, Every(%v), window=%v, rerun=%v, fnError=%v)",
				len(p.Jobs), p.Jobs, p.Interval, p.Window, p.Rerun, p.FnError)
		}
	}
	fmt.Fprintf(&b, "seed %d: %d replicas, %s, effect=%s work=%v %v\n", p.Seed, p.N, mode, p.Effect, p.Work, p.Tags)
	fmt.Fprintf(&b, "  lease=%v heartbeat=%v retry=%v skew=%v callTimeout=%v drain=%v sdkAttempts=%d\n",
		p.Lease, p.Heartbeat, p.Retry, p.Skew, p.CallTimeout, p.Drain, p.Attempts)
	fmt.Fprintf(&b, "  clocks (wild=%v, stepped=%v):", p.wild(), p.stepped())
	for i, c := range p.Clocks {
		fmt.Fprintf(&b, " r%d{%v x%.4f}", i, c.Offset, c.Rate)
	}
	b.WriteString("\n")
	for _, s := range p.Steps {
		fmt.Fprintf(&b, "  wall step %s at %v for %v by %v\n", repName(s.Rep), s.At, s.Dur, s.By)
	}
	for _, f := range p.Faults {
		who := repName(f.Rep)
		if f.Rep == p.opRep() {
			who = "operator"
		}
		fmt.Fprintf(&b, "  fault %s op=%q %s p=%.1f [%v, %v) delay=%v\n", who, f.Op, f.Kind, f.P, f.From, f.To, f.Delay)
	}
	for _, a := range p.Crashes {
		if a.Rep < 0 {
			fmt.Fprintf(&b, "  crash the leader at %v\n", a.At)
		} else {
			fmt.Fprintf(&b, "  crash r%d at %v\n", a.Rep, a.At)
		}
	}
	for _, a := range p.Pauses {
		fmt.Fprintf(&b, "  pause r%d at %v for %v\n", a.Rep, a.At, a.Dur)
	}
	for _, a := range p.Resigns {
		fmt.Fprintf(&b, "  Resign on r%d at %v\n", a.Rep, a.At)
	}
	for _, a := range p.Panics {
		fmt.Fprintf(&b, "  fn panics on r%d after %v (supervisor restarts)\n", a.Rep, a.At)
	}
	if p.Double >= 0 {
		fmt.Fprintf(&b, "  two Run calls on r%d's handle\n", p.Double)
	}
	for _, a := range p.Joins {
		fmt.Fprintf(&b, "  r%d joins the pool at %v\n", a.Rep, a.At)
	}
	if len(p.Ops) > 0 {
		net := "a clean network"
		if p.OpFaulty {
			net = fmt.Sprintf("the world's network (faults of r%d and of all)", p.opRep())
		}
		on := ""
		if p.OpJob != "" {
			on = " on " + p.OpJob
		}
		fmt.Fprintf(&b, "  operator%s (clock %v, %s):", on, p.OpClock.Offset, net)
		for _, o := range p.Ops {
			fmt.Fprintf(&b, " %s at %v", o.Kind, o.At)
			if o.Kind == OpResume {
				fmt.Fprintf(&b, " (catchUp=%v)", o.CatchUp)
			}
		}
		b.WriteString("\n")
	}
	if p.Pool {
		fmt.Fprintf(&b, "  faults end %v, quiet until %v (pool live bound %v, pool gap bound %v)", p.FaultEnd, p.end(), p.poolLiveBound(), p.poolGapBound())
	} else {
		fmt.Fprintf(&b, "  faults end %v, quiet until %v (live bound %v, gap bound %v)", p.FaultEnd, p.end(), p.liveBound(), p.gapBound())
	}
	return b.String()
}

func repName(rep int) string {
	switch rep {
	case -1:
		return "all"
	case leader:
		return "leader"
	}
	return fmt.Sprintf("r%d", rep)
}

// TestDrawsAreSpread checks the fault draws of consecutive requests: a
// fault of probability p must hit about a fraction p of them, in streaks
// no longer than chance makes likely.
func TestDrawsAreSpread(t *testing.T) {
	for _, seed := range []uint64{1, 131741, 1 << 40} {
		p := &Plan{Seed: seed}
		for rep := range 3 {
			for _, op := range []string{"UpdateItem", "BatchGetItem"} {
				hits, streak, longest, close := 0, 0, 0, 0
				prev := -1.0
				for n := range uint64(2000) {
					u := p.draw(rep, op, n)
					if u < 0 || u >= 1 {
						t.Fatalf("seed %d %s r%d request %d: draw %v outside [0, 1)", seed, op, rep, n, u)
					}
					if u < 0.7 {
						hits++
						streak++
						longest = max(longest, streak)
					} else {
						streak = 0
					}
					if math.Abs(u-prev) < 0.01 {
						close++
					}
					prev = u
				}
				// p = 0.7 over 2,000 draws: 1,400 ± 20 expected; a streak
				// of 50 has odds below 1 in 10^4 here.
				if hits < 1300 || hits > 1500 || longest >= 50 || close > 100 {
					t.Errorf("seed %d %s r%d: %d of 2000 draws below 0.7, longest streak %d, %d consecutive pairs within 0.01 (about 40 expected)",
						seed, op, rep, hits, longest, close)
				}
			}
		}
	}
}
