package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/ddbleasetest"
)

const (
	table = "sim-table" // the lease and its job runs
	sink  = "sim-sink"  // the users' effects
	job   = "job"
)

// ctxRec is one leader context as a user saw it: from the first call of fn
// with it to the moment a goroutine waiting on it saw it end.
type ctxRec struct {
	rep, call int
	job       string
	fence     int64
	start     time.Duration
	end       time.Duration // -1 while live
	cause     string
}

type sample struct {
	at     time.Duration
	rep    int
	job    string
	leader bool
	snap   int // > 0: one snapshot of every running replica (see snapshot); 0: one replica's
}

type fnCall struct {
	rep, call int
	job       string
	slot      string    // the run's id: the slot, then "#trigger-<id>" for a triggered run
	slotAt    time.Time // run.Slot()
	trigger   string    // run.Trigger()
	fence     int64
	at        time.Duration
	dead      bool   // fn's context had already ended when fn was called
	result    string // what fn returned ("" while it runs, "nil" for nil)
}

// opCall is one operator call as the operator saw it.
type opCall struct {
	kind     OpKind
	try      int           // 1 for the first attempt
	called   time.Duration // when the call was made
	returned time.Duration
	err      error
	catchUp  bool
	trigger  ddblease.Trigger // OpTrigger, when it returned one
	fence    int64            // OpRelease: the fence read by Admin.Job and released
}

type runReturn struct {
	rep, call int
	called    time.Duration // when the supervisor called Run
	at        time.Duration // when Run returned
	err       error
	panicked  bool
}

// history is what the simulated users observed, in virtual time since
// the start of the run.
type history struct {
	mu       sync.Mutex
	ctxs     []*ctxRec
	samples  []sample
	calls    []fnCall
	returns  []runReturn
	resigns  map[int]time.Duration // replica -> first Resign call
	shutdown map[int]time.Duration // replica -> when its contexts were cancelled
	crashAt  map[int]time.Duration
	ops      []opCall
	notes    []string
}

// sim is one run of a plan inside a synctest bubble.
type sim struct {
	p     *Plan
	w     *world
	h     history
	reps  []*replicaState
	op    *replicaState     // the operator's network and clock
	ls    []*ddblease.Lease // one job: each replica's handle
	pools []*ddblease.Pool  // a pool: each replica's
	gs    []map[string]*ddblease.Guard
	ctxs  []context.Context
	stop  []context.CancelFunc

	mu       sync.Mutex
	seen     map[context.Context]*ctxRec // leader contexts already recorded
	panicked map[int]bool
	nEffect  int
	running  sync.WaitGroup // Run calls of live replicas
	crashed  sync.WaitGroup // Run calls of crashed replicas
	callDone map[[2]int]chan struct{}
}

func (s *sim) now() time.Duration { return s.w.since() }

func (s *sim) note(format string, args ...any) {
	s.h.mu.Lock()
	s.h.notes = append(s.h.notes, fmt.Sprintf("%v ", s.now())+fmt.Sprintf(format, args...))
	s.h.mu.Unlock()
}

// lease returns rep's handle of job (the pool's, under a pool).
func (s *sim) lease(rep int, j string) *ddblease.Lease {
	if s.p.Pool {
		return s.pools[rep].Lease(j)
	}
	return s.ls[rep]
}

// leads reports whether rep leads a job (any of the pool's).
func (s *sim) leads(rep int) bool {
	for _, j := range s.p.jobs() {
		if s.lease(rep, j).IsLeader() {
			return true
		}
	}
	return false
}

