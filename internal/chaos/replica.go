package chaos

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
)

// ReplicaConfig is what a replica process is started with.
type ReplicaConfig struct {
	Name      string
	Endpoint  string   // the replica's proxy
	Table     string   // leases and job runs
	Sink      string   // the side-effect sink
	Job       string   // the one job, when Pool is empty
	Pool      string   // a pool: the replica runs Pool.RunSchedule over Jobs
	Jobs      []string // the pool's jobs
	Lease     time.Duration
	Heartbeat time.Duration
	Retry     time.Duration
	Skew      time.Duration
	Drain     time.Duration
	Call      time.Duration
	Slot      time.Duration // the schedule: Every(Slot)
	Work      time.Duration // how long a tick works before its side effect
	Offset    time.Duration // clock offset
	DriftPPM  int64         // clock rate error
	Events    string        // history file
	// Transactions: the server has TransactWriteItems. Without it the
	// slots that would use TransactWrite or Commit use Update.
	Transactions bool
	// RaceDemo makes the replica race on purpose and exit, to show that a
	// race-built replica's data race fails the run.
	RaceDemo bool
}

// Guard forms, chosen by slot number (Form).
const (
	FormPut      = "put"      // Guard.Put, read-modify-write of the sink item
	FormUpdate   = "update"   // Guard.Update
	FormTransact = "transact" // Guard.TransactWrite
	FormCommit   = "commit"   // JobRun.Commit
	FormCheck    = "check"    // Guard.Check, then an unguarded write
	FormDo       = "do"       // Guard.Do, whose function makes an unguarded write
)

var forms = []string{FormPut, FormUpdate, FormTransact, FormCommit, FormCheck, FormDo}

// Form is the guard form a slot's tick uses: the forms in turn by slot
// number, TransactWrite and Commit replaced by Update on a server without
// transactions.
func Form(slot time.Time, every time.Duration, transactions bool) string {
	f := forms[int((slot.UnixNano()/int64(every))%int64(len(forms)))]
	if !transactions && (f == FormTransact || f == FormCommit) {
		return FormUpdate
	}
	return f
}

// Atomic reports whether a form checks the fence atomically with its write.
func Atomic(form string) bool { return form != FormCheck && form != FormDo }

// HWAttribute is the sink item's fence high-water mark (GuardOptions.
// FenceAttribute of the replicas' guards).
const HWAttribute = "hw"

// SinkKey is the sink item that collects a job's side effects.
func SinkKey(job string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "sink#" + job}}
}

// prober reads what a user of the lease can see — IsLeader (through
// State) of each job and the leader contexts handed to fn — and records
// the readings on either side of every change. Readings are serialised,
// so a replica's readings are totally ordered; each is bracketed by the
// real time just before and just after it.
type prober struct {
	rec   *Recorder
	clock func() time.Time
	ppm   int64

	mu   sync.Mutex
	jobs []*probed // one job, or a pool's jobs
	ctxs map[*liveCtx]bool
}

// probed is one job's lease as the prober reads it. job is empty for the
// one job of a replica that runs no pool.
type probed struct {
	job     string
	lease   *ddblease.Lease
	last    Event
	logged  bool // last was recorded
	started bool
}

type liveCtx struct {
	ctx   context.Context
	job   string
	fence int64
	slot  string
	ended bool
}

func (p *prober) probe() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, j := range p.jobs {
		p.probeJob(j)
	}
	for c := range p.ctxs {
		p.ctxEnded(c)
	}
}

// probeJob reads one job's state. p.mu is held.
func (p *prober) probeJob(j *probed) {
	b := time.Now()
	st := j.lease.State()
	a := time.Now()
	e := Event{Kind: EvBelief, Job: j.job, OK: st.Leader, B: b.UnixNano(), A: a.UnixNano()}
	if st.Leader {
		e.Fence = st.Fence
		e.Deadline = RealDeadline(st.Deadline, p.clock, p.ppm).UnixNano()
	}
	if !j.started || e.OK != j.last.OK || e.Fence != j.last.Fence || e.Deadline > j.last.Deadline+int64(time.Millisecond) {
		if j.started && !j.logged {
			p.rec.Record(j.last)
		}
		p.rec.Record(e)
		j.logged = true
	} else {
		j.logged = false
	}
	j.last, j.started = e, true
}

