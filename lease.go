package ddblease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// This file owns Lease: the handle, New, State, CheckHealth, the write
// lock, the lease item's read and conditional write (Lease.read,
// Lease.write) and what the handle last observed of it (Lease.observe),
// and its events; acquisition, heartbeat and resignation are fence.go's,
// heartbeat.go's and resign.go's.

// Lease is one contender's handle on the lease of one job. Its methods are
// safe for concurrent use; writes to the lease item are serialised. At most
// one Run or RunSchedule may be active on a handle at a time.
type Lease struct {
	db     observedDB // reports every request to the observer
	table  string
	job    string
	opts   *Options // a pool's jobs share the pool's
	notify notifier
	warn   warnLimiter

	writes writeLock    // held across every write to the lease item
	camp   campaignSlot // the active Run or RunSchedule (run.go)

	mu  sync.Mutex // guards ten, obs and seen
	ten *term      // the current or last term; nil before the first
	obs observation
	// vers are the renewal versions this handle wrote that the item may
	// carry: our own writes are conditioned on them.
	vers versions
	// yield: after this handle gave the lease up while its campaign goes
	// on (Resign during Run, an operator's request), Acquire leaves a free
	// lease to the standbys while it is open.
	yield yieldWindow
	seen  seenHolder

	// reached records that a request of this handle went out to the
	// table: it was answered, or failed in transit (the SDK wraps a
	// transport failure in a response error too), so its credentials and
	// region worked. From then on, a request the client could not send
	// (its credentials failing to refresh, say) is a transient failure.
	reached atomic.Bool

	// noTxn records that the server answered TransactWriteItems with
	// UnknownOperationException, so that Claim asks only once.
	noTxn atomic.Bool

	health health // what CheckHealth reports, fed by this handle's events

	ctl controlWatch // operator controls seen by the keeper (heartbeat.go)

	// bound is what the lease belongs to: alone for a lease of its own,
	// the pool whose job it is (NewPool), whose session its acquisitions
	// bind it to.
	bound binding

	// born is when the handle was made, by both clocks: a schedule runner
	// follows the wall clock's moves from there, so that a RunSchedule
	// called again (after a panic, say) while the wall clock is stepped
	// ahead still sees it come back.
	born *sent
}

// binding is what a lease belongs to (docs/internals.md): nothing but
// itself (alone), or a pool (*Pool) whose job it is. The lease asks it the
// few things that differ, never which it is, so that a lease of its own
// never enters the pool's code.
type binding interface {
	// attempt waits for a turn to write the lease item (a pool's
	// replica acquires and hands over a few jobs at a time); done ends it.
	attempt(ctx context.Context) (done func(), err error)
	// liveness returns what a tenure acquired now leads by: a lifetime of
	// its own, or the pool's live session (errNoSession when none).
	liveness(l *Lease) (liveness, error)
	// boundTo returns the pool's name and its live session, whose items
	// are this handle's to take; "" for either if none.
	boundTo() (pool, sid string)
	// frees applies the pool's session rules to the item l last
	// observed, bound to another session, and reports whether they
	// freed it now (Pool.frees).
	frees(ctx context.Context, l *Lease) bool
	// changeLevel is the log level of a change of leadership: a pool
	// logs one line per change of its assignment instead (Info), its jobs
	// theirs at Debug.
	changeLevel() slog.Level
}

// alone is the binding of a lease of its own.
type alone struct{}

func (alone) attempt(context.Context) (func(), error) { return func() {}, nil }
func (alone) liveness(*Lease) (liveness, error)       { return &solo{}, nil }
func (alone) boundTo() (pool, sid string)             { return "", "" }
func (alone) frees(context.Context, *Lease) bool      { return false }
func (alone) changeLevel() slog.Level                 { return slog.LevelInfo }

// maxDoubt bounds Lease.doubt; an older version in doubt is forgotten,
// which at worst makes a later write of ours fail its condition.
const maxDoubt = 50

// seenHolder is the last holder a standby reported (EventLeaderSeen).
type seenHolder struct {
	owner string
	fence int64
}

