package main

import (
	"bytes"
	"encoding/json"
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
		out := ok(t, cli(t, env, "--endpoint", r.url, "--table", table, "runs", "billing", "--since", "10m"))
		shown := strings.Count(out, "\n") - 1 // the header
		assert.GreaterOrEqual(t, shown, 9, "the last 10 minutes' runs:\n%s", out)
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
	assert.LessOrEqual(t, long.status, 2*(2+statusRuns)+1, "status: the directory, and the lease item and latest runs of 2 jobs")
	assert.LessOrEqual(t, long.runs, 2, "runs --since reads the runs it shows, and the lease item (and one at the edge)")
	assert.LessOrEqual(t, long.watch, short.watch+1)
}