// ctxEnded records c's end if its context has ended. p.mu is held.
func (p *prober) ctxEnded(c *liveCtx) {
	if !c.ended && c.ctx.Err() != nil {
		c.ended = true
		p.rec.Record(Event{Kind: EvCtxEnd, Job: c.job, Fence: c.fence, Slot: c.slot, A: time.Now().UnixNano(), Err: errText(context.Cause(c.ctx))})
	}
}

// watch follows a leader context handed to fn until fn returns: a
// goroutine records when it sees the context end.
func (p *prober) watch(ctx context.Context, job string, fence int64, slot string) (unwatch func()) {
	c := &liveCtx{ctx: ctx, job: job, fence: fence, slot: slot}
	p.mu.Lock()
	p.ctxs[c] = true
	p.mu.Unlock()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-ctx.Done():
			p.probe()
		case <-stop:
		}
	}()
	return func() {
		close(stop)
		<-done
		p.mu.Lock()
		p.ctxEnded(c)
		delete(p.ctxs, c)
		p.mu.Unlock()
	}
}

// probing is an http.RoundTripper that reads the lease's state just before
// each request is sent and just after its answer arrives: a tenure cannot
// begin before the answer of the write that acquired it, and a resigning
// holder's belief ends before its resignation is sent, so these readings
// bound handovers tightly whatever the scheduler does.
type probing struct {
	p    *prober
	next http.RoundTripper
}

func (t probing) RoundTrip(r *http.Request) (*http.Response, error) {
	t.p.probe()
	resp, err := t.next.RoundTrip(r)
	t.p.probe()
	return resp, err
}

