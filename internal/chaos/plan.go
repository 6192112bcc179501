package chaos

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Timing is the lease and schedule timing every replica of a run uses.
type Timing struct {
	Lease, Heartbeat, Retry, Skew, Drain, Call time.Duration
	Slot, Work                                 time.Duration
}

// DefaultTiming keeps a run short: a one-second lease. Drain is longer
// than a run takes with no fault: Work and four requests (claim, effect,
// finish, a retry), each answered within Call. On a loaded machine (two
// cores, race-built replicas, two plans at once) a 500 ms drain was
// overrun by a run whose every request was answered in time.
var DefaultTiming = Timing{
	Lease: time.Second, Heartbeat: 250 * time.Millisecond, Retry: 100 * time.Millisecond,
	Skew: 400 * time.Millisecond, Drain: time.Second, Call: 200 * time.Millisecond,
	Slot: 300 * time.Millisecond, Work: 150 * time.Millisecond,
}

// Action kinds of a plan step.
const (
	ActKill   = "kill"   // SIGKILL a replica; start a new one after Dur
	ActDeploy = "deploy" // start a new replica, then SIGTERM an old one
	ActPause  = "pause"  // SIGSTOP a replica for Dur (longer than a lease), then SIGCONT
	ActNet    = "net"    // set a replica's proxy faults for Dur
)

// Step is one fault at time At after the run starts. Target picks among
// the replicas alive then (modulo their number).
type Step struct {
	At     time.Duration
	Action string
	Target int
	Dur    time.Duration
	Faults Faults
}

// Plan is a run's whole fault schedule, drawn from its seed.
type Plan struct {
	Seed     uint64
	Wild     bool // clock offsets far beyond MaxClockSkew
	Replicas int  // started at once
	// Pool: each replica runs Pool.RunSchedule over Jobs jobs instead of
	// Lease.RunSchedule over one.
	Pool   bool
	Jobs   int
	Faulty time.Duration
	Quiet  time.Duration // after the faults, none
	Steps  []Step
	rng    *rand.Rand
}

// NewPlan draws a plan. In a wild plan clocks are offset by up to five
// leases; otherwise offsets and drift keep every pair of clocks within
// MaxClockSkew for the run.
func NewPlan(seed uint64, wild bool, t Timing) *Plan {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	p := &Plan{Seed: seed, Wild: wild, Replicas: 3 + rng.IntN(3), Faulty: 6 * t.Lease, Quiet: 4 * t.Lease, rng: rng}
	at := t.Lease + time.Duration(rng.Int64N(int64(t.Lease)))
	for at < p.Faulty {
		s := Step{At: at, Target: rng.IntN(8)}
		switch x := rng.IntN(10); {
		case x < 2:
			s.Action, s.Dur = ActKill, time.Duration(rng.Int64N(int64(t.Lease)))
		case x < 4:
			s.Action = ActDeploy
		case x < 6:
			// Pause the leader: it wakes up stale, mid-tick with luck.
			s.Action, s.Dur = ActPause, t.Lease+time.Duration(rng.Int64N(int64(2*t.Lease)))
			s.Target = 2 * rng.IntN(4)
		default:
			s.Action, s.Dur = ActNet, t.Lease/2+time.Duration(rng.Int64N(int64(2*t.Lease)))
			s.Faults = p.drawFaults(t)
		}
		p.Steps = append(p.Steps, s)
		at += t.Lease/2 + time.Duration(rng.Int64N(int64(t.Lease)))
	}
	// Pool mode is drawn apart from the faults, so that a seed's faults
	// are the same in either mode (SetPool forces it).
	prng := rand.New(rand.NewPCG(seed, 0x9001))
	p.SetPool(prng.IntN(3) == 0, t)
	p.Jobs = 4 + prng.IntN(5)
	return p
}

// SetPool sets whether the plan runs a pool, and its quiet phase to
// match. A pool's quiet phase lasts until the pool has settled (the last
// killed replica's session lapsed and seen so, a replica started as the
// faults end joined), its jobs moved and led (liveBounds), and three slots
// of every job more, to judge.
func (p *Plan) SetPool(on bool, t Timing) {
	p.Pool = on
	p.Quiet = 4 * t.Lease
	if !on {
		return
	}
	settled := p.Faulty + t.Lease/2
	for _, s := range p.Steps {
		if s.Action == ActKill {
			settled = max(settled, s.At+t.Call+t.Lease+2*t.Skew)
		}
	}
	slot := p.Timing(t).Slot
	p.Quiet = settled - p.Faulty + t.Call + t.Heartbeat + ViewLag(t) + PoolGapBound(t) + t.Lease + // liveBounds' from
		slot + t.Lease + 3*slot // the last slot judged ends a slot and a lease before the stop
}

// Timing is the timing the plan's replicas use: t, but in a pool each job
// has a slot every two Slots. A replica of a pool runs several jobs'
// slots at once, each run a Work and three or four requests long; on a
// loaded machine (two cores, race-built replicas, two plans at once) a
// run then took longer than Slot, and the next slot of its job was
// skipped as missed once the run ended.
func (p *Plan) Timing(t Timing) Timing {
	if p.Pool {
		t.Slot *= 2
	}
	return t
}

// JobNames names a run's jobs: one job, or a pool's.
func (p *Plan) JobNames() []string {
	if !p.Pool {
		return []string{"chaos"}
	}
	var jobs []string
	for i := range p.Jobs {
		jobs = append(jobs, fmt.Sprintf("job-%d", i+1))
	}
	return jobs
}

func (p *Plan) drawFaults(t Timing) Faults {
	var f Faults
	switch p.rng.IntN(5) {
	case 0:
		f.Drop = 0.3 + 0.5*p.rng.Float64()
	case 1:
		f.Reset = 0.3 + 0.5*p.rng.Float64()
	case 2:
		f.Error5xx = 0.3 + 0.5*p.rng.Float64()
	case 3:
		f.Throttle = 0.3 + 0.5*p.rng.Float64()
	default:
		f.Drop, f.Reset, f.Error5xx, f.Throttle = 0.1, 0.1, 0.1, 0.1
	}
	if p.rng.IntN(3) == 0 {
		f.Latency = time.Duration(p.rng.Int64N(int64(t.Call)))
	}
	return f
}

// Clock draws a new replica's clock: offset and drift.
func (p *Plan) Clock(t Timing) (time.Duration, int64) {
	if p.Wild {
		return time.Duration(p.rng.Int64N(int64(10*t.Lease))) - 5*t.Lease, p.rng.Int64N(100_001) - 50_000
	}
	// Offsets within ±0.4 Skew and drift within ±0.2%: over a run of
	// about 12 s two clocks stay within 0.8 Skew + 50 ms of each other,
	// inside the bound, and near enough to it that a takeover ignoring the
	// skew shows.
	return time.Duration(p.rng.Int64N(int64(t.Skew*8/10))) - t.Skew*4/10, p.rng.Int64N(4001) - 2000
}

// String lists the plan, for a failure report.
func (p *Plan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d wild=%v replicas=%d faulty=%v quiet=%v", p.Seed, p.Wild, p.Replicas, p.Faulty, p.Quiet)
	if p.Pool {
		fmt.Fprintf(&b, " pool of %d jobs", p.Jobs)
	}
	b.WriteString("\n")
	for _, s := range p.Steps {
		fmt.Fprintf(&b, "  %8v %-6s target=%d dur=%v %+v\n", s.At, s.Action, s.Target, s.Dur, s.Faults)
	}
	return b.String()
}
