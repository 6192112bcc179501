// Package sim is a deterministic simulation of ddblease: the library's real
// code (Lease.Run, Lease.RunSchedule, Pool.Run, Pool.RunSchedule,
// JobRun.Commit, Guard.Put, Update, TransactWrite and Do, Admin) runs for
// several replicas inside one process under testing/synctest, so that
// minutes of protocol time take milliseconds. The package has no code
// outside its tests.
//
// # The world
//
// Each replica has its own *dynamodb.Client whose HTTP transport is an
// in-memory http.RoundTripper to github.com/truora/minidyn's handler
// (serialised by a mutex, an httptest.ResponseRecorder per request; a set
// that an update's DELETE leaves empty is removed, as DynamoDB does,
// where minidyn would keep an untyped value that fails every later Query
// of the table: dropEmptySets). A plan
// drawn from the seed decides the faults applied at that transport: black
// holes (no answer until the request's context ends), answers lost after the
// server applied the request (hang or reset), delays before or after the
// server, 500, 503, throttling and TransactionConflict answers with the
// bodies DynamoDB sends, and connection resets. Whether a fault of
// probability p hits a request is drawn from a hash of the seed, the
// replica, the operation and the request's number, so that it does not
// depend on other replicas' requests; the hash is passed through a
// finalizer, so that consecutive requests draw independent numbers
// (TestDrawsAreSpread). It also sets each replica's
// clock (offset and rate, through Options.Now, within or beyond
// MaxClockSkew), wall-clock steps (Options.Now shifted for a while; the
// runtime clock the library's timers use does not move, as a process's
// monotonic clock does not when NTP steps the wall clock),
// crashes (the replica's clock freezes, its network black-holes new
// requests while requests already in flight still land, its fn is never
// told; at the end it is wound down so that the bubble can exit: its clock
// runs again and its context ends, while its network still black-holes new
// requests; it is excluded from the checks from the crash on) and pauses (its clock
// frozen; its requests, answers and fn held). Users misbehave as real ones do:
// Resign while Run leads, two Run calls on one handle, a panic in fn
// recovered by a supervisor that calls Run again, slots whose fn fails.
//
// At about 40% of the seeds an operator acts too, drawn from a hash stream
// of its own (a seed draws everything else as it did before, and a seed
// without an operator runs as it did then). From one goroutine, with its
// own *ddblease.Admin and its own clock (within 0.4*MaxClockSkew), it calls
// Admin.Trigger, Admin.Pause then Admin.Resume (with or without the
// catch-up) under RunSchedule, and Admin.Job then Admin.ForceRelease with
// the fence read (a plain release, never ReleaseOptions.HolderDead) under
// either. Most calls land just after a fault window of the plan opens or
// just before a crash, and at half the triggers and pauses the leader's
// transactions (claims, finishes) lose their answers, hang or fail from
// the call on (from up to a slot before a pause), sometimes with its
// heartbeats black-holed, so that the tenure ends during the run. Half
// the operators have a clean network (a laptop outside the faulty one),
// half the world's: faults of their own (Rep N, printed "operator") and
// every replica's. A Pause that fails is made
// again (up to three tries), a Resume until it is applied or refused as
// not paused; what every call returned is recorded. Every call is made a
// lease before the faulty phase ends (a release two leases before), so
// that FaultEnd and the quiet period are as without an operator.
//
// At about 20% of the seeds the replicas run a pool instead, drawn from a
// hash stream of its own too (never at a seed of foundSeeds, which replay
// paths found in single leases; foundPoolSeeds replay pool seeds): each
// replica calls Pool.Run over 3 to 6 jobs, its fn doing for each job what
// a Run leader does (a guarded effect on the job's own items, with a Guard
// per job, every Work times the number of jobs: as many effects in all as
// one leader makes). Some replicas (never r0) make their first Run call
// late, within the first 80% of the faulty phase, so that the others hand
// them their share. The network faults, clocks, wall steps, crashes and
// pauses are drawn as for a single lease; a fault or wall step aimed at
// the leader hits a replica that leads some job. Half the pool seeds
// (drawPoolSchedule) run Pool.RunSchedule instead of Pool.Run (the plan
// prints which): every job on Every(Interval), its fn doing for the job
// what a RunSchedule firing does (a guarded commit, an idempotent put or a
// put per slot, on the job's own items; each job's slots are keyed apart).
// Their slots come no more often than every quarter lease, and a pool
// drawn with the throttle shape's frequent heartbeats runs Pool.Run: the
// jobs' run items share the table with the member items, which minidyn
// reads whole for each renewal's Query.
//
// At a pool of schedules the operator acts as under RunSchedule (at about
// 40% of them, from its own stream), its calls naming one job (OpJob,
// printed with the operator), its targeted faults aimed at that job's
// leader; its writes reach the job's holder through the session's notes. A
// pool of Run has no operator, and no pool seed has a Resign, a second Run
// call or a panic in fn (a panic in a pool's fn panics again in the pool's
// goroutine, which stops the process). -sim.only=pool (or poolschedule)
// runs only the seeds whose plan is one. A pool replica's busy-loop limit
// is the single lease's times the number of jobs plus one (a lease for
// each, and the membership).
//
// After FaultEnd the plan is quiet; then every live replica is shut down by
// cancelling its context.
//
// # What is checked
//
// Under a pool, every invariant about leaders below (fence-order,
// fence-dup, stale-leader, overlap, two-leaders, no-leader, gap) is judged
// per job, from that job's leader contexts and IsLeader samples, with the
// pool's bounds (below); guard-order judges transactions per lease item;
// run-returned, run-shutdown and run-hang judge Pool.Run's returns (it
// returns only when its context ends, and then nil); busy-loop and leak
// apply as they are; and spread is judged besides. Under a pool of
// schedules, fn-twice and two-effects judge each job's slots, and
// run-fence, slot-missed, run-running and missed-count judge each job's
// run items, with the pool's bounds: the slots judged are those due once
// the split has settled (spreadFrom), as a slot due while its job moved
// is caught up only if it is the latest. trigger-fence, trigger-final and
// trigger-lost judge each job's triggered runs (from that job's fn calls,
// IsLeader samples and Admin.Runs: a job the operator never triggered
// must have none), and pause-respect and catch-up-once judge the
// operator's job's slots against its Pause and Resume. The world follows
// each session's notes (world.notesRead), and note-lost reports an
// operator's note added as an element the member item still held from a
// note a renewal had already returned: the set merges the two, and the
// next renewal's DELETE of the note it handled takes both, so that the
// holder never reads the change (seed 381290 found it when a note was the
// job's name; each note now has an id of its own).
//
// Every invariant is judged from what the users observed, in virtual time:
// the leader contexts handed to fn (when fn first saw one and when a
// goroutine waiting on it saw it end), the fence given with it, IsLeader
// samples, what Run and RunSchedule returned, fn calls per slot, the writes
// the server applied (the effects carry the fence the user presented) and
// the job-run items (ListRuns). In every run, wild clocks included:
//
//   - fence-order: fences handed to fn grow from one tenure to the next of a
//     Run call (and, with clocks within the bound, across all replicas);
//   - fence-dup: no fence is handed to two leader contexts;
//   - stale-leader: no leader context stays live more than a lease after
//     another replica's fn received a higher fence;
//   - guard-order: no guard accepts a fence lower than one it accepted
//     (per item for Put and Update, per job for TransactWrite and Commit);
//   - two-effects: no slot has two committed effects, no idempotency key is
//     written twice; fn-twice: no slot's fn is called twice under NeverRerun;
//   - run-returned: Run does not return while its context is live unless fn
//     panicked or the user's Resign stopped it with an error (nothing
//     silent); run-shutdown: after a clean shutdown Run returns nil (a
//     call a supervisor makes after it, with the ended context, returns
//     an error wrapping context.Canceled, as documented);
//     run-hang: Run returns after its context ends;
//   - busy-loop: no replica (nor the operator) sends more than 50 requests
//     in 100ms;
//   - leak: every goroutine ends (synctest reports a bubble that cannot);
//   - trigger-fence: a triggered run whose item ends succeeded or failed
//     was run by fn only with the fence its item holds (under Rerun, its
//     latest call), and, under NeverRerun, once; fn never ran a trigger
//     that has no run item (Admin.TriggerRun and Admin.Runs are read
//     after the shutdown);
//   - pause-respect (the clock-free part): no slot's fn is called later
//     than 2*CallTimeout + MaxClockSkew (plus the plan's longest delay)
//     after a Pause returned and before the Resume was called, whatever
//     the slot's instant (a firing whose controls were read before the
//     pause landed has had a read and a claim's time to finish).
//
// Forced releases keep the invariants above (stale-leader, fence-order,
// guard-order) and those below; the gap checks start, besides, once a
// release's recorded expiry is MaxClockSkew old and a standby has polled.
//
// With clocks within MaxClockSkew and no wall step beyond it:
//
//   - overlap: no two live leader contexts at once (pauses excepted);
//     two-leaders: IsLeader true on two replicas, or on one while another's
//     leader context is live.
//
// With clocks within the bound (wall steps allowed: they are over before the
// faults end), once the faults end:
//
//   - no-leader: a replica leads within LiveBound (LeaseDuration +
//     2*MaxClockSkew + RetryInterval + 2*CallTimeout + LeaseDuration/20);
//     a leaderless moment after that first leader is judged as a gap;
//   - gap: no leaderless gap longer than GapBound (LeaseDuration/10 +
//     2*MaxClockSkew + RetryInterval + 2*CallTimeout + LeaseDuration/20),
//     by IsLeader samples, and no tenure that ends after the faults ended
//     without another leader context following within GapBound (plus a
//     slot interval under RunSchedule), counted from when a replica that
//     crashed can no longer hold the lease, if that is later (a lease
//     write it had in flight may land after the crash). A tenure that a
//     newer fence took over before it ended (its replica was paused past
//     its deadline and sees the end when it resumes) hands nothing over
//     and is not judged here: the job's leaderless time began when the
//     newer tenure ended, and no-leader judges it (seed 921956: a pool
//     job's tenure seen ended at the faults' end, 0.8 s after the job's
//     next tenure had been ended by a replica with a clock an hour ahead,
//     was judged against the gap bound instead of the live bound);
//   - slot-missed: every slot due from then on fired (succeeded or failed);
//   - run-running: no run is left running when a later tenure fired within
//     the catch-up window of its slot;
//   - missed-count: RunRecord.Missed, when marked known, is the number of
//     slots without a run before the fired one (within the window; runs
//     of a later fence, claimed after it, do not count);
//   - run-fence: a slot's run whose item (ListRuns) ends succeeded or
//     failed was run by fn only with the fence its item holds (under
//     Rerun, its latest call);
//   - trigger-final: a trigger whose run was claimed (Admin.TriggerRun
//     finds it) is not left running; trigger-lost: a trigger the
//     operator's Admin.Trigger returned is claimed once replicas led, after
//     it and after the faults settled, for two heartbeats, four
//     CallTimeouts, two RetryIntervals, a slot's work and half a lease.
//
// Under a pool, no-leader and gap use the pool's bounds, which add the
// membership's own delays. A view lag (HeartbeatInterval + CallTimeout +
// 2*MaxClockSkew) bounds how long after a change of the pool's item every
// live replica's view shows it: its next renewal (a heartbeat after the
// last was sent, or once that one, which may have waited its CallTimeout
// in the faults, was answered),
// and an expiry judged on clocks up to 2*MaxClockSkew apart.
//
//   - no-leader: each job is led within PoolLiveBound of the faults' end,
//     the longer of two paths: a lease lost with its replica's membership
//     (a crash, a replica cut off: a LeaseDuration + MaxClockSkew for the
//     membership to expire, concurrently with the lease) is taken as in
//     LiveBound once the view lag has shown the membership gone
//     (LiveBound + view lag; twice LiveBound + view lag under a stepped
//     clock, where the membership is seen gone only by watching it for a
//     lease, and the lease is then watched for another); or a replica
//     whose membership lapsed in the
//     faults renews (CallTimeout + HeartbeatInterval), the others see it
//     (view lag), the job's former assignee resigns (CallTimeout) and the
//     new one takes it as a standby (RetryInterval + 2*CallTimeout +
//     LeaseDuration/20);
//   - gap: PoolGapBound is GapBound + view lag + CallTimeout: a job moved
//     by the pool is resigned by its former assignee and taken by the new
//     one, whose view may show the move a view lag after the former's;
//   - spread: from spreadFrom until the shutdown (every live replica has
//     renewed after the faults and a crashed one's membership and leases
//     have lapsed, as for the gap checks; then a view lag, PoolGapBound
//     for the moves, and no sooner than PoolLiveBound after the faults),
//     at every instant at which every live replica sampled every job, each
//     job is led (IsLeader) by exactly one replica: the one ddblease.Assign
//     gives it over the replicas alive (not crashed) at the end, so that
//     each leads jobs/replicas rounded down or up; after a forced release
//     that applied (its replica declines the job, which moves it and may
//     move another in its place), by one replica, each leading its share
//     rounded down or up. The quiet period of a pool seed is long enough
//     for several heartbeats of it.
//
// With clocks within the bound, each of them within MaxClockSkew of
// virtual time too, and no wall step beyond it, judged by the slots'
// instants against the operator's calls in virtual time, with a margin of
// MaxClockSkew each side:
//
//   - pause-respect: no slot due after the first Pause that returned and
//     before the Resume call that followed gets fn called before that
//     Resume, nor after it unless the Resume asked for the catch-up (the
//     slots there end skipped-by-pause or without a run);
//   - catch-up-once: after a Resume with catchUp, the slots the pause
//     covered get at most one fn call between them (the latest slot,
//     once; under Rerun, again by newer tenures when an older one left
//     its run running).
//
// # Running it
//
//	go test ./internal/sim -run 'TestSim$' -sim.seeds=200   # a quick look
//	go test ./internal/sim -run 'TestSim$|TestFoundSeeds$' -sim.seeds=60 -sim.replays=1 -timeout 20m  # CI
//	go test ./internal/sim -run 'TestSim$' -sim.long -timeout 24h  # 100,000 seeds
//	go test ./internal/sim -run 'TestSim$' -sim.seed=1234 -v  # replay one seed
//
// Without -sim.seeds, -sim.seed or -sim.long the test skips, saying so, so
// that go test ./... (which runs it with -race, and against other servers
// it does not use) stays quick. A failure prints its seed, its plan and a
// replay command. -sim.first moves the seed range, -sim.workers sets how
// many seeds run at once, -sim.list prints one line per failing seed,
// -sim.keepgoing surveys without failing, -sim.plans prints the plans
// without running them, and -sim.log, with -sim.seed, prints the
// library's log lines as the replay runs. The plan is a function of the
// seed alone; the run is not bit for bit: the library draws renewal
// versions and jitter from math/rand/v2 and the SDK its retry jitter, and
// goroutines woken at the same virtual instant run in any order, so a
// replay reproduces the plan exactly and the failure most of the time.
//
// Limits of synctest shape two choices. A goroutine waiting on a
// sync.Mutex is not durably blocked, so a handle's mutex held across a
// request that waits for virtual time, while another goroutine of the
// same handle waits for it, would stop virtual time for ever: requests
// take no virtual time unless the plan delays them, and a handle that the
// user drives from two goroutines (Resign, two Run calls) gets no faults.
// A client that retries without waiting would spin at one virtual instant:
// past 50 requests in 100ms a replica's requests take 10ms, and the
// busy-loop is reported. A seed that still does not end in real time
// (-sim.stuck, default 2m) stops the run with its plan. For the same
// reason a paused or crashed replica's Options.Now does not block: it
// reads the value it had when the process stopped (the library reads the
// clock under its handle's mutex), and what a user observes of the
// stopped process is held instead: fn, the IsLeader samples and the
// recording of a leader context's end.
package sim
