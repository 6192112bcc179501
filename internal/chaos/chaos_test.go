package chaos_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
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
// MaxClockSkew; DDBLEASE_CHAOS_SEEDS sets the number, and
// DDBLEASE_CHAOS_SEED replays one seed (its plan is printed on failure).
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
	parallel := envInt("DDBLEASE_CHAOS_PARALLEL", 2)
	sem := make(chan struct{}, parallel)
	var (
		mu     sync.Mutex
		totals = map[string]int{}
		runs   int
		found  int
	)
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
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				res, err := h.Run(ctx, plan)
				if err != nil {
					t.Fatalf("seed %d: %v", seed, err)
				}
				t.Log(res.Describe())
				mu.Lock()
				runs++
				found += len(res.Violations)
				for k, v := range res.Faults {
					totals[k] += v
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
	t.Logf("server %s: %d runs, faults injected %v, %d violations", srv.Name, runs, totals, found)
}
