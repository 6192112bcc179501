package ddblease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease/internal/probe"
)

// Lease is one contender's handle on the lease of one job. Its methods are
// safe for concurrent use; writes to the lease item are serialised.
type Lease struct {
	db    DynamoDBAPI
	table string
	job   string
	key   map[string]types.AttributeValue
	opts  Options
	log   *slog.Logger

	writeMu sync.Mutex // held across every write to the lease item

	mu  sync.Mutex // guards ten, obs and mine
	ten tenure
	obs observation
	// mine lists renewal versions this handle wrote that the item may
	// carry: the last one confirmed, then any whose outcome is unknown. Our
	// own writes are conditioned on the item carrying one of them, so a
	// write that lands late (its answer lost, or abandoned on a timeout)
	// can never undo a newer one, such as a resignation.
	mine []string

	// noTxn records that the server answered TransactWriteItems with
	// UnknownOperationException, so that Claim asks only once.
	noTxn atomic.Bool

	health health // what CheckHealth reports, fed by this handle's events
}

// maxMine bounds Lease.mine; an older version in doubt is forgotten, which
// at worst makes a later write of ours fail its condition.
const maxMine = 50

// tenure is this handle's own view of its leadership.
type tenure struct {
	held       bool
	fence      int64
	version    string    // renewal version of our last successful write
	sentAt     time.Time // when that write was sent (monotonic)
	deadline   time.Time // sentAt + LeaseDuration - margin (monotonic)
	acquiredAt time.Time
	renewedAt  time.Time
	draining   bool
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
	return &Lease{
		db:    db,
		table: table,
		job:   job,
		key:   map[string]types.AttributeValue{attrPK: avS(leaseKey(job))},
		opts:  o,
		log:   o.Logger.With("job", job, "owner", o.Owner),
	}, nil
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
	s := State{
		Job:        l.job,
		Owner:      l.opts.Owner,
		Fence:      l.ten.fence,
		AcquiredAt: l.ten.acquiredAt,
		RenewedAt:  l.ten.renewedAt,
	}
	if l.ten.held && now.Before(l.ten.deadline) {
		s.Leader = true
		s.Deadline = l.ten.deadline.Round(0)
	}
	return s
}

// IsLeader reports whether this handle holds the lease and its local
// deadline has not passed.
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
// deadline (a slow answer, retries), an error wrapping ErrLost.
// On a handle that already leads, it renews the lease and returns the
// current fence.
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
		":me":     avS(l.opts.Owner),
		":zero":   avN(0),
		":one":    avN(1),
		":exp":    avN(now.Add(l.opts.LeaseDuration).UnixMilli()),
		":rv":     avS(rv),
		":lms":    avN(l.opts.LeaseDuration.Milliseconds()),
		":now":    avN(now.UnixMilli()),
		":cutoff": avN(now.Add(-l.opts.MaxClockSkew).UnixMilli()),
		":false":  avBool(false),
	}
	// The item is absent, or it is expired, still ours (it carries a
	// version we wrote), or watched unchanged for a lease; and it does not
	// carry rv already, so that an SDK retry of a write that did land is
	// refused instead of taking a second fence.
	takeover := "#exp < :cutoff"
	if mine := l.mineIn(values); mine != "" {
		takeover += " OR (#owner = :me AND " + mine + ")"
	}
	if seen, ok := l.watchedLongEnough(now); ok {
		takeover += " OR #rv = :seen"
		values[":seen"] = avS(seen)
	}
	// An existing item must also be well formed: a fence that is missing or
	// not a number would restart fences, so such an item is refused.
	wellFormed := "attribute_type(#fence, :tn) AND attribute_type(#owner, :ts) AND attribute_type(#rv, :ts) " +
		"AND attribute_type(#exp, :tn)"
	cond := "attribute_not_exists(#pk) OR ((" + takeover + ") AND #rv <> :rv AND " + wellFormed + ")"
	values[":tn"], values[":ts"] = avS("N"), avS("S")
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
	rec, ours, err := l.write(ctx, l.opts.CallTimeout, in, rv)
	switch {
	case ours && !l.opts.Now().Before(now.Add(l.opts.LeaseDuration-l.opts.margin())):
		// The write landed, but we learned it only after the tenure's
		// local deadline: it is over before it began.
		return 0, fmt.Errorf("%w: %q fence %d: the acquisition was confirmed only after its local deadline", ErrLost, l.job, rec.Fence)
	case ours:
		l.begin(rec, now)
		return rec.Fence, nil
	case err != nil:
		return 0, fmt.Errorf("ddblease: acquire %q: %w", l.job, err)
	}
	return 0, &HeldError{Job: l.job, Owner: rec.Owner, Fence: rec.Fence, ExpiresAt: rec.ExpiresAt, Draining: rec.Draining}
}