// observation is what a standby last saw of the lease item.
type observation struct {
	valid   bool
	present bool
	// boundFree: rec is bound to a pool session that the session rules
	// freed (Pool.frees).
	boundFree bool
	rec       seenItem
	since     time.Time // when rec.version was first seen, by the runtime's clock
}

// seenItem is what a handle keeps of the lease item it last saw: the
// fields of its Record that the handle's rules read, and the controls only
// when one is set (most items carry none), so that a handle that keeps an
// item for a long time (a held pool job's) stays small.
type seenItem struct {
	Owner     string
	Fence     int64
	ExpiresAt time.Time
	Duration  time.Duration
	Draining  bool
	Pool      string
	Session   string
	version   string
	ctl       *Control // nil when no control is set; never changed once set
}

// known are the strings a handle holds already that an item it reads
// may carry: its Owner, its pool's name and live session (if any), and the
// version of its last confirmed write.
type known struct{ owner, pool, sid, version string }

// keepItem returns what a handle keeps of rec: prev is the item it kept
// last. Its strings are those of prev or of k where equal, else copies, so that what
// it keeps holds on to nothing of the response it was decoded from (the
// SDK decodes a response's strings into one shared buffer).
func keepItem(rec Record, prev seenItem, k known) seenItem {
	s := seenItem{Owner: reuse(rec.Owner, prev.Owner, k.owner), Fence: rec.Fence, ExpiresAt: rec.ExpiresAt,
		Duration: rec.Duration, Draining: rec.Draining, Pool: reuse(rec.Pool, prev.Pool, k.pool),
		Session: reuse(rec.Session, prev.Session, k.sid), version: reuse(rec.version, prev.version, k.version)}
	if rec.Control != (Control{}) {
		c := rec.Control
		for _, f := range []*string{&c.PausedBy, &c.ResumedBy, &c.ResignBy, &c.ReleasedBy, &c.catchUp, &c.triggers} {
			*f = strings.Clone(*f)
		}
		s.ctl = &c
	}
	return s
}

// reuse returns v as one of the strings given when it equals one, else
// as a copy.
func reuse(v string, have ...string) string {
	if v == "" {
		return ""
	}
	for _, h := range have {
		if v == h {
			return h
		}
	}
	return strings.Clone(v)
}

// control returns the item's controls (zero when none is set).
func (s seenItem) control() Control {
	if s.ctl == nil {
		return Control{}
	}
	return *s.ctl
}

// New returns a handle on the lease of job in table. It makes no call; the
// table must exist (see CreateTable) when the handle is used.
func New(db DynamoDBAPI, table, job string, optFns ...func(*Options)) (*Lease, error) {
	o, err := checkNew(db, table, "job name", job, []string{"job\x00" + job}, optFns)
	if err != nil {
		return nil, err
	}
	l := &Lease{}
	born := o.sendNow()
	initLease(l, db, table, job, &o, alone{}, &born)
	return l, nil
}

// initLease makes l the handle of a job whose name and options are
// checked: a lease of its own (New) or a job of the pool bound (NewPool),
// whose jobs share the pool's options and birth.
func initLease(l *Lease, db DynamoDBAPI, table, job string, o *Options, bound binding, born *sent) {
	*l = Lease{
		table: table,
		job:   job,
		opts:  o,
		born:  born,
		bound: bound,
	}
	l.notify.to = (*leaseEvents)(l)
	l.db = observedDB{db: db, now: o.Now, sink: (*leaseCalls)(l)}
}

// leaseEvents is a Lease as the sink of its events (its notifier's): they
// go to its health check, its log and the user's observer.
type leaseEvents Lease

func (h *leaseEvents) deliver(e Event) {
	l := (*Lease)(h)
	l.health.observe(e)
	h.writeLog(e)
	if l.opts.Observer != nil {
		l.opts.Observer(e)
	}
}

// leaseCalls is a Lease as the sink of its client's requests
// (observedDB): a conversion of the handle, so that it needs no closure.
type leaseCalls Lease

// reportCall reports a request of this handle.
func (c *leaseCalls) reportCall(e Event) {
	l := (*Lease)(c)
	l.notify.emit(l.event(EventCall, e))
}

