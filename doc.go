// Package ddblease elects one leader per job among the replicas of a service,
// using a single DynamoDB table, and hands every tenure a fencing token so
// that the side effects of a stale leader can be refused.
//
// A Lease is one replica's handle on one job. Run campaigns for the lease,
// keeps it alive while the leader's function runs, cancels that function's
// context the moment leadership is lost, and on shutdown drains the function
// and resigns so that a standby takes over at once:
//
//	lease, err := ddblease.New(db, "leases", "billing-nightly")
//	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
//	defer stop()
//	err = lease.Run(ctx, func(ctx context.Context, fence int64) error {
//		// leader work; pass fence to every side effect
//	})
//
// # What is guaranteed
//
// Fences. Every acquisition increments the job's fence with one conditional
// write; fences never decrease and the lease item is never deleted. A write
// through Guard.TransactWrite or JobRun.Commit is refused once a newer fence
// has been issued; a write through Guard.Put or Guard.Update is refused once
// a higher fence has written the same item, and not before (see Guarding
// side effects). This holds whatever the clocks, pauses, partitions or lost
// responses do: it rests only on DynamoDB's conditional writes.
//
// Mutual exclusion (timed). At any real instant at most one replica believes
// it holds a job's lease (IsLeader, the leader context of Run), provided the
// wall clocks of the replicas differ by less than Options.MaxClockSkew and
// their rates agree within a few percent. A holder's belief ends at its local
// deadline: the monotonic time at which its last confirmed write was sent,
// plus LeaseDuration, minus a safety margin of LeaseDuration/10. A timer
// ends it there whatever requests are in flight, and a renewal confirmed
// after the deadline never revives it. A standby
// takes over only when the recorded expiry is older than MaxClockSkew on its
// own clock, or when it has watched the same renewal version unchanged for a
// whole lease duration on its monotonic clock.
//
// # What is not guaranteed
//
// Leadership is not a guarantee that a side effect happens once: a leader can
// be paused after it checked it was leader and before its write lands. Only
// fenced writes (Guard) are safe against that, and only for sinks that check
// the fence atomically. Fencing alone does not make a schedule slot's effect
// happen once either: deduplicate the effect by slot as well.
//
// When clocks differ by more than MaxClockSkew, two replicas may both believe
// they lead for a while; fenced writes remain safe.
//
// # Schedules and job runs
//
// RunSchedule wraps Run around a Schedule (Every, or any type with
// robfig/cron's Next method): only the leader fires, and each firing first
// claims its slot, the schedule's nominal fire time, with a conditional
// write of a job-run item that records the claimant's fence. A slot has at
// most one run; a run that an older tenure left running is marked abandoned
// (NeverRerun, the default) or run again by the newer tenure (Rerun). Slots
// that came due while no one led follow the catch-up rule: the latest one
// fires if it is at most JobOptions.CatchUpWindow old, older ones are
// skipped and counted.
//
// A slot's effect happens once only if it is deduplicated by slot: commit
// it together with the run's completion (JobRun.Commit), or key it by
// JobRun.IdempotencyKey in a sink that refuses a key twice.
//
// # Many jobs
//
// A Pool runs a set of jobs spread across the replicas that run it: each
// leads its share, the surplus is handed over (drained, then resigned) when
// a replica joins, and the jobs of one that leaves or dies go to the
// others. Each job keeps a lease item and a fence of its own, with every
// guarantee above; a replica's session (its member item, renewed once per
// HeartbeatInterval) keeps every job it holds (docs/sessions.md).
// Pool.RunSchedule runs each job on a schedule.
//
// # Operating jobs
//
// Admin is the operator's handle on a table: it lists jobs and runs, and
// acts through the lease item, which the replicas read. RequestResign asks
// the current tenure to hand over (Run honours it at its next heartbeat,
// like a SIGTERM, and lets another replica lead); ForceRelease raises the
// fence in one write, so the holder's fenced writes are refused at once,
// while a standby leads only once the holder's recorded expiry has passed,
// keeping one leader at a time (at once if the operator states, with
// ReleaseOptions.HolderDead, that the holder is dead); Pause and Resume
// stop and restart RunSchedule's firing (slots due meanwhile are recorded
// as RunSkippedByPause); Trigger asks the leader for an extra run of the
// job, claimed and fenced like a slot. The ddblease command
// (cmd/ddblease) calls them.
//
// # Guarding side effects
//
// A Guard, which may live in another service, refuses writes that carry a
// stale fence; its forms differ in what they refuse. TransactWrite (and
// JobRun.Commit) checks the lease item's fence in the same transaction as
// the writes, and refuses any fence but the current one. Put and Update
// keep a fence high-water mark in the item they write, and refuse only a
// fence lower than the highest that wrote that item (by any form: the
// actions of TransactWrite and Commit keep the same mark): a stale leader may
// still write an item no newer tenure has written (under NeverRerun, the
// item of a slot the newer tenure abandoned). Check and Do refuse any fence
// but the current one at the instant of their read, and are not atomic:
// they are for sinks outside DynamoDB. Every form fails closed, a context
// that has ended included. Put and Update store a write token on the item
// (GuardOptions.TokenAttribute), so that a write whose answer was lost is
// reported as applied; transactions carry a ClientRequestToken, and are
// retried while conflicting writes cancel them.
//
// # Observing
//
// Options.Observer and GuardOptions.Observer receive an Event for every
// change of leadership, renewal, job run, guard refusal and DynamoDB
// request; the library's log lines are made from the same events.
//
// # Errors
//
// ErrHeld, ErrLost, ErrNotLeader, ErrSlotTaken, ErrStaleFence,
// ErrTransactionsUnsupported, ErrMalformedItem, ErrDrainTimeout,
// ErrNotResigned, ErrTableSchema, ErrUnknownJob, ErrNotHeld,
// ErrResignRequested and ErrInvalid are sentinels to test with
// errors.Is; HeldError,
// SlotTakenError and StaleFenceError carry the details. Run panics with a
// *PanicError, after ending the tenure and resigning, when its function
// panics. Errors from the
// AWS SDK stay in the chain for errors.As.
package ddblease