// write sends a conditional write that sets the renewal version rv, and
// finds out whether it was applied. ours reports that the item now carries
// rv: the write, or an earlier attempt of it that the SDK retried, took
// effect. Otherwise rec is the item as read (zero if absent) and err is nil
// when the condition failed, or the error when the outcome is unknown.
func (l *Lease) write(ctx context.Context, timeout time.Duration, in *dynamodb.UpdateItemInput, rv string) (rec Record, ours bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	out, err := l.db.UpdateItem(cctx, in)
	cancel()
	var item map[string]types.AttributeValue
	var ccf *types.ConditionalCheckFailedException
	switch {
	case err == nil && len(out.Attributes) > 0:
		item = out.Attributes
	case errors.As(err, &ccf) && len(ccf.Item) > 0:
		item = ccf.Item
		err = nil
	case errors.As(err, &ccf):
		err = nil
		fallthrough
	default:
		// Either the server returned no item with its answer, or the outcome
		// is unknown: read the item back. The read must be made even when ctx
		// has ended, so that a write that did land is known.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		r, present, rerr := l.read(rctx, true)
		cancel()
		if rerr != nil {
			// Even a conditional failure leaves the write in doubt here: an
			// earlier attempt of it, retried by the SDK, may have landed.
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
		return Record{}, false, derr
	}
	l.observe(r, true)
	l.wrote(rv, r.version == rv, false)
	return r, r.version == rv, nil
}

// wrote records the outcome of a write of version rv: applied, or in doubt
// (it may still land).
func (l *Lease) wrote(rv string, applied, inDoubt bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case applied:
		l.mine = append(l.mine[:0], rv)
	case inDoubt:
		l.mine = append(l.mine, rv)
		if len(l.mine) > maxMine {
			l.mine = l.mine[len(l.mine)-maxMine:]
		}
	}
}

// mineIn returns the condition that the item carries a version this handle
// wrote, adding its values; "" when there is none.
func (l *Lease) mineIn(values map[string]types.AttributeValue) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.mine) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("#rv IN (")
	for i, v := range l.mine {
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
		return Record{}, false, fmt.Errorf("ddblease: read lease %q: %w", l.job, err)
	}
	if len(out.Item) == 0 {
		return Record{}, false, nil
	}
	r, err := decodeLease(out.Item)
	return r, err == nil, err
}