// RunReplica runs one replica until SIGTERM: it campaigns for the job
// (or, with cfg.Pool set, runs its share of the pool's jobs) and, while it
// leads, fires the schedule's slots; each tick writes its side effect into
// the job's sink item through the slot's guard form and finishes its run.
// Everything the replica's user code can see is recorded: IsLeader
// readings of each job, the leader contexts handed to fn (when each began
// and when it was seen ended), each fn call, each effect and what
// RunSchedule returned.
func RunReplica(cfg ReplicaConfig) error {
	if cfg.RaceDemo {
		return raceDemo()
	}
	// The handler is in place before the start is recorded: a replica
	// that recorded its start ends on SIGTERM by its own shutdown, and one
	// that did not never ran the library (Check).
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	rec, err := NewRecorder(cfg.Events, cfg.Name)
	if err != nil {
		return err
	}
	defer rec.Close()
	rec.Record(Event{Kind: EvStart, OK: RaceEnabled})

	clock := Clock(cfg.Offset, cfg.DriftPPM)
	pr := &prober{rec: rec, clock: clock, ppm: cfg.DriftPPM, ctxs: map[*liveCtx]bool{}}
	// The observer's events are recorded for information; each is also an
	// occasion to read the state.
	var campaigned atomic.Bool // the library began to campaign (EventCampaign)
	observe := func(e ddblease.Event) {
		switch e.Kind {
		case ddblease.EventCampaign:
			campaigned.Store(true)
		case ddblease.EventCall:
			if errors.Is(e.Err, context.DeadlineExceeded) {
				now := time.Now()
				rec.Record(Event{Kind: EvTimedOut, B: now.Add(-e.Latency).UnixNano(), A: now.UnixNano(), Info: e.Op})
			}
			return
		case ddblease.EventRetry:
			return
		}
		rec.Record(Event{Kind: EvObserved, Job: cfg.jobOf(e.Job), Info: e.Kind.String(), Fence: e.Fence, Err: errText(e.Err) + string(e.Reason)})
		pr.probe()
	}

	db := ddbtest.Endpoint(cfg.Endpoint).Client(func(rt http.RoundTripper) http.RoundTripper { return probing{p: pr, next: rt} })
	opts := func(o *ddblease.Options) {
		o.Observer = observe
		o.Owner = cfg.Name
		o.LeaseDuration, o.HeartbeatInterval, o.RetryInterval = cfg.Lease, cfg.Heartbeat, cfg.Retry
		o.MaxClockSkew, o.DrainTimeout, o.CallTimeout = cfg.Skew, cfg.Drain, cfg.Call
		o.Now = clock
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	var (
		lease *ddblease.Lease
		pool  *ddblease.Pool
	)
	sinks := map[string]sink{}
	if cfg.Pool == "" {
		if lease, err = ddblease.New(db, cfg.Table, cfg.Job, opts); err != nil {
			return err
		}
		pr.jobs = []*probed{{lease: lease}}
	} else {
		if pool, err = ddblease.NewPool(db, cfg.Table, cfg.Pool, cfg.Jobs, opts); err != nil {
			return err
		}
		for _, job := range cfg.Jobs {
			pr.jobs = append(pr.jobs, &probed{job: job, lease: pool.Lease(job)})
		}
	}
	for i, job := range cfg.jobNames() {
		guard, err := ddblease.NewGuard(db, cfg.Table, job, func(o *ddblease.GuardOptions) { o.FenceAttribute = HWAttribute })
		if err != nil {
			return err
		}
		sinks[job] = sink{cfg: cfg, job: job, index: i, db: db, guard: guard}
	}

	// A stall of this process (a loaded machine) is a fault, as the
	// suite's own are.
	go func() {
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		last := time.Now()
		for range t.C {
			now := time.Now()
			if now.Sub(last) > 250*time.Millisecond {
				rec.Record(Event{Kind: EvStall, B: last.UnixNano(), A: now.UnixNano()})
			}
			last = now
		}
	}()

	// The sampler reads IsLeader every millisecond or two, between the
	// readings taken around each request.
	sampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			pr.probe()
			select {
			case <-t.C:
			case <-sampling:
				return
			}
		}
	}()

	tick := func(ctx context.Context, s sink, run *ddblease.JobRun) error {
		b := time.Now()
		live := ctx.Err() == nil
		job := cfg.jobOf(s.job)
		slot := run.Slot().UTC().Format(time.RFC3339Nano)
		rec.Record(Event{Kind: EvRun, Job: job, Fence: run.Fence(), Slot: slot, B: b.UnixNano(), OK: live})
		unwatch := pr.watch(ctx, job, run.Fence(), slot)
		defer func() {
			unwatch()
			rec.Record(Event{Kind: EvReturn, Job: job, Fence: run.Fence(), Slot: slot, A: time.Now().UnixNano()})
		}()
		pr.probe()
		// Work, then write the effect even if leadership was lost
		// meanwhile: a paused leader wakes up and tries, and the guard
		// must refuse it.
		select {
		case <-time.After(cfg.Work):
		case <-ctx.Done():
		}
		// The jobs of a pool take the forms in turn from different
		// starting points, so that one slot time sees several forms.
		form := Form(run.Slot().Add(time.Duration(s.index)*cfg.Slot), cfg.Slot, cfg.Transactions)
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*cfg.Call)
		cb := time.Now()
		checked, effErr := s.write(ectx, form, run)
		cancel()
		info := ""
		if checked {
			info = "checked"
		}
		rec.Record(Event{Kind: EvEffect, Job: job, Form: form, Fence: run.Fence(), Slot: slot, OK: effErr == nil, Err: errText(effErr),
			B: cb.UnixNano(), A: time.Now().UnixNano(), Info: info})
		if form == FormCommit && effErr == nil {
			rec.Record(Event{Kind: EvFinished, Job: job, Fence: run.Fence(), Slot: slot, OK: true, Info: "committed"})
			return nil
		}
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*cfg.Call)
		finErr := run.Finish(fctx, effErr)
		cancel()
		rec.Record(Event{Kind: EvFinished, Job: job, Fence: run.Fence(), Slot: slot, OK: finErr == nil, Err: errText(finErr)})
		return effErr
	}
	jobOpts := func(o *ddblease.JobOptions) {
		o.CatchUpWindow = 4 * cfg.Slot
		o.Retention = time.Hour
	}
	if pool == nil {
		err = lease.RunSchedule(ctx, ddblease.Every(cfg.Slot), func(ctx context.Context, run *ddblease.JobRun) error {
			return tick(ctx, sinks[cfg.Job], run)
		}, jobOpts)
	} else {
		err = pool.RunSchedule(ctx, ddblease.AllJobs(ddblease.Every(cfg.Slot)), func(ctx context.Context, job string, run *ddblease.JobRun) error {
			s, ok := sinks[job]
			if !ok {
				return errors.New("fn called for job " + job + ", not in the pool")
			}
			return tick(ctx, s, run)
		}, jobOpts)
	}
	pr.probe()
	close(sampling)
	<-sampled
	// Every return is recorded as it is: the checker decides which are
	// clean (nil), which are reported outcomes that the plan made possible
	// (ErrDrainTimeout, ErrNotResigned, a stop while every attempt was
	// failing) and which are failures.
	text := exitText(err)
	if err != nil && !campaigned.Load() && errors.Is(err, context.Canceled) {
		// ctx ended before RunSchedule began: it attempted nothing, and
		// returns ctx's error, as documented.
		text = ExitEndedBeforeRun + err.Error()
	}
	rec.Record(Event{Kind: EvExit, OK: err == nil, Err: text})
	return nil
}

