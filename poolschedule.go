package ddblease

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"
)

// This file owns Pool.RunSchedule: the schedules of a pool's jobs, run
// from one timer for the whole pool. A held job between two steps of its
// schedule is a value in the timer's heap: no goroutine waits for it, and
// its session (session.go) renews it with every other job, so that it
// makes no request either. Each step is RunSchedule's own (runner.step:
// the operator's requests, then the slot due, through the one run
// protocol, runner.execute), run on a goroutine of its own.

// JobSchedules gives the schedule of each job of a pool (Pool.RunSchedule).
type JobSchedules func(job string) Schedule

// AllJobs gives every job of a pool the same schedule.
func AllJobs(s Schedule) JobSchedules { return func(string) Schedule { return s } }

// RunSchedule runs this replica's share of the pool's jobs, each on its
// schedule (scheds), as Lease.RunSchedule runs one job: it claims each
// slot once under the job's fence, fires fn with the run, records the
// outcome, and applies the catch-up rule, the pause, the triggers and the
// RerunPolicy of opts, the same for every job. The pool spreads the jobs
// over its replicas, moves them, and stops, as Run does (its documentation
// says how); a job handed over drains its running firing, if any, and is
// resigned.
//
// A job this replica holds costs, between its slots, no goroutine and no
// request: its session's renewal (one write per replica per
// HeartbeatInterval) keeps it, and one timer for the whole pool wakes it
// for its next slot, or when an operator's change reaches it through the
// session (Admin's Pause, Resume, Trigger, RequestResign and ForceRelease,
// noticed at the session's next renewal). Each step of a job runs on a
// goroutine of its own; firings of different jobs run at once.
//
// RunSchedule returns nil when ctx ends, once every job has been drained
// and resigned; an error naming the job when its schedule misbehaves or fn
// panics (a *PanicError: the run is recorded failed, the pool stops);
// and, as Run does, an error that retrying the membership cannot mend.
// fn's errors are recorded in the runs, not returned. A job whose schedule
// has no further slot stays held, and idle. scheds must give every job a
// valid schedule; equivalent on every replica.
func (p *Pool) RunSchedule(ctx context.Context, scheds JobSchedules, fn func(ctx context.Context, job string, run *JobRun) error,
	optFns ...func(*JobOptions)) error {
	if scheds == nil || fn == nil {
		return invalid("pool %q: RunSchedule: scheds and fn must not be nil", p.name)
	}
	o, err := newJobOptions(optFns)
	if err != nil {
		return err
	}
	// One function for every job: the run names its job.
	jobFn := func(ctx context.Context, run *JobRun) error { return fn(ctx, run.Job(), run) }
	// The runners, in the order of p.jobs (sorted): one allocation for
	// them all.
	runners := make([]runner, len(p.jobs))
	for i, job := range p.jobs {
		sched := scheds(job)
		if err := checkSchedule(sched); err != nil {
			return fmt.Errorf("pool %q: RunSchedule: job %q: %w", p.name, job, err)
		}
		if _, err := nextSlot(sched, p.opts.Now()); err != nil {
			return fmt.Errorf("pool %q: RunSchedule: job %q: %w", p.name, job, err)
		}
		l := &p.leases[i]
		runners[i] = runner{l: l, sched: sched, fn: jobFn, o: &o, looked: *l.born}
	}
	s := &poolScheduler{}
	// A job's first run on this replica lives in one block with the
	// others' (so that a pool at rest is few allocations, not one a job
	// among a burst's garbage); one started again has its own.
	block := make([]scheduledJob, len(p.jobs))
	return p.run(ctx, func(r *poolRun, i int) *jobRun {
		j := &block[i]
		if j.s != nil {
			j = new(scheduledJob)
		}
		*j = scheduledJob{s: s, r: &runners[i], l: &p.leases[i], pr: r, index: -1}
		j.tenureWatch.f, j.jobWatch.f = j.wake, j.handOver
		j.run.init()
		if err := j.l.camp.enter(j.l, &r.runCtx); err != nil { // set once, before any job starts
			if errors.As(err, new(endedBeforeRun)) {
				err = nil // started as the pool stopped or handed it over: nothing attempted
			}
			go j.finish(err)
			return &j.run
		}
		j.entered = true
		j.l.ctl.watchFunc(j.controlsChanged)
		j.pr.p.withToken(j.campaign)
		return &j.run
	})
}