// Acquire waits until it holds the lease or ctx ends, and returns the fence.
// It polls with eventually consistent reads every RetryInterval (less a
// jitter), ten times as often while the holder drains, and writes only when
// the lease looks free: the conditional write decides. Throttling, server
// and network errors are logged and retried; other errors are returned.
func (l *Lease) Acquire(ctx context.Context) (int64, error) {
	var lastErr error
	for {
		var err error
		if l.takeable() {
			var fence int64
			if fence, err = l.TryAcquire(ctx); err == nil {
				return fence, nil
			}
		} else if err = l.poll(ctx); err == nil && l.takeable() {
			continue
		}
		if err != nil && !errors.Is(err, ErrHeld) && !errors.Is(err, ErrLost) {
			if ctx.Err() != nil {
				return 0, fmt.Errorf("ddblease: acquire %q: %w", l.job, context.Cause(ctx))
			}
			if !transient(err) {
				return 0, err
			}
			l.log.Warn("ddblease: lease poll failed; retrying", "err", err)
			lastErr = err
		}
		if err := sleep(ctx, l.pollInterval()); err != nil {
			return 0, errors.Join(fmt.Errorf("ddblease: acquire %q: %w", l.job, err), lastErr)
		}
	}
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
	now := l.opts.Now()
	l.mu.Lock()
	o := l.obs
	l.mu.Unlock()
	d := l.opts.RetryInterval
	if o.present && o.rec.Draining {
		d /= 10
	}
	d = time.Duration(float64(d) * (0.75 + 0.2*rand.Float64()))
	if o.present {
		byExpiry := o.rec.ExpiresAt.Add(l.opts.MaxClockSkew).Sub(now)
		byWatch := o.since.Add(max(l.opts.LeaseDuration, o.rec.Duration)).Sub(now)
		d = min(d, max(min(byExpiry, byWatch)+time.Millisecond, 0))
	}
	return d
}

func (l *Lease) observe(rec Record, present bool) {
	now := l.opts.Now()
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
}

// takeable reports whether the last observation allows an acquisition
// attempt: nothing seen yet, no item, our own item, an expiry older than
// MaxClockSkew, or one renewal version watched for a whole lease.
func (l *Lease) takeable() bool {
	now := l.opts.Now()
	if _, ok := l.watchedLongEnough(now); ok {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	o := l.obs
	return !o.valid || !o.present || o.rec.Owner == l.opts.Owner ||
		o.rec.ExpiresAt.Before(now.Add(-l.opts.MaxClockSkew))
}

// watchedLongEnough returns the renewal version this handle has seen
// unchanged for at least a whole lease, by its monotonic clock.
func (l *Lease) watchedLongEnough(now time.Time) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	o := l.obs
	if !o.present {
		return "", false
	}
	return o.rec.version, now.Sub(o.since) >= max(l.opts.LeaseDuration, o.rec.Duration)
}

func (l *Lease) current() tenure {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ten
}

// begin records a new tenure from the item our write produced.
func (l *Lease) begin(rec Record, sentAt time.Time) {
	l.mu.Lock()
	l.ten = tenure{
		held:       true,
		fence:      rec.Fence,
		version:    rec.version,
		sentAt:     sentAt,
		deadline:   sentAt.Add(l.opts.LeaseDuration - l.opts.margin()),
		acquiredAt: sentAt.Round(0),
		renewedAt:  sentAt.Round(0),
	}
	t := l.ten
	l.mu.Unlock()
	probe.Tenure(l.job, l.opts.Owner, t.fence, t.deadline, false)
}

// renewed records a successful fenced write sent at sentAt.
func (l *Lease) renewed(fence int64, version string, sentAt time.Time) {
	l.mu.Lock()
	if !l.ten.held || l.ten.fence != fence {
		l.mu.Unlock()
		return
	}
	l.ten.version = version
	l.ten.sentAt = sentAt
	l.ten.deadline = sentAt.Add(l.opts.LeaseDuration - l.opts.margin())
	l.ten.renewedAt = sentAt.Round(0)
	deadline := l.ten.deadline
	l.mu.Unlock()
	probe.Tenure(l.job, l.opts.Owner, fence, deadline, false)
}

// end closes the tenure with the given fence.
func (l *Lease) end(fence int64) {
	l.mu.Lock()
	ended := l.ten.held && l.ten.fence == fence
	if ended {
		l.ten.held = false
		l.ten.draining = false
	}
	l.mu.Unlock()
	if ended {
		probe.Tenure(l.job, l.opts.Owner, fence, time.Time{}, true)
	}
}

// holds reports whether the tenure with this fence is still open.
func (l *Lease) holds(fence int64) bool {
	t := l.current()
	return t.held && t.fence == fence
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}