// callAnswered records that a request of this handle went out.
func (c *leaseCalls) callAnswered() { c.reached.Store(true) }

// checkNew checks what New and NewPool are given (the client, the table,
// the job's or pool's name) and returns the options with their defaults;
// the default owner is numbered by the items the handle contends for
// (defaultOwner).
func checkNew(db DynamoDBAPI, table, what, name string, contends []string, optFns []func(*Options)) (Options, error) {
	var o Options
	if err := CheckClient(db); err != nil {
		return o, err
	}
	if err := checkTable(table); err != nil {
		return o, err
	}
	if err := checkName(what, name, MaxJobLength); err != nil {
		return o, err
	}
	for _, fn := range optFns {
		if fn != nil {
			fn(&o)
		}
	}
	if err := o.setDefaults(); err != nil {
		return o, err
	}
	if o.Owner == "" {
		o.Owner = defaultOwner(table, contends)
	}
	return o, nil
}

// writeLock is held across every write to the lease item. The handle's
// events (its notifier, given to each call) are not delivered while it is
// held: unlock delivers them once it is released, so that an observer may
// call any method of the handle.
//
// A writer waits for the lock on a channel, made only while someone
// waits, not on a mutex: a write holds the lock across a request, and a
// goroutine waiting on a channel is one the Go runtime (and a synctest
// bubble, which the simulation runs in) sees as blocked.
type writeLock struct {
	mu    sync.Mutex    // guards held and freed; never held across a wait
	held  bool          // a writer holds the lock
	freed chan struct{} // closed when the lock is next released; nil if no one waits
}

func (w *writeLock) lock(n *notifier) {
	w.mu.Lock()
	for w.held {
		if w.freed == nil {
			w.freed = make(chan struct{})
		}
		freed := w.freed
		w.mu.Unlock()
		<-freed
		w.mu.Lock()
	}
	w.held = true
	w.mu.Unlock()
	n.hold()
}

// tryLock takes the lock if it is free, and reports whether it did.
func (w *writeLock) tryLock(n *notifier) bool {
	w.mu.Lock()
	free := !w.held
	w.held = true
	w.mu.Unlock()
	if free {
		n.hold()
	}
	return free
}

// unlock releases the lock, wakes the writers waiting for it (one of them
// takes it) and delivers the events queued meanwhile.
func (w *writeLock) unlock(n *notifier) {
	n.release()
	w.mu.Lock()
	w.held = false
	if w.freed != nil {
		close(w.freed)
		w.freed = nil
	}
	w.mu.Unlock()
	n.flush()
}

// Job returns the job name.
func (l *Lease) Job() string { return l.job }

// Owner returns this contender's owner id.
func (l *Lease) Owner() string { return l.opts.Owner }

// Options returns the options in force, defaults filled in.
func (l *Lease) Options() Options { return *l.opts }

// State is this handle's view of its own leadership. Its JSON form has
// the field names of ddblease's other JSON output (job, owner, leader,
// fence, acquiredAt, ...), RFC 3339 times, and no zero time.
type State struct {
	Job    string `json:"job"`
	Owner  string `json:"owner"`
	Leader bool   `json:"leader"` // held and the local deadline has not passed
	Fence  int64  `json:"fence"`  // fence of the current or last tenure; 0 if none
	// AcquiredAt and RenewedAt are the wall-clock times of the tenure's
	// acquisition and latest successful renewal.
	AcquiredAt time.Time `json:"acquiredAt,omitzero"`
	RenewedAt  time.Time `json:"renewedAt,omitzero"`
	// Deadline is when this replica stops believing it leads unless a
	// heartbeat succeeds first; zero when not leader.
	Deadline time.Time `json:"deadline,omitzero"`
}

// State returns this handle's view of its leadership.
func (l *Lease) State() State {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := State{Job: l.job, Owner: l.opts.Owner}
	if t := l.ten; t != nil {
		// The last renewal of the lifetime it leads by: its own
		// heartbeat's, or its session's (which may predate it).
		life := t.live.life()
		s.Fence, s.AcquiredAt, s.RenewedAt = t.fence, t.acquiredAt, t.acquiredAt
		if r := life.renewed(); r.After(s.RenewedAt) {
			s.RenewedAt = r
		}
		if t.leadsLocked() {
			d, _ := life.deadlines()
			s.Leader = true
			s.Deadline = d.Round(0)
		}
	}
	return s
}

