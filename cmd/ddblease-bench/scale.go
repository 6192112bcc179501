package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/reqcount"
)

// countingHandler counts log records at Warn and above, and writes the
// first few to stderr.
type countingHandler struct {
	n    *atomic.Int64
	next slog.Handler
}

func (h countingHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	if h.n.Add(1) <= 20 {
		return h.next.Handle(ctx, r)
	}
	return nil
}
func (h countingHandler) WithAttrs(a []slog.Attr) slog.Handler {
	return countingHandler{h.n, h.next.WithAttrs(a)}
}
func (h countingHandler) WithGroup(g string) slog.Handler {
	return countingHandler{h.n, h.next.WithGroup(g)}
}

// latencies collects request latencies.
type latencies struct {
	mu   sync.Mutex
	on   bool
	d    []time.Duration
	errs int
}

func (l *latencies) observe(op string, d time.Duration, err error) {
	if op != "UpdateItem" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.on {
		return
	}
	l.d = append(l.d, d)
	if err != nil {
		l.errs++
	}
}

func heapInuse() (inuse, sys uint64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse, ms.Sys
}

func memStats() runtime.MemStats {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms
}

// runScale holds cfg.n leases in this one process, each its own Lease on
// its own job, driven by its own Run, and reports memory, goroutines, CPU per
// heartbeat round and heartbeat punctuality as one SCALE event.
func runScale(cfg config) error {
	var warns atomic.Int64
	logger := slog.New(countingHandler{&warns, slog.NewTextHandler(os.Stderr, nil)})
	lat := &latencies{}
	wire := &detached{base: newTransport(cfg.conns)}
	defer wire.wait(30 * time.Second)
	counter := reqcount.New(wire)
	counter.Observe = lat.observe
	db := newClient(cfg.endpoint, counter)

	if cfg.memprofile != "" {
		runtime.MemProfileRate = 1
	}
	heap0, _ := heapInuse()
	rss0, _ := rss()
	g0 := runtime.NumGoroutine()

	leases := make([]*ddblease.Lease, cfg.n)
	for i := range leases {
		l, err := ddblease.New(db, cfg.table, fmt.Sprintf("%s-%05d", cfg.job, i), func(o *ddblease.Options) {
			o.LeaseDuration = cfg.set.lease
			o.HeartbeatInterval = cfg.set.hb
			o.RetryInterval = cfg.set.retry
			o.Logger = logger
		})
		if err != nil {
			return err
		}
		leases[i] = l
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var leading, lost, runErrs atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	ramp := cfg.ramp
	for i, l := range leases {
		if d := time.Until(start.Add(ramp * time.Duration(i) / time.Duration(cfg.n))); d > 0 {
			time.Sleep(d)
		}
		wg.Go(func() {
			err := l.Run(ctx, func(lctx context.Context, _ int64) error {
				leading.Add(1)
				<-lctx.Done()
				leading.Add(-1)
				if errors.Is(context.Cause(lctx), ddblease.ErrLost) {
					lost.Add(1)
				}
				return nil
			})
			if err != nil {
				runErrs.Add(1)
			}
		})
	}
	allLead := time.Now().Add(cfg.set.lease)
	for leading.Load() < int64(cfg.n) && time.Now().Before(allLead) {
		time.Sleep(50 * time.Millisecond)
	}
	acquiredIn := time.Since(start)
	led := leading.Load()

	// Warm up one round, then measure cfg.rounds rounds.
	last := make([]time.Time, cfg.n)
	var gaps []time.Duration
	var renewals int64
	sample := func(record bool) {
		for i, l := range leases {
			s := l.State()
			if s.RenewedAt.IsZero() || s.RenewedAt.Equal(last[i]) {
				continue
			}
			if record && !last[i].IsZero() {
				gaps = append(gaps, s.RenewedAt.Sub(last[i]))
				renewals++
			}
			last[i] = s.RenewedAt
		}
	}
	tick := min(time.Second, cfg.set.hb/4)
	warmEnd := time.Now().Add(cfg.set.hb * time.Duration(cfg.warmup))
	for time.Now().Before(warmEnd) {
		sample(false)
		time.Sleep(tick)
	}
	sample(false)
	heap1, sys1 := heapInuse()
	if cfg.memprofile != "" {
		if f, err := os.Create(cfg.memprofile); err == nil {
			_ = pprof.WriteHeapProfile(f)
			f.Close()
		}
	}
	ms1 := memStats()
	rss1, _ := rss()
	g1 := runtime.NumGoroutine()
	lost0 := lost.Load()

	lat.mu.Lock()
	lat.on = true
	lat.mu.Unlock()
	cnt0 := counter.Snapshot()
	if cfg.cpuprofile != "" {
		if f, err := os.Create(cfg.cpuprofile); err == nil {
			if err := pprof.StartCPUProfile(f); err == nil {
				defer f.Close()
			}
		}
	}
	cpu0, wall0 := cpuTime(), time.Now()
	winEnd := wall0.Add(cfg.set.hb * time.Duration(cfg.rounds))
	for time.Now().Before(winEnd) {
		time.Sleep(tick)
		sample(true)
	}
	cpu1, wall1 := cpuTime(), time.Now()
	if cfg.cpuprofile != "" {
		pprof.StopCPUProfile()
	}
	cnt := counter.Snapshot().Sub(cnt0)
	lat.mu.Lock()
	lat.on = false
	ds := slices.Clone(lat.d)
	latErrs := lat.errs
	lat.mu.Unlock()
	_, rssPeak := rss()
	ms2 := memStats()
	lostInWindow := lost.Load() - lost0
	leadingAtEnd := leading.Load()

	stopAt := time.Now()
	cntStop := counter.Snapshot()
	cancel()
	wg.Wait()
	shutdown := time.Since(stopAt)
	stopWrites := counter.Snapshot().Sub(cntStop)["UpdateItem"]

	late := func(limit time.Duration) int {
		n := 0
		for _, g := range gaps {
			if g-cfg.set.hb > limit {
				n++
			}
		}
		return n
	}
	slices.Sort(gaps)
	slices.Sort(ds)
	rounds := wall1.Sub(wall0).Seconds() / cfg.set.hb.Seconds()
	kv := []string{
		fmt.Sprintf("n=%d", cfg.n),
		fmt.Sprintf("led=%d", led),
		fmt.Sprintf("acquired_s=%.2f", acquiredIn.Seconds()),
		fmt.Sprintf("heap_base=%d", heap0),
		fmt.Sprintf("heap=%d", heap1),
		fmt.Sprintf("sys=%d", sys1),
		fmt.Sprintf("stack=%d", ms1.StackInuse),
		fmt.Sprintf("gc_cycles=%d", ms2.NumGC-ms1.NumGC),
		fmt.Sprintf("rss_base=%d", rss0),
		fmt.Sprintf("rss=%d", rss1),
		fmt.Sprintf("rss_peak=%d", rssPeak),
		fmt.Sprintf("goroutines_base=%d", g0),
		fmt.Sprintf("goroutines=%d", g1),
		fmt.Sprintf("rounds=%.2f", rounds),
		fmt.Sprintf("cpu_s=%.3f", (cpu1 - cpu0).Seconds()),
		fmt.Sprintf("cpu_per_round_s=%.3f", (cpu1-cpu0).Seconds()/rounds),
		fmt.Sprintf("renewals=%d", renewals),
		fmt.Sprintf("renewals_expected=%.0f", float64(cfg.n)*rounds),
		fmt.Sprintf("gap_p50_ms=%d", pct(gaps, 0.5).Milliseconds()),
		fmt.Sprintf("gap_p99_ms=%d", pct(gaps, 0.99).Milliseconds()),
		fmt.Sprintf("gap_max_ms=%d", pct(gaps, 1).Milliseconds()),
		fmt.Sprintf("late_100ms=%d", late(100*time.Millisecond)),
		fmt.Sprintf("late_1s=%d", late(time.Second)),
		fmt.Sprintf("lost=%d", lostInWindow),
		fmt.Sprintf("lost_total=%d", lost.Load()),
		fmt.Sprintf("leading_end=%d", leadingAtEnd),
		fmt.Sprintf("updates=%d", cnt["UpdateItem"]),
		fmt.Sprintf("gets=%d", cnt[reqcount.GetConsistent]+cnt[reqcount.GetEventual]),
		fmt.Sprintf("upd_p50_ms=%.2f", ms(pct(ds, 0.5))),
		fmt.Sprintf("upd_p99_ms=%.2f", ms(pct(ds, 0.99))),
		fmt.Sprintf("upd_max_ms=%.2f", ms(pct(ds, 1))),
		fmt.Sprintf("upd_errors=%d", latErrs),
		fmt.Sprintf("warnings=%d", warns.Load()),
		fmt.Sprintf("run_errors=%d", runErrs.Load()),
		fmt.Sprintf("shutdown_s=%.2f", shutdown.Seconds()),
		fmt.Sprintf("shutdown_writes=%d", stopWrites),
		fmt.Sprintf("goroutines_after=%d", runtime.NumGoroutine()),
	}
	emit("SCALE", time.Now(), kv...)
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// pct returns the q-quantile of sorted values (nearest rank); q=1 is the max.
func pct(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
