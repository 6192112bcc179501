package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/ddblease/ddblease"
)

// This file holds the children of the sessions figure: a replica of a pool
// of scheduled jobs (Pool.RunSchedule), and one process holding many idle
// scheduled jobs. The parent's side is sessionsbench.go.

func jobNames(prefix string, n int) []string {
	jobs := make([]string, n)
	for i := range jobs {
		jobs[i] = fmt.Sprintf("%s-%05d", prefix, i)
	}
	return jobs
}

// runSchedReplica is one replica of a pool of cfg.n jobs named cfg.job,
// each on Every(cfg.every), run by Pool.RunSchedule until SIGTERM. It
// prints:
//
//	RUN job=… slot=<ns> fence=…     as fn starts a run (fn returns at once)
//	LEAD job=… fence=…              when a reading of the job's State first finds this replica leading it
//	END job=…                       at the last reading that found it leading, once one finds it not
//	WRITES w_member=… …             every cfg.report: the items written and read so far, by class
//
// The job's State is read every cfg.sample, so a LEAD comes after the
// tenure's start and an END before its end: two replicas' LEAD–END spans
// of one job that overlap are an overlap that happened.
func runSchedReplica(cfg config) error {
	emit("START", time.Now(), fmt.Sprintf("pid=%d", os.Getpid()))
	wire := &detached{base: newTransport(cfg.conns)}
	defer wire.wait(30 * time.Second)
	items := newItemCounter(newClient(cfg.endpoint, wire))
	jobs := jobNames(cfg.job, cfg.n)
	p, err := ddblease.NewPool(items, cfg.table, cfg.job, jobs, cfg.leaseOptions)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	quit := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		sampleLeaders(p, jobs, cfg.sample, quit)
	}()
	go func() {
		t := time.NewTicker(cfg.report)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case now := <-t.C:
				emit("WRITES", now, items.fields()...)
			}
		}
	}()
	err = p.RunSchedule(ctx, ddblease.AllJobs(ddblease.Every(cfg.every)), func(_ context.Context, job string, run *ddblease.JobRun) error {
		emit("RUN", time.Now(), "job="+job, fmt.Sprintf("slot=%d", run.Slot().UnixNano()), fmt.Sprintf("fence=%d", run.Fence()))
		return nil
	})
	close(quit)
	<-sampled
	emit("WRITES", time.Now(), items.fields()...)
	status := "ok"
	if err != nil {
		status = "error"
		fmt.Fprintln(os.Stderr, "sched replica:", err)
	}
	emit("EXIT", time.Now(), "err="+status)
	return err
}

// sampleLeaders reads the State of each job every interval and prints LEAD
// and END as described at runSchedReplica, until quit is closed.
func sampleLeaders(p *ddblease.Pool, jobs []string, every time.Duration, quit <-chan struct{}) {
	type held struct {
		fence int64
		last  time.Time
	}
	leading := map[string]held{}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-quit:
			for job, h := range leading {
				emit("END", h.last, "job="+job)
			}
			return
		case <-t.C:
		}
		for _, job := range jobs {
			s := p.Lease(job).State()
			at := time.Now()
			h, was := leading[job]
			if was && (!s.Leader || s.Fence != h.fence) {
				emit("END", h.last, "job="+job)
				delete(leading, job)
			}
			if !s.Leader {
				continue
			}
			if _, ok := leading[job]; !ok {
				emit("LEAD", at, "job="+job, fmt.Sprintf("fence=%d", s.Fence))
			}
			leading[job] = held{s.Fence, at}
		}
	}
}

