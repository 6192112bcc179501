package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/reqcount"
)

// overhead times TryAcquire and Heartbeat against the raw UpdateItem they
// send, interleaved call by call (in random order) so that drift on a shared
// machine hits both alike.
func (r *runner) overhead() {
	n := r.cfg.overhead
	if n <= 0 {
		return
	}
	r.logf("overhead: %d interleaved calls of each kind", n)
	ctx := context.Background()
	db := newClient(r.cfg.endpoint, newTransport(4))
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	opts := func(owner string) func(*ddblease.Options) {
		return func(o *ddblease.Options) { o.Owner = owner; o.Logger = quiet }
	}
	prefix := "overhead-" + r.runID

	// Capture the library's acquire and heartbeat requests (owner "ours",
	// fence 1), and make an item that the heartbeat request renews.
	rec := &reqcount.Recorder{DynamoDBAPI: db}
	capture, err := ddblease.New(rec, r.cfg.table, prefix+"-capture", opts("ours"))
	if err != nil {
		r.fail("overhead", err)
		return
	}
	if _, err := capture.TryAcquire(ctx); err != nil {
		r.fail("overhead", err)
		return
	}
	acquireIn := rec.LastUpdate()
	if err := capture.Heartbeat(ctx); err != nil {
		r.fail("overhead", err)
		return
	}
	heartbeatIn := rec.LastUpdate()
	rawHB := prefix + "-hb-raw"
	if _, err := db.UpdateItem(ctx, reqcount.OnKey(acquireIn, rawHB)); err != nil {
		r.fail("overhead", err)
		return
	}
	heartbeatIn = reqcount.OnKey(reqcount.KeepVersion(heartbeatIn, acquireIn), rawHB)

	// Warm up connections and the server.
	for i := range 20 {
		_, _ = db.UpdateItem(ctx, reqcount.OnKey(acquireIn, fmt.Sprintf("%s-warm-%d", prefix, i)))
	}
	// A job's first acquisition also lists it in the table's directory
	// (two more writes, once in the job's life): list each job first, and
	// time the acquisition of its resigned lease, one UpdateItem as the raw
	// call is.
	for i := range n {
		l, err := ddblease.New(db, r.cfg.table, fmt.Sprintf("%s-ours-%d", prefix, i), opts("earlier"))
		if err == nil {
			_, err = l.TryAcquire(ctx)
		}
		if err == nil {
			err = l.Resign(ctx)
		}
		if err != nil {
			r.fail("overhead", err)
			return
		}
	}
	var acqOurs, acqRaw, hbOurs, hbRaw []time.Duration
	for i := range n {
		l, err := ddblease.New(db, r.cfg.table, fmt.Sprintf("%s-ours-%d", prefix, i), opts("ours"))
		if err != nil {
			r.fail("overhead", err)
			return
		}
		in := reqcount.OnKey(acquireIn, fmt.Sprintf("%s-raw-%d", prefix, i))
		ours := func() error { _, err := l.TryAcquire(ctx); return err }
		raw := func() error { _, err := db.UpdateItem(ctx, in); return err }
		d1, d2, err := pair(i, ours, raw)
		if err != nil {
			r.fail("overhead acquire", err)
			return
		}
		acqOurs, acqRaw = append(acqOurs, d1), append(acqRaw, d2)
	}

	l, err := ddblease.New(db, r.cfg.table, prefix+"-hb-ours", opts("ours"))
	if err != nil {
		r.fail("overhead", err)
		return
	}
	if _, err := l.TryAcquire(ctx); err != nil {
		r.fail("overhead", err)
		return
	}
	for i := range n {
		ours := func() error { return l.Heartbeat(ctx) }
		raw := func() error { _, err := db.UpdateItem(ctx, heartbeatIn); return err }
		d1, d2, err := pair(i, ours, raw)
		if err != nil {
			r.fail("overhead heartbeat", err)
			return
		}
		hbOurs, hbRaw = append(hbOurs, d1), append(hbRaw, d2)
	}
	_ = l.Resign(ctx)
	_ = capture.Resign(ctx)

	res := &overheadResult{N: n}
	res.AcquireOurs, res.AcquireRaw = msf(median(acqOurs)), msf(median(acqRaw))
	res.HeartbeatOurs, res.HeartbeatRaw = msf(median(hbOurs)), msf(median(hbRaw))
	res.AcquireRatio = res.AcquireOurs / res.AcquireRaw
	res.HeartbeatRatio = res.HeartbeatOurs / res.HeartbeatRaw
	res.AcquireMeanRatio = trimmedMean(acqOurs) / trimmedMean(acqRaw)
	res.HeartbeatMeanRat = trimmedMean(hbOurs) / trimmedMean(hbRaw)
	r.mu.Lock()
	r.res.Overhead = res
	r.mu.Unlock()
	r.logf("overhead: acquire %.3f/%.3f ms (x%.3f), heartbeat %.3f/%.3f ms (x%.3f)",
		res.AcquireOurs, res.AcquireRaw, res.AcquireRatio, res.HeartbeatOurs, res.HeartbeatRaw, res.HeartbeatRatio)
}

// pair runs ours and raw once each, in an order that alternates with i.
func pair(i int, ours, raw func() error) (dOurs, dRaw time.Duration, err error) {
	timeIt := func(f func() error) (time.Duration, error) {
		t := time.Now()
		err := f()
		return time.Since(t), err
	}
	if i%2 == 0 {
		if dOurs, err = timeIt(ours); err != nil {
			return
		}
		dRaw, err = timeIt(raw)
		return
	}
	if dRaw, err = timeIt(raw); err != nil {
		return
	}
	dOurs, err = timeIt(ours)
	return
}

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return pct(s, 0.5)
}

// trimmedMean is the mean after dropping the slowest and fastest 10%.
func trimmedMean(ds []time.Duration) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	k := len(s) / 10
	s = s[k : len(s)-k]
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return float64(sum) / float64(max(len(s), 1))
}
