package sim

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

var (
	flagSeed    = flag.Uint64("sim.seed", 0, "replay this seed alone, verbosely")
	flagSeeds   = flag.Int("sim.seeds", 0, "number of seeds to run (CI: 60); without it or -sim.seed or -sim.long the test skips")
	flagFirst   = flag.Uint64("sim.first", 1, "first seed")
	flagLong    = flag.Bool("sim.long", false, "long mode: 100,000 seeds unless -sim.seeds says more")
	flagWorkers = flag.Int("sim.workers", 0, "seeds run at once (default GOMAXPROCS)")
	flagShow    = flag.Int("sim.show", 5, "failing seeds printed in full")
	flagStuck   = flag.Duration("sim.stuck", 2*time.Minute, "real time after which a seed counts as stuck (the run stops)")
	flagPlans   = flag.Bool("sim.plans", false, "print the plans of the seeds without running them")
	flagList    = flag.Bool("sim.list", false, "print one line per failing seed: its violation kinds and scenario tags")
	flagKeepOn  = flag.Bool("sim.keepgoing", false, "report violations without failing the test (to survey a code base)")
	flagLog     = flag.Bool("sim.log", false, "with -sim.seed: print the library's log lines (debug level) as the replay runs")
	flagReplays = flag.Int("sim.replays", 0, "replays of each seed in foundSeeds (CI: 1); without it TestFoundSeeds skips")
	flagOnly    = flag.String("sim.only", "", `run only the seeds whose plan is a pool ("pool") or a pool of schedules ("poolschedule"); the others are drawn and skipped`)
	flagEvery   = flag.Int("sim.progress", 0, "print a line to stderr after every N seeds (seeds done, failing so far, the failing seeds' numbers); 0: none")
)

// foundSeeds are seeds that found faults of the library (or of the
// checker) with the fault draws as they are. A replay takes the seed's
// path often, not always (the SDK's and the library's jitter), so
// TestFoundSeeds runs each several times.
type foundSeed struct {
	seed uint64
	what string
}

var foundSeeds = []foundSeed{
	{321397, "checker: a slot fired before the pause by replicas whose clocks were within the bound of each other but 1.1 s ahead of virtual time, judged as fired in the pause"},
	{141013, "a claim found a run an older tenure left running and could not mark it abandoned: the slot counted as handled"},
	{149650, "a claim answered after the tenure's deadline by the runtime clock: the ended tenure claimed the next slot, found its own run and moved past both (1 replay in 150 took that path before the fix)"},
	{149795, "checker: a leaderless moment after a panic, once a leader had followed the faults, reported as no leader at all"},
	{183445, "an orphan the finder could not mark before its tenure ended: the next tenure's catch-up stopped at the finder's run and never read it (each claim now records the slots still to sweep)"},
	{131, "a slot due during a pause no leader saw was fired after a resumption without catch-up (the claim now checks the pause's span)"},
	{63, "a slot whose claim was retried across a pause was fired after the resumption"},
	{80, "a slot skipped by the pause was recorded without the missed count computed for it"},
	{137, "a resumption's catch-up recorded Missed=0 as known"},
	{236, "a paused job whose skip record failed sent requests in a loop"},
	{443, "a resumption's catch-up moved the schedule's last slot, so the catch-up never read an earlier tenure's orphans; abandon writes sent in bursts"},
	{1046, "a look at the operator controls that failed was not made again: a trigger stayed pending for the rest of the tenure"},
	{218101, "a trigger whose outcome could not be recorded stayed pending, and the same tenure's next look recognised its claim and ran fn again under NeverRerun"},
	{218791, "the same, with a wall-clock step"},
	{201234, "a released replica, leaving the lease to the others, polled every RetryInterval/10 while the lease looked takeable"},
	{209233, "a leader whose wall clock stepped ahead during a pause recorded a slot skipped that came due after the resumption; it never ran"},
	{217840, "the same, four slots"},
	{211904, "a wall clock stepped back: the leader started again from now and claimed slots before ones already handled; its run left running there was never swept"},
	{150, "a wall clock that came back from a jump of an hour ahead: the slots the jump passed over must still fire"},
	{553, "the same, for a replica that first looked while its clock was ahead"},
	{210171, "checker: a resumption's catch-up claimed at the millisecond of the slot's claim was counted before it"},
	{237206, "checker: clocks within the bound of each other but all far behind the simulation's time: slots judged due before the leader's clock reached them"},
	{225630, "a wall clock that jumped ahead before the replica's first look came back: it waited for the slots it had fired ahead instead of firing the ones the jump passed over (the runner now follows the clock from the handle's making)"},
	{235946, "the same, for a RunSchedule called again after a panic while the clock was ahead"},
	{231957, "the same, a replica that first led during a 5 s step"},
	{237234, "the same, with four replicas and a step of 5 s for 200 ms"},
	{236474, "a triggered run taken over (Rerun) by a newer tenure that then crashed: the older tenure, its outcome refused, cleared the request, and no one finished the run"},
	{240864, "a slot run again (Rerun) by the tenure between two of one replica's tenures and left running: the replica's catch-up began after the slot it had handled itself and never read it back"},
	{245631, "a pool member whose wall clock was ahead by 6 s when it last renewed, then crashed: its expiry kept the others from taking its jobs (a member now also counts gone once read unchanged for a lease)"},
	{254667, "a triggered run an older tenure left running, whose marking failed, counted as handled: the request was cleared and the run stayed running (the request now stays pending, looked at again a RetryInterval later)"},
	{255728, "the same as 245631, with a wall step of an hour"},
	{271220, "checker: a slot fired early during the faults by a wall clock 15 s ahead, its outcome lost to them and the run abandoned, counted as never fired"},
	{274527, "a wall clock stepped an hour ahead: until the next renewal the tenure did not lead by it, and each try of the firing (every RetryInterval) read 1,000 skipped slots back again, 10 BatchGetItem each"},
	{280137, "a slot's claim that landed before the Pause, its answer lost, was recognised by a retry after it (read back) and fn ran 1.1 s after the Pause returned"},
	{287504, "a wall clock 5 s ahead when the operator released the lease stretched the holder's yield and its watch of the released item, both measured by Options.Now: no replica led until 8 s, 5 s after the faults ended"},
	{288928, "a checker defect: slots that came due by a wall clock stepped 15 s ahead during the faults were claimed early, given up to the faults and abandoned without fn; the checker counted them as never fired"},
}