// enter records fn being handed ctx and fence for job j.
func (s *sim) enter(rep, call int, j string, ctx context.Context, fence int64) {
	s.mu.Lock()
	if _, ok := s.seen[ctx]; ok {
		s.mu.Unlock()
		return
	}
	rec := &ctxRec{rep: rep, call: call, job: j, fence: fence, start: s.now(), end: -1}
	s.seen[ctx] = rec
	s.mu.Unlock()
	s.h.mu.Lock()
	s.h.ctxs = append(s.h.ctxs, rec)
	s.h.mu.Unlock()
	context.AfterFunc(ctx, func() {
		s.reps[rep].hold(nil) // a stopped process sees nothing end
		s.h.mu.Lock()
		rec.end = s.now()
		rec.cause = fmt.Sprint(context.Cause(ctx))
		s.h.mu.Unlock()
	})
}

// sample samples IsLeader of jobs on rep (every job if none is named),
// at one instant.
func (s *sim) sample(rep int, jobs ...string) {
	at := s.now()
	if len(jobs) == 0 {
		jobs = s.p.jobs()
	}
	xs := make([]sample, len(jobs))
	for i, j := range jobs {
		xs[i] = sample{at: at, rep: rep, job: j, leader: s.lease(rep, j).IsLeader()}
	}
	s.h.mu.Lock()
	s.h.samples = append(s.h.samples, xs...)
	s.h.mu.Unlock()
}

// maybePanic panics in fn once, at its first call after the plan says.
func (s *sim) maybePanic(rep int) {
	for _, a := range s.p.Panics {
		if a.Rep == rep && s.now() >= a.At {
			s.mu.Lock()
			done := s.panicked[rep]
			s.panicked[rep] = true
			s.mu.Unlock()
			if !done {
				s.note("r%d: fn panics", rep)
				panic("simulated panic in fn")
			}
		}
	}
}

func av(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}
func as(v string) types.AttributeValue { return &types.AttributeValueMemberS{Value: v} }

// effect is one guarded side effect of a Run leader of job j.
func (s *sim) effect(ctx context.Context, rep int, j string, fence int64) {
	g := s.gs[rep][j]
	s.mu.Lock()
	s.nEffect++
	n := s.nEffect
	s.mu.Unlock()
	sfx := "" // one job: the items as they were before pools
	if s.p.Pool {
		sfx = "#" + j
	}
	switch s.p.Effect {
	case "put":
		_, _ = g.Put(ctx, fence, &dynamodb.PutItemInput{TableName: aws.String(sink),
			Item: map[string]types.AttributeValue{"pk": as("sink#put" + sfx), "wf": av(fence), "n": av(int64(n))}})
	case "update":
		_, _ = g.Update(ctx, fence, &dynamodb.UpdateItemInput{TableName: aws.String(sink),
			Key:                       map[string]types.AttributeValue{"pk": as("sink#upd" + sfx)},
			UpdateExpression:          aws.String("SET wf = :wf, n = :n"),
			ExpressionAttributeValues: map[string]types.AttributeValue{":wf": av(fence), ":n": av(int64(n))}})
	case "txn":
		_ = g.TransactWrite(ctx, fence, []types.TransactWriteItem{{Put: &types.Put{TableName: aws.String(sink),
			Item: map[string]types.AttributeValue{"pk": as(fmt.Sprintf("sink#txn%s#%d#%d", sfx, rep, n)), "wf": av(fence)}}}})
	case "do":
		_ = g.Do(ctx, fence, func(context.Context, int64) error { return nil })
	}
}

func (s *sim) fnRun(rep, call int) func(context.Context, int64) error {
	return func(ctx context.Context, fence int64) error { return s.lead(rep, call, job, ctx, fence) }
}

// fnPool is fnRun for each job of a pool.
func (s *sim) fnPool(rep, call int) func(context.Context, string, int64) error {
	return func(ctx context.Context, j string, fence int64) error { return s.lead(rep, call, j, ctx, fence) }
}

// lead is a Run leader's work on job j: an effect every Work.
func (s *sim) lead(rep, call int, j string, ctx context.Context, fence int64) error {
	r := s.reps[rep]
	s.enter(rep, call, j, ctx, fence)
	for {
		r.hold(nil)
		s.maybePanic(rep)
		s.sample(rep, j)
		s.effect(ctx, rep, j, fence)
		if !sleepCtx(ctx, s.p.Work) {
			r.hold(nil)
			return ctx.Err()
		}
	}
}

