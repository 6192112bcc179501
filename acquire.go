package ddblease

import (
	"context"
	"errors"
	"fmt"
	"time"
)

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
		t, again, err := l.attempt(ctx)
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
// (Pool.attempt).
func (l *Lease) attempt(ctx context.Context) (t *term, again bool, err error) {
	done, err := l.pool.attempt(ctx)
	if err != nil {
		return nil, false, err
	}
	defer done()
	if l.mayTry() {
		t, err = l.tryAcquire(ctx)
		return t, false, err
	}
	rec, present, err := l.read(ctx, false)
	if err != nil {
		return nil, false, err
	}
	l.observe(rec, present) // a standby's poll: an eventually consistent read
	l.judgeBound(ctx)
	return nil, l.mayTry(), nil
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
// free lease to the others (yieldUntil), it looks again after a jittered
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
	l.mu.Lock()
	y := time.Until(l.yieldUntil)
	l.mu.Unlock()
	if y > 0 {
		// Leaving a free lease to the standbys: look again after a
		// RetryInterval, to see whether one took it.
		d = min(max(d, jitter(l.opts.RetryInterval)), y)
	}
	return d
}

func (l *Lease) observe(rec Record, present bool) {
	defer l.notify.flush()
	l.mu.Lock()
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
	l.obs.valid, l.obs.present, l.obs.rec = true, true, rec
	if rec.Owner != l.opts.Owner && !rec.ExpiresAt.IsZero() && (rec.Owner != l.seen.owner || rec.Fence != l.seen.fence) {
		l.seen = seenHolder{owner: rec.Owner, fence: rec.Fence}
		l.notify.push(l.event(EventLeaderSeen, Event{Holder: rec.Owner, Fence: rec.Fence}))
	}
}

// mayTry reports whether Acquire may try to take the lease now: the last
// observation allows it (see takeover), and this handle is not leaving a
// free lease to the others (yieldUntil).
func (l *Lease) mayTry() bool {
	if !l.takeoverRule().mayTry(l.opts.sendNow()) {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.yieldUntil.After(time.Now())
}