// jobNames lists the replica's jobs: the pool's, or its one job.
func (cfg ReplicaConfig) jobNames() []string {
	if cfg.Pool == "" {
		return []string{cfg.Job}
	}
	return cfg.Jobs
}

// jobOf is the job name an event carries: a pool's job, or none for the
// one job of a replica that runs no pool.
func (cfg ReplicaConfig) jobOf(job string) string {
	if cfg.Pool == "" {
		return ""
	}
	return job
}

// Exit outcomes as EvExit's Err starts.
const (
	ExitDrainTimeout = "drain-timeout: "
	ExitNotResigned  = "not-resigned: "
	// ExitStoppedFailing: the context ended while every attempt since the
	// last tenure failed; Run returns the cause (context.Canceled) joined
	// with the last error.
	ExitStoppedFailing = "stopped-failing: "
	// ExitEndedBeforeRun: the context ended before RunSchedule began to
	// campaign (a SIGTERM just after the start); it returns ctx's error.
	ExitEndedBeforeRun = "ended-before-run: "
)

func exitText(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ddblease.ErrDrainTimeout):
		return ExitDrainTimeout + err.Error()
	case errors.Is(err, ddblease.ErrNotResigned):
		return ExitNotResigned + err.Error()
	case errors.Is(err, context.Canceled):
		return ExitStoppedFailing + err.Error()
	}
	return err.Error()
}

// sink writes each tick's effect into one item: a log (list) of entries
// (fence, slot, replica, form), one attribute per slot that has an effect
// (so that a retried request cannot append twice), a version every write
// increments (for Put's read-modify-write) and, for the atomic forms, the
// fence high-water mark.
type sink struct {
	cfg   ReplicaConfig
	job   string // whose sink item
	index int    // the job's place in the pool (0 without a pool)
	db    *dynamodb.Client
	guard *ddblease.Guard
}

func avN(n int64) *types.AttributeValueMemberN {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}

func avS(s string) *types.AttributeValueMemberS { return &types.AttributeValueMemberS{Value: s} }