func (s *sim) fnSchedule(rep, call int) func(context.Context, *ddblease.JobRun) error {
	return func(ctx context.Context, run *ddblease.JobRun) error { return s.scheduled(rep, call, job, ctx, run) }
}

// fnPoolSchedule is fnSchedule for each job of a pool.
func (s *sim) fnPoolSchedule(rep, call int) func(context.Context, string, *ddblease.JobRun) error {
	return func(ctx context.Context, j string, run *ddblease.JobRun) error {
		return s.scheduled(rep, call, j, ctx, run)
	}
}

// jobOptions are the plan's options of RunSchedule.
func (s *sim) jobOptions(o *ddblease.JobOptions) {
	o.CatchUpWindow = s.p.Window
	if s.p.Rerun {
		o.Rerun = ddblease.Rerun
	}
}

// scheduled is a firing of RunSchedule (the pool's, under a pool) on job
// j: it records the call, samples, works, and makes the plan's effect.
func (s *sim) scheduled(rep, call int, j string, ctx context.Context, run *ddblease.JobRun) (err error) {
	r := s.reps[rep]
	fence := run.Fence()
	dead := ctx.Err() != nil
	s.enter(rep, call, j, ctx, fence)
	slot := run.Slot().UTC().Format(time.RFC3339Nano)
	if run.Trigger() != "" {
		// Its own key for the effects: a trigger's instant may be a slot's.
		slot += "#trigger-" + run.Trigger()
	}
	if s.p.Pool {
		slot = j + "/" + slot // each job's slots are its own
	}
	s.h.mu.Lock()
	idx := len(s.h.calls)
	s.h.calls = append(s.h.calls, fnCall{rep: rep, call: call, job: j, slot: slot, slotAt: run.Slot(), trigger: run.Trigger(),
		fence: fence, at: s.now(), dead: dead})
	s.h.mu.Unlock()
	defer func() {
		s.h.mu.Lock()
		s.h.calls[idx].result = fmt.Sprint(err)
		s.h.mu.Unlock()
	}()
	r.hold(nil)
	s.maybePanic(rep)
	s.sample(rep)
	if s.p.Work > 0 && !sleepCtx(ctx, s.p.Work) {
		r.hold(nil)
		return ctx.Err()
	}
	r.hold(nil)
	s.mu.Lock()
	s.nEffect++
	n := s.nEffect
	s.mu.Unlock()
	switch s.p.Effect {
	case "commit":
		err = run.Commit(ctx, []types.TransactWriteItem{{Put: &types.Put{TableName: aws.String(sink),
			Item: map[string]types.AttributeValue{"pk": as(fmt.Sprintf("eff#%s|%d|%d|%d", slot, fence, rep, n)), "wf": av(fence)}}}})
	case "idem":
		_, err = s.gs[rep][j].Put(ctx, fence, &dynamodb.PutItemInput{TableName: aws.String(sink),
			Item:                map[string]types.AttributeValue{"pk": as("idem#" + run.IdempotencyKey()), "wf": av(fence)},
			ConditionExpression: aws.String("attribute_not_exists(pk)")})
	case "slotput":
		_, err = s.gs[rep][j].Put(ctx, fence, &dynamodb.PutItemInput{TableName: aws.String(sink),
			Item: map[string]types.AttributeValue{"pk": as("slotsink#" + slot), "wf": av(fence)}})
	}
	if err != nil {
		return err
	}
	if s.p.FnError > 0 && n%10 == 0 {
		err = errors.New("simulated job failure")
	}
	return err
}

