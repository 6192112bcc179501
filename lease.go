package ddblease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Lease is one contender's handle on the lease of one job. Its methods are
// safe for concurrent use; writes to the lease item are serialised. At most
// one Run or RunSchedule may be active on a handle at a time.
type Lease struct {
	db     DynamoDBAPI // reports every request to the observer
	table  string
	job    string
	key    map[string]types.AttributeValue
	opts   Options
	log    *slog.Logger
	notify notifier
	warn   warnLimiter

	writeMu     sync.Mutex  // held across every write to the lease item
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
	// standbys until then.
	yieldUntil time.Time
	seen       seenHolder

	// noTxn records that the server answered TransactWriteItems with
	// UnknownOperationException, so that Claim asks only once.
	noTxn atomic.Bool

	health health // what CheckHealth reports, fed by this handle's events

	ctl controlWatch // operator controls seen by the keeper (control.go)
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
	since   time.Time // when rec.version was first seen (monotonic)
}

// New returns a handle on the lease of job in table. It makes no call; the
// table must exist (see CreateTable) when the handle is used.
func New(db DynamoDBAPI, table, job string, optFns ...func(*Options)) (*Lease, error) {
	if db == nil {
		return nil, invalid("DynamoDB client is nil")
	}
	if err := checkTable(table); err != nil {
		return nil, err
	}
	if err := checkName("job name", job, MaxJobLength); err != nil {
		return nil, err
	}
	var o Options
	for _, fn := range optFns {
		if fn != nil {
			fn(&o)
		}
	}
	if err := o.setDefaults(); err != nil {
		return nil, err
	}
	l := &Lease{
		table: table,
		job:   job,
		key:   map[string]types.AttributeValue{attrPK: avS(leaseKey(job))},
		opts:  o,
		log:   o.Logger.With("job", job, "owner", o.Owner),
	}
	l.notify.fn = l.deliver
	l.db = observedDB{db: db, now: o.Now, report: func(e Event) { l.notify.emit(l.event(EventCall, e)) }}
	return l, nil
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

// State is this handle's view of its own leadership.
type State struct {
	Job    string
	Owner  string
	Leader bool  // held and the local deadline has not passed
	Fence  int64 // fence of the current or last tenure; 0 if none
	// AcquiredAt and RenewedAt are the wall-clock times of the tenure's
	// acquisition and latest successful renewal.
	AcquiredAt time.Time
	RenewedAt  time.Time
	// Deadline is when this replica stops believing it leads unless a
	// heartbeat succeeds first; zero when not leader.
	Deadline time.Time
}

// State returns this handle's view of its leadership.
func (l *Lease) State() State {
	now := l.opts.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	s := State{Job: l.job, Owner: l.opts.Owner}
	if t := l.ten; t != nil {
		s.Fence, s.AcquiredAt, s.RenewedAt = t.fence, t.acquiredAt, t.renewedAt
		if !t.over && now.Before(t.deadline) {
			s.Leader = true
			s.Deadline = t.deadline.Round(0)
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

// TryAcquire makes one conditional write that takes the lease if it is free,
// expired, or already this owner's, and returns the new fence. When another
// owner holds a live lease it returns a *HeldError (errors.Is(err, ErrHeld));
// when the write's success is learned only after the tenure's local
// deadline (a slow answer), an error wrapping ErrLost. On a handle that
// already leads, it renews the lease and returns the current fence.
// Errors the server blames on the request (a missing table, a wrong key
// schema, denied access) name the table.
func (l *Lease) TryAcquire(ctx context.Context) (int64, error) {
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	if t := l.current(); t.held && l.opts.Now().Before(t.deadline) {
		err := l.heartbeatLocked(ctx)
		if err == nil {
			return t.fence, nil
		}
		if !errors.Is(err, ErrLost) {
			return 0, err
		}
	}
	return l.acquireLocked(ctx)
}

func (l *Lease) acquireLocked(ctx context.Context) (int64, error) {
	now := l.opts.Now()
	rv := randomID(8)
	names := map[string]string{
		"#pk": attrPK, "#owner": attrOwner, "#fence": attrFence, "#exp": attrExpires,
		"#rv": attrVersion, "#lms": attrLeaseMs, "#acq": attrAcquiredAt, "#ren": attrRenewedAt,
		"#drn": attrDraining,
	}
	values := map[string]types.AttributeValue{
		":me":    avS(l.opts.Owner),
		":zero":  avN(0),
		":one":   avN(1),
		":exp":   avN(now.Add(l.opts.LeaseDuration).UnixMilli()),
		":lms":   avN(l.opts.LeaseDuration.Milliseconds()),
		":now":   avN(now.UnixMilli()),
		":false": avBool(false),
		":rv":    avS(rv),
	}
	cond := l.takeoverRule().condition(now, rv, l.mineIn(values), values)
	in := &dynamodb.UpdateItemInput{
		TableName: aws.String(l.table),
		Key:       l.key,
		UpdateExpression: aws.String("SET #owner = :me, #fence = if_not_exists(#fence, :zero) + :one, " +
			"#exp = :exp, #rv = :rv, #lms = :lms, #acq = :now, #ren = :now, #drn = :false"),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            names,
		ExpressionAttributeValues:           values,
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
	deadline := now.Add(l.opts.LeaseDuration - l.opts.margin())
	rec, ours, err := l.write(ctx, l.opts.CallTimeout, deadline, in, rv)
	switch {
	case ours && !l.begin(ctx, rec, now, l.opts.Now().Sub(now)):
		// The write landed, but we learned it only after the tenure's
		// local deadline: it is over before it began.
		return 0, fmt.Errorf("%w: %q fence %d: the acquisition was confirmed only after its local deadline", ErrLost, l.job, rec.Fence)
	case ours:
		return rec.Fence, nil
	case err != nil:
		return 0, fmt.Errorf("ddblease: acquire %q: %w", l.job, explainTableError(ctx, l.db, l.table, err))
	}
	return 0, &HeldError{Job: l.job, Owner: rec.Owner, Fence: rec.Fence, ExpiresAt: rec.ExpiresAt, Draining: rec.Draining}
}

// write sends a conditional write that sets the renewal version rv, and
// finds out whether it was applied. ours reports that the item now carries
// rv. Otherwise rec is the item as read (zero if absent) and err is nil
// when the condition failed, or the error when the outcome is unknown.
//
// The write is made once: the SDK's own retries are turned off for it, so
// that a refusal (throttling, a validation error) proves it did not apply.
// When the outcome is unknown the item is read back, even when ctx has
// ended, but never past until (zero: no bound but timeout): past it, the
// write stays in doubt.
func (l *Lease) write(ctx context.Context, timeout time.Duration, until time.Time, in *dynamodb.UpdateItemInput, rv string) (rec Record, ours bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, bounded(timeout, until, l.opts.Now()))
	out, err := l.db.UpdateItem(cctx, in, singleAttempt)
	cancel()
	var item map[string]types.AttributeValue
	var ccf *types.ConditionalCheckFailedException
	switch {
	case err == nil && len(out.Attributes) > 0:
		item = out.Attributes
	case errors.As(err, &ccf) && len(ccf.Item) > 0:
		item = ccf.Item
		err = nil
	case err != nil && !errors.As(err, &ccf) && !mayHaveApplied(err):
		// Refused before it could apply: nothing is in doubt.
		return Record{}, false, err
	case errors.As(err, &ccf):
		err = nil
		fallthrough
	default:
		// Either the server returned no item with its answer, or the outcome
		// is unknown: read the item back. The read must be made even when ctx
		// has ended, so that a write that did land is known.
		t := bounded(timeout, until, l.opts.Now())
		if t <= 0 {
			l.wrote(rv, false, true)
			return Record{}, false, errors.Join(err, errors.New("ddblease: no time left to read the lease back"))
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t)
		r, present, rerr := l.read(rctx, true)
		cancel()
		if rerr != nil {
			// Even a conditional failure leaves the write in doubt here: the
			// write might still be delivered late.
			l.wrote(rv, false, true)
			return Record{}, false, errors.Join(err, rerr)
		}
		if !present {
			l.wrote(rv, false, err != nil)
			return Record{}, false, err
		}
		l.observe(r, true)
		l.wrote(rv, r.version == rv, err != nil)
		return r, r.version == rv, err
	}
	r, derr := decodeLease(item)
	if derr != nil {
		return Record{}, false, fmt.Errorf("%w (table %q)", derr, l.table)
	}
	l.observe(r, true)
	l.wrote(rv, r.version == rv, false)
	return r, r.version == rv, nil
}

// bounded returns timeout, or less if until (when not zero) comes sooner.
func bounded(timeout time.Duration, until, now time.Time) time.Duration {
	if until.IsZero() {
		return timeout
	}
	return min(timeout, until.Sub(now))
}

// singleAttempt turns the SDK's retries off for one request.
func singleAttempt(o *dynamodb.Options) { o.RetryMaxAttempts = 1 }

// wrote records the outcome of a write of version rv: applied, or in doubt
// (it may still land).
func (l *Lease) wrote(rv string, applied, inDoubt bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case applied:
		// Writes in doubt were conditioned on versions the item no longer
		// carries: none of them can land any more.
		l.confirmed, l.doubt = rv, nil
	case inDoubt:
		l.doubt = append(l.doubt, rv)
		if len(l.doubt) > maxDoubt {
			l.doubt = l.doubt[len(l.doubt)-maxDoubt:]
		}
	}
}

// mineIn returns the condition that the item carries a version this handle
// wrote, adding its values; "" when there is none.
func (l *Lease) mineIn(values map[string]types.AttributeValue) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	mine := l.doubt
	if l.confirmed != "" {
		mine = append([]string{l.confirmed}, l.doubt...)
	}
	if len(mine) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("#rv IN (")
	for i, v := range mine {
		if i > 0 {
			b.WriteString(", ")
		}
		k := ":mine" + strconv.Itoa(i)
		values[k] = avS(v)
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
		Key:            l.key,
		ConsistentRead: aws.Bool(consistent),
	})
	if err != nil {
		return Record{}, false, fmt.Errorf("ddblease: read lease %q: %w", l.job, explainTableError(ctx, l.db, l.table, err))
	}
	if len(out.Item) == 0 {
		return Record{}, false, nil
	}
	r, err := decodeLease(out.Item)
	if err != nil {
		return Record{}, false, fmt.Errorf("%w (table %q)", err, l.table)
	}
	return r, true, nil
}

// Acquire waits until it holds the lease or ctx ends, and returns the fence.
// It polls with eventually consistent reads every RetryInterval (less a
// jitter), ten times as often while the holder drains, and writes only when
// the lease looks free: the conditional write decides. Throttling, server
// and network errors are logged (rate-limited) and retried; errors the
// server blames on the request (a missing table, a wrong key schema, denied
// access, bad credentials) and a malformed lease item are returned at once.
// When ctx ends it returns an error wrapping ctx's cause, joined with the
// last error if the last attempt failed.
func (l *Lease) Acquire(ctx context.Context) (int64, error) {
	fence, _, err := l.acquire(ctx)
	return fence, err
}

// acquire is Acquire; failing reports that every attempt failed.
func (l *Lease) acquire(ctx context.Context) (fence int64, failing bool, err error) {
	var lastErr error
	succeeded := false
	for {
		if ctx.Err() != nil {
			return 0, !succeeded && lastErr != nil, errors.Join(fmt.Errorf("ddblease: acquire %q: %w", l.job, ended(ctx)), lastErr)
		}
		var err error
		wait := l.pollInterval()
		if y := l.yielding(); y > 0 {
			wait = min(wait, y)
		}
		if l.takeable() && l.yielding() <= 0 {
			if fence, err = l.TryAcquire(ctx); err == nil {
				return fence, false, nil
			}
		} else if err = l.poll(ctx); err == nil && l.takeable() && l.yielding() <= 0 {
			continue
		}
		switch {
		case err == nil, errors.Is(err, ErrHeld), errors.Is(err, ErrLost):
			lastErr, succeeded = nil, true
		case ctx.Err() != nil:
			continue
		case !retryable(err):
			return 0, true, err
		default:
			lastErr = err
			l.notify.emit(l.event(EventRetry, Event{Op: "acquire", Err: err}))
		}
		if sleep(ctx, wait) != nil {
			continue
		}
	}
}

// yielding returns how long Acquire still leaves a free lease to others.
func (l *Lease) yielding() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.yieldUntil.Sub(l.opts.Now())
}

