package ddblease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// This file owns acquisition and the fence: the standby's polls
// (Acquire), each attempt (a conditional write when the lease looks
// takeable, a read otherwise), the write that takes the lease and
// increments its fence (tryAcquire) and lists the job in the directory
// (Lease.list), and the takeover rule that write and the standby's
// waiting both follow (takeover).

// Acquire waits until it holds the lease or ctx ends, and returns the fence.
// It polls with eventually consistent reads every RetryInterval (less a
// jitter), ten times as often while the holder drains, and writes only when
// the lease looks free: the conditional write decides. Throttling, server
// and network errors are logged (rate-limited) and retried; errors the
// server blames on the request (a missing table, a wrong key schema, denied
// access, bad credentials) and a malformed lease item are returned at once,
// and so is a request the client could not send (no credentials, no
// region, a credentials service refusing the client) while no request of
// this handle has ever reached the table, unless the failure looks like a
// network that is not up yet (a credentials endpoint refusing connections
// or timing out, a credentials service throttling or failing): that is
// retried for one LeaseDuration first. Once a request has reached the
// table, such failures are retried like a network error.
// When ctx ends it returns an error wrapping ctx's cause, joined with the
// last error if the last attempt failed.
func (l *Lease) Acquire(ctx context.Context) (int64, error) {
	t, _, err := l.acquire(ctx)
	if err != nil {
		return 0, err
	}
	return t.fence, nil
}

// acquire is Acquire, returning the term; failing reports that every
// attempt failed.
func (l *Lease) acquire(ctx context.Context) (t *term, failing bool, err error) {
	return l.acquireWith(ctx, nil)
}

// acquireWith is acquire whose first attempt has its turn already
// (Pool.withToken): token ends it; nil, the attempt waits for one.
func (l *Lease) acquireWith(ctx context.Context, token func()) (t *term, failing bool, err error) {
	defer func() {
		if token != nil {
			token() // never attempted
		}
	}()
	var lastErr error
	succeeded := false
	var unsentSince time.Time // first failure to send, while nothing has reached the table
	// Failed attempts back off, so that a standby facing an outage of fast
	// errors does not hammer the table even when the lease looks takeable.
	bo := fixed(l.opts.RetryInterval)
	for {
		if ctx.Err() != nil {
			return nil, !succeeded && lastErr != nil, errors.Join(fmt.Errorf("ddblease: acquire %q: %w", l.job, ended(ctx)), lastErr)
		}
		t, again, err := l.attempt(ctx, token)
		token = nil
		switch {
		case t != nil:
			return t, false, nil
		case again:
			continue
		}
		wait := l.pollInterval()
		switch {
		case err == nil, errors.Is(err, ErrHeld), errors.Is(err, ErrLost), errors.Is(err, errNoSession):
			lastErr, succeeded = nil, true
			bo.reset()
			if errors.Is(err, errNoSession) {
				// A lease takeable now waits for the pool's session.
				wait = max(wait, jitter(l.opts.RetryInterval))
			}
		case ctx.Err() != nil:
			continue
		case unsent(err) && !l.reached.Load() && !l.opts.mayPassAtStart(err, &unsentSince):
			// Nothing has ever reached the table: a client without
			// credentials or region would fail the same way for ever.
			return nil, true, fmt.Errorf("ddblease: %q: no request could be sent to table %q (check the client's credentials and region): %w",
				l.job, l.table, err)
		case !retryable(err):
			return nil, true, err
		default:
			lastErr = err
			wait = max(wait, bo.next())
			l.notify.emit(l.event(EventRetry, Event{Op: "acquire", Err: err}))
		}
		if sleep(ctx, wait) != nil {
			continue
		}
	}
}