// operate makes the operator's calls of the plan, in time order, from
// one goroutine (one operator at a laptop), with its own Admin.
func (s *sim) operate(adm *ddblease.Admin) {
	p := s.p
	rec := func(c opCall) {
		c.returned = s.now()
		s.h.mu.Lock()
		s.h.ops = append(s.h.ops, c)
		s.h.mu.Unlock()
		extra := ""
		switch {
		case c.kind == OpTrigger && c.err == nil:
			extra = " " + c.trigger.RunID()
		case c.kind == OpRelease:
			extra = fmt.Sprintf(" fence %d", c.fence)
		case c.kind == OpResume:
			extra = fmt.Sprintf(" catchUp=%v", c.catchUp)
		}
		s.note("operator: %s%s (try %d, called at %v) -> %v", c.kind, extra, c.try, c.called, c.err)
	}
	ctx := context.Background()
	wait := max(p.Lease/4, time.Millisecond)
	for _, o := range p.Ops {
		if d := o.At - s.now(); d > 0 {
			time.Sleep(d)
		}
		switch o.Kind {
		case OpTrigger:
			c := opCall{kind: o.Kind, try: 1, called: s.now()}
			c.trigger, c.err = adm.Trigger(ctx, p.opJob())
			rec(c)
		case OpPause:
			// Tried again while it fails, as an operator would: a pause
			// whose answer was lost finds the job paused and says so.
			for try := 1; try <= 3; try++ {
				c := opCall{kind: o.Kind, try: try, called: s.now()}
				_, c.err = adm.Pause(ctx, p.opJob())
				rec(c)
				if c.err == nil {
					break
				}
				time.Sleep(wait)
			}
		case OpResume:
			// Tried again until applied, or refused because the job is
			// not paused (a lost answer's write landed, or no pause did).
			for try := 1; try <= 40; try++ {
				c := opCall{kind: o.Kind, try: try, called: s.now(), catchUp: o.CatchUp}
				_, c.err = adm.Resume(ctx, p.opJob(), o.CatchUp)
				rec(c)
				if c.err == nil || errors.Is(c.err, ddblease.ErrInvalid) {
					break
				}
				time.Sleep(wait)
			}
		case OpRelease:
			c := opCall{kind: o.Kind, try: 1, called: s.now()}
			st, err := adm.Job(ctx, p.opJob())
			if err != nil {
				c.err = fmt.Errorf("Job: %w", err)
				rec(c)
				continue
			}
			c.fence = st.Lease.Fence
			_, c.err = adm.ForceRelease(ctx, p.opJob(), c.fence)
			rec(c)
		}
	}
}

// supervise is the user's main loop for one Run call: it restarts Run or
// RunSchedule after a panic or an error, as a supervisor would.
func (s *sim) supervise(rep, call int, wg *sync.WaitGroup, done chan struct{}) {
	defer wg.Done()
	defer close(done)
	ctx := s.ctxs[rep]
	if d := s.p.joinAt(rep) - s.now(); d > 0 && !sleepCtx(ctx, d) {
		return
	}
	for {
		var err error
		panicked := false
		called := s.now()
		func() {
			defer func() {
				if v := recover(); v != nil {
					panicked = true
					err = fmt.Errorf("panic: %v", v)
				}
			}()
			switch {
			case s.p.Pool && s.p.Schedule:
				err = s.pools[rep].RunSchedule(ctx, ddblease.AllJobs(ddblease.Every(s.p.Interval)), s.fnPoolSchedule(rep, call), s.jobOptions)
			case s.p.Pool:
				err = s.pools[rep].Run(ctx, s.fnPool(rep, call))
			case s.p.Schedule:
				err = s.ls[rep].RunSchedule(ctx, ddblease.Every(s.p.Interval), s.fnSchedule(rep, call), s.jobOptions)
			default:
				err = s.ls[rep].Run(ctx, s.fnRun(rep, call))
			}
		}()
		s.h.mu.Lock()
		s.h.returns = append(s.h.returns, runReturn{rep: rep, call: call, called: called, at: s.now(), err: err, panicked: panicked})
		s.h.mu.Unlock()
		if ctx.Err() != nil || err == nil {
			return
		}
		if !sleepCtx(ctx, s.p.Retry) {
			return
		}
	}
}