// poll reads the lease item, eventually consistent, and records what it saw.
func (l *Lease) poll(ctx context.Context) error {
	rec, present, err := l.read(ctx, false)
	if err == nil {
		l.observe(rec, present)
	}
	return err
}

// pollInterval is how long a standby waits before it looks again: a
// jittered RetryInterval (a tenth of it while the holder drains), or less
// when the lease becomes takeable sooner, by its recorded expiry or by the
// watch on its renewal version, so that a crashed holder's lease is taken
// the moment it may be, without extra reads.
func (l *Lease) pollInterval() time.Duration {
	r := l.takeoverRule()
	d := l.opts.RetryInterval
	if r.obs.present && r.obs.rec.Draining {
		d /= 10
	}
	d = jitter(d)
	if r.obs.present {
		d = min(d, r.wait(l.opts.Now()))
	}
	return d
}

func (l *Lease) observe(rec Record, present bool) {
	now := l.opts.Now()
	defer l.notify.flush()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !present {
		l.obs = observation{valid: true}
		return
	}
	if !l.obs.present || l.obs.rec.version != rec.version {
		l.obs.since = now
	}
	l.obs.valid, l.obs.present, l.obs.rec = true, true, rec
	if rec.Owner != l.opts.Owner && !rec.ExpiresAt.IsZero() && (rec.Owner != l.seen.owner || rec.Fence != l.seen.fence) {
		l.seen = seenHolder{owner: rec.Owner, fence: rec.Fence}
		l.notify.push(l.event(EventLeaderSeen, Event{Holder: rec.Owner, Fence: rec.Fence}))
	}
}

// takeable reports whether the last observation allows an acquisition
// attempt now (see takeover).
func (l *Lease) takeable() bool { return l.takeoverRule().mayTry(l.opts.Now()) }