// foundPoolSeeds are seeds that found faults running a pool. A seed of
// foundSeeds replays a single lease even where its draw is a pool's (it
// was found before pools existed, or in a single lease); a seed here is
// one whose draw is a pool's, and replays it.
var foundPoolSeeds = []foundSeed{
	{373024, "a pool: a replica whose first member read was answered before another's session existed, then paused, judged that session gone from the stale read and, the job assigned to it, took it while its holder led (a session now counts as gone only by a member read sent after the replica found the job bound to it)"},
	{388170, "a pool of schedules: two leaders of one job, the stale member read of 373024"},
	{401394, "a pool of schedules: two leaders of one job, the stale member read of 373024"},
	{407073, "a pool: two leaders of one job, the stale member read of 373024"},
	{381290, "a pool of schedules: a trigger's note, added to the holder's member item while the note of the Resume just before it awaited its deletion, was deleted with it unread: the trigger stayed pending for the rest of the tenure (each note now has an id of its own)"},
	{921956, "checker: a pool job's tenure, paused past its deadline, seen ended at the faults' end after a newer tenure had taken the job and been ended in the faults (a replica's clock an hour ahead ended its session), judged as a hand-over against the gap bound"},
	{960562, "a pool of schedules: an operator released a job by force from one replica, then from the other: both declined it, the assignment gave it to one of them, and that one would not start a job it declined while another replica was live: the job had no leader for the rest of the run (a replica now leaves a job it declines to the assignment once its own member item, as read, shows the decline)"},
	{1000442, "checker: a pool of schedules: an operator's release ended one replica's tenure and another replica took the job at the same virtual instant; the IsLeader samples each replica took on its own goroutine at that instant read the first before its end and the second after its start (the samples that compare replicas are now one snapshot of all)"},
	{484961, "a pool of schedules: an operator released a job by force while its holder resigned it to hand it over; the resignation, refused, ended the tenure, and the note of the release then found no tenure holding the item and left it bound to the holder's live session, which no other replica may take: the job had no leader for the rest of the run (an item bound to the session that no tenure holds is now freed, and a failed free is tried again)"},
	{1022224, "a pool: a replica paused through a blackhole lapsed; one survivor deleted its member item, and the other, which joined during the blackhole and had never read it, found its jobs bound to a session gone from the members and waited a whole lease to take them (a dead member is now ended first and deleted three leases after its expiry)"},
	{1011708, "harness: a pool of schedules: a campaign waited on a job's write lock while the pool's loop held it across a request delayed in virtual time (freeing an item an operator released); a goroutine waiting on a sync.Mutex is not durably blocked in a synctest bubble, so virtual time stood still (the write lock now waits on a channel)"},
}

