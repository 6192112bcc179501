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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
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
	kinds := &writeKinds{DynamoDBAPI: db}

	if cfg.memprofile != "" {
		runtime.MemProfileRate = 1
	}
	heap0, _ := heapInuse()
	rss0, _ := rss()
	g0 := runtime.NumGoroutine()

	leases := make([]*ddblease.Lease, cfg.n)
	for i := range leases {
		l, err := ddblease.New(kinds, cfg.table, fmt.Sprintf("%s-%05d", cfg.job, i), func(o *ddblease.Options) {
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
	windowProfile := cpuProfile(cfg.cpuprofile)
	cpu0, wall0 := cpuTime(), time.Now()
	winEnd := wall0.Add(cfg.set.hb * time.Duration(cfg.rounds))
	for time.Now().Before(winEnd) {
		time.Sleep(tick)
		sample(true)
	}
	cpu1, wall1 := cpuTime(), time.Now()
	windowProfile()
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

	stopProfile := cpuProfile(cfg.stopprofile)
	stopMem := memStats()
	stopAt, stopCPU := time.Now(), cpuTime()
	cntStop := counter.Snapshot()
	kinds0 := kinds.snapshot()
	cancel()
	wg.Wait()
	shutdown, shutdownCPU := time.Since(stopAt), cpuTime()-stopCPU
	stopMem1 := memStats()
	stopWrites := counter.Snapshot().Sub(cntStop)["UpdateItem"]
	stopKinds := kinds.snapshot().sub(kinds0)
	stopProfile()
	rawMem := memStats()
	raw, rawCPU, rawErrs, err := rawResignations(db, cfg)
	rawMem1 := memStats()
	if err != nil {
		return err
	}

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
		fmt.Sprintf("shutdown_resignations=%d", stopKinds.resign),
		fmt.Sprintf("shutdown_drain_marks=%d", stopKinds.drain),
		fmt.Sprintf("shutdown_renewals=%d", stopKinds.renew),
		fmt.Sprintf("shutdown_cpu_s=%.2f", shutdownCPU.Seconds()),
		fmt.Sprintf("shutdown_alloc_mb=%.0f", float64(stopMem1.TotalAlloc-stopMem.TotalAlloc)/1e6),
		fmt.Sprintf("shutdown_gc=%d", stopMem1.NumGC-stopMem.NumGC),
		fmt.Sprintf("raw_resign_s=%.2f", raw.Seconds()),
		fmt.Sprintf("raw_resign_cpu_s=%.2f", rawCPU.Seconds()),
		fmt.Sprintf("raw_resign_alloc_mb=%.0f", float64(rawMem1.TotalAlloc-rawMem.TotalAlloc)/1e6),
		fmt.Sprintf("raw_resign_gc=%d", rawMem1.NumGC-rawMem.NumGC),
		fmt.Sprintf("raw_resign_errors=%d", rawErrs),
		fmt.Sprintf("goroutines_after=%d", runtime.NumGoroutine()),
	}
	emit("SCALE", time.Now(), kv...)
	return nil
}

// writeKinds counts the library's UpdateItem requests by what they are:
// a resignation (it sets the expiry to zero), a drain mark (a renewal that
// marks the item draining) or a plain renewal.
type writeKinds struct {
	ddblease.DynamoDBAPI
	resign, drain, renew atomic.Int64
}

type kindCounts struct{ resign, drain, renew int64 }

func (w *writeKinds) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	v := in.ExpressionAttributeValues
	switch drn, _ := v[":drn"].(*types.AttributeValueMemberBOOL); {
	case v[":zero"] != nil:
		w.resign.Add(1)
	case drn != nil && drn.Value:
		w.drain.Add(1)
	default:
		w.renew.Add(1)
	}
	return w.DynamoDBAPI.UpdateItem(ctx, in, optFns...)
}

func (w *writeKinds) snapshot() kindCounts {
	return kindCounts{w.resign.Load(), w.drain.Load(), w.renew.Load()}
}

func (c kindCounts) sub(b kindCounts) kindCounts {
	return kindCounts{c.resign - b.resign, c.drain - b.drain, c.renew - b.renew}
}

// rawResignations sends cfg.n copies of the library's own resignation
// request at once, through the same client, each to an item of its own that
// an equally copied acquisition made (so that its condition holds), and
// returns how long they took and the CPU time this process spent meanwhile:
// the floor under the shutdown of cfg.n leases.
func rawResignations(db *dynamodb.Client, cfg config) (wall, cpu time.Duration, failed int64, err error) {
	ctx := context.Background()
	rec := &reqcount.Recorder{DynamoDBAPI: db}
	capture, err := ddblease.New(rec, cfg.table, cfg.job+"-capture", func(o *ddblease.Options) { o.Owner = "raw" })
	if err != nil {
		return 0, 0, 0, err
	}
	if _, err := capture.TryAcquire(ctx); err != nil {
		return 0, 0, 0, fmt.Errorf("raw resignations: acquire: %w", err)
	}
	acquireIn := rec.LastUpdate()
	if err := capture.Resign(ctx); err != nil {
		return 0, 0, 0, fmt.Errorf("raw resignations: resign: %w", err)
	}
	resignIn := rec.LastUpdate()
	burst := func(in *dynamodb.UpdateItemInput, timeout time.Duration) (wall, cpu time.Duration, failed int64) {
		var errs atomic.Int64
		var wg sync.WaitGroup
		t0, cpu0 := time.Now(), cpuTime()
		for i := range cfg.n {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(ctx, timeout)
				defer cancel()
				if _, err := db.UpdateItem(ctx, reqcount.OnKey(in, fmt.Sprintf("%s-raw-%05d", cfg.job, i))); err != nil {
					errs.Add(1)
				}
			})
		}
		wg.Wait()
		return time.Since(t0), cpuTime() - cpu0, errs.Load()
	}
	if _, _, errs := burst(acquireIn, time.Minute); errs > 0 {
		return 0, 0, 0, fmt.Errorf("raw resignations: %d of %d acquisitions failed", errs, cfg.n)
	}
	if cfg.stopprofile != "" {
		defer cpuProfile(strings.TrimSuffix(cfg.stopprofile, ".stop.pprof") + ".raw.pprof")()
	}
	// Each bounded as the library bounds its calls (CallTimeout, by
	// default half the heartbeat interval), which also takes the
	// transport's path for calls that can be cancelled.
	wall, cpu, failed = burst(resignIn, cfg.set.hb/2)
	return wall, cpu, failed, nil
}

// cpuProfile starts a CPU profile written to path (none when path is
// empty) and returns the function that stops it.
func cpuProfile(path string) (stop func()) {
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
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