// IsLeader reports whether this handle holds the lease and its local
// deadline has not passed. It makes no request. It turns false at the
// deadline whatever requests are in flight, and at the same moment the
// leader context given to Run's function is cancelled.
func (l *Lease) IsLeader() bool { return l.State().Leader }

// Holder reads the lease item with a strongly consistent read and returns it
// as the table sees it. It returns a zero Record when the job's lease has
// never been acquired. An expired lease is returned as it is: compare
// ExpiresAt with the clock.
func (l *Lease) Holder(ctx context.Context) (Record, error) {
	rec, present, err := l.read(ctx, true)
	if err != nil || !present {
		return Record{}, err
	}
	return rec, nil
}

// write sends a conditional write that sets the renewal version rv, and
// finds out whether it was applied. ours reports that the item now carries
// rv. Otherwise rec is the item as read (zero if absent) and err is nil
// when the condition failed, or the error when the outcome is unknown.
//
// The write is made once: the SDK's own retries are turned off for it, so
// that a refusal (throttling, a validation error) proves it did not apply.
// When the outcome is unknown the item is read back (condWrite), even when
// ctx has ended, but never past until (zero: no bound but timeout): past
// it, the write stays in doubt.
func (l *Lease) write(ctx context.Context, timeout time.Duration, until time.Time, in *dynamodb.UpdateItemInput, rv string) (rec Record, ours bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, bounded(timeout, until, l.opts.Now()))
	out, err := l.db.UpdateItem(cctx, in, singleAttempt)
	cancel()
	w := condWrite{db: l.db, actions: []types.TransactWriteItem{action(l.table, l.opts.Layout.leaseKey(l.job))}, watch: 0, once: true,
		timeout: min(timeout, l.opts.CallTimeout), until: until, now: l.opts.Now,
		mine: func(item map[string]types.AttributeValue) bool {
			v, ok := item[attrVersion].(*types.AttributeValueMemberS)
			return ok && v.Value == rv
		},
	}.resolve(ctx, attributes(out), err)
	doubt := w.outcome == unknown
	if !doubt {
		err = nil
	}
	switch {
	case w.outcome == failed:
		return Record{}, false, w.err // refused before it could apply: nothing is in doubt
	case w.rerr != nil:
		// Even a failed condition leaves the write in doubt here: the write
		// might still be delivered late.
		l.vers.wrote(rv, false, true)
		return Record{}, false, errors.Join(err, fmt.Errorf("ddblease: read lease %q: %w", l.job, explainTableError(ctx, l.db, l.table, l.opts.Layout, w.rerr)))
	case len(w.item) == 0:
		l.vers.wrote(rv, false, doubt)
		return Record{}, false, err
	}
	r, derr := decodeLease(l.opts.Layout, w.item)
	if derr != nil {
		l.vers.wrote(rv, false, doubt)
		return Record{}, false, errors.Join(err, fmt.Errorf("%w (table %q)", derr, l.table))
	}
	// An applied write's version is recorded first: the item kept then
	// shares its string (keepItem).
	landed := w.outcome == applied
	if landed {
		l.vers.wrote(rv, true, doubt)
	}
	l.observe(r, true)
	if !landed {
		l.vers.wrote(rv, false, doubt)
	}
	return r, landed, err
}

// versions are the renewal versions of a handle's writes that the item
// may carry: confirmed, the version of its last write known to have
// landed, and doubt, later versions whose outcome is unknown (they may
// still land). The handle's own writes are conditioned on the item
// carrying one of them, so that a write that lands late (its answer
// lost, or abandoned on a timeout) can never undo a newer one, such as a
// resignation. The confirmed version is never dropped.
type versions struct {
	mu        sync.Mutex
	confirmed string
	doubt     []string
}

