// Package ddbleasegocron plugs ddblease into github.com/go-co-op/gocron/v2,
// so that a gocron scheduler on every replica of a service runs each job on
// one replica, with a fencing token for its side effects.
//
// Two adapters, for gocron's two distributed options:
//
//   - Elector (gocron.WithDistributedElector): the replica that holds one
//     lease runs every job. IsLeader answers from the lease's own state,
//     without a DynamoDB request, and Fence gives the tenure's fence for a
//     ddblease.Guard.
//   - Locker (gocron.WithDistributedLocker): each job has its own lease, and
//     each firing claims a ddblease job run for its slot (the schedule's
//     nominal time, matched from the firing time), so a slot runs once
//     however the replicas' clocks and start times differ within
//     MaxClockSkew. Task makes the job's gocron task: it hands the job the
//     claimed run (its fence and idempotency key) and the run's context,
//     which lives until the run's tenure is lost or its drain times out
//     (not until gocron's Shutdown, which cancels gocron's own job
//     context), and records the job's error in the run.
//
// docs/schedulers.md in the repository shows the change for an existing
// gocron user. The guarantees are ddblease's: fenced writes are safe
// whatever the clocks do; one leader at a time, and so one run per slot,
// while the clocks differ by less than MaxClockSkew.
package ddbleasegocron
