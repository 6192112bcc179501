package ddblease

import (
	"context"
	"math/rand/v2"
	"time"
)

// This file owns the one waiting policy (backoff, jitter) and the one retry
// loop (retrier.do).

// The library's one waiting policy between attempts of a step that failed
// with a retryable error (see retryable): a backoff, whose waits start at
// base and double up to max (max equal to base gives a fixed interval),
// each less the common jitter. The standby's poll uses the same jitter.
//
// Where each loop waits:
//   - a failed acquisition or poll: RetryInterval (the standby's poll
//     itself waits a jittered RetryInterval, or less when the lease becomes
//     takeable sooner);
//   - a heartbeat: from RetryInterval up to HeartbeatInterval/2, until the
//     tenure's deadline;
//   - a resignation, a RunSchedule claim, finish or control read, and a
//     catch-up's reads: RetryInterval;
//   - a write refused by a conflict with a transaction: from 20ms up to
//     320ms, until the call's deadline;
//   - BatchGetItem's unprocessed keys: RetryInterval, up to 10 rounds.

// jitter returns d less a random 5-25%, the spread every wait of the
// library uses so that replicas started together do not act in step.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.75 + 0.2*rand.Float64()))
}

// backoff gives the waits between the attempts of one step.
type backoff struct {
	base, max time.Duration
	n         int // waits given so far
}

// fixed returns a backoff that always waits about d.
func fixed(d time.Duration) *backoff { return &backoff{base: d, max: d} }

// next returns the wait before the next attempt.
func (b *backoff) next() time.Duration {
	d := b.base
	for i := 0; i < b.n && d < b.max; i++ {
		d *= 2
	}
	b.n++
	return jitter(min(d, b.max))
}

// reset starts the waits again from base, after a success.
func (b *backoff) reset() { b.n = 0 }

// wait sleeps for the next wait, or until ctx ends (its cause then).
func (b *backoff) wait(ctx context.Context) error { return sleep(ctx, b.next()) }

// retrier says how retrier.do retries a step. A zero field leaves its
// bound out.
type retrier struct {
	backoff  *backoff         // the waits between attempts (required)
	again    func(error) bool // whether an error is worth another attempt; nil: retryable
	attempts int              // at most this many attempts
	now      func() time.Time // the clock of deadline
	deadline time.Time        // no attempt but the first starts, and no wait ends, at or after it
	timeout  time.Duration    // bound on each attempt; on those after the first, deadline bounds it too
	onRetry  func(err error)  // told of each failed attempt that will be retried, before the wait
}

// Why retry stopped.
const (
	retryDone     = iota // the step succeeded, or failed with an error not worth retrying
	retryEnded           // ctx ended
	retryDeadline        // the next attempt would start at or after the deadline
	retryAttempts        // the attempts were used up
)

// do is the library's one retry loop: it calls step, and calls it again
// after the next wait of r.backoff while it fails with an error worth
// retrying (r.again), until ctx ends, the attempts are used up or the next
// attempt would start at or after r.deadline. It returns the number of
// attempts made, why it stopped, and step's last error.
func (r retrier) do(ctx context.Context, step func(ctx context.Context) error) (n int, stop int, err error) {
	again := r.again
	if again == nil {
		again = retryable
	}
	for n = 1; ; n++ {
		t := r.timeout
		if n > 1 && !r.deadline.IsZero() {
			left := r.deadline.Sub(r.now())
			if left <= 0 {
				return n - 1, retryDeadline, err
			}
			if t > 0 {
				t = min(t, left)
			}
		}
		actx, cancel := ctx, context.CancelFunc(func() {})
		if t > 0 {
			actx, cancel = context.WithTimeout(ctx, t)
		}
		err = step(actx)
		cancel()
		switch {
		case err == nil || !again(err):
			return n, retryDone, err
		case ctx.Err() != nil:
			return n, retryEnded, err
		case r.attempts > 0 && n >= r.attempts:
			return n, retryAttempts, err
		}
		d := r.backoff.next()
		if !r.deadline.IsZero() && !r.now().Add(d).Before(r.deadline) {
			return n, retryDeadline, err
		}
		if r.onRetry != nil {
			r.onRetry(err)
		}
		if sleep(ctx, d) != nil {
			return n, retryEnded, err
		}
	}
}

// sleep waits d, or until ctx ends (its cause then).
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