// scheduledJob is one job of Pool.RunSchedule on this replica, from its
// start to its hand-over or the pool's stop: it campaigns for the lease
// (on a goroutine, from its turn for a first attempt), then steps its
// schedule, each step on a goroutine of its own, while its tenure lasts;
// when the tenure ends it campaigns again, unless the job's run in the
// pool (run) ended.
//
// Between its steps a held job keeps two watches (its tenure's end, its
// hand-over) and no keeper (the session's notes reach its term's
// noticeControl, which calls resignRequested): its leader context
// is made by the first step that needs one, and kept for the rest of the
// tenure only once fn was given it.
type scheduledJob struct {
	s   *poolScheduler
	r   *runner
	l   *Lease
	run jobRun // ends when the pool hands the job over or stops
	pr  *poolRun

	// Set as a tenure begins, before its first step; read by the steps.
	t *term
	// The watches on the tenure's end (it wakes the job) and on run's
	// end (the hand-over), kept in the job and set from lead to
	// stopWatching (watching), so that a tenure's begin allocates none.
	watching    bool
	tenureWatch endWatch
	jobWatch    endWatch

	// entered: the job's campaign on the lease (campaignSlot.enter)
	// began; it lasts from the job's start to its run's end
	// (campaignSlot.leave).
	entered bool
	first   bool // the tenure's first step: the runner begins it
	handed  bool // fn was given the leader context: it is kept until the tenure ends

	// Guarded by s.mu.
	at      time.Time // the next step, by the runtime's clock; zero: none
	index   int       // in s.heap; -1 when not in it
	drained *time.Timer
	// leader is fn's context, made from the tenure's (it ends with the
	// tenure); nil until a step needs it, and again after a step that
	// did not give it to fn. stop, once set, ends it before the tenure:
	// the hand-over, or an operator's resign request.
	leader       context.Context
	cancelLeader context.CancelCauseFunc
	stop         error
	holding      bool // in a tenure (from lead to stopWatching): only then is a step started
	busy         bool // a step is running
	again        bool // woken while a step ran: step again at once
	look         bool // the operator controls changed: read them at the next step
}

// campaign waits for the lease, then begins a tenure; it ends the job's
// run when the run ends first. It runs once the pool gives it a turn for
// its first attempt (token; Pool.withToken). Its context lasts as long as
// it does.
func (j *scheduledJob) campaign(token func()) {
	ctx, cancel := j.run.ends.derive(j.pr.runCtx)
	t, failing, err := j.l.acquireWith(ctx, token)
	cancel(nil)
	if err != nil {
		if j.run.ends.why() != nil && !failing {
			err = nil
		}
		j.finish(err)
		return
	}
	j.lead(t)
}

// lead begins tenure t: the watches on its end and on the job's
// hand-over, the term's call on a resign request, and a first step
// at once.
func (j *scheduledJob) lead(t *term) {
	j.t, j.first, j.handed = t, true, false
	t.l.mu.Lock()
	t.onResign = j // the session's notes reach it
	t.l.mu.Unlock()
	j.s.mu.Lock()
	j.leader, j.cancelLeader, j.stop = nil, nil, nil
	j.s.mu.Unlock()
	// A watch that fires at once (the tenure or the run already over) wakes
	// nothing yet: the job is holding, and may step, once both are set.
	t.ends.watch(&j.tenureWatch)
	j.run.ends.watch(&j.jobWatch)
	j.watching = true
	j.s.mu.Lock()
	j.holding = true
	j.s.mu.Unlock()
	j.s.wake(j)
}

// wake asks for a step at once (poolScheduler.wake).
func (j *scheduledJob) wake() { j.s.wake(j) }

// handOver is called when the run ends: the pool handed the job over, or
// stopped. The job is drained, then resigned.
func (j *scheduledJob) handOver() {
	j.s.drainBy(j, j.l.opts.DrainTimeout)
	j.stopLeading(fmt.Errorf("ddblease: pool: handing job %q over: %w", j.l.job, j.run.ends.why()))
}

// resignRequested is the term's call (onResign) when an operator asked
// the tenure to resign: the job is drained, declined and handed over.
func (j *scheduledJob) resignRequested() {
	j.stopLeading(fmt.Errorf("%w: fence %d", ErrResignRequested, j.t.fence))
	j.pr.p.decline(j.l.job)
}

