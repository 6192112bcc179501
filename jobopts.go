package ddblease

import (
	"time"
)

// This file owns JobOptions and their defaults.

// Default values of JobOptions.
const (
	DefaultRetention     = 30 * 24 * time.Hour
	DefaultCatchUpWindow = 15 * time.Minute
)

// Limits on the job-run calls.
const (
	// MaxListSlots is the most slots one ListRuns call covers.
	MaxListSlots = 1000
	// MaxCommitItems is the most writes JobRun.Commit accepts: DynamoDB's
	// 100 actions per transaction, less the run's update and the lease check.
	MaxCommitItems = 98
	// maxErrorText bounds the error text stored in a run item, in bytes.
	maxErrorText = 4096
)

// JobOptions configures the job-run calls (Claim, RunSchedule). All
// replicas of a job must use the same values. A zero field takes its
// default; a negative duration is an error.
type JobOptions struct {
	// Rerun is the policy for a slot whose run an older tenure left running.
	// Default NeverRerun.
	Rerun RerunPolicy

	// Retention is how long a run item is kept: its RunTTLAttribute is the
	// claim time plus Retention. It must exceed CatchUpWindow, since a slot
	// whose item has expired may be claimed again. DynamoDB deletes expired
	// items only when time to live is enabled, and up to a few days late.
	// Default 30 days.
	Retention time.Duration

	// CatchUpWindow is how late RunSchedule may still fire a slot: the most
	// recent slot that came due while no one led is fired if it is at most
	// this old, and older ones are skipped. It must exceed the timer and
	// takeover delays a firing may suffer: a slot found later than this is
	// never fired. Default 15 minutes, which covers a failover
	// (LeaseDuration plus RetryInterval) and a rolling deploy with margin,
	// while a replica that starts hours after a nightly slot does not fire
	// it at a surprising time.
	CatchUpWindow time.Duration

	// NoTransactions makes Claim write the run item with a plain
	// conditional write, without a check on the lease item. By default Claim
	// uses TransactWriteItems so that a deposed leader cannot claim; on a
	// server that answers UnknownOperationException (dynalite, for one) it
	// falls back to the plain write, and remembers that for the Lease. The
	// plain write still refuses a slot that has a run; it only rests on the
	// local tenure check to refuse a deposed leader.
	NoTransactions bool
}

func newJobOptions(optFns []func(*JobOptions)) (JobOptions, error) {
	var o JobOptions
	for _, fn := range optFns {
		if fn != nil {
			fn(&o)
		}
	}
	return o, o.setDefaults()
}

func (o *JobOptions) setDefaults() error {
	if o.Rerun != NeverRerun && o.Rerun != Rerun {
		return invalid("JobOptions: unknown RerunPolicy %d", int(o.Rerun))
	}
	if o.Retention < 0 || o.CatchUpWindow < 0 {
		return invalid("JobOptions: Retention (%v) and CatchUpWindow (%v) must not be negative", o.Retention, o.CatchUpWindow)
	}
	if o.Retention == 0 {
		o.Retention = DefaultRetention
	}
	if o.CatchUpWindow == 0 {
		o.CatchUpWindow = DefaultCatchUpWindow
	}
	if o.Retention <= o.CatchUpWindow {
		return invalid("JobOptions: Retention %v must exceed CatchUpWindow %v", o.Retention, o.CatchUpWindow)
	}
	return nil
}
