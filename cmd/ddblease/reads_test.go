package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// itemRelay is a proxy in front of the test server that counts the
// requests the command sends, by operation, and the items the server
// examined for them: a Query's or Scan's ScannedCount (or the items it
// returned, where the server does not report the count, as the
// in-process one), the item a GetItem found, the items a BatchGetItem
// returned.
type itemRelay struct {
	url      string
	mu       sync.Mutex
	requests map[string]int
	items    int
}

func newItemRelay(t *testing.T) *itemRelay {
	t.Helper()
	target, err := url.Parse(srv.URL)
	require.NoError(t, err)
	r := &itemRelay{requests: map[string]int{}}
	rp := httputil.NewSingleHostReverseProxy(target)
	tr := &http.Transport{}
	rp.Transport = tr
	rp.ModifyResponse = func(resp *http.Response) error {
		b, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			return err
		}
		resp.Body = io.NopCloser(bytes.NewReader(b))
		var out struct {
			ScannedCount int
			Items        []any
			Item         map[string]any
			Responses    map[string][]any
		}
		_ = json.Unmarshal(b, &out)
		n := max(out.ScannedCount, len(out.Items))
		if out.Item != nil {
			n = 1
		}
		for _, items := range out.Responses {
			n += len(items)
		}
		op := strings.TrimPrefix(resp.Request.Header.Get("X-Amz-Target"), "DynamoDB_20120810.")
		r.mu.Lock()
		r.requests[op]++
		r.items += n
		r.mu.Unlock()
		return nil
	}
	ts := httptest.NewServer(rp)
	t.Cleanup(func() { ts.Close(); tr.CloseIdleConnections() })
	r.url = ts.URL
	return r
}

// take returns the counts since the last take.
func (r *itemRelay) take() (requests map[string]int, items int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	requests, items = r.requests, r.items
	r.requests, r.items = map[string]int{}, 0
	return requests, items
}

// status, runs and watch read what they show, by key: the items they
// examine are the same on a job with 20 runs as on one with 300, and no
// request is a Scan.
func TestReadsGrowWithWhatIsAsked(t *testing.T) {
	t.Parallel()
	type reads struct{ status, runs, watch int }
	measure := func(t *testing.T, history_ int) reads {
		table := srv.NewTable(t)
		start := time.Now().UTC().Truncate(time.Minute).Add(-time.Duration(history_) * time.Minute)
		history(t, table, "billing", start, history_)
		history(t, table, "report", start, 3)
		r := newItemRelay(t)
		env := baseEnv()
		var got reads
		ok(t, cli(t, env, "--endpoint", r.url, "--table", table, "status"))
		reqs, items := r.take()
		assert.Zero(t, reqs["Scan"])
		got.status = items
		// The history ends the minute before start's; writing it may take
		// a minute boundary or two on a loaded machine: the last 15
		// minutes hold at least 12 of its slots.
		out := ok(t, cli(t, env, "--endpoint", r.url, "--table", table, "runs", "billing", "--since", "15m"))
		shown := strings.Count(out, "\n") - 1 // the header
		assert.GreaterOrEqual(t, shown, 12, "the last 15 minutes' runs:\n%s", out)
		reqs, items = r.take()
		assert.Zero(t, reqs["Scan"])
		got.runs = items - shown

		w := exec.Command(bin, "--endpoint", r.url, "--table", table, "watch", "billing", "--interval", "100ms")
		w.Env = env
		require.NoError(t, w.Start())
		waitFor(t, "watch looks ten times", func() bool {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.requests["GetItem"] >= 11
		})
		require.NoError(t, w.Process.Kill())
		_ = w.Wait()
		reqs, items = r.take()
		assert.Zero(t, reqs["Scan"])
		// Per look: the lease item, and the runs from the latest seen on.
		got.watch = items / reqs["GetItem"]
		assert.LessOrEqual(t, got.watch, 3, "items per look")
		return got
	}
	short, long := measure(t, 20), measure(t, 300)
	t.Logf("items examined, 20 runs: %+v; 300 runs: %+v", short, long)
	assert.Equal(t, short.status, long.status, "status reads the jobs, not their runs")
	assert.LessOrEqual(t, long.status, 2*4, "status: per job its directory entry, lease item, latest run and last failure")
	assert.LessOrEqual(t, long.runs, 2, "runs --since reads the runs it shows, and the lease item (and one at the edge)")
	assert.LessOrEqual(t, long.watch, short.watch+1)
}