// wrote records the outcome of a write of version rv: applied, or in doubt
// (it may still land).
func (v *versions) wrote(rv string, applied, inDoubt bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	switch {
	case applied:
		// Writes in doubt were conditioned on versions the item no longer
		// carries: none of them can land any more.
		v.confirmed, v.doubt = rv, nil
	case inDoubt:
		v.doubt = append(v.doubt, rv)
		if len(v.doubt) > maxDoubt {
			v.doubt = v.doubt[len(v.doubt)-maxDoubt:]
		}
	}
}

// last returns the version of the last write known applied; "" if none.
func (v *versions) last() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.confirmed
}

// ours reports whether rv is a renewal version this handle wrote: its
// last confirmed, or one in doubt.
func (v *versions) ours(rv string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return rv != "" && (rv == v.confirmed || slices.Contains(v.doubt, rv))
}

// condition returns the condition that the item carries a version this
// handle wrote, adding its values; "" when there is none.
func (v *versions) condition(values map[string]types.AttributeValue) string {
	v.mu.Lock()
	defer v.mu.Unlock()
	mine := v.doubt
	if v.confirmed != "" {
		mine = append([]string{v.confirmed}, v.doubt...)
	}
	if len(mine) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("#rv IN (")
	for i, rv := range mine {
		if i > 0 {
			b.WriteString(", ")
		}
		k := ":mine" + strconv.Itoa(i)
		values[k] = avS(rv)
		b.WriteString(k)
	}
	b.WriteString(")")
	return b.String()
}

// read gets the lease item; consistent selects a strongly consistent read.
func (l *Lease) read(ctx context.Context, consistent bool) (Record, bool, error) {
	cctx, cancel := context.WithTimeout(ctx, l.opts.CallTimeout)
	defer cancel()
	out, err := l.db.GetItem(cctx, &dynamodb.GetItemInput{
		TableName:      aws.String(l.table),
		Key:            l.opts.Layout.leaseKey(l.job),
		ConsistentRead: aws.Bool(consistent),
	})
	if err != nil {
		return Record{}, false, fmt.Errorf("ddblease: read lease %q: %w", l.job, explainTableError(ctx, l.db, l.table, l.opts.Layout, err))
	}
	if len(out.Item) == 0 {
		return Record{}, false, nil
	}
	r, err := decodeLease(l.opts.Layout, out.Item)
	if err != nil {
		return Record{}, false, fmt.Errorf("%w (table %q)", err, l.table)
	}
	return r, true, nil
}

// writeLog writes the log line an event deserves: one per change of
// leadership at Info, failures at Warn (repeated ones rate-limited), and
// nothing per poll or per request. A pool's job logs its changes of
// leadership at Debug: the pool logs one line per change of its
// assignment at Info (poolRun.act), whatever the number of jobs.
func (h *leaseEvents) writeLog(e Event) {
	l := (*Lease)(h)
	ctx := context.Background()
	if c := l.camp.ctx.Load(); c != nil {
		ctx = *c
	}
	log := l.log()
	change := l.bound.changeLevel()
	switch e.Kind {
	case EventAcquired:
		log.Log(ctx, change, "ddblease: acquired the lease", "fence", e.Fence)
	case EventLost:
		log.WarnContext(ctx, "ddblease: leadership lost", "fence", e.Fence, "reason", string(e.Reason), "err", e.Err)
	case EventDraining:
		log.Log(ctx, change, "ddblease: shutting down: draining the leader's work before resigning", "fence", e.Fence)
	case EventResigned:
		log.Log(ctx, change, "ddblease: resigning the lease", "fence", e.Fence)
	case EventLeaderSeen:
		log.Log(ctx, change, "ddblease: another replica leads", "holder", e.Holder, "fence", e.Fence)
	case EventRunFinished:
		// A slot skipped by an operator's pause is what was asked for:
		// RunSchedule says so at Info.
		if e.Status != RunSucceeded && e.Status != RunSkippedByPause {
			log.WarnContext(ctx, "ddblease: job run did not succeed", "slot", fmtSlot(e.Slot), "fence", e.Fence,
				"status", string(e.Status), "err", e.Err)
		}
	case EventSlotsMissed:
		if e.Missed < 0 {
			log.WarnContext(ctx, "ddblease: a new leader could not check whether earlier slots were missed", "firing", fmtSlot(e.Slot))
		} else {
			log.WarnContext(ctx, "ddblease: slots were missed: no leader ran them in time, and only the latest due slot is run",
				"missed", e.Missed, "firing", fmtSlot(e.Slot))
		}
	case EventRetry:
		if ok, suppressed := l.warn.allow(e.Op, e.Time); ok {
			args := []any{"step", e.Op, "err", e.Err}
			if e.Fence != 0 {
				args = append(args, "fence", e.Fence)
			}
			if suppressed > 0 {
				args = append(args, "similar_warnings_suppressed", suppressed)
			}
			log.WarnContext(ctx, "ddblease: a step failed; retrying", args...)
		}
	case EventStopped:
		// The error is returned to the caller: logging it too would report
		// it twice.
		if e.Err != nil {
			log.DebugContext(ctx, "ddblease: the campaign stopped with an error", "err", e.Err)
		}
	case EventRenewed:
		log.DebugContext(ctx, "ddblease: renewed the lease", "fence", e.Fence, "margin", e.Margin, "latency", e.Latency)
	}
}