// stopLeading ends the job's lead in this tenure with cause (the first
// cause given stands): the leader context, if one was made, and the
// tenure at the next step, which is asked for at once.
func (j *scheduledJob) stopLeading(cause error) {
	j.s.mu.Lock()
	if j.stop == nil {
		j.stop = cause
	}
	cause, cancel := j.stop, j.cancelLeader
	j.s.mu.Unlock()
	if cancel != nil {
		cancel(cause)
	}
	j.s.wake(j)
}

// leaderContext returns the leader context for a step, made if the
// tenure has none; ok is false once the lead is over: the tenure ended,
// or the job's lead was stopped (stopLeading).
func (j *scheduledJob) leaderContext() (ctx context.Context, ok bool) {
	j.s.mu.Lock()
	defer j.s.mu.Unlock()
	if j.stop != nil || !j.t.holds() {
		return nil, false
	}
	if j.leader == nil {
		j.leader, j.cancelLeader = j.t.derive()
	}
	return j.leader, true
}

// dropLeader forgets the leader context after a step, while fn was never
// given it: no one else holds it, and a held job between its steps keeps
// none.
func (j *scheduledJob) dropLeader() {
	j.s.mu.Lock()
	cancel := j.cancelLeader
	j.leader, j.cancelLeader = nil, nil
	j.s.mu.Unlock()
	if cancel != nil {
		cancel(nil)
	}
}

// controlsChanged is called when a note showed the operator controls
// changed: the next step reads them, at once.
func (j *scheduledJob) controlsChanged() {
	j.s.mu.Lock()
	j.look = true
	j.s.mu.Unlock()
	j.s.wake(j)
}

// step runs one step of the schedule, on its own goroutine, and tells the
// scheduler when the next is due; once the lead is over (the tenure
// ended, or stopLeading) it ends the tenure instead.
func (j *scheduledJob) step() {
	done := false
	defer func() {
		if done {
			return
		}
		// fn panicked (the run is recorded failed), or called
		// runtime.Goexit: the tenure ends, and the pool stops.
		var err error = fmt.Errorf("%w: job %q", errGoexit, j.l.job)
		if v := recover(); v != nil {
			pe, ok := v.(*PanicError)
			if !ok {
				pe = &PanicError{Value: v, Stack: debug.Stack()}
			}
			err = pe
		}
		j.t.endAbnormally(j.pr.runCtx, fmt.Errorf("%w: %q fence %d: the job's function did not return: %v", ErrLost, j.l.job, j.t.fence, err))
		j.stopWatching()
		j.finish(err)
	}()
	ctx, ok := j.leaderContext()
	if !ok {
		done = true
		j.end()
		return
	}
	j.r.called = false
	if j.first {
		j.first = false
		j.r.begin(ctx, j.t)
	}
	j.s.mu.Lock()
	if j.look {
		j.look, j.r.ctl.look = false, true
	}
	j.s.mu.Unlock()
	wait, ok, err := j.r.step(ctx, j.t)
	switch {
	case err != nil:
		done = true
		rerr := j.t.resignRetrying(j.pr.runCtx, fmt.Errorf("%w: %q fence %d: the schedule failed", ErrLost, j.l.job, j.t.fence))
		j.stopWatching()
		j.finish(errors.Join(err, rerr))
		return
	case !ok && ctx.Err() == nil:
		wait = -1 // no further slot: held and idle, until the tenure ends
	}
	if j.handed = j.handed || j.r.called; !j.handed {
		j.dropLeader()
	}
	done = true
	j.s.stepped(j, wait)
}

// end settles a tenure whose lead is over: it resigns unless the tenure
// ended first, then campaigns again, or ends the job's run when the pool
// handed the job over or stopped.
func (j *scheduledJob) end() {
	j.stopWatching()
	t := j.t
	var err error
	if t.holds() {
		err = t.resignRetrying(j.pr.runCtx, fmt.Errorf("%w: %q fence %d: resigning", ErrLost, j.l.job, t.fence))
	}
	if j.run.ends.why() != nil {
		j.finish(err)
		return
	}
	t.yieldToOthers(err)
	j.pr.p.withToken(j.campaign)
}

