package ddblease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// This file owns Pool: NewPool, Run's membership loop (poolRun) and Run's
// one Lease.Run per job assigned to this replica.

// Pool runs a set of singleton jobs spread across the replicas that run the
// same pool: each replica leads its share of the jobs (the jobs divided by
// the live replicas, rounded up or down), hands its surplus over (drained,
// then resigned) when another replica joins, and takes its share of the
// jobs of one that leaves or dies. Each job keeps a lease item and a fence
// of its own, with every guarantee of a single lease: one leader at a
// time, a fence that grows, a drain on hand-over. The jobs a replica holds
// are bound to its session (session.go): its member item, whose one
// renewal per HeartbeatInterval renews them all.
//
// The replicas know each other through their member items in the pool's
// partition of the same table (Layout), each renewing its own every
// HeartbeatInterval (one UpdateItem, then one Query that reads the
// others'): its expiry, and the view it acts on (which replicas it sees
// live). Between renewals each reads the others' again every
// RetryInterval (the same Query), as a lease's standby polls its lease,
// and renews and acts at once when the members it counts live changed. A
// replica that stops renewing counts as gone once its expiry, a
// LeaseDuration after its last renewal, is MaxClockSkew old, or once the
// others have read its entry unchanged for a lease (the longer of their
// LeaseDuration and its own) by their runtime clocks (its wall clock may
// have been ahead), so that its jobs are led again when single leases in
// their place would be; one that stops running the pool removes itself
// first, so that the others take its jobs within a RetryInterval of its
// shutdown. From the live replicas each
// computes the same assignment: the jobs, in the order of a hash, each go
// to the live replica ranked highest for it (rendezvous hashing) that has
// fewer than its share, so that a change of replicas moves few jobs besides
// the ones it must. A replica campaigns only for the jobs assigned to it,
// and hands a job it leads over only to a replica whose entry says it acts
// on the same view, and so campaigns for that job (a replica whose view
// changes writes its entry again at once). A job waits for a replica that
// joined, left or died to be seen (up to a RetryInterval, or the dead
// replica's lapse), then for its lease as any standby does.
type Pool struct {
	db       DynamoDBAPI
	table    string
	name     string
	jobs     []string // sorted, unique
	jobsHash string   // names the job list in the member item (listHash)
	leases   []Lease  // the jobs', in the order of jobs: one allocation for them all
	born     sent     // when NewPool made the jobs' handles (Lease.born)
	opts     Options  // resolved: the same for every job's lease
	log      *slog.Logger
	running  atomic.Bool
	notify   notifier    // the membership's events, to Options.Observer
	health   poolHealth  // what CheckHealth reports of the membership
	warn     warnLimiter // of another process replacing this replica's session (Pool.warnIfReplaced)
	declines chan struct{}
	attempts chan struct{} // a token per acquisition attempt in flight (attempt)
	tokMu    sync.Mutex
	starts   []func(done func()) // campaigns waiting for a token (withToken)

	leaving atomic.Bool // Run is stopping: its member item says so

	mu   sync.Mutex
	seen poolView // the live members last read; live is nil before the first look
	// declined holds the jobs an operator asked this replica to resign
	// during this Run: it declines them (its member item says so).
	declined map[string]bool
	// sess is this replica's session (session.go); pastSessions, those
	// of this Run that are over, whose jobs it may take back at once.
	sess         *session
	pastSessions map[string]bool
	// members holds every member item last read, live or not; watched,
	// each member's session version as last read, and when it was first
	// read so by the runtime clock; gone, the sessions that jobs are
	// bound to and the last read did not show (sessionFree), by
	// owner+"\x00"+session.
	members map[string]member
	watched map[string]watchedEntry
	gone    map[string]goneEntry
	ending  map[string]chan struct{} // sessions this replica is ending (sessionFree), by id: closed when the end's outcome is known
}

// poolView is the pool as one renewal read it: the live members.
type poolView struct {
	live    []string          // sorted; nil before the first look
	members map[string]member // the live members' items
}