// event fills in the fields every event of this handle carries.
func (l *Lease) event(kind EventKind, e Event) Event {
	e.Kind, e.Job, e.Owner, e.Time = kind, l.job, l.opts.Owner, l.opts.Now()
	return e
}

// CheckHealth reports whether this handle is in a state that restarting
// its process could cure, in the spirit of client-go's HealthzAdaptor. It
// returns nil, or an error wrapping ErrUnhealthy that says why in one line,
// when:
//
//   - this handle leads and its renewals are overdue: no heartbeat has
//     landed for more than HeartbeatInterval plus tolerance (a heartbeat
//     that keeps failing, or a renewal loop that is stuck); or
//   - its campaign has failed with the same error for longer than
//     tolerance: the same step (a poll, an acquisition, a heartbeat, a
//     claim) failing with the same DynamoDB error code or cause, with no
//     success of that request in between (a table with the wrong key
//     schema, a missing table, denied access), or Run, RunSchedule or
//     Acquire having returned an error and no campaign having succeeded
//     since.
//
// With Options.Health.FailedRuns set, it also fails once that many runs
// in a row recorded by this handle failed (see HealthOptions).
//
// A standby that polls the lease is healthy, however long another replica
// leads; so is a handle that never campaigned or whose Run returned
// because its context ended. Tolerance zero means LeaseDuration; a
// negative tolerance is an error wrapping ErrInvalid.
//
// The verdict is built from this handle's own events (those Options.Observer
// is given), so it needs no call to DynamoDB.
func (l *Lease) CheckHealth(tolerance time.Duration) error {
	if tolerance < 0 {
		return invalid("health tolerance is negative (%v)", tolerance)
	}
	if tolerance == 0 {
		tolerance = l.opts.LeaseDuration
	}
	var renewed time.Time // the last renewal of the lifetime it leads by (a session's renews a pool's job)
	if t := l.current(); t != nil {
		renewed = t.live.life().renewed()
	}
	return l.health.check(l.opts.Now(), l.job, l.opts.HeartbeatInterval, tolerance, l.opts.Health.FailedRuns, renewed)
}

func (l *Lease) observe(rec Record, present bool) {
	defer l.notify.flush()
	k := known{owner: l.opts.Owner, version: l.vers.last()}
	k.pool, k.sid = l.bound.boundTo() // before the lock: the pool's own
	l.mu.Lock()
	kept := keepItem(rec, l.obs.rec, k)
	defer l.mu.Unlock()
	if !present {
		l.obs = observation{valid: true}
		return
	}
	if !l.obs.present || l.obs.rec.version != rec.version {
		l.obs.since = time.Now()
	}
	if !l.obs.present || l.obs.rec.version != rec.version || l.obs.rec.Fence != rec.Fence || l.obs.rec.Session != rec.Session {
		l.obs.boundFree = false
	}
	l.obs.valid, l.obs.present, l.obs.rec = true, true, kept
	if rec.Owner != l.opts.Owner && !rec.ExpiresAt.IsZero() && (rec.Owner != l.seen.owner || rec.Fence != l.seen.fence) {
		l.seen = seenHolder{owner: rec.Owner, fence: rec.Fence}
		l.notify.push(l.event(EventLeaderSeen, Event{Holder: rec.Owner, Fence: rec.Fence}))
	}
}