// TestFoundSeeds replays the seeds in foundSeeds and foundPoolSeeds.
func TestFoundSeeds(t *testing.T) {
	if *flagReplays <= 0 {
		t.Skip("runs in the simulation's own step: go test ./internal/sim -run 'TestFoundSeeds$' -sim.replays=40")
	}
	for _, f := range foundPoolSeeds {
		if !newPlan(f.seed).Pool {
			t.Errorf("seed %d of foundPoolSeeds does not draw a pool", f.seed)
		}
	}
	for _, f := range append(slices.Clone(foundSeeds), foundPoolSeeds...) {
		t.Run(fmt.Sprint(f.seed), func(t *testing.T) {
			t.Parallel() // one seed per core at a time
			for i := range *flagReplays {
				res := runSeed(t, f.seed)
				if len(res.violations) > 0 {
					t.Errorf("seed %d (%s), replay %d:\n%s\n  %s", f.seed, f.what, i+1, res.plan, strings.Join(res.violations, "\n  "))
					break
				}
			}
		})
	}
}

// result is one seed's outcome.
type result struct {
	seed       uint64
	violations []string
	plan       string
	notes      []string
	virtual    time.Duration
}

// runSeed runs one seed in its own bubble. A bubble that cannot end
// (a goroutine left blocked) is reported as a leak.
func runSeed(t *testing.T, seed uint64) (res result) {
	p := newPlan(seed)
	res = result{seed: seed, plan: p.String()}
	defer func() {
		if v := recover(); v != nil {
			res.violations = append(res.violations, fmt.Sprintf("%s: the run's goroutines did not all end: %v", VLeak, v))
		}
	}()
	synctest.Test(t, func(*testing.T) {
		start := time.Now()
		v, h := execute(p)
		res.violations = append(res.violations, v...)
		h.mu.Lock()
		res.notes = slices.Clone(h.notes)
		h.mu.Unlock()
		res.virtual = time.Since(start)
	})
	return res
}

func kindOf(v string) string { k, _, _ := strings.Cut(v, ":"); return k }