// runSchedIdle holds cfg.n scheduled jobs in one process, a pool of one
// replica whose jobs have no slot for a day, and prints one IDLE event: the
// memory and goroutines the held jobs cost (against the process before the
// pool was made), the items written over cfg.rounds heartbeats once every
// job was held, and the shutdown.
func runSchedIdle(cfg config) error {
	wire := &detached{base: newTransport(cfg.conns)}
	defer wire.wait(30 * time.Second)
	client := newClient(cfg.endpoint, wire)
	items := newItemCounter(client)
	jobs := jobNames(cfg.job, cfg.n)

	if cfg.memprofile != "" {
		runtime.MemProfileRate = 1
	}
	// The base is the process with its client's connections open (as any
	// service's are), so that the figure per job is what the jobs cost;
	// cold is the base before that, for the figures measured so before.
	runtime.GC()
	cold, _ := heapInuse()
	if err := warmConns(client, cfg.table, cfg.conns); err != nil {
		return fmt.Errorf("open the client's connections: %w", err)
	}
	runtime.GC()
	heap0, _ := heapInuse()
	live0 := memStats().HeapAlloc
	rss0, _ := rss()
	g0 := runtime.NumGoroutine()
	p, err := ddblease.NewPool(items, cfg.table, cfg.job, jobs, cfg.leaseOptions)
	if err != nil {
		return err
	}
	far := time.Now().Add(24 * time.Hour)
	sched := ddblease.ScheduleFunc(func(t time.Time) time.Time {
		if t.Before(far) {
			return far
		}
		return time.Time{}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	var runs atomic.Int64
	start := time.Now()
	go func() {
		done <- p.RunSchedule(ctx, ddblease.AllJobs(sched), func(context.Context, string, *ddblease.JobRun) error {
			runs.Add(1) // never: no slot falls due
			return nil
		})
	}()
	heldCount := func() int {
		n := 0
		for _, job := range jobs {
			if p.Lease(job).IsLeader() {
				n++
			}
		}
		return n
	}
	for heldCount() < cfg.n && time.Since(start) < 10*cfg.set.lease {
		time.Sleep(250 * time.Millisecond)
	}
	heldIn := time.Since(start)
	// Let the campaigns end and the burst's garbage go before measuring.
	time.Sleep(cfg.set.hb)
	runtime.GC()
	heap1, _ := heapInuse()
	rss1, _ := rss()
	ms := memStats()
	live1 := ms.HeapAlloc // the objects alive after the collection; heap is their spans
	g1 := runtime.NumGoroutine()
	lib := libraryGoroutines()
	if cfg.memprofile != "" {
		if f, err := os.Create(cfg.memprofile); err == nil {
			_ = pprof.WriteHeapProfile(f)
			_ = f.Close()
		}
	}

	before := items.fields()
	w0 := time.Now()
	time.Sleep(cfg.set.hb * time.Duration(cfg.rounds))
	after := items.fields()
	window := time.Since(w0)
	held := heldCount()

	stopAt := time.Now()
	cancel()
	err = <-done
	shutdown := time.Since(stopAt)
	final := items.fields()
	kv := []string{
		fmt.Sprintf("n=%d", cfg.n), fmt.Sprintf("held=%d", held), fmt.Sprintf("held_s=%.2f", heldIn.Seconds()),
		fmt.Sprintf("heap_cold_base=%d", cold), fmt.Sprintf("heap_base=%d", heap0), fmt.Sprintf("heap=%d", heap1), fmt.Sprintf("stack=%d", ms.StackInuse),
		fmt.Sprintf("live_base=%d", live0), fmt.Sprintf("live=%d", live1),
		fmt.Sprintf("rss_base=%d", rss0), fmt.Sprintf("rss=%d", rss1),
		fmt.Sprintf("goroutines_base=%d", g0), fmt.Sprintf("goroutines=%d", g1), fmt.Sprintf("goroutines_library=%d", lib),
		fmt.Sprintf("window_s=%.2f", window.Seconds()), fmt.Sprintf("runs=%d", runs.Load()),
		fmt.Sprintf("shutdown_s=%.2f", shutdown.Seconds()), fmt.Sprintf("err=%v", err != nil),
	}
	kv = append(kv, prefixed("before_", before)...)
	kv = append(kv, prefixed("after_", after)...)
	kv = append(kv, prefixed("final_", final)...)
	emit("IDLE", time.Now(), kv...)
	if err != nil {
		return fmt.Errorf("RunSchedule: %w", err)
	}
	return nil
}

func prefixed(p string, kv []string) []string {
	out := make([]string, len(kv))
	for i, s := range kv {
		out[i] = p + s
	}
	return out
}

// libraryGoroutines counts the goroutines with a frame of the library's
// root package on their stack.
func libraryGoroutines() int {
	buf := make([]byte, 1<<24)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("github.com/ddblease/ddblease.")) {
			n++
		}
	}
	return n
}

// warmConns opens up to n connections of client, with n requests at once
// that read no item (DescribeTable), and returns their errors.
func warmConns(client *dynamodb.Client, table string, n int) error {
	errs := make([]error, max(n, 1))
	var wg sync.WaitGroup
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, errs[i] = client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: &table})
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