// stopWatching stops the tenure's watches and the drain timer, and
// forgets the tenure's steps and its leader context (ended, or ending
// with the tenure).
func (j *scheduledJob) stopWatching() {
	if j.watching {
		j.t.ends.unwatch(&j.tenureWatch)
		j.run.ends.unwatch(&j.jobWatch)
		j.watching = false
	}
	j.s.mu.Lock()
	if j.drained != nil {
		j.drained.Stop()
		j.drained = nil
	}
	j.s.remove(j)
	j.holding, j.busy, j.again, j.look = false, false, false, false
	j.leader, j.cancelLeader = nil, nil
	j.s.mu.Unlock()
}

// finish ends the job's run in the pool with err.
func (j *scheduledJob) finish(err error) {
	if j.entered {
		j.l.camp.leave(j.l, true, err)
	}
	j.run.err = err
	j.pr.finished <- j.l.job
}

// poolScheduler is the one timer of a Pool.RunSchedule: a heap of the
// held jobs by the time of their next step.
type poolScheduler struct {
	mu    sync.Mutex
	heap  jobHeap
	timer *time.Timer
	first time.Time // what the timer is armed for
}

// wake asks for a step of j at once, if j is in a tenure: a wake that
// comes after the tenure's end (a watch that fired as it ended, a note
// read while the job campaigns) has nothing to step, and the next
// tenure's first step reads the controls anyway.
func (s *poolScheduler) wake(j *scheduledJob) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !j.holding {
		return
	}
	if j.busy {
		j.again = true
		return
	}
	s.atLocked(j, time.Now())
}

// drainBy ends the tenure of a job handed over whose step still runs
// after d: the lease is resigned (its firing stays fenced), as a lease of
// its own stops renewing after DrainTimeout.
func (s *poolScheduler) drainBy(j *scheduledJob, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !j.busy || j.drained != nil {
		return
	}
	t := j.t
	j.drained = time.AfterFunc(d, func() {
		t.l.log().Warn("ddblease: job still running after DrainTimeout; resigning it", "fence", t.fence)
		_ = t.resignRetrying(context.Background(), fmt.Errorf("%w: %q fence %d: DrainTimeout passed", ErrLost, t.l.job, t.fence))
	})
}

// stepped records that a step of j ended; the next is due after wait (at
// once if it was woken meanwhile; never, for a negative wait, unless
// woken).
func (s *poolScheduler) stepped(j *scheduledJob, wait time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j.busy = false
	switch {
	case !j.holding:
	case j.again:
		j.again = false
		s.atLocked(j, time.Now())
	case wait >= 0:
		s.atLocked(j, time.Now().Add(wait))
	}
}

// atLocked (re)schedules j's next step at at.
func (s *poolScheduler) atLocked(j *scheduledJob, at time.Time) {
	j.at = at
	if j.index >= 0 {
		heap.Fix(&s.heap, j.index)
	} else {
		heap.Push(&s.heap, j)
	}
	s.armLocked()
}

// remove takes j out of the heap. Called with s.mu held.
func (s *poolScheduler) remove(j *scheduledJob) {
	if j.index >= 0 {
		heap.Remove(&s.heap, j.index)
	}
}

// armLocked sets the timer for the earliest step.
func (s *poolScheduler) armLocked() {
	if len(s.heap) == 0 {
		return
	}
	at := s.heap[0].at
	if s.timer != nil && at.Equal(s.first) {
		return
	}
	if s.timer != nil {
		s.timer.Stop()
	}
	s.first = at
	s.timer = time.AfterFunc(time.Until(at), s.fire)
}

// fire is the timer's function: it starts the steps due.
func (s *poolScheduler) fire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.timer, s.first = nil, time.Time{}
	now := time.Now()
	for len(s.heap) > 0 && !s.heap[0].at.After(now) {
		j := heap.Pop(&s.heap).(*scheduledJob)
		j.busy = true
		go j.step()
	}
	s.armLocked()
}

// jobHeap orders jobs by their next step.
type jobHeap []*scheduledJob

func (h jobHeap) Len() int           { return len(h) }
func (h jobHeap) Less(a, b int) bool { return h[a].at.Before(h[b].at) }
func (h jobHeap) Swap(a, b int) {
	h[a], h[b] = h[b], h[a]
	h[a].index, h[b].index = a, b
}
func (h *jobHeap) Push(x any) {
	j := x.(*scheduledJob)
	j.index = len(*h)
	*h = append(*h, j)
}
func (h *jobHeap) Pop() any {
	old := *h
	j := old[len(old)-1]
	old[len(old)-1] = nil
	j.index = -1
	*h = old[:len(old)-1]
	return j
}