// watchedEntry is a member's session and version as last read, and
// since when.
type watchedEntry struct {
	sid, sv string
	since   time.Time
}

// goneEntry is a session that jobs are bound to and that a member read
// did not show: when sessionFree first asked for it, and when a member
// read sent after that ended without it (zero until one did), both by
// the runtime clock. A read sent before the ask may predate the session
// itself, so it proves nothing; a read sent after it does (member reads
// are strongly consistent), and the session's holder could then renew
// it no later than the read: its deadline passes a LeaseDuration after.
type goneEntry struct {
	asked, missing time.Time
}

// NewPool returns a pool of jobs in table, run by this replica as
// Options.Owner. Each job has a Lease handle (New), with the options
// given; the pool's name and the jobs' names follow the rules of job names.
// It makes no call.
func NewPool(db DynamoDBAPI, table, pool string, jobs []string, optFns ...func(*Options)) (*Pool, error) {
	contends := []string{"pool\x00" + pool}
	for _, job := range jobs {
		contends = append(contends, "job\x00"+job)
	}
	o, err := checkNew(db, table, "pool name", pool, contends, optFns)
	if err != nil {
		return nil, err
	}
	if len(jobs) == 0 {
		return nil, invalid("pool %q has no jobs", pool)
	}
	for _, job := range jobs {
		if err := checkName("job name", job, MaxJobLength); err != nil {
			return nil, fmt.Errorf("pool %q: %w", pool, err)
		}
	}
	sorted := slices.Sorted(slices.Values(jobs))
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return nil, invalid("pool %q: job %q is listed twice", pool, sorted[i])
		}
	}
	p := &Pool{db: db, table: table, name: pool, opts: o, jobs: sorted, jobsHash: listHash(sorted),
		leases: make([]Lease, len(sorted)), born: o.sendNow(),
		log: lineLogger(o.Logger, "pool", pool, o.Owner), notify: notifier{to: observerTo(o.Observer)}, declines: make(chan struct{}, 1),
		attempts: make(chan struct{}, maxPoolAttempts)}
	for i, job := range p.jobs {
		initLease(&p.leases[i], db, table, job, &p.opts, p, &p.born)
	}
	return p, nil
}

// maxPoolAttempts bounds the acquisition attempts of a pool's jobs in
// flight at once. A replica that starts thousands of campaigns together
// (its first start, a replica leaving a large pool) would otherwise queue
// them all in the client's connection pool, where their CallTimeouts run
// out before they are sent; those would be retried, queued again, and few
// would ever acquire. Waiting for a token costs no timeout.
const maxPoolAttempts = 32