// attempt makes one attempt to acquire: a conditional write when the
// lease may be takeable, a read otherwise (again reports that the read
// found it takeable). A pool's job waits for its pool's token first
// (Pool.attempt), unless token is its turn already (acquireWith).
func (l *Lease) attempt(ctx context.Context, token func()) (t *term, again bool, err error) {
	done := token
	if done == nil {
		if done, err = l.bound.attempt(ctx); err != nil {
			return nil, false, err
		}
	}
	defer done()
	if l.mayTry() {
		t, err = l.tryAcquire(ctx, true)
		if errors.Is(err, ErrHeld) && l.bound.frees(ctx, l) {
			// Refused as bound to another's session, which the session
			// rules free now (a dead replica's): take it at once.
			return nil, true, nil
		}
		return t, false, err
	}
	rec, present, err := l.read(ctx, false)
	if err != nil {
		return nil, false, err
	}
	prev := l.takeoverRule()
	l.observe(rec, present) // a standby's poll: an eventually consistent read
	l.warnSameOwner(prev, rec, present)
	l.bound.frees(ctx, l)
	return nil, l.mayTry(), nil
}

// warnSameOwner logs a warning (at most one every warnEvery) when a
// standby's polls show the lease renewed under this handle's Owner by a
// writer this handle does not know: another live process uses the same
// Owner, which Options.Owner forbids. prev is the rule of the observation
// before rec's. A predecessor that stopped under the same Owner (a
// restarted pod keeps its name) renews nothing, and is not warned of.
func (l *Lease) warnSameOwner(prev takeover, rec Record, present bool) {
	if !present || !prev.obs.present || prev.ours || rec.Session != "" || rec.Owner != l.opts.Owner ||
		prev.obs.rec.Owner != rec.Owner || prev.obs.rec.version == rec.version {
		return
	}
	l.mu.Lock()
	ours := l.vers.ours(rec.version)
	l.mu.Unlock()
	if ours {
		return
	}
	if ok, suppressed := l.warn.allow("same owner", time.Now()); ok {
		l.log().Warn("ddblease: another process holds this lease under this handle's Owner: Options.Owner must differ between contenders; "+
			"this handle waits for the lease to expire, as for any holder", "holder", rec.Owner, "fence", rec.Fence,
			"similar_warnings_suppressed", suppressed)
	}
}

// mayPassAtStart reports whether err, of a request never sent while
// nothing has reached the table, may still pass: it looks like a network
// not up yet (mayPass), and such failures began, at *since (set by the
// first), less than a LeaseDuration ago.
func (o *Options) mayPassAtStart(err error, since *time.Time) bool {
	if !mayPass(err) {
		return false
	}
	now := o.Now()
	if since.IsZero() {
		*since = now
	}
	return now.Sub(*since) < o.LeaseDuration
}

// pollInterval is how long a standby waits before it looks again: a
// jittered RetryInterval (a tenth of it while the holder drains), or less
// when the lease becomes takeable sooner, by its recorded expiry or by the
// watch on its renewal version, so that a crashed holder's lease is taken
// the moment it may be, without extra reads. While this handle leaves a
// free lease to the others (Lease.yield), it looks again after a jittered
// RetryInterval, to see whether one took it, and at the end of the yield:
// not in a loop while the lease looks takeable.
func (l *Lease) pollInterval() time.Duration {
	r := l.takeoverRule()
	d := l.opts.RetryInterval
	if r.obs.present && r.obs.rec.Draining {
		d /= 10
	}
	d = jitter(d)
	if r.obs.present && r.obs.rec.Session == "" {
		d = min(d, r.wait(l.opts.sendNow()))
	}
	if y := l.yield.left(); y > 0 {
		// Leaving a free lease to the standbys: look again after a
		// RetryInterval, to see whether one took it.
		d = min(max(d, jitter(l.opts.RetryInterval)), y)
	}
	return d
}

// mayTry reports whether Acquire may try to take the lease now: the last
// observation allows it (see takeover), and this handle is not leaving a
// free lease to the others (Lease.yield).
func (l *Lease) mayTry() bool {
	return l.takeoverRule().mayTry(l.opts.sendNow()) && l.yield.left() <= 0
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
	t, err := l.tryAcquire(ctx, false)
	if err != nil {
		return 0, err
	}
	return t.fence, nil
}

