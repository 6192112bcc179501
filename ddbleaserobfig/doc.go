// Package ddbleaserobfig plugs ddblease into github.com/robfig/cron/v3, so
// that a cron.Cron on every replica of a service runs each firing of a job
// once, on the replica that leads the job, with a fencing token for its
// side effects.
//
// A Wrapper campaigns in the background for one lease per job; its Job
// method turns a function into a cron.Job that, each time the cron fires
// it, matches the firing to the entry schedule's slot (its nominal time),
// claims that slot's run (ddblease's Lease.Claim) and runs the function
// with the run (JobRun.Fence for a ddblease.Guard, JobRun.IdempotencyKey
// for the sink) and the run's context, which lives until the run's tenure
// is lost or its drain times out: a shutdown lets the run in flight
// finish before the lease is resigned. A replica that does not lead, or
// whose slot is already claimed, skips the firing.
//
// robfig's Schedule has the Next method that ddblease.Schedule names, so a
// parsed spec can also drive ddblease's own Lease.RunSchedule directly,
// without a cron.Cron; docs/schedulers.md in the repository shows both,
// and how daylight-saving transitions and @every behave.
package ddbleaserobfig