// TestSim runs the seeded simulations. See doc.go.
func TestSim(t *testing.T) {
	if *flagSeed != 0 {
		t.Logf("plan:\n%s", newPlan(*flagSeed))
		res := runSeed(t, *flagSeed)
		for _, n := range res.notes {
			t.Logf("  %s", n)
		}
		t.Logf("virtual time %v", res.virtual)
		for _, v := range res.violations {
			t.Errorf("VIOLATION %s", v)
		}
		return
	}
	n := *flagSeeds
	if *flagLong && n < 100_000 {
		n = 100_000
	}
	if *flagPlans {
		for seed := *flagFirst; seed < *flagFirst+uint64(n); seed++ {
			fmt.Println(newPlan(seed))
		}
		return
	}
	if n <= 0 {
		t.Skip("the simulation runs in its own step: go test ./internal/sim -run 'TestSim$' -sim.seeds=2000 (see doc.go)")
	}
	workers := *flagWorkers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	var (
		next     atomic.Uint64
		mu       sync.Mutex
		failed   []result
		virtual  time.Duration
		firstBy  = map[string]uint64{}
		known    []uint64 // seeds with a known defect excused (knownNote)
		countBy  = map[string]int{}
		seedsBy  = map[string]int{}
		wallFrom = time.Now()
		done     int
		skipped  int
	)
	next.Store(*flagFirst)
	// A seed that does not end in real time has stopped virtual time: a
	// goroutine blocked where synctest cannot see a durable block.
	var running sync.Map // seed -> real start
	stopWatch := make(chan struct{})
	defer close(stopWatch)
	go func() {
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(5 * time.Second):
			}
			running.Range(func(k, v any) bool {
				if time.Since(v.(time.Time)) > *flagStuck {
					fmt.Fprintf(os.Stderr, "seed %d has run for %v of real time: virtual time is stuck. Plan:\n%s\n", k, *flagStuck, newPlan(k.(uint64)))
					buf := make([]byte, 1<<24)
					fmt.Fprintf(os.Stderr, "goroutines:\n%s\n", buf[:runtime.Stack(buf, true)])
					os.Exit(2)
				}
				return true
			})
		}
	}()
	last := *flagFirst + uint64(n)
	t.Run("seeds", func(t *testing.T) {
		for w := range workers {
			t.Run(fmt.Sprintf("w%d", w), func(t *testing.T) {
				t.Parallel()
				for {
					seed := next.Add(1) - 1
					if seed >= last {
						return
					}
					if !wanted(seed) {
						mu.Lock()
						skipped++
						mu.Unlock()
						continue
					}
					running.Store(seed, time.Now())
					res := runSeed(t, seed)
					running.Delete(seed)
					mu.Lock()
					virtual += res.virtual
					kinds := map[string]bool{}
					for _, v := range res.violations {
						k := kindOf(v)
						countBy[k]++
						kinds[k] = true
					}
					for k := range kinds {
						seedsBy[k]++
						if f, ok := firstBy[k]; !ok || seed < f {
							firstBy[k] = seed
						}
					}
					if len(res.violations) > 0 {
						failed = append(failed, res)
					}
					if slices.ContainsFunc(res.notes, func(n string) bool { return strings.Contains(n, knownNote) }) {
						known = append(known, seed)
					}
					if done++; *flagEvery > 0 && done%*flagEvery == 0 {
						var fs []uint64
						for _, f := range failed {
							fs = append(fs, f.seed)
						}
						fmt.Fprintf(os.Stderr, "sim: %d of %d seeds done in %v, %d failing %v\n", done, n, time.Since(wallFrom).Round(time.Second), len(failed), fs)
					}
					mu.Unlock()
				}
			})
		}
	})
	wall := time.Since(wallFrom)
	sort.Slice(failed, func(i, j int) bool { return failed[i].seed < failed[j].seed })
	if skipped > 0 {
		t.Logf("%d of the %d seeds drawn are not %s plans: skipped", skipped, n, *flagOnly)
		n -= skipped
	}
	t.Logf("%d seeds in %v (%.1f seeds/s), %v of virtual time (%.0fx), %d failing",
		n, wall.Round(time.Millisecond), float64(n)/wall.Seconds(), virtual.Round(time.Second), virtual.Seconds()/wall.Seconds(), len(failed))
	var kinds []string
	for k := range firstBy {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		t.Logf("  %-13s in %5d seeds (%d violations), first at seed %d", k, seedsBy[k], countBy[k], firstBy[k])
	}
	if len(known) > 0 {
		slices.Sort(known)
		t.Logf("  a known defect excused (%s) in %d seeds: %v", knownNote, len(known), known[:min(len(known), 20)])
	}
	if *flagList {
		for _, res := range failed {
			kinds := map[string]bool{}
			for _, v := range res.violations {
				kinds[kindOf(v)] = true
			}
			var ks []string
			for k := range kinds {
				ks = append(ks, k)
			}
			sort.Strings(ks)
			fmt.Printf("FAILED seed=%d kinds=%s tags=%v\n", res.seed, strings.Join(ks, ","), newPlan(res.seed).Tags)
		}
	}
	for i, res := range failed {
		if i >= *flagShow {
			break
		}
		var b strings.Builder
		fmt.Fprintf(&b, "seed %d failed; replay with: go test ./internal/sim -run 'TestSim$' -sim.seed=%d -v\n%s\n", res.seed, res.seed, res.plan)
		for j, v := range res.violations {
			if j == 8 {
				fmt.Fprintf(&b, "  ... %d more\n", len(res.violations)-j)
				break
			}
			fmt.Fprintf(&b, "  VIOLATION %s\n", v)
		}
		if *flagKeepOn {
			t.Log(b.String())
		} else {
			t.Error(b.String())
		}
	}
	if len(failed) > *flagShow {
		var seeds []string
		for _, r := range failed[*flagShow:] {
			seeds = append(seeds, fmt.Sprint(r.seed))
			if len(seeds) == 50 {
				break
			}
		}
		t.Logf("more failing seeds: %s", strings.Join(seeds, " "))
		if !*flagKeepOn {
			t.Fail()
		}
	}
}

// wanted reports whether seed's plan is of the kind -sim.only asks for.
func wanted(seed uint64) bool {
	switch *flagOnly {
	case "":
		return true
	case "pool":
		return newPlan(seed).Pool
	case "poolschedule":
		p := newPlan(seed)
		return p.Pool && p.Schedule
	}
	return true
}
