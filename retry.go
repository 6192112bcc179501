package ddblease

import (
	"context"
	"math/rand/v2"
	"time"
)

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

// retry calls step until it succeeds, fails with an error that retrying
// cannot mend, ctx ends, or attempts calls have failed, waiting as b says
// between calls. It returns step's last error.
func retry(ctx context.Context, b *backoff, attempts int, step func() error) error {
	var err error
	for i := 0; i < attempts; i++ {
		if i > 0 && b.wait(ctx) != nil {
			return err
		}
		if err = step(); err == nil || !retryable(err) || ctx.Err() != nil {
			return err
		}
	}
	return err
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