// attempt waits for a token for one acquisition attempt or resignation of
// a job of the pool p (nil: a lease of its own, which needs none) and
// returns the function that gives it back, or ctx's error.
func (p *Pool) attempt(ctx context.Context) (done func(), err error) {
	select {
	case p.attempts <- struct{}{}:
		return p.giveBack, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// withToken runs f on a goroutine of its own once a token is free, with
// the token (f gives it back by calling done, once): a campaign's first
// attempt. The campaigns that wait for a token wait in a queue, not on a
// goroutine each, so that a replica starting thousands of campaigns at
// once runs about maxPoolAttempts goroutines for them, not thousands
// (the runtime keeps the record of every goroutine it ever ran at once).
func (p *Pool) withToken(f func(done func())) {
	select {
	case p.attempts <- struct{}{}:
		go f(p.giveBack)
		return
	default:
	}
	p.tokMu.Lock()
	p.starts = append(p.starts, f)
	p.tokMu.Unlock()
	// A token given back between the try above and the queueing found
	// the queue empty: take the turn of whoever waits now.
	p.serveStarts()
}

// giveBack gives a token back: to the campaign that has waited longest
// for one (withToken), or to the pool.
func (p *Pool) giveBack() {
	p.tokMu.Lock()
	f := p.nextStartLocked()
	p.tokMu.Unlock()
	if f != nil {
		go f(p.giveBack)
		return
	}
	<-p.attempts
}

// nextStartLocked takes the campaign that has waited longest for a token
// off the queue; nil if none waits. Called with tokMu held.
func (p *Pool) nextStartLocked() func(done func()) {
	if len(p.starts) == 0 {
		return nil
	}
	f := p.starts[0]
	p.starts[0] = nil
	p.starts = p.starts[1:]
	return f
}

// serveStarts starts waiting campaigns while tokens are free.
func (p *Pool) serveStarts() {
	for {
		p.tokMu.Lock()
		if len(p.starts) == 0 {
			p.tokMu.Unlock()
			return
		}
		select {
		case p.attempts <- struct{}{}:
		default:
			p.tokMu.Unlock()
			return
		}
		f := p.nextStartLocked()
		p.tokMu.Unlock()
		go f(p.giveBack)
	}
}

// Lease returns the lease of job, nil if job is not in the pool: for
// IsLeader, State, a Guard's fence and the other per-job calls.
func (p *Pool) Lease(job string) *Lease {
	i, ok := slices.BinarySearch(p.jobs, job)
	if !ok {
		return nil
	}
	return &p.leases[i]
}

// Members returns the replicas the pool last saw live, sorted (nil before
// Run's first look at the pool's members).
func (p *Pool) Members() []string {
	seen, _ := p.view()
	return slices.Clone(seen.live)
}

// Assigned returns the jobs assigned to this replica by the replicas last
// seen live, sorted: those it leads or campaigns for as its share.
func (p *Pool) Assigned() []string {
	seen, _ := p.view()
	owners, _ := p.assignment(seen)
	var mine []string
	for _, job := range p.jobs {
		if owners[job] == p.opts.Owner {
			mine = append(mine, job)
		}
	}
	return mine
}

// Run runs this replica's share of the pool until ctx ends: it renews its
// membership every HeartbeatInterval, and runs Lease.Run, with fn, for each
// job assigned to it, cancelling the Run of a job assigned elsewhere (it
// drains and resigns, and the job's new replica takes it). fn is called as
// Lease.Run calls it, with the job's name.
//
// A job whose fn returns nil on its own, while it leads, is resigned (as
// Lease.Run does) and campaigned for again at the pool's next membership
// renewal, up to a HeartbeatInterval later; it stays assigned to this
// replica. An operator's resign request (Admin.RequestResign) on a job
// this replica leads is drained like a hand-over and moves the job: this
// replica declines it (its member item says so) for as long as this Run
// lasts, and the others assign it elsewhere at their next renewal (with a
// single replica, or every replica declining it, it comes back). To keep
// the shares even, another job may move to this replica in its place.
//
// Replicas may run different job lists for a while (a deploy that adds or
// removes jobs): each member item names its list (a hash), and a replica
// campaigns, besides its own share, for every job of its list assigned to
// a replica that runs another list, so that no job is left without a
// leader while the lists differ; it never hands a job over to such a
// replica.
//
// When ctx ends, Run removes this replica from the pool, then drains and
// resigns every job it leads, and returns nil. It stops the same way, and
// returns the error, naming its job, when fn returns an error while it
// leads (not after its tenure ended) or panics (a *PanicError); and, naming
// the table and the member item, when a membership renewal fails with an
// error that retrying cannot mend (a missing table, a wrong key schema,
// denied access, bad credentials). Other renewal failures are retried each
// HeartbeatInterval: each is logged at Warn and reported to
// Options.Observer as EventRetry with Op "membership" and Pool set, and
// CheckHealth fails once they have lasted longer than its tolerance. A
// second Run on the same pool while one is active is an error.
func (p *Pool) Run(ctx context.Context, fn func(ctx context.Context, job string, fence int64) error) error {
	if fn == nil {
		return invalid("pool %q: Run: fn is nil", p.name)
	}
	return p.run(ctx, func(r *poolRun, i int) *jobRun {
		run := &jobRun{}
		run.init()
		r.runJob(p.jobs[i], run, fn)
		return run
	})
}

// run is Run and RunSchedule: start starts the job's run (that of Run, or
// RunSchedule's), which ends (run.ends) on hand-over or when the pool
// stops; it sends the job on r.finished when the job's run has ended.
func (p *Pool) run(ctx context.Context, start func(r *poolRun, i int) *jobRun) error {
	if !p.running.CompareAndSwap(false, true) {
		return invalid("pool %q: another Run is active on this pool", p.name)
	}
	defer p.running.Store(false)
	if ctx.Err() != nil {
		return fmt.Errorf("ddblease: pool %q: %w", p.name, ended(ctx))
	}
	p.begin()
	p.list(ctx)
	r := &poolRun{p: p, startJob: start, runs: make([]*jobRun, len(p.jobs)), finished: make(chan string, len(p.jobs))}
	var cancel context.CancelFunc
	r.runCtx, cancel = context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	err := r.loop(ctx)
	p.health.stopped(p.opts.Now(), err)
	return err
}

// poolRun is one Run of a pool: the Runs of the jobs it started.
type poolRun struct {
	p *Pool
	// startJob starts the run of the job at index i of p.jobs.
	startJob func(r *poolRun, i int) *jobRun
	runs     []*jobRun         // by the job's index in p.jobs; nil where no run of this replica's is
	finished chan string       // a job's Run returned
	runCtx   context.Context   // the values of the jobs' contexts (derived from their ends)
	unsentAt time.Time         // the first renewal never sent, while none has reached the table
	reached  bool              // a renewal reached the table
	failing  bool              // the last renewal failed: the next comes after a RetryInterval
	looked   map[string]member // the members the last look read, since the last renewal; nil: none
	changed  *poolView         // the view a look found changed, for the renewal it calls (nil: none)
	blind    bool              // the last look failed: the next waits a RetryInterval
}

// jobRun is the Run of one job of a pool. It ends (cancel) when the job
// is handed over, declined, or stopped with the pool; the contexts that
// end with it are made only while a step needs one (ends.derive), so that
// a held job at rest holds none.
type jobRun struct {
	mu        sync.Mutex
	ends      ending
	cancelled bool // cancel was called (by the pool's loop, which alone reads it)
	err       error
}

// init readies a new run: its ending is guarded by its mutex.
func (run *jobRun) init() { run.ends.mu = &run.mu }

// cancel ends the job's run here: it drains and resigns.
func (run *jobRun) cancel() { run.ends.end(nil) }

// loop renews the membership and acts on it every HeartbeatInterval, at
// once after a decline, and at once when a look between renewals (look)
// finds the live members changed, until ctx ends or the pool must stop.
func (r *poolRun) loop(ctx context.Context) error {
	p := r.p
	for {
		// The next renewal is due a HeartbeatInterval after this one was
		// sent, as a lease's heartbeat is (not after its answer and the
		// actions on it): the session's expiry counts from the send, and
		// its renewal's age is a lease's, so that its jobs fail over as
		// leases do.
		sent := time.Now()
		if err := r.renew(ctx); err != nil {
			return r.stop(err)
		}
		r.act(ctx)
		due := sent.Add(p.opts.HeartbeatInterval)
		if r.failing {
			// As a lease's heartbeat: try again soon, while the session
			// still has time left.
			due = time.Now().Add(jitter(min(p.opts.RetryInterval, p.opts.HeartbeatInterval)))
		}
		for {
			wake := time.NewTimer(r.untilLook(due))
			woke, err := r.wait(ctx, wake.C)
			wake.Stop()
			if woke == wokeStop {
				return r.stop(err)
			}
			if woke == wokeDecline || !time.Now().Before(due) || r.look(ctx) {
				break
			}
		}
	}
}

// untilLook returns how long the loop waits before it looks at the
// members, or renews at due: a jittered RetryInterval, as a lease's
// standby polls, or less when a member lapses sooner (untilLapse). A
// replica whose last renewal failed looks nothing up: it renews at due.
func (r *poolRun) untilLook(due time.Time) time.Duration {
	d := time.Until(due)
	if r.failing {
		return max(d, 0)
	}
	d = min(d, jitter(r.p.opts.RetryInterval))
	if r.blind {
		return max(d, 0)
	}
	if l, ok := r.p.untilLapse(r.looked); ok {
		d = min(d, l)
	}
	return max(d, 0)
}

// look reads the pool's member items between two renewals, as a lease's
// standby polls the lease item, so that this replica sees each member's
// renewal within a RetryInterval of it (the watch a lapse is judged by:
// Pool.watch) and learns of a lapse, a leave, a join or a job declined
// (a resign request, a forced release) when it happens. It reports
// whether the view of that read (viewOf: the live members and the jobs
// each declines) differs from the one this replica acts on: it then
// renews at once, and acts. A failed read changes nothing but puts the
// next look a RetryInterval off; the next renewal reports its failure.
func (r *poolRun) look(ctx context.Context) bool {
	p := r.p
	members, sent, err := p.readMembers(ctx)
	r.blind = err != nil
	if err != nil {
		return false
	}
	r.looked = members
	p.watch(members, sent)
	seen, _ := p.view()
	next := p.liveView(members, p.opts.sendNow())
	if p.viewOf(next) == p.viewOf(seen) {
		return false
	}
	r.changed = &next
	return true
}

// renew renews this replica's membership and records the members read. It
// returns an error that retrying cannot mend; it reports and logs others.
func (r *poolRun) renew(ctx context.Context) error {
	p := r.p
	seen, err := p.renew(ctx, r.changed)
	r.changed = nil
	now := p.opts.Now()
	switch {
	case err == nil:
		r.reached, r.failing, r.looked = true, false, nil
		p.health.ok()
		p.mu.Lock()
		p.seen = seen
		p.mu.Unlock()
		return nil
	case ctx.Err() != nil:
		return nil
	case !retryable(err):
		return err
	case unsent(err) && !r.reached && !p.opts.mayPassAtStart(err, &r.unsentAt):
		return fmt.Errorf("ddblease: pool %q: no request could be sent to table %q (check the client's credentials and region): %w",
			p.name, p.table, err)
	}
	r.failing = true
	p.log.Warn("ddblease: could not renew the pool membership", "err", err)
	p.health.fail(now, err)
	p.notify.emit(Event{Kind: EventRetry, Pool: p.name, Owner: p.opts.Owner, Time: now, Op: stepMembership, Err: err})
	if r.reached && p.liveSession() == nil {
		// The session's deadline passed: the others count this replica
		// gone, so lead nothing they may have taken on.
		p.mu.Lock()
		p.seen = poolView{live: []string{}}
		p.mu.Unlock()
	}
	return nil
}

// act hands over the jobs assigned elsewhere and starts the Runs of the
// jobs this replica campaigns for. A change is logged in one line at
// Info, whatever the number of jobs it moves (each job's own lines are at
// Debug: leaseEvents.writeLog).
func (r *poolRun) act(ctx context.Context) {
	p := r.p
	seen, declined := p.view()
	owners, mine := p.assignment(seen)
	handed, started := 0, 0
	defer func() {
		if handed > 0 || started > 0 {
			p.log.Info("ddblease: the pool's assignment changed", "members", len(seen.live), "jobs", r.running(),
				"starting", started, "handing_over", handed)
		}
	}()
	for i, run := range r.runs {
		if run == nil {
			continue
		}
		job := p.jobs[i]
		to := owners[job]
		switch {
		case run.cancelled || to == p.opts.Owner || p.alsoFor(seen, to):
			continue
		case !declined[job] && to != "" && seen.members[to].view != mine && p.Lease(job).IsLeader():
			// Its replica does not act on this view yet, and may not
			// campaign for the job: keep leading it until it does.
			continue
		}
		run.cancelled = true
		run.cancel() // a hand-over: the job's Run drains and resigns
		handed++
	}
	if ctx.Err() != nil {
		return
	}
	for i, job := range p.jobs {
		to := owners[job]
		if r.runs[i] != nil || p.declineUnseen(seen, declined, job) ||
			to != p.opts.Owner && !p.alsoFor(seen, to) {
			continue
		}
		r.start(i)
		started++
	}
}

// declineUnseen reports whether this replica declines job and the view
// does not show it yet (its member item, as last read, lacks the
// decline): the view's assignment does not know of the decline, and the
// job is not started here. Once the view shows it, the assignment
// decides: a job every live replica declines goes to one of them
// (assign), which then leads it.
func (p *Pool) declineUnseen(seen poolView, declined map[string]bool, job string) bool {
	return declined[job] && len(seen.live) > 1 && !slices.Contains(seen.members[p.opts.Owner].declined, job)
}

// running returns how many jobs this replica runs (leads, or campaigns
// for) and has not handed over.
func (r *poolRun) running() int {
	n := 0
	for _, run := range r.runs {
		if run != nil && !run.cancelled {
			n++
		}
	}
	return n
}

// start starts the run of the job at index i of p.jobs.
func (r *poolRun) start(i int) {
	r.runs[i] = r.startJob(r, i)
}

// runJob runs the lease of job for Run, on a goroutine of its own.
func (r *poolRun) runJob(job string, run *jobRun, fn func(context.Context, string, int64) error) {
	p := r.p
	l := p.Lease(job)
	go func() {
		jctx, cancel := run.ends.derive(r.runCtx)
		defer cancel(nil)
		defer func() { r.finished <- job }()
		defer func() {
			// A panic in fn (Run resigned, then panicked again) ends the
			// pool like fn's error: nothing above this goroutine could
			// recover it.
			if v := recover(); v != nil {
				pe, ok := v.(*PanicError)
				if !ok {
					pe = &PanicError{Value: v, Stack: debug.Stack()}
				}
				run.err = pe
			}
		}()
		run.err = runJob(jctx, l, job, func(ctx context.Context, job string, fence int64) error {
			err := fn(ctx, job, fence)
			if errors.Is(context.Cause(ctx), ErrResignRequested) {
				p.decline(job)
			}
			return err
		})
	}()
}

// What ended a wait of the membership loop.
const (
	wokeTimer   = iota // its timer fired
	wokeDecline        // this replica declined a job: renew at once
	wokeStop           // ctx ended, or a job's fn failed: the pool stops
)

// wait waits for timer or a decline. It returns wokeStop, with the error
// that stops the pool if any, when ctx ended or a job's fn failed.
func (r *poolRun) wait(ctx context.Context, timer <-chan time.Time) (woke int, err error) {
	p := r.p
	for {
		select {
		case <-ctx.Done():
			return wokeStop, nil
		case job := <-r.finished:
			i, _ := slices.BinarySearch(p.jobs, job)
			run := r.runs[i]
			r.runs[i] = nil
			switch {
			case run.err == nil:
			case run.cancelled:
				p.log.Warn("ddblease: a job handed over did not end cleanly", "job", job, "err", run.err)
			default:
				// fn failed while it led: the pool stops, as Run does.
				return wokeStop, fmt.Errorf("ddblease: pool %q: job %q: %w", p.name, job, run.err)
			}
		case <-p.declines:
			_, declined := p.view()
			for i, run := range r.runs {
				if run != nil && declined[p.jobs[i]] && !run.cancelled {
					run.cancelled = true
					run.cancel()
				}
			}
			return wokeDecline, nil
		case <-timer:
			return wokeTimer, nil
		}
	}
}

// stop tells the others that this replica leaves (its member item says
// so: they assign its jobs elsewhere at their next renewal), drains and
// resigns every job while its session is renewed, then leaves the pool,
// and returns the jobs' errors (a drain timeout, a resignation that
// failed) with the one that stopped the pool, if any.
func (r *poolRun) stop(failed error) error {
	p := r.p
	p.leaving.Store(true)
	defer p.leaving.Store(false)
	ctx := context.WithoutCancel(r.runCtx)
	if failed == nil || retryable(failed) {
		_, _ = p.renew(ctx, nil)
	}
	pending := 0
	for _, run := range r.runs {
		if run != nil {
			pending++
		}
	}
	if pending > 0 {
		p.log.Info("ddblease: leaving the pool: handing its jobs over", "jobs", pending)
	}
	for _, run := range r.runs {
		if run != nil {
			run.cancel()
		}
	}
	errs := []error{failed}
	for pending > 0 {
		wait := time.NewTimer(jitter(p.opts.HeartbeatInterval))
		select {
		case <-r.finished:
			pending--
		case <-wait.C:
			_, _ = p.renew(ctx, nil) // the session keeps the jobs still draining
		}
		wait.Stop()
	}
	for i, run := range r.runs {
		if run != nil && run.err != nil {
			errs = append(errs, fmt.Errorf("ddblease: pool %q: job %q: %w", p.name, p.jobs[i], run.err))
		}
	}
	p.leave()
	return errors.Join(errs...)
}

// runJob runs the lease of job until jctx ends. A job started as the pool
// stopped or handed it over, whose Run found jctx already ended, attempted
// nothing: that is no error.
func runJob(jctx context.Context, l *Lease, job string, fn func(context.Context, string, int64) error) error {
	err := l.Run(jctx, func(ctx context.Context, fence int64) error { return fn(ctx, job, fence) })
	if errors.As(err, new(endedBeforeRun)) {
		return nil
	}
	return err
}

// begin readies the pool's state for a Run: a new session, nothing seen,
// nothing declined, no decline pending.
func (p *Pool) begin() {
	p.mu.Lock()
	p.seen, p.declined = poolView{}, nil
	p.sess, p.pastSessions = newSession(p), map[string]bool{}
	p.members, p.watched, p.gone, p.ending = nil, map[string]watchedEntry{}, map[string]goneEntry{}, map[string]chan struct{}{}
	p.mu.Unlock()
	select {
	case <-p.declines:
	default:
	}
}

// liveness is the binding's (lease.go): a job's tenure leads by this
// replica's live session.
func (p *Pool) liveness(l *Lease) (liveness, error) {
	if s := p.liveSession(); s != nil {
		return s, nil
	}
	return nil, fmt.Errorf("%w: %q: pool %q", errNoSession, l.job, p.name)
}

// boundTo returns the pool's name and the live session's id, "" if none.
func (p *Pool) boundTo() (pool, sid string) {
	if s := p.liveSession(); s != nil {
		return p.name, s.sid
	}
	return p.name, ""
}

// changeLevel: the pool logs its jobs' changes of leadership at Debug,
// and one line per change of its assignment at Info (poolRun.act).
func (p *Pool) changeLevel() slog.Level { return slog.LevelDebug }

// liveSession returns this replica's session while it is live, else nil.
func (p *Pool) liveSession() *session {
	p.mu.Lock()
	s := p.sess
	p.mu.Unlock()
	if s == nil || s.left() <= 0 {
		return nil
	}
	return s
}

// session returns the session to renew: the current one, or a new one
// when it is over (its jobs are this replica's to take back at once).
func (p *Pool) session() *session {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sess == nil || p.sess.isOver() {
		if p.sess != nil {
			p.pastSessions[p.sess.sid] = true
		}
		p.sess = newSession(p)
	}
	return p.sess
}

// view returns the pool as last seen, and the jobs this replica declines.
func (p *Pool) view() (poolView, map[string]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen, maps.Clone(p.declined)
}

// CheckHealth reports whether this replica's share of the pool is in a
// state that restarting its process could cure. It returns nil, or an
// error wrapping ErrUnhealthy that says why in one line, when the
// membership's renewals have failed for longer than tolerance with no
// success since, when Run returned an error and has not run again since,
// or when CheckHealth of one of the pool's leases (Pool.Lease) fails.
// Tolerance zero means LeaseDuration; a negative tolerance is an error
// wrapping ErrInvalid. It needs no call to DynamoDB.
func (p *Pool) CheckHealth(tolerance time.Duration) error {
	if tolerance < 0 {
		return invalid("health tolerance is negative (%v)", tolerance)
	}
	if tolerance == 0 {
		tolerance = p.opts.LeaseDuration
	}
	errs := []error{p.health.check(p.opts.Now(), p.name, tolerance)}
	for i := range p.leases {
		errs = append(errs, p.leases[i].CheckHealth(tolerance))
	}
	return errors.Join(errs...)
}