func (s sink) entry(form string, fence int64, slot time.Time) *types.AttributeValueMemberM {
	return &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
		"fence": avN(fence), "slot": avS(slot.UTC().Format(time.RFC3339Nano)),
		"replica": avS(s.cfg.Name), "form": avS(form),
	}}
}

func slotAttr(slot time.Time) string { return "s" + strconv.FormatInt(slot.UnixNano(), 10) }

// update is the append as an update.
func (s sink) update(form string, fence int64, slot time.Time) (expr, cond string, names map[string]string, values map[string]types.AttributeValue) {
	expr = "SET #log = list_append(if_not_exists(#log, :empty), :entry), #slot = :f, #ver = if_not_exists(#ver, :zero) + :one"
	names = map[string]string{"#log": "log", "#slot": slotAttr(slot), "#ver": "ver"}
	values = map[string]types.AttributeValue{
		":empty": &types.AttributeValueMemberL{Value: []types.AttributeValue{}},
		":entry": &types.AttributeValueMemberL{Value: []types.AttributeValue{s.entry(form, fence, slot)}},
		":f":     avN(fence), ":zero": avN(0), ":one": avN(1),
	}
	return expr, "attribute_not_exists(#slot)", names, values
}

// write makes the tick's effect with form. checked reports that a
// non-atomic form's Check accepted the fence. An error that is not a
// refusal for a stale fence may hide a write that landed (its answer lost
// or late, and a retry refused by the slot's condition): the sink item is
// then read, and the effect counts as made if the entry is there, as a
// user deduplicating by slot would do.
func (s sink) write(ctx context.Context, form string, run *ddblease.JobRun) (checked bool, err error) {
	checked, err = s.write1(ctx, form, run)
	var stale *ddblease.StaleFenceError
	if err == nil || errors.As(err, &stale) {
		return checked, err
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*s.cfg.Call)
	defer cancel()
	out, rerr := s.db.GetItem(rctx, &dynamodb.GetItemInput{TableName: aws.String(s.cfg.Sink), Key: SinkKey(s.job), ConsistentRead: aws.Bool(true)})
	if rerr == nil && hasEntry(out.Item, s.entry(form, run.Fence(), run.Slot())) {
		return checked, nil
	}
	return checked, err
}

// hasEntry reports whether the sink item's log holds entry.
func hasEntry(item map[string]types.AttributeValue, entry *types.AttributeValueMemberM) bool {
	l, ok := item["log"].(*types.AttributeValueMemberL)
	if !ok {
		return false
	}
	str := func(m map[string]types.AttributeValue, k string) string {
		switch v := m[k].(type) {
		case *types.AttributeValueMemberS:
			return v.Value
		case *types.AttributeValueMemberN:
			return v.Value
		}
		return ""
	}
	for _, v := range l.Value {
		m, ok := v.(*types.AttributeValueMemberM)
		if !ok {
			continue
		}
		same := true
		for _, k := range []string{"fence", "slot", "replica", "form"} {
			same = same && str(m.Value, k) == str(entry.Value, k)
		}
		if same {
			return true
		}
	}
	return false
}

