package chaos

import "time"

// Clock returns a clock offset from the real one by offset and running at
// (1 + ppm/1e6) times its rate. Its readings keep a monotonic component,
// as Options.Now requires.
func Clock(offset time.Duration, ppm int64) func() time.Time {
	base := time.Now()
	return func() time.Time {
		elapsed := time.Since(base)
		return base.Add(offset + elapsed + time.Duration(int64(elapsed)/1_000_000*ppm))
	}
}

// RealDeadline converts a deadline read on clock into real time.
func RealDeadline(deadline time.Time, clock func() time.Time, ppm int64) time.Time {
	left := deadline.Sub(clock())
	real := time.Duration(float64(left) / (1 + float64(ppm)/1e6))
	return time.Now().Add(real)
}