// tryAcquire is TryAcquire, returning the term. For a campaign's attempt
// it writes nothing while the handle leaves a free lease to the others
// (nil, nil): a resignation that held the write lock meanwhile has just
// begun such a pause.
func (l *Lease) tryAcquire(ctx context.Context, campaign bool) (*term, error) {
	l.writes.lock(&l.notify)
	defer l.writes.unlock(&l.notify)
	if t := l.current(); t != nil && t.leads() {
		err := t.renew(ctx)
		if err == nil {
			return t, nil
		}
		if !errors.Is(err, ErrLost) {
			return nil, err
		}
	}
	if campaign && l.yield.left() > 0 {
		return nil, nil
	}
	live, err := l.bound.liveness(l)
	if err != nil {
		return nil, err
	}
	snt := l.opts.sendNow()
	now := snt.at
	rv := randomID(8)
	u := newLeaseUpdate()
	u.add("#owner = :me, #fence = if_not_exists(#fence, :zero) + :one")
	u.renewal(l.opts, now, rv, false)
	u.set("acq", attrAcquiredAt, avN(now.UnixMilli()))
	live.binds(u)
	names, values := u.names, u.values
	names["#pk"], names["#owner"], names["#fence"], names["#ses"] = l.opts.Layout.PartitionKey, attrOwner, attrFence, attrSession
	values[":me"], values[":zero"], values[":one"] = avS(l.opts.Owner), avN(0), avN(1)
	cond := l.takeoverRule().condition(snt, rv, l.vers.condition(values), values)
	update := u.expression()
	in := &dynamodb.UpdateItemInput{
		TableName:                           aws.String(l.table),
		Key:                                 l.opts.Layout.leaseKey(l.job),
		UpdateExpression:                    aws.String(update),
		ConditionExpression:                 aws.String(cond),
		ExpressionAttributeNames:            names,
		ExpressionAttributeValues:           values,
		ReturnValues:                        types.ReturnValueAllNew,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
	deadline := now.Add(l.opts.holdFor())
	rec, ours, err := l.write(ctx, l.opts.CallTimeout, deadline, in, rv)
	switch {
	case ours:
		if t := l.begin(l.camp.values(ctx), rec, snt, l.opts.Now().Sub(now), live); t != nil {
			if !rec.listed {
				l.list(ctx, rec.Fence)
			}
			return t, nil
		}
		// The write landed, but we learned it only after the tenure's
		// local deadline: it is over before it began.
		return nil, fmt.Errorf("%w: %q fence %d: the acquisition was confirmed only after its local deadline", ErrLost, l.job, rec.Fence)
	case err != nil:
		return nil, fmt.Errorf("ddblease: acquire %q: %w", l.job, explainTableError(ctx, l.db, l.table, l.opts.Layout, err))
	}
	return nil, &HeldError{Job: l.job, Owner: rec.Owner, Fence: rec.Fence, ExpiresAt: rec.ExpiresAt, Draining: rec.Draining}
}

// takeover is the one home of the rule by which a contender may take a
// lease it has observed. A lease may be taken when:
//   - there is no lease item;
//   - its recorded expiry is older than MaxClockSkew on the contender's
//     clock (the writer's clock may be that much behind);
//   - the contender has watched one renewal version unchanged for a whole
//     lease (the longer of its own LeaseDuration and the duration written)
//     on the runtime's monotonic clock: no clocks compared at all, and no
//     step of the wall clock (Options.Now) moves it;
//   - it is this handle's own item, carrying a version this handle wrote.
//
// The same value yields the DynamoDB condition that decides (condition),
// the client-side "may I try now" (mayTry), and how long a standby waits
// before the lease becomes takeable by time alone (wait). Each takes the
// instant as sent: by Options.Now, which expiries are compared with, and
// by the runtime's clock, which the watch runs on.
type takeover struct {
	obs   observation
	owner string        // this handle's owner id
	ours  bool          // the observed item carries a renewal version this handle wrote
	sid   string        // this handle's pool session, if live: the items bound to it are this handle's to take
	skew  time.Duration // MaxClockSkew
	lease time.Duration // this handle's LeaseDuration
}

// takeoverRule returns the rule for the last observation.
func (l *Lease) takeoverRule() takeover {
	l.mu.Lock()
	r := takeover{obs: l.obs, owner: l.opts.Owner, ours: l.vers.ours(l.obs.rec.version), skew: l.opts.MaxClockSkew,
		lease: l.opts.LeaseDuration}
	l.mu.Unlock()
	_, r.sid = l.bound.boundTo()
	return r
}

// lapse returns the observed renewal's lapse rule: its recorded expiry,
// watched since the first read that showed its version, for the longer of
// this handle's LeaseDuration and the one the item records.
func (r takeover) lapse() lapse {
	return lapse{expires: r.obs.rec.ExpiresAt, since: r.obs.since, lease: max(r.lease, r.obs.rec.Duration), skew: r.skew}
}

// watched returns the renewal version watched unchanged for a whole lease.
func (r takeover) watched(now sent) (string, bool) {
	if !r.obs.present {
		return "", false
	}
	return r.obs.rec.version, r.lapse().watched(now)
}

// mayTry reports whether an acquisition attempt may succeed now: nothing
// observed yet, no item, this handle's own item (its owner, and a version
// this handle wrote: another process with the same Owner is waited for as
// any other holder is, with reads), or takeable by expiry or by watching.
func (r takeover) mayTry(now sent) bool {
	if !r.obs.valid || !r.obs.present {
		return true
	}
	if r.obs.rec.Session != "" {
		// Bound to a pool session: only the session rules free it.
		return r.obs.boundFree || r.sid != "" && r.obs.rec.Owner == r.owner && r.obs.rec.Session == r.sid
	}
	if r.obs.rec.Owner == r.owner && r.ours {
		return true
	}
	return r.lapse().passed(now)
}

// wait returns how long until the observed lease becomes takeable by time
// alone (0 if it is, or if there is nothing to wait for).
func (r takeover) wait(now sent) time.Duration {
	if !r.obs.present || r.obs.rec.Session != "" {
		return 0
	}
	return r.lapse().wait(now)
}

// lapse is the one rule by which a renewal that another process wrote
// (a lease item's, a pool member's session) has lapsed, so that what it
// held may be taken: its recorded expiry is older than MaxClockSkew on
// the reader's clock (the writer's clock may be that much behind), or the
// reader has watched its version unchanged for a whole lease on the
// runtime's monotonic clock, since the first read that showed it (no
// clocks compared, and no step of a wall clock moves it). The writer's
// deadline, the send time of its renewal plus its LeaseDuration less a
// margin, is before both. A lease's takeover, a pool's judgement of its
// members (Pool.liveIn), the end of a lapsed session (Pool.sessionFree)
// and the wake at a member's lapse (Pool.untilLapse) all apply it.
type lapse struct {
	expires time.Time     // the recorded expiry, by the writer's clock
	since   time.Time     // the first read of the version, by the runtime's clock; zero: not watched
	lease   time.Duration // the longer of the reader's LeaseDuration and the writer's
	skew    time.Duration // MaxClockSkew
}

// watched reports whether the version has been watched for a whole lease.
func (x lapse) watched(now sent) bool {
	return !x.since.IsZero() && !now.real.Before(x.since.Add(x.lease))
}

// passed reports whether the renewal has lapsed at now.
func (x lapse) passed(now sent) bool { return x.watched(now) || expiredBy(x.expires, now.at, x.skew) }

// wait returns how long until the renewal lapses by time alone, 0 if it
// has.
func (x lapse) wait(now sent) time.Duration {
	d := x.expires.Add(x.skew).Sub(now.at)
	if !x.since.IsZero() {
		d = min(d, x.since.Add(x.lease).Sub(now.real))
	}
	return max(d+time.Millisecond, 0)
}

// condition returns the DynamoDB condition under which an acquisition
// sent at now takes the item, adding its values: the item is absent, or
// takeable by expiry, by watching, or ours (mine: the condition that the
// item carries a version this handle wrote, "" if none). rv is the version
// the acquisition writes: an item that carries it already is refused, so
// that a retry of a write that landed does not take a second fence. The
// item must also be well formed: a fence that is missing or not a number
// would restart fences.
//
// An item bound to a pool session is taken by expiry or watching never:
// only as this handle's own, or, for a lease of a pool, when it is bound
// to this handle's live session, or to the session last observed once
// the session rules freed it (sessionFree), on condition that it is still
// bound to that session with the fence observed.
func (r takeover) condition(now sent, rv, mine string, values map[string]types.AttributeValue) string {
	takeable := "#exp < :cutoff"
	values[":cutoff"] = avN(now.at.Add(-r.skew).UnixMilli())
	if seen, ok := r.watched(now); ok {
		takeable += " OR #rv = :seen"
		values[":seen"] = avS(seen)
	}
	takeable = "(attribute_not_exists(#ses) OR #ses = :nos) AND (" + takeable + ")"
	values[":nos"] = avS(noSession)
	if mine != "" {
		takeable += " OR (#owner = :me AND " + mine + ")"
	}
	if r.sid != "" {
		takeable += " OR (#owner = :me AND #ses = :mysid)"
		values[":mysid"] = avS(r.sid)
	}
	if o := r.obs; o.present && o.rec.Session != "" && o.boundFree {
		takeable += " OR (#owner = :bo AND #ses = :bs AND #fence = :bf)"
		values[":bo"], values[":bs"], values[":bf"] = avS(o.rec.Owner), avS(o.rec.Session), avN(o.rec.Fence)
	}
	values[":rv"], values[":tn"], values[":ts"] = avS(rv), avS("N"), avS("S")
	wellFormed := "attribute_type(#fence, :tn) AND attribute_type(#owner, :ts) AND attribute_type(#rv, :ts) " +
		"AND attribute_type(#exp, :tn)"
	return "attribute_not_exists(#pk) OR ((" + takeable + ") AND #rv <> :rv AND " + wellFormed + ")"
}

// list writes job's directory entry, then marks the lease item listed, so
// that later acquisitions skip it. It touches no attribute of the lease
// protocol. A failure is logged: the next acquisition tries again.
func (l *Lease) list(ctx context.Context, fence int64) {
	y := l.opts.Layout
	ctx = context.WithoutCancel(ctx)
	cctx, cancel := context.WithTimeout(ctx, l.opts.CallTimeout)
	entry := y.directoryKey(skJobPrefix, l.job)
	entry[attrJob] = avS(l.job)
	_, err := l.db.PutItem(cctx, &dynamodb.PutItemInput{TableName: aws.String(l.table), Item: entry})
	cancel()
	if err == nil {
		cctx, cancel = context.WithTimeout(ctx, l.opts.CallTimeout)
		_, err = l.db.UpdateItem(cctx, &dynamodb.UpdateItemInput{
			TableName: aws.String(l.table), Key: y.leaseKey(l.job),
			UpdateExpression:          aws.String("SET #listed = :true"),
			ConditionExpression:       aws.String("#fence = :fence"),
			ExpressionAttributeNames:  map[string]string{"#listed": attrListed, "#fence": attrFence},
			ExpressionAttributeValues: map[string]types.AttributeValue{":true": avBool(true), ":fence": avN(fence)},
		})
		cancel()
		if len(failedConditions(err)) > 0 {
			err = nil // a newer tenure lists it
		}
	}
	if err != nil {
		l.log().Warn("ddblease: could not list the job in the table's directory; the next acquisition tries again", "err", err)
	}
}
