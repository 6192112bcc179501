package ddbleaseotel_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/ddbleaseotel"
	"github.com/ddblease/ddblease/ddbleasetest"
	"go.uber.org/goleak"
)

var srv *ddbleasetest.Server

func TestMain(m *testing.M) {
	srv = ddbleasetest.Start()
	code := m.Run()
	srv.Close()
	if code == 0 {
		err := goleak.Find()
		for i := 0; err != nil && i < 2; i++ { // goroutines winding down get a few seconds
			err = goleak.Find()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// TestTrackedLeaderGaugeEndsAtDeadline: a tracked lease's leader gauge
// falls to 0 when the tenure's local deadline passes, with no event to
// say so (nobody renews the lease acquired with TryAcquire).
func TestTrackedLeaderGaugeEndsAtDeadline(t *testing.T) {
	m, c := newMetrics(t)
	table := srv.NewTable(t)
	var skew atomic.Int64
	l, err := ddblease.New(srv.Client(), table, "billing", m.Instrument, func(o *ddblease.Options) {
		o.Owner = "a"
		o.LeaseDuration = 10 * time.Second
		o.Now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	})
	if err != nil {
		t.Fatal(err)
	}
	untrack := m.Track(l)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fence, err := l.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.collect()
	c.want("ddblease.leader", 1, job, ownA)
	c.want("ddblease.fence", fence, job, ownA)
	c.want("ddblease.acquisitions", 1, job)

	skew.Store(int64(10 * time.Second)) // past the local deadline
	c.collect()
	c.want("ddblease.leader", 0, job, ownA)
	c.want("ddblease.fence", fence, job, ownA)

	untrack()
	c.collect()
	if _, ok := c.value("ddblease.leader", job, ownA); ok {
		t.Error("the gauge of an untracked lease is still reported")
	}
}

// TestUntrackedLeaseEndsOnItsEvents: without Track, the gauges follow the
// events; the tenure's end at its deadline (nobody renews) is one.
func TestUntrackedLeaseEndsOnItsEvents(t *testing.T) {
	m, c := newMetrics(t)
	table := srv.NewTable(t)
	l, err := ddblease.New(srv.Client(), table, "billing", m.Instrument, func(o *ddblease.Options) {
		o.Owner = "a"
		o.LeaseDuration = 2 * time.Second
		o.HeartbeatInterval = 900 * time.Millisecond
		o.CallTimeout = 800 * time.Millisecond
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := l.TryAcquire(ctx); err != nil {
		t.Fatal(err)
	}
	c.collect()
	c.want("ddblease.leader", 1, job, ownA)
	for l.IsLeader() { // the deadline is 1.8s away
		time.Sleep(10 * time.Millisecond)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		c.collect()
		if v, _ := c.value("ddblease.losses", job, ddbleaseotel.AttrReason.String("deadline")); v == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.want("ddblease.losses", 1, job, ddbleaseotel.AttrReason.String("deadline"))
	c.want("ddblease.leader", 0, job, ownA)
}

// TestRunsOfARealLease: job runs claimed and finished on a real lease are
// counted by status, with their duration.
func TestRunsOfARealLease(t *testing.T) {
	m, c := newMetrics(t)
	table := srv.NewTable(t)
	l, err := ddblease.New(srv.Client(), table, "billing", m.Instrument, func(o *ddblease.Options) { o.Owner = "a" })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := l.TryAcquire(ctx); err != nil {
		t.Fatal(err)
	}
	slot := time.Now().Truncate(time.Minute)
	for i, runErr := range []error{nil, errors.New("upstream down")} {
		run, err := l.Claim(ctx, slot.Add(time.Duration(i)*time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if err := run.Finish(ctx, runErr); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	c.collect()
	c.want("ddblease.runs", 1, job, ddbleaseotel.AttrStatus.String("succeeded"))
	c.want("ddblease.runs", 1, job, ddbleaseotel.AttrStatus.String("failed"))
	c.want("ddblease.resignations", 1, job)
	if n, _ := c.histogram("ddblease.run.duration", job, ddbleaseotel.AttrStatus.String("failed")); n != 1 {
		t.Errorf("run.duration count = %d, want 1", n)
	}
	c.want("ddblease.leader", 0, job, ownA)
}
