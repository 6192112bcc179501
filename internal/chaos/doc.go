// Package chaos is the fault-injection suite: replicas run as separate OS
// processes against a DynamoDB-compatible server, behind fault-injecting
// proxies, under a seeded plan of kills, deploys, pauses, lost responses,
// server errors, throttling and clock offsets. Each replica records what
// its user code could see; a checker then reads those records and the
// tables and reports every violation of the library's guarantees.
//
// The suite lives in chaos_test.go; this package holds the parts: the
// replica's main (RunReplica), the proxy, the plan and the checker.
//
// # Pool mode
//
// About a third of the plans (drawn from the seed apart from the faults, so
// that a seed's faults are the same either way; DDBLEASE_CHAOS_POOL=1 makes
// every plan a pool's, =0 none) run a pool: each replica runs
// Pool.RunSchedule over 4 to 8 jobs, every job on the same Every(2*Slot)
// schedule (Plan.Timing: a replica runs several jobs' slots at once, and on
// a loaded machine a run outlasted a single Slot, so that the next slot of
// its job was skipped as missed), under the same kinds of faults (kills,
// deploys, pauses, proxy faults, clock offsets; a step aimed at "the
// leader" aims at the holder of one of the jobs). Each job keeps its own
// lease item, fence, guard, run items and sink item (SinkKey of the job),
// and the jobs take the guard forms in turn from different starting points.
// A replica records for each job what it records for its one lease (below):
// the readings of the job's Pool.Lease(job).State, its fn calls, leader
// contexts, effects and finished runs, each event naming its job. The
// checker judges each job on its own, with every check below, and each
// violation names its job; what Pool.RunSchedule returned, and the
// processes, are judged once per replica.
//
// Liveness in a pool waits longer, by the simulation's pool bounds
// (internal/sim, plan_test.go): a job is seen led within poolLiveBound
// after the faults (a session lapsed and seen gone, or a replica that
// rejoins and is handed the job: with DefaultTiming 3.6 s) plus a lease;
// and every slot due is judged from the moment the pool settled (the
// faults over, the last replica started, the last killed replica's
// session lapsed and seen so) plus a call and a heartbeat, a view lag
// (HeartbeatInterval + CallTimeout + 2*MaxClockSkew) and poolGapBound
// (a job moved: its holder's resignation and a standby's takeover) plus a
// lease. A pool plan's quiet phase is long enough to judge three slots of
// every job after that (about 9.5 leases, at most 11, instead of 4).
//
// # What a replica records
//
// Nothing the library says about itself is the basis of a check. A
// replica records:
//
//   - readings of IsLeader (through State, which gives the fence with it),
//     each bracketed by the real time just before and just after it. They
//     are taken by a sampler every 2 ms, by the HTTP transport of the
//     replica's DynamoDB client just before each request is sent and just
//     after its answer arrives, by the observer callback, and by fn.
//     Readings are serialised, so a replica's readings are totally ordered;
//     the two on either side of every change are written to the history;
//   - each fn call (the slot, the fence, the real time at entry, and whether
//     the leader context was live then), the moment a goroutine watching
//     that context saw it end (or a reading found it ended), and fn's
//     return;
//   - each side effect, with the guard form used and the real time the
//     call began;
//   - what RunSchedule returned;
//   - the observer's events, for information only.
//
// # Windows
//
// A tenure's window (Window) is what a user could see of it: IsLeader true
// for its fence, or a live leader context inside fn. Its bounds are
// outer: it never starts later or ends earlier than user code could have
// seen it, so an overlap found is an overlap that may have been seen.
//
// The start is the time just before the last reading that found the
// replica not leading with that fence, before the first that found it
// leading (or fn's entry, if earlier). IsLeader turns true before any slot's
// fn is called, so fn's entry alone would start the window too late. The
// observer's EventAcquired is no start either: it is delivered after
// IsLeader already answers true, so its time is an upper bound of the
// start, not a lower one, and a window started there could hide an
// overlap. The transport's reading taken as the acquiring write's answer
// arrives comes before the library can have seen that answer, so the start
// is tight however the scheduler delays the sampler.
//
// The end is the time just after the first reading that found the tenure
// over, or, for the leader context, the first moment it was seen ended or
// fn returned, whichever is later of the two components. A resigning
// holder's belief ends before its resignation is sent, and the transport's
// reading just before that request bounds it. A replica killed while
// leading ends when the harness sees its process gone. One case is placed
// differently: if the replica was stopped (SIGSTOP, timed from when /proc
// shows it stopped to when SIGCONT is about to be sent) between the last
// reading that saw the tenure and the first that saw it over, no code of
// it could run meanwhile, and the end is placed at the deadline it last
// read if that came before SIGCONT; readings after SIGCONT check that
// IsLeader is indeed false then. A true reading that spans a whole stop,
// the deadline it returned passed before SIGCONT, was taken before the
// stop (after it, IsLeader would have been false), and is live only up to
// it (settleAcrossStops). A leader context whose timer fires only
// after SIGCONT is counted (Stats.CtxLiveAfterWake), not judged.
//
// # Invariants
//
// In every run, wild clocks included (and for each job of a pool): fences
// are issued to one replica each and only grow in each replica; a tenure never turns false and true
// again; no sink write of an atomic form (Put, Update, TransactWrite,
// Commit) is accepted after one with a higher fence; TransactWrite, Commit,
// Check and Do accept no fence once a higher one was seen by a replica
// before the call began; no replica goes on believing in a fence more than
// 1.5 leases after a higher fence was seen (its own deadline bounds the
// belief to 0.9 lease after its last confirmed write, which came before
// the newer fence); fn is called at most once per slot (NeverRerun),
// counted from the fn calls, not from the sink's deduplication; the sink
// holds only effects some fn call made, and every effect reported
// accepted; run items agree with what replicas finished; every replica not
// killed recorded what RunSchedule returned: nil is clean,
// ErrDrainTimeout, ErrNotResigned and a stop while every attempt was
// failing (context.Canceled joined with the last error) are counted as
// reported outcomes and are violations unless the replica's proxy injected faults, or it was
// stopped, within a lease of its SIGTERM; no replica panicked, raced or
// exited with an error, and each was built as the suite was (race or
// not).
//
// With clocks within MaxClockSkew, also: windows of different replicas do
// not overlap; after the faults stop a replica sees itself leading within
// two leases plus skew plus a poll, and every slot due after that has a
// succeeded run and an effect (for a pool, each job by the pool's bounds
// above), but a slot with no run item that came due while a run of its
// job was under way and that run returned once the next slot was due
// (the runner runs the latest due slot only, as documented). A replica
// that returns ErrDrainTimeout or ErrNotResigned had a fault within a
// lease of its shutdown: the plan's, or requests the server answered
// later than CallTimeout. Liveness counts from the end of the faults, or of the
// last stall after them: the suite's own process not running for more
// than 250 ms, a replica's process likewise (its EvStall events; the
// plan's SIGSTOPs aside), or a request the server answered later than
// CallTimeout with no latency injected (a proxy sees it): on a loaded
// machine these are faults like the plan's. With wild clocks, overlaps are counted and
// the longest is reported.
package chaos
