package ddblease

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// This file owns Lease: the handle, New, State and the write lock;
// acquisition, heartbeat and resignation are fence.go's, heartbeat.go's and
// resign.go's.

// Lease is one contender's handle on the lease of one job. Its methods are
// safe for concurrent use; writes to the lease item are serialised. At most
// one Run or RunSchedule may be active on a handle at a time.
type Lease struct {
	db     DynamoDBAPI // reports every request to the observer
	table  string
	job    string
	opts   Options
	log    *slog.Logger
	notify notifier
	warn   warnLimiter

	writes      writeLock   // held across every write to the lease item
	campaigning atomic.Bool // Run or RunSchedule is active
	// runCtx is the context of the active Run, whose values (trace ids)
	// the log lines carry.
	runCtx atomic.Pointer[context.Context]

	mu  sync.Mutex // guards ten, obs, confirmed, doubt, yieldUntil and seen
	ten *term      // the current or last term; nil before the first
	obs observation
	// confirmed is the renewal version of this handle's last write known
	// to have landed; doubt lists later versions whose outcome is unknown
	// (they may still land). Our own writes are conditioned on the item
	// carrying one of them, so a write that lands late (its answer lost,
	// or abandoned on a timeout) can never undo a newer one, such as a
	// resignation. The confirmed version is never dropped.
	confirmed string
	doubt     []string
	// yieldUntil: after this handle gave the lease up while its campaign
	// goes on (Resign during Run), Acquire leaves a free lease to the
	// standbys until then, by the runtime's monotonic clock: a yield is a
	// duration, which a step of the wall clock (Options.Now) must not
	// stretch.
	yieldUntil time.Time
	seen       seenHolder

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

	ctl controlWatch // operator controls seen by the keeper (control.go)

	// pool is the pool whose job this lease is (NewPool); nil for a lease
	// of its own. Its acquisitions bind the lease to the pool's session.
	pool *Pool

	// born is when the handle was made, by both clocks: a schedule runner
	// follows the wall clock's moves from there, so that a RunSchedule
	// called again (after a panic, say) while the wall clock is stepped
	// ahead still sees it come back.
	born sent
}

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
	rec     Record
	since   time.Time // when rec.version was first seen, by the runtime's clock
	// boundFree: rec is bound to a pool session that the session rules
	// freed (Lease.judgeBound).
	boundFree bool
}

// New returns a handle on the lease of job in table. It makes no call; the
// table must exist (see CreateTable) when the handle is used.
func New(db DynamoDBAPI, table, job string, optFns ...func(*Options)) (*Lease, error) {
	o, err := checkNew(db, table, "job name", job, []string{"job\x00" + job}, optFns)
	if err != nil {
		return nil, err
	}
	l := &Lease{
		table: table,
		job:   job,
		opts:  o,
		log:   lineLogger(o.Logger, "job", job, o.Owner),
		born:  o.sendNow(),
	}
	l.notify.fn = l.deliver
	l.writes.notify = &l.notify
	l.db = observedDB{db: db, now: o.Now, report: func(e Event) { l.notify.emit(l.event(EventCall, e)) },
		answered: func() { l.reached.Store(true) }}
	return l, nil
}

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

// writeLock is held across every write to the lease item. Events are
// not delivered while it is held: unlock delivers them once it is
// released, so that an observer may call any method of the handle.
type writeLock struct {
	mu     sync.Mutex
	notify *notifier
}

func (w *writeLock) lock() {
	w.mu.Lock()
	w.notify.hold()
}

// unlock releases the lock and delivers the events queued meanwhile.
func (w *writeLock) unlock() {
	w.notify.release()
	w.mu.Unlock()
	w.notify.flush()
}

// deliver hands an event to the health check, the log and the user's
// observer.
func (l *Lease) deliver(e Event) {
	l.health.observe(e)
	l.logEvent(e)
	if l.opts.Observer != nil {
		l.opts.Observer(e)
	}
}

// Job returns the job name.
func (l *Lease) Job() string { return l.job }

// Owner returns this contender's owner id.
func (l *Lease) Owner() string { return l.opts.Owner }

// Options returns the options in force, defaults filled in.
func (l *Lease) Options() Options { return l.opts }

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
		s.Fence, s.AcquiredAt, s.RenewedAt = t.fence, t.acquiredAt, t.renewedAt
		if t.sess != nil {
			if r := t.sess.renewed(); r.After(s.RenewedAt) {
				s.RenewedAt = r
			}
		}
		if t.leadsLocked() {
			d, _ := t.deadlines()
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
