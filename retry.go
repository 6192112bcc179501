package ddblease

import (
	"context"
	"math/rand/v2"
	"time"
)

// jitter returns d less a random 5-25%, the spread every wait of the
// library uses so that replicas started together do not act in step.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.75 + 0.2*rand.Float64()))
}

// retry calls step until it succeeds, fails with an error that retrying
// cannot mend (see retryable), ctx ends, or attempts calls have failed,
// waiting a jittered interval between calls. It returns step's last error.
func retry(ctx context.Context, interval time.Duration, attempts int, step func() error) error {
	var err error
	for i := 0; i < attempts; i++ {
		if i > 0 && sleep(ctx, jitter(interval)) != nil {
			return err
		}
		if err = step(); err == nil || !retryable(err) || ctx.Err() != nil {
			return err
		}
	}
	return err
}