// failingHistory writes n runs of job, a minute apart from start, all
// succeeded but the one at index failAt, under a lease it then resigns.
func failingHistory(t *testing.T, table, job string, start time.Time, n, failAt int) {
	t.Helper()
	ctx := context.Background()
	l, err := ddblease.New(srv.Client(nil), table, job, func(o *ddblease.Options) { o.Owner = "history"; o.Logger = quiet })
	require.NoError(t, err)
	_, err = l.Acquire(ctx)
	require.NoError(t, err)
	for i := range n {
		run, err := l.Claim(ctx, start.Add(time.Duration(i)*time.Minute))
		require.NoError(t, err)
		var runErr error
		if i == failAt {
			runErr = fmt.Errorf("run %d failed: disk full", i)
		}
		require.NoError(t, run.Finish(ctx, runErr))
	}
	require.NoError(t, l.Resign(ctx))
}

// status reads at most 4 items per job (its directory entry, its lease
// item, its latest run, its last failure by key), whatever the job's
// history: a job of 30 runs whose failure is older than its 20 latest
// costs what a job of 3 does, and status still shows that failure.
func TestStatusReadsFourItemsPerJob(t *testing.T) {
	t.Parallel()
	table := srv.NewTable(t)
	start := time.Now().UTC().Truncate(time.Minute).Add(-40 * time.Minute)
	failingHistory(t, table, "billing", start, 30, 5) // 24 successes after the failure
	failingHistory(t, table, "report", start, 3, -1)  // no failure
	failingHistory(t, table, "sweeper", start, 0, -1) // no run
	r := newItemRelay(t)
	env := baseEnv()

	for _, c := range []struct {
		name string
		args []string
	}{
		{"every job", nil},
		{"named jobs", []string{"billing", "report", "sweeper"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r.take()
			out := ok(t, cli(t, env, append([]string{"--endpoint", r.url, "--table", table, "status"}, c.args...)...))
			reqs, items := r.take()
			t.Logf("status of 3 jobs: %d items, requests %v", items, reqs)
			assert.Zero(t, reqs["Scan"])
			assert.LessOrEqual(t, items, 3*4, "at most 4 items per job")
			assert.LessOrEqual(t, reqs["Query"], 1+3, "the directory, and one Query of the latest run per job")
			row := lineWith(t, out, "billing")
			assert.Contains(t, row, "succeeded "+start.Add(29*time.Minute).Format(time.RFC3339))
			assert.Contains(t, row, "failed "+start.Add(5*time.Minute).Format(time.RFC3339)+": run 5 failed: disk full")
			assert.Regexp(t, `report .*succeeded \S+\s+-\s`, lineWith(t, out, "report"), "no failure")
		})
	}

	r.take()
	v := lastRunsJSON(t, env, table, "billing")
	_, items := r.take()
	assert.LessOrEqual(t, items, 3, "one named job: its lease item, latest run and last failure")
	require.NotNil(t, v[0].LastFailure)
	assert.Equal(t, start.Add(5*time.Minute), v[0].LastFailure.Slot, "the failure 24 runs back")
	assert.Equal(t, "run 5 failed: disk full", v[0].LastFailure.Error)
	require.NotNil(t, v[0].LastRun)
	assert.Equal(t, start.Add(29*time.Minute), v[0].LastRun.Slot)
}
