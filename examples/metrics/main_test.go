package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/ddbleasetest"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
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

// scrape is one read of a replica's /metrics.
type scrape map[string]*dto.MetricFamily

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

func scrapeOf(t *testing.T, base string) scrape {
	t.Helper()
	code, body := get(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	return fams
}

// value returns the value of the sample of family name whose labels
// include want, and whether there is one; for a histogram, its count.
func (s scrape) value(name string, want map[string]string) (float64, bool) {
	f := s[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if labels[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

// eventually polls cond until it holds, failing the test after a minute
// (a generous bound for a loaded machine; the hand-over takes well under
// a second).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestHandOverSeenOnMetrics(t *testing.T) {
	db := srv.Client()
	table := srv.NewTable(t)
	const job = "report"
	opts := func(o *ddblease.Options) {
		// Room for a loaded machine: a heartbeat may be late by seconds
		// before the tenure ends, and the counts below change.
		o.LeaseDuration = 6 * time.Second
		o.HeartbeatInterval = 500 * time.Millisecond
		o.RetryInterval = 200 * time.Millisecond
	}
	var reps [2]*replica
	var urls [2]string
	var cancels [2]context.CancelFunc
	var done [2]chan error
	for i := range reps {
		r, err := newReplica(db, table, job, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		hs := httptest.NewServer(r.Handler)
		defer hs.Close()
		reps[i], urls[i] = r, hs.URL
		done[i] = make(chan error, 2)
	}
	t.Cleanup(func() { // on a failure, stop what still runs
		for i, cancel := range cancels {
			if cancel != nil {
				cancel()
				<-done[i]
			}
		}
	})
	a, b := reps[0], reps[1]
	jobL := map[string]string{"ddblease_job": job}
	own := func(r *replica) map[string]string {
		return map[string]string{"ddblease_job": job, "ddblease_owner": r.Lease.Owner()}
	}
	start := func(i int) {
		ctx, cancel := context.WithCancel(context.Background())
		cancels[i] = cancel
		go func() {
			err := reps[i].Run(ctx)
			done[i] <- err
			done[i] <- err // for the cleanup
		}()
	}

	// a leads and renews; b campaigns, and sees a.
	start(0)
	eventually(t, "a leads", a.Lease.IsLeader)
	start(1)
	eventually(t, "a renewed twice and b polled twice", func() bool {
		hb, _ := scrapeOf(t, urls[0]).value("ddblease_heartbeat_duration_seconds", jobL)
		polls, _ := scrapeOf(t, urls[1]).value("ddblease_dynamodb_calls_total",
			map[string]string{"ddblease_job": job, "db_operation_name": "GetItem", "ddblease_call_outcome": "ok"})
		return hb >= 2 && polls >= 2
	})
	sa, sb := scrapeOf(t, urls[0]), scrapeOf(t, urls[1])
	for _, c := range []struct {
		s     scrape
		name  string
		l     map[string]string
		value float64
	}{
		{sa, "ddblease_leader", own(a), 1},
		{sb, "ddblease_leader", own(b), 0},
		{sa, "ddblease_acquisitions_total", jobL, 1},
		{sb, "ddblease_acquisitions_total", jobL, 0},
		{sb, "ddblease_handovers_total", jobL, 0},
	} {
		if v, ok := c.s.value(c.name, c.l); !ok || v != c.value {
			t.Errorf("before the hand-over: %s%v = %v (present %v), want %v", c.name, c.l, v, ok, c.value)
		}
	}
	for i, u := range urls {
		if code, body := get(t, u+"/healthz"); code != http.StatusOK {
			t.Errorf("replica %d /healthz before the hand-over: %d %s", i, code, body)
		}
	}

	// a's Run context ends: it drains, resigns, and b takes over.
	cancels[0]()
	if err := <-done[0]; err != nil {
		t.Fatalf("a's Run: %v", err)
	}
	eventually(t, "b leads", b.Lease.IsLeader)
	eventually(t, "b's acquisition is counted", func() bool {
		v, _ := scrapeOf(t, urls[1]).value("ddblease_acquisitions_total", jobL)
		return v == 1
	})

	sa, sb = scrapeOf(t, urls[0]), scrapeOf(t, urls[1])
	for _, c := range []struct {
		s     scrape
		name  string
		l     map[string]string
		value float64
	}{
		{sa, "ddblease_leader", own(a), 0},
		{sb, "ddblease_leader", own(b), 1},
		{sa, "ddblease_acquisitions_total", jobL, 1},
		{sa, "ddblease_resignations_total", jobL, 1},
		{sa, "ddblease_handovers_total", jobL, 0},
		{sb, "ddblease_acquisitions_total", jobL, 1},
		{sb, "ddblease_resignations_total", jobL, 0},
		{sb, "ddblease_handovers_total", jobL, 1},
	} {
		if v, ok := c.s.value(c.name, c.l); !ok || v != c.value {
			t.Errorf("after the hand-over: %s%v = %v (present %v), want %v", c.name, c.l, v, ok, c.value)
		}
	}
	fa, _ := sa.value("ddblease_fence", own(a))
	fb, _ := sb.value("ddblease_fence", own(b))
	if fa < 1 || fb <= fa {
		t.Errorf("fences: a %v, b %v; want 0 < a < b", fa, fb)
	}
	if n, ok := sa.value("ddblease_heartbeat_duration_seconds", jobL); !ok || n < 2 {
		t.Errorf("a's heartbeat duration count = %v, want at least 2", n)
	}
	if n, ok := sa.value("ddblease_heartbeat_margin_seconds", jobL); !ok || n < 2 {
		t.Errorf("a's heartbeat margin count = %v, want at least 2", n)
	}
	// A stopped replica and a leading one are both healthy.
	for i, u := range urls {
		if code, body := get(t, u+"/healthz"); code != http.StatusOK || strings.TrimSpace(body) != "ok" {
			t.Errorf("replica %d /healthz after the hand-over: %d %s", i, code, body)
		}
	}

	cancels[1]()
	if err := <-done[1]; err != nil {
		t.Fatalf("b's Run: %v", err)
	}
}

// TestDocSnippets checks that the Go code docs/observability.md shows is
// cut from this file.
func TestDocSnippets(t *testing.T) {
	doc, err := os.ReadFile("../../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	blocks := strings.Split(string(doc), "```go\n")
	if len(blocks) < 2 {
		t.Fatal("docs/observability.md shows no Go code")
	}
	for _, b := range blocks[1:] {
		snippet, _, ok := strings.Cut(b, "```")
		if !ok {
			t.Fatalf("unterminated code block: %.60q", b)
		}
		if !strings.Contains(string(src), snippet) {
			t.Errorf("docs/observability.md shows code that is not in examples/metrics/main.go:\n%s", snippet)
		}
	}
}