// sampler takes a snapshot of every running replica's leadership each
// period. Replicas that act at one virtual instant run in some real order
// within it, so samples taken on their own goroutines at "the same
// instant" are not one moment: a leader's read before it stepped down and
// its successor's read after it took over would look like two leaders.
func (s *sim) sampler(period time.Duration, done <-chan struct{}) {
	t := time.NewTicker(period)
	defer t.Stop()
	for n := 1; ; n++ {
		select {
		case <-done:
			return
		case <-t.C:
			s.snapshot(n)
		}
	}
}

// snapshot records the leadership of every job on every replica that is
// running (neither paused nor crashed), as of one moment: it collects
// each handle's leader flag and fence until two collects in a row agree
// (no tenure began or ended between them; a fence names each tenure, and
// one that ended never leads again).
func (s *sim) snapshot(n int) {
	type view struct {
		leader bool
		fence  int64
	}
	at, jobs := s.now(), s.p.jobs()
	collect := func() []view {
		vs := make([]view, 0, s.p.N*len(jobs))
		for rep := range s.p.N {
			for _, j := range jobs {
				st := s.lease(rep, j).State()
				vs = append(vs, view{st.Leader, st.Fence})
			}
		}
		return vs
	}
	prev := collect()
	for {
		cur := collect()
		if slices.Equal(prev, cur) {
			break
		}
		prev = cur
		runtime.Gosched()
	}
	var xs []sample
	for rep := range s.p.N {
		if s.reps[rep].stopped() {
			continue
		}
		for i, j := range jobs {
			xs = append(xs, sample{at: at, rep: rep, job: j, leader: prev[rep*len(jobs)+i].leader, snap: n})
		}
	}
	s.h.mu.Lock()
	s.h.samples = append(s.h.samples, xs...)
	s.h.mu.Unlock()
}

