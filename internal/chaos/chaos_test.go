package chaos_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddblease/ddblease/internal/chaos"
	"github.com/ddblease/ddblease/internal/ddbtest"
)

var srv *ddbtest.Server

func TestMain(m *testing.M) {
	if js := os.Getenv(chaos.ReplicaEnv); js != "" {
		var cfg chaos.ReplicaConfig
		if err := json.Unmarshal([]byte(js), &cfg); err != nil {
			fmt.Fprintln(os.Stderr, "replica config:", err)
			os.Exit(2)
		}
		if err := chaos.RunReplica(cfg); err != nil {
			fmt.Fprintln(os.Stderr, "replica:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	srv = ddbtest.Start()
	code := m.Run()
	srv.Close()
	os.Exit(code)
}

// envInt reads a count from the environment.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// TestFaults runs seeded fault plans and checks every history. Short mode
// (the default) runs 20 seeds, half of them with clocks far beyond
// MaxClockSkew, about a third of them pools; DDBLEASE_CHAOS_SEEDS sets the
// number, and DDBLEASE_CHAOS_SEED replays one seed (its plan is printed on
// failure). DDBLEASE_CHAOS_POOL=1 makes every plan a pool's, =0 none.
func TestFaults(t *testing.T) {
	seeds := envInt("DDBLEASE_CHAOS_SEEDS", 20)
	first := uint64(envInt("DDBLEASE_CHAOS_FIRST", 1))
	if s := os.Getenv("DDBLEASE_CHAOS_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("DDBLEASE_CHAOS_SEED: %v", err)
		}
		first, seeds = n, 1
	}
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The replicas are this binary: built with -race when the suite is,
	// so a data race in a replica fails the run (TestRaceInReplicaFails).
	t.Logf("replicas run %s (race detector: %v)", bin, chaos.RaceEnabled)
	parallel := envInt("DDBLEASE_CHAOS_PARALLEL", 2)
	sem := make(chan struct{}, parallel)
	var (
		mu     sync.Mutex
		totals = map[string]int{}
		runs   int
		found  int
		sum    chaos.Stats
		bad    []uint64
		noTxn  bool
		pools  int
	)
	sum.ByForm = map[string]int{}
	t.Run("seeds", func(t *testing.T) {
		for seed := first; seed < first+uint64(seeds); seed++ {
			wild := seed%2 == 0
			t.Run(fmt.Sprintf("seed=%d/wild=%v", seed, wild), func(t *testing.T) {
				t.Parallel()
				sem <- struct{}{}
				defer func() { <-sem }()
				dir := t.TempDir()
				h := &chaos.Harness{Binary: bin, Server: srv, Dir: dir, Timing: chaos.DefaultTiming}
				plan := chaos.NewPlan(seed, wild, h.Timing)
				switch os.Getenv("DDBLEASE_CHAOS_POOL") {
				case "1":
					plan.SetPool(true, h.Timing)
				case "0":
					plan.SetPool(false, h.Timing)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				res, err := h.Run(ctx, plan)
				if err != nil {
					t.Fatalf("seed %d: %v", seed, err)
				}
				t.Log(res.Describe())
				mu.Lock()
				runs++
				if plan.Pool {
					pools++
				}
				found += len(res.Violations)
				for k, v := range res.Faults {
					totals[k] += v
				}
				addStats(&sum, res.Stats)
				noTxn = noTxn || !res.Transactions
				if len(res.Violations) > 0 {
					bad = append(bad, seed)
				}
				mu.Unlock()
				if len(res.Violations) > 0 || os.Getenv("DDBLEASE_CHAOS_KEEP") != "" {
					keep := filepath.Join(os.TempDir(), fmt.Sprintf("ddblease-chaos-seed-%d", seed))
					_ = os.RemoveAll(keep)
					_ = os.CopyFS(keep, os.DirFS(dir))
				}
				if len(res.Violations) > 0 {
					t.Errorf("seed %d: %d violations (replay with DDBLEASE_CHAOS_SEED=%d; histories in %s)\nplan:\n%s",
						seed, len(res.Violations), seed, filepath.Join(os.TempDir(), fmt.Sprintf("ddblease-chaos-seed-%d", seed)), plan)
					for _, v := range res.Violations {
						t.Error(v)
					}
				}
			})
		}
	})
	t.Logf("server %s: %d runs (%d of them pools), faults injected %v, %d violations (seeds %v)", srv.Name, runs, pools, totals, found, bad)
	t.Logf("totals: %+v", sum)
	if noTxn {
		t.Logf("server %s has no transactions: the TransactWrite and Commit slots used Update", srv.Name)
	}
}

func addStats(sum *chaos.Stats, s chaos.Stats) {
	sum.Tenures += s.Tenures
	sum.Runs += s.Runs
	sum.Effects += s.Effects
	for k, v := range s.ByForm {
		sum.ByForm[k] += v
	}
	sum.Refused += s.Refused
	sum.Succeeded += s.Succeeded
	sum.DrainTimeouts += s.DrainTimeouts
	sum.NotResigned += s.NotResigned
	sum.StoppedFailing += s.StoppedFailing
	sum.WildOverlaps += s.WildOverlaps
	sum.MaxWildOverlap = max(sum.MaxWildOverlap, s.MaxWildOverlap)
	sum.EndsInStop += s.EndsInStop
	sum.CtxLiveAfterWake += s.CtxLiveAfterWake
	sum.Observed += s.Observed
	sum.Stalls += s.Stalls
	sum.MaxStall = max(sum.MaxStall, s.MaxStall)
	sum.SlowCalls += s.SlowCalls
	sum.ReplicaStalls += s.ReplicaStalls
}

// TestRaceInReplicaFails starts a replica that races on purpose and checks
// that the checker reports it: under -race the replica is race-built (it is
// this binary) and exits with "WARNING: DATA RACE". Without -race there is
// nothing to detect, and the test says so.
func TestRaceInReplicaFails(t *testing.T) {
	if !chaos.RaceEnabled {
		t.Skip("the suite is not race-built (go test -race): a replica's data race cannot be detected")
	}
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.Marshal(chaos.ReplicaConfig{Name: "racer", RaceDemo: true})
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), chaos.ReplicaEnv+"="+string(js))
	out, err := cmd.CombinedOutput()
	v, _ := chaos.Check(chaos.CheckInput{Race: true, Procs: []chaos.ProcExit{{Name: "racer", Err: err, Stderr: string(out)}}})
	found := false
	for _, s := range v {
		found = found || strings.Contains(s, "DATA RACE")
	}
	if !found {
		t.Fatalf("a racing replica was not reported; exit %v, violations %q, output:\n%s", err, v, out)
	}
}