// leaseLog is a Lease as the handler of its log lines: lineLogger's
// handler, each record beginning with job=the handle's job and owner,
// written to Options.Logger's handler. A conversion of the handle, so
// that its logger (Lease.log) needs no allocation of its own.
type leaseLog Lease

// log returns the logger of l's lines, made on each call (inlined, on the
// caller's stack), so that a handle keeps none.
func (l *Lease) log() *slog.Logger { return slog.New((*leaseLog)(l)) }

func (h *leaseLog) line() lineHandler {
	return lineHandler{h: h.opts.Logger.Handler(), key: "job", name: h.job, owner: h.opts.Owner}
}

func (h *leaseLog) Enabled(ctx context.Context, level slog.Level) bool {
	return h.opts.Logger.Handler().Enabled(ctx, level)
}

func (h *leaseLog) Handle(ctx context.Context, r slog.Record) error {
	return h.line().Handle(ctx, r)
}

func (h *leaseLog) WithAttrs(as []slog.Attr) slog.Handler { return h.line().WithAttrs(as) }

func (h *leaseLog) WithGroup(name string) slog.Handler { return h.line().WithGroup(name) }

// campaignSlot admits one campaign (Run or RunSchedule) of a handle at a
// time, and holds its context, whose values (trace ids) the handle's log
// lines carry.
type campaignSlot struct {
	active atomic.Bool
	ctx    atomic.Pointer[context.Context]
}

// enter begins a campaign of l under *ctx, unless one is active or the
// context has ended; leave ends it. The slot keeps ctx, which must not
// change while the campaign lasts (a pool's jobs share their run's).
func (c *campaignSlot) enter(l *Lease, ctx *context.Context) error {
	if !c.active.CompareAndSwap(false, true) {
		return invalid("Run %q: another Run or RunSchedule is active on this handle; use one Lease per contender", l.job)
	}
	c.ctx.Store(ctx)
	if (*ctx).Err() != nil {
		c.leave(l, false, nil)
		return fmt.Errorf("ddblease: run %q: %w", l.job, endedBeforeRun{ended(*ctx)})
	}
	l.notify.emit(l.event(EventCampaign, Event{}))
	return nil
}

// values returns the context whose values a tenure's contexts carry: the
// campaign's (Run's, RunSchedule's, a pool's run's), or ctx outside one
// (TryAcquire). A pool's job campaigns under a context of its own, which
// ends as its campaign does: the tenure keeps the pool's instead.
func (c *campaignSlot) values(ctx context.Context) context.Context {
	if p := c.ctx.Load(); p != nil {
		return *p
	}
	return ctx
}

// leave ends the campaign that enter began: it reports EventStopped with
// the campaign's error if it stopped (rather than unwinding from a panic
// in fn).
func (c *campaignSlot) leave(l *Lease, stopped bool, err error) {
	if stopped {
		l.notify.emit(l.event(EventStopped, Event{Err: err}))
	}
	c.ctx.Store(nil)
	c.active.Store(false)
}

// yieldWindow is how long a handle leaves a free lease to the others, by
// the runtime's monotonic clock: a yield is a duration, which a step of
// the wall clock (Options.Now) must not stretch. It holds the end (nil
// before the first), and is only ever extended.
type yieldWindow struct{ until atomic.Pointer[time.Time] }

// open keeps the window open for at least d from now.
func (y *yieldWindow) open(d time.Duration) {
	u := time.Now().Add(d)
	for {
		cur := y.until.Load()
		if cur != nil && !u.After(*cur) || y.until.CompareAndSwap(cur, &u) {
			return
		}
	}
}

// left returns how long the window stays open; zero or less once closed.
func (y *yieldWindow) left() time.Duration {
	if u := y.until.Load(); u != nil {
		return time.Until(*u)
	}
	return 0
}