func (s sink) write1(ctx context.Context, form string, run *ddblease.JobRun) (checked bool, err error) {
	fence, slot := run.Fence(), run.Slot()
	table, key := aws.String(s.cfg.Sink), SinkKey(s.job)
	switch form {
	case FormPut:
		return false, s.put(ctx, fence, slot)
	case FormUpdate:
		expr, cond, names, values := s.update(form, fence, slot)
		_, err := s.guard.Update(ctx, fence, &dynamodb.UpdateItemInput{TableName: table, Key: key,
			UpdateExpression: &expr, ConditionExpression: &cond, ExpressionAttributeNames: names, ExpressionAttributeValues: values})
		return false, err
	case FormTransact, FormCommit:
		// The guard, and Commit, set the high-water mark of the items they
		// write, as Put and Update do.
		expr, cond, names, values := s.update(form, fence, slot)
		items := []types.TransactWriteItem{{Update: &types.Update{TableName: table, Key: key,
			UpdateExpression: &expr, ConditionExpression: &cond, ExpressionAttributeNames: names, ExpressionAttributeValues: values}}}
		if form == FormCommit {
			return false, run.Commit(ctx, items, func(o *ddblease.CommitOptions) { o.FenceAttribute = HWAttribute })
		}
		return false, s.guard.TransactWrite(ctx, fence, items)
	case FormCheck, FormDo:
		plain := func(ctx context.Context, fence int64) error {
			checked = true
			expr, cond, names, values := s.update(form, fence, slot)
			_, err := s.db.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: table, Key: key,
				UpdateExpression: &expr, ConditionExpression: &cond, ExpressionAttributeNames: names, ExpressionAttributeValues: values})
			return err
		}
		if form == FormDo {
			return checked, s.guard.Do(ctx, fence, plain)
		}
		if err := s.guard.Check(ctx, fence); err != nil {
			return false, err
		}
		return checked, plain(ctx, fence)
	}
	return false, errors.New("unknown form " + form)
}

// put appends by reading the sink item and putting it back whole, on
// condition that its version is the one read; Guard.Put adds the fence
// check. A lost race with another writer is retried.
func (s sink) put(ctx context.Context, fence int64, slot time.Time) error {
	table, key := aws.String(s.cfg.Sink), SinkKey(s.job)
	var err error
	for range 5 {
		var out *dynamodb.GetItemOutput
		out, err = s.db.GetItem(ctx, &dynamodb.GetItemInput{TableName: table, Key: key, ConsistentRead: aws.Bool(true)})
		if err != nil {
			return err
		}
		item := map[string]types.AttributeValue{}
		for k, v := range out.Item {
			item[k] = v
		}
		// The guard sets its own attributes (the fence high-water mark and
		// its write token) and refuses an item that carries them.
		delete(item, HWAttribute)
		delete(item, ddblease.DefaultGuardTokenAttribute)
		if _, dup := item[slotAttr(slot)]; dup {
			if hasEntry(item, s.entry(FormPut, fence, slot)) {
				return nil // an earlier attempt landed
			}
			return errors.New("the slot already has an effect")
		}
		item["pk"] = key["pk"]
		var log []types.AttributeValue
		if l, ok := item["log"].(*types.AttributeValueMemberL); ok {
			log = append(log, l.Value...)
		}
		item["log"] = &types.AttributeValueMemberL{Value: append(log, s.entry(FormPut, fence, slot))}
		item[slotAttr(slot)] = avN(fence)
		names := map[string]string{"#slot": slotAttr(slot), "#ver": "ver"}
		values := map[string]types.AttributeValue{}
		cond := "attribute_not_exists(#slot) AND attribute_not_exists(#ver)"
		ver := int64(0)
		if v, ok := item["ver"].(*types.AttributeValueMemberN); ok {
			ver, _ = strconv.ParseInt(v.Value, 10, 64)
			cond = "attribute_not_exists(#slot) AND #ver = :ver"
			values[":ver"] = v
		}
		item["ver"] = avN(ver + 1)
		in := &dynamodb.PutItemInput{TableName: table, Item: item, ConditionExpression: &cond, ExpressionAttributeNames: names}
		if len(values) > 0 {
			in.ExpressionAttributeValues = values
		}
		_, err = s.guard.Put(ctx, fence, in)
		var stale *ddblease.StaleFenceError
		if err == nil || errors.As(err, &stale) || ctx.Err() != nil {
			return err
		}
	}
	return err
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	var stale *ddblease.StaleFenceError
	if errors.As(err, &stale) {
		return "stale: " + err.Error()
	}
	return err.Error()
}

// raceDemo has two goroutines write one variable unsynchronised: under the
// race detector the process reports "WARNING: DATA RACE" and exits with
// status 66.
func raceDemo() error {
	var n int
	done := make(chan struct{})
	go func() {
		n++
		close(done)
	}()
	n++
	<-done
	_ = n
	return nil
}