// execute runs the plan and returns the violations found. It must be
// called inside a synctest bubble.
func execute(p *Plan) (violations []string, h *history) {
	w := newWorld(p)
	s := &sim{p: p, w: w, seen: map[context.Context]*ctxRec{}, panicked: map[int]bool{}, callDone: map[[2]int]chan struct{}{}}
	s.h.resigns, s.h.shutdown, s.h.crashAt = map[int]time.Duration{}, map[int]time.Duration{}, map[int]time.Duration{}
	setup, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := client(direct{w}, 0)
	if err := ddblease.CreateTable(setup, admin, table); err != nil {
		return []string{"setup: " + err.Error()}, &s.h
	}
	if err := ddbleasetest.CreateKeyTable(setup, admin, sink, "pk", types.ScalarAttributeTypeS); err != nil {
		return []string{"setup: " + err.Error()}, &s.h
	}
	logger := slog.New(slog.DiscardHandler)
	if *flagLog {
		// Replays only (-sim.seed): the library's log lines, stamped with
		// the bubble's clock (the run starts at 2000-01-01 00:00:00 UTC).
		logger = slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	for i := range p.N {
		r := &replicaState{id: i, w: w, dead: make(chan struct{}), clock: p.Clocks[i]}
		for _, a := range p.Pauses {
			if a.Rep == i {
				r.pauses = append(r.pauses, window{a.At, a.At + a.Dur})
			}
		}
		for _, st := range p.Steps {
			if st.Rep == i && st.Rep != leader {
				r.steps = append(r.steps, st)
			}
		}
		s.reps = append(s.reps, r)
		db := client(transport{r}, p.Attempts)
		opts := func(o *ddblease.Options) {
			o.Owner = fmt.Sprintf("r%d", i)
			o.LeaseDuration, o.HeartbeatInterval, o.RetryInterval = p.Lease, p.Heartbeat, p.Retry
			o.MaxClockSkew, o.CallTimeout, o.DrainTimeout = p.Skew, p.CallTimeout, p.Drain
			o.Logger = logger.With("rep", i)
			o.Now = r.now
		}
		if p.Pool {
			pl, err := ddblease.NewPool(db, table, "pool", p.Jobs, opts)
			if err != nil {
				return []string{"setup: " + err.Error()}, &s.h
			}
			s.pools = append(s.pools, pl)
		} else {
			l, err := ddblease.New(db, table, job, opts)
			if err != nil {
				return []string{"setup: " + err.Error()}, &s.h
			}
			s.ls = append(s.ls, l)
		}
		gs := map[string]*ddblease.Guard{}
		for _, j := range p.jobs() {
			g, err := ddblease.NewGuard(db, table, j, func(o *ddblease.GuardOptions) { o.CallTimeout = p.CallTimeout })
			if err != nil {
				return []string{"setup: " + err.Error()}, &s.h
			}
			gs[j] = g
		}
		s.gs = append(s.gs, gs)
		ctx, stop := context.WithCancel(context.Background())
		s.ctxs, s.stop = append(s.ctxs, ctx), append(s.stop, stop)
	}
	// The operator: its own client, through the world's network (its
	// faults and every replica's) or a clean one, and its own clock.
	s.op = &replicaState{id: p.opRep(), w: w, dead: make(chan struct{}), clock: p.OpClock}
	var opDone sync.WaitGroup
	if len(p.Ops) > 0 {
		var rt http.RoundTripper = direct{w}
		if p.OpFaulty {
			rt = transport{s.op}
		}
		adm, err := ddblease.NewAdmin(client(rt, 0), table, func(o *ddblease.AdminOptions) {
			o.Operator = "operator"
			o.CallTimeout = p.Lease
			o.Now = s.op.now
		})
		if err != nil {
			return []string{"setup: " + err.Error()}, &s.h
		}
		opDone.Go(func() { s.operate(adm) })
	}
	var wgs = make([]*sync.WaitGroup, p.N)
	for i := range p.N {
		wgs[i] = &sync.WaitGroup{}
		calls := 1
		if p.Double == i {
			calls = 2
		}
		for c := range calls {
			done := make(chan struct{})
			s.callDone[[2]int{i, c}] = done
			wgs[i].Add(1)
			go s.supervise(i, c, wgs[i], done)
		}
	}
	samplersDone := make(chan struct{})
	if debugReq {
		go func() {
			real0 := realNow()
			for {
				select {
				case <-samplersDone:
					return
				case <-time.After(5 * time.Second):
					fmt.Fprintf(os.Stderr, "virtual %v real %v\n", s.now(), realNow().Sub(real0))
				}
			}
		}()
	}
	period := max(p.Lease/20, time.Millisecond)
	var samplers sync.WaitGroup
	samplers.Go(func() { s.sampler(period, samplersDone) })
	// Users' actions and crashes, in time order.
	type action struct {
		at time.Duration
		do func()
	}
	var acts []action
	for _, a := range p.Resigns {
		acts = append(acts, action{a.At, func() {
			go func() {
				s.reps[a.Rep].hold(nil)
				ctx, cancel := context.WithTimeout(s.ctxs[a.Rep], 3*p.CallTimeout)
				defer cancel()
				err := s.ls[a.Rep].Resign(ctx)
				s.note("r%d: Resign -> %v", a.Rep, err)
				s.h.mu.Lock()
				if _, ok := s.h.resigns[a.Rep]; !ok {
					s.h.resigns[a.Rep] = s.now()
				}
				s.h.mu.Unlock()
			}()
		}})
	}
	crashed := map[int]bool{}
	// The replica that leads now, outside Clean and the crashed; -3 if none.
	// Under a pool whose operator names a job, the one that leads that job
	// if any, so that the operator's targeted faults hit its leader.
	leading := func() int {
		if p.OpJob != "" {
			for i := range p.N {
				if !crashed[i] && !slices.Contains(p.Clean, i) && s.lease(i, p.OpJob).IsLeader() {
					return i
				}
			}
		}
		for i := range p.N {
			if !crashed[i] && !slices.Contains(p.Clean, i) && s.leads(i) {
				return i
			}
		}
		return -3
	}
	for i, f := range p.Faults {
		if f.Rep == leader {
			acts = append(acts, action{f.From, func() {
				rep := leading()
				w.resolved.Store(i, rep)
				s.note("fault %d (%s on %s) aimed at the leader hits r%d", i, f.Kind, f.Op, rep)
			}})
		}
	}
	for _, st := range p.Steps {
		if st.Rep == leader {
			acts = append(acts, action{st.At, func() {
				rep := leading()
				if rep < 0 {
					return
				}
				r := s.reps[rep]
				r.mu.Lock()
				r.steps = append(slices.Clone(r.steps), st)
				r.mu.Unlock()
				s.note("wall step by %v aimed at the leader hits r%d", st.By, rep)
			}})
		}
	}
	for _, a := range p.Crashes {
		acts = append(acts, action{max(a.At, 0), func() {
			rep := a.Rep
			if rep < 0 { // the leader, if any
				rep = leading()
			}
			if rep < 0 || crashed[rep] || len(crashed) == p.N-1 {
				return
			}
			crashed[rep] = true
			s.h.mu.Lock()
			s.h.crashAt[rep] = s.now()
			s.h.mu.Unlock()
			s.reps[rep].crashEl.Store(int64(s.now()))
			s.reps[rep].crashed.Store(true)
			s.note("r%d crashed", rep)
		}})
	}
	sortActs(acts, func(a action) time.Duration { return a.at })
	for _, a := range acts {
		if d := a.at - s.now(); d > 0 {
			time.Sleep(d)
		}
		a.do()
	}
	if d := p.end() - s.now(); d > 0 {
		time.Sleep(d)
	}
	var opHung []string
	if !waitFor(&opDone, p.Lease) {
		opHung = append(opHung, fmt.Sprintf("%s: the operator's calls had not returned by the end of the quiet period", VRunHang))
	}
	// Clean shutdown of the live replicas.
	wait := p.Drain + 3*p.Lease + 10*p.CallTimeout + 10*p.Retry + p.Work + time.Second
	for i := range p.N {
		if !crashed[i] {
			s.h.mu.Lock()
			s.h.shutdown[i] = s.now()
			s.h.mu.Unlock()
			s.stop[i]()
		}
	}
	var hung []string
	for i := range p.N {
		if crashed[i] {
			continue
		}
		if !waitFor(wgs[i], wait) {
			for key, ch := range s.callDone {
				select {
				case <-ch:
				default:
					if key[0] == i {
						hung = append(hung, fmt.Sprintf("run-hang: r%d call %d: Run did not return within %v after its context ended", i, key[1], wait))
					}
				}
			}
		}
	}
	checkAt := s.now()
	close(samplersDone)
	violations = append(append(hung, opHung...), check(s, admin, checkAt)...)
	// Wind the crashed replicas down, and anything still hung: black-hole
	// their networks, unfreeze them and end their contexts.
	for i := range p.N {
		if crashed[i] {
			close(s.reps[i].dead)
			s.stop[i]()
		}
	}
	for i := range p.N {
		if crashed[i] && !waitFor(wgs[i], wait) {
			violations = append(violations, fmt.Sprintf("run-hang: crashed r%d: Run did not return within %v after its context ended", i, wait))
			if debugReq {
				buf := make([]byte, 1<<22)
				fmt.Fprintf(os.Stderr, "goroutines:\n%s\n", buf[:runtime.Stack(buf, true)])
			}
		}
	}
	samplers.Wait()
	opDone.Wait()
	return violations, &s.h
}

func waitFor(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

func sortActs[T any](xs []T, key func(T) time.Duration) {
	for i := 1; i < len(xs); i++ {
		for j := i; j > 0 && key(xs[j]) < key(xs[j-1]); j-- {
			xs[j], xs[j-1] = xs[j-1], xs[j]
		}
	}
}
