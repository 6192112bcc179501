package ddblease

import (
	"log/slog"
	"time"
)

// This file owns Options and their defaults and validation.

// Default values of Options.
const (
	DefaultLeaseDuration = 30 * time.Second
	DefaultRetryInterval = time.Second
	DefaultMaxClockSkew  = time.Second
	DefaultDrainTimeout  = 10 * time.Second
)

// MaxLeaseDuration is the longest LeaseDuration New accepts.
const MaxLeaseDuration = 24 * time.Hour

// MaxJobLength is the longest job name New accepts, in bytes.
const MaxJobLength = 200

// Options configures a Lease. A zero field takes its default; a negative
// duration is an error.
type Options struct {
	// Owner identifies this contender in the lease item. It must differ
	// between live contenders: a handle that finds the lease renewed under
	// its Owner by a writer it does not know (another process given the
	// same Owner) waits for it as for any holder, and logs a warning.
	// Default: DefaultOwner's id (the ECS task ARN, the Kubernetes pod or
	// "<hostname>-<pid>", then a random suffix drawn once per process),
	// shared by the process's handles; a second handle of the process on
	// the same job or pool gets it followed by "-2", a third "-3", and so
	// on.
	Owner string

	// LeaseDuration is how long a written lease stays valid, from 10ms to
	// MaxLeaseDuration. Default 30s.
	LeaseDuration time.Duration

	// HeartbeatInterval is how often the leader renews the lease; it must be
	// at least 1ms and below LeaseDuration/2. Default LeaseDuration/3.
	HeartbeatInterval time.Duration

	// RetryInterval is how often a standby polls the lease, less a random
	// 5-25% jitter, and how soon a failed heartbeat is retried; it must be
	// at least 1ms. A standby that sees the holder draining polls ten times
	// as often. Default 1s.
	RetryInterval time.Duration

	// MaxClockSkew bounds the difference between the wall clocks of the
	// replicas. A standby takes over a lease only once its recorded expiry is
	// older than MaxClockSkew on the standby's clock (or it has watched the
	// lease unchanged for a whole lease). Zero means the default, 1s; it must
	// be below LeaseDuration.
	MaxClockSkew time.Duration

	// DrainTimeout bounds how long Run keeps the lease alive, after its
	// context ends, while the leader's function returns. Default 10s.
	DrainTimeout time.Duration

	// CallTimeout bounds every DynamoDB call; a heartbeat's call is further
	// bounded by the time left before the local deadline. It must be below
	// HeartbeatInterval. Default HeartbeatInterval/2.
	CallTimeout time.Duration

	// Logger receives warnings about retried errors and lost tenures. Errors
	// are also returned to the caller or delivered as the cause of the leader
	// context. Default slog.Default().
	Logger *slog.Logger

	// Observer, if not nil, is told of every change of leadership, renewal,
	// job run and DynamoDB request of this handle (see Event). Use it for
	// logs, metrics and alerts. It is called synchronously, one call at a
	// time per handle and in the order of the changes, after the change
	// (IsLeader already answers the new state), and never while a lock of
	// the Lease is held: events that arise during a write to the lease item
	// (its requests, an acquisition, a renewal, a loss found by it) are
	// delivered once that write is over, by the goroutine that made it or by
	// the one delivering events at the time. So it may call any method of
	// the Lease, Resign and Heartbeat included; a call that makes requests
	// reports more events, delivered after it returns (an observer that
	// makes a request on every EventCall never stops). It must not block: a
	// slow observer delays the goroutine that reports, which may be the one
	// renewing the lease, though never the end of a tenure at its deadline.
	// A panic in it is not recovered.
	Observer func(Event)

	// Now returns the current time. It must carry a monotonic reading, as
	// time.Now's results do (offsets added with Add keep it). Default
	// time.Now. Tests inject offset or drifting clocks here.
	Now func() time.Time

	// Layout names the table's key attributes and the prefix of the
	// library's keys. Default: the zero Layout (keys "pk" and "sk", no
	// prefix). Every replica of a job, its Guard and Admin must use the
	// same one.
	Layout Layout

	// Health configures what CheckHealth judges besides the lease: by
	// default, nothing (see HealthOptions).
	Health HealthOptions
}

// margin is how much earlier than the written expiry a holder stops
// believing it leads.
func (o *Options) margin() time.Duration { return o.LeaseDuration / 10 }

func (o *Options) setDefaults() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"LeaseDuration", o.LeaseDuration}, {"HeartbeatInterval", o.HeartbeatInterval},
		{"RetryInterval", o.RetryInterval}, {"MaxClockSkew", o.MaxClockSkew},
		{"DrainTimeout", o.DrainTimeout}, {"CallTimeout", o.CallTimeout},
	} {
		if d.v < 0 {
			return invalid("%s is negative (%v)", d.name, d.v)
		}
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	if o.LeaseDuration < 10*time.Millisecond || o.LeaseDuration > MaxLeaseDuration {
		return invalid("LeaseDuration %v is outside 10ms to %v", o.LeaseDuration, MaxLeaseDuration)
	}
	if o.HeartbeatInterval == 0 {
		o.HeartbeatInterval = o.LeaseDuration / 3
	}
	if o.HeartbeatInterval < time.Millisecond {
		return invalid("HeartbeatInterval %v is below 1ms", o.HeartbeatInterval)
	}
	if o.HeartbeatInterval*2 >= o.LeaseDuration {
		return invalid("HeartbeatInterval %v must be below LeaseDuration/2 (%v)", o.HeartbeatInterval, o.LeaseDuration/2)
	}
	if o.RetryInterval == 0 {
		o.RetryInterval = DefaultRetryInterval
	}
	if o.RetryInterval < time.Millisecond {
		return invalid("RetryInterval %v is below 1ms", o.RetryInterval)
	}
	if o.MaxClockSkew == 0 {
		o.MaxClockSkew = DefaultMaxClockSkew
	}
	if o.MaxClockSkew >= o.LeaseDuration {
		return invalid("MaxClockSkew %v must be below LeaseDuration %v", o.MaxClockSkew, o.LeaseDuration)
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = DefaultDrainTimeout
	}
	if o.CallTimeout == 0 {
		o.CallTimeout = o.HeartbeatInterval / 2
	}
	if o.CallTimeout >= o.HeartbeatInterval {
		return invalid("CallTimeout %v must be below HeartbeatInterval %v", o.CallTimeout, o.HeartbeatInterval)
	}
	if o.Health.FailedRuns < 0 {
		return invalid("Health.FailedRuns %d is negative", o.Health.FailedRuns)
	}
	if o.Owner != "" { // else New or NewPool sets the default
		if err := checkName("Owner", o.Owner, 256); err != nil {
			return err
		}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	var err error
	o.Layout, err = o.Layout.withDefaults("Options")
	return err
}

// checkTable validates a DynamoDB table name.
func checkTable(table string) error {
	if len(table) < 3 || len(table) > 255 {
		return invalid("table name %q must be 3 to 255 characters long", table)
	}
	for _, r := range table {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.') {
			return invalid("table name %q may hold only letters, digits, '_', '-' and '.'", table)
		}
	}
	return nil
}
