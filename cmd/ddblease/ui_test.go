package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/ddbleasetest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// uiProc is a running `ddblease ui`.
type uiProc struct {
	url    string // http://127.0.0.1:PORT/
	stderr *lockedBuffer
	client *http.Client
	stop   func() error // interrupts it and waits for its end
}

// startUI runs `ddblease ui` on a free loopback port against endpoint,
// with args after the command, and stops it (SIGINT, exit status 0) when
// the test ends.
func startUI(t *testing.T, env []string, endpoint, table string, args ...string) *uiProc {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"--endpoint", endpoint, "--table", table, "ui", "--addr", "127.0.0.1:0"}, args...)...)
	cmd.Env = env
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	p := &uiProc{stderr: &lockedBuffer{}, client: &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}}
	cmd.Stderr = p.stderr
	require.NoError(t, cmd.Start())
	lines := bufio.NewScanner(out)
	require.True(t, lines.Scan(), "ddblease ui printed nothing; stderr: %s", p.stderr.String())
	m := regexp.MustCompile(`at http://\S*:(\d+)/`).FindStringSubmatch(lines.Text())
	require.NotNil(t, m, "first line: %q", lines.Text())
	p.url = "http://127.0.0.1:" + m[1] + "/"
	go func() { _, _ = io.Copy(io.Discard, out) }()
	p.stop = sync.OnceValue(func() error { _ = cmd.Process.Signal(syscall.SIGINT); return cmd.Wait() })
	t.Cleanup(func() {
		p.client.CloseIdleConnections()
		assert.NoError(t, p.stop(), "ddblease ui exits 0 on an interrupt; stderr: %s", p.stderr.String())
	})
	return p
}

// do sends a request to the page's server and returns the status and the
// body.
func (p *uiProc) do(t *testing.T, method, path string, hdr map[string]string, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, p.url+strings.TrimPrefix(path, "/"), strings.NewReader(body))
	require.NoError(t, err)
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := p.client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// state reads /api/state as the page does.
func (p *uiProc) state(t *testing.T, query string) uiState {
	t.Helper()
	code, body := p.do(t, "GET", "/api/state?"+query, nil, "")
	require.Equal(t, http.StatusOK, code, body)
	var st uiState
	require.NoError(t, json.Unmarshal([]byte(body), &st), body)
	return st
}

// relay is a counting proxy in front of the test server: the requests the
// page's server makes, by DynamoDB operation.
func relay(t *testing.T) (string, *ddbleasetest.Faults) {
	t.Helper()
	target, err := url.Parse(srv.URL)
	require.NoError(t, err)
	tr := &http.Transport{}
	f := ddbleasetest.NewFaults()
	f.Base = tr
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = f
	ts := httptest.NewServer(rp)
	t.Cleanup(func() { ts.Close(); tr.CloseIdleConnections() })
	return ts.URL, f
}

func total(counts map[string]int) int {
	n := 0
	for _, c := range counts {
		n += c
	}
	return n
}

// history records n finished runs of job, one a minute from start, every
// fifth one failed, under a lease taken and resigned for it.
func history(t *testing.T, table, job string, start time.Time, n int) {
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
		if i%5 == 4 {
			runErr = fmt.Errorf("run %d failed", i)
		}
		require.NoError(t, run.Finish(ctx, runErr))
	}
	require.NoError(t, l.Resign(ctx))
}

func newAdmin(t *testing.T, table string) *ddblease.Admin {
	t.Helper()
	a, err := ddblease.NewAdmin(srv.Client(nil), table)
	require.NoError(t, err)
	return a
}

// The page's server makes the same requests per refresh whatever the
// history: a few to list the jobs and the pools, and one per job for its
// runs.
func TestUIReadsPerRefresh(t *testing.T) {
	t.Parallel()
	table := srv.NewTable(t)
	now := time.Now().UTC().Truncate(time.Minute)
	history(t, table, "billing", now.Add(-20*time.Minute), 10)
	history(t, table, "report", now.Add(-20*time.Minute), 3)
	endpoint, f := relay(t)
	p := startUI(t, baseEnv(), endpoint, table)

	perRefresh := func() (int, uiState) {
		before := total(f.Counts())
		st := p.state(t, "range=24h")
		return total(f.Counts()) - before, st
	}
	perRefresh() // a first call may check the table once
	small, st := perRefresh()
	require.Len(t, st.Jobs, 2)
	assert.Len(t, st.Jobs[0].Runs, 10)
	assert.LessOrEqual(t, small, 3+len(st.Jobs), "the listings, and one read per job: %v", f.Counts())

	history(t, table, "billing", now.Add(-23*time.Hour), 100)
	large, st := perRefresh()
	assert.Len(t, st.Jobs[0].Runs, 110, "errors: %q, %q", st.Errors, st.Jobs[0].Error)
	assert.Equal(t, small, large, "reads per refresh with 10 and with 110 runs: %v", f.Counts())

	history(t, table, "nightly", now.Add(-time.Hour), 1)
	more, st := perRefresh()
	require.Len(t, st.Jobs, 3)
	assert.Equal(t, small+1, more, "one more job, one more read")
	_, st = perRefresh()
	assert.Len(t, st.Jobs[0].Runs, 110, "errors: %q, %q", st.Errors, st.Jobs[0].Error)
}

// Read-only by default: the page offers no action and the server refuses
// one, however it is asked.
func TestUIReadOnlyByDefault(t *testing.T) {
	t.Parallel()
	table := srv.NewTable(t)
	history(t, table, "billing", time.Now().Add(-time.Hour), 1)
	env := append(baseEnv(), uiTokenEnv+"=secret-token")
	p := startUI(t, env, srv.URL, table)

	code, page := p.do(t, "GET", "/", nil, "")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, page, `<script src="app.js"`)
	assert.False(t, p.state(t, "").Actions)
	for _, hdr := range []map[string]string{
		{"Content-Type": "application/json"},
		{"Content-Type": "application/json", uiTokenHeader: "secret-token"},
	} {
		code, body := p.do(t, "POST", "/api/action", hdr, `{"job":"billing","action":"pause","asker":"mallory"}`)
		assert.Equal(t, http.StatusForbidden, code)
		assert.Contains(t, body, "actions are off")
	}
	st, err := newAdmin(t, table).Job(context.Background(), "billing")
	require.NoError(t, err)
	assert.False(t, st.Lease.Control.Paused)
}

// With --allow-actions, an action needs the token and a request from the
// page's own origin; the server answers only to loopback names.
func TestUIActionsNeedTokenAndSameOrigin(t *testing.T) {
	t.Parallel()
	table := srv.NewTable(t)
	history(t, table, "billing", time.Now().Add(-time.Hour), 1)
	env := append(baseEnv(), uiTokenEnv+"=secret-token")
	p := startUI(t, env, srv.URL, table, "--allow-actions")
	admin := newAdmin(t, table)
	paused := func() bool {
		st, err := admin.Job(context.Background(), "billing")
		require.NoError(t, err)
		return st.Lease.Control.Paused
	}
	host := strings.TrimSuffix(strings.TrimPrefix(p.url, "http://"), "/")
	pause := `{"job":"billing","action":"pause","asker":"mallory"}`
	for _, c := range []struct {
		name string
		hdr  map[string]string
		code int
		want string
	}{
		{"no token", map[string]string{"Content-Type": "application/json"}, 403, "missing or wrong token"},
		{"wrong token", map[string]string{uiTokenHeader: "guess"}, 403, "missing or wrong token"},
		{"cross-site, by Sec-Fetch-Site", map[string]string{uiTokenHeader: "secret-token",
			"Sec-Fetch-Site": "cross-site", "Origin": "http://evil.example"}, 403, "cross-site request refused"},
		{"cross-site, by Origin", map[string]string{uiTokenHeader: "secret-token", "Origin": "http://evil.example"}, 403, "cross-site request refused"},
		{"same site, other port", map[string]string{uiTokenHeader: "secret-token",
			"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:1"}, 403, "cross-site request refused"},
		{"another name for 127.0.0.1", map[string]string{uiTokenHeader: "secret-token", "Host": "evil.example:" +
			strings.Split(host, ":")[1]}, 421, `Host \"evil.example:` + strings.Split(host, ":")[1] + `\" refused`},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, body := p.do(t, "POST", "/api/action", c.hdr, pause)
			assert.Equal(t, c.code, code, body)
			assert.Contains(t, body, c.want)
			assert.False(t, paused(), "nothing was done")
		})
	}
	code, _ := p.do(t, "GET", "/api/state", map[string]string{"Host": "evil.example"}, "")
	assert.Equal(t, http.StatusMisdirectedRequest, code, "a rebound name cannot read either")

	ok := map[string]string{uiTokenHeader: "secret-token", "Sec-Fetch-Site": "same-origin", "Origin": "http://" + host}
	code, body := p.do(t, "POST", "/api/action", ok, `{"job":"billing","action":"pause"}`)
	assert.Equal(t, http.StatusBadRequest, code, "who asks is required: %s", body)
	code, body = p.do(t, "POST", "/api/action", ok, `{"job":"billing","action":"force-release","asker":"alice"}`)
	assert.Equal(t, http.StatusBadRequest, code, "force-release is not offered: %s", body)
	code, body = p.do(t, "POST", "/api/action", ok, `{"job":"billing","action":"pause","asker":"alice"}`)
	assert.Equal(t, http.StatusOK, code, body)
	assert.True(t, paused())
	st, err := admin.Job(context.Background(), "billing")
	require.NoError(t, err)
	assert.Equal(t, "alice via ddblease ui", st.Lease.Control.PausedBy)
	waitFor(t, "the action logged with who asked", func() bool {
		return strings.Contains(p.stderr.String(), "action=pause job=billing asker=alice")
	})
}

// /metrics serves the table's state in the Prometheus text format.
func TestUIMetrics(t *testing.T) {
	t.Parallel()
	table := srv.NewTable(t)
	ctx := context.Background()
	start := time.Now().UTC().Truncate(time.Minute).Add(-10 * time.Minute)
	history(t, table, "report", start, 5) // the fifth run fails
	a := startReplica(t, table, "billing", "replica-a", func(context.Context, *ddblease.JobRun) error { return nil })
	waitFor(t, "a leads", a.l.IsLeader)
	p := startUI(t, baseEnv(), srv.URL, table, "--metrics-window", "1h")

	scrape := func() map[string]map[string]float64 {
		code, body := p.do(t, "GET", "/metrics", nil, "")
		require.Equal(t, http.StatusOK, code, body)
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
		require.NoError(t, err, body)
		out := map[string]map[string]float64{}
		for name, fam := range fams {
			out[name] = map[string]float64{}
			for _, m := range fam.GetMetric() {
				var labels []string
				for _, l := range m.GetLabel() {
					labels = append(labels, l.GetName()+"="+l.GetValue())
				}
				out[name][strings.Join(labels, ",")] = m.GetGauge().GetValue()
			}
		}
		return out
	}
	m := scrape()
	assert.Equal(t, 1.0, m["ddblease_table_read_ok"][""])
	assert.Equal(t, 1.0, m["ddblease_job_has_leader"]["ddblease_job=billing"])
	assert.Equal(t, 0.0, m["ddblease_job_has_leader"]["ddblease_job=report"], "resigned")
	assert.Equal(t, float64(a.l.State().Fence), m["ddblease_job_fence"]["ddblease_job=billing"])
	assert.Less(t, m["ddblease_job_renewal_age_seconds"]["ddblease_job=billing"], 2.0)
	assert.Equal(t, 0.0, m["ddblease_job_paused"]["ddblease_job=billing"])
	assert.Equal(t, 1.0, m["ddblease_job_last_run_status"]["ddblease_job=report,ddblease_run_status=failed"])
	assert.Equal(t, 0.0, m["ddblease_job_last_run_status"]["ddblease_job=report,ddblease_run_status=succeeded"])
	assert.Equal(t, 4.0, m["ddblease_job_runs"]["ddblease_job=report,ddblease_run_status=succeeded"])
	assert.Equal(t, 1.0, m["ddblease_job_runs"]["ddblease_job=report,ddblease_run_status=failed"])
	assert.Equal(t, 0.0, m["ddblease_job_runs"]["ddblease_job=report,ddblease_run_status=abandoned"])
	assert.Equal(t, 60.0, m["ddblease_job_period_seconds"]["ddblease_job=report"])
	runs, err := newAdmin(t, table).Runs(ctx, "report", ddblease.RunRange{})
	require.NoError(t, err)
	assert.InDelta(t, float64(runs[4].FinishedAt.UnixMilli())/1000, m["ddblease_job_last_run_end_timestamp_seconds"]["ddblease_job=report"], 0.001)
	assert.NotContains(t, m["ddblease_job_last_run_status"], "ddblease_job=billing,ddblease_run_status=failed", "no run ended in the window")

	_, err = newAdmin(t, table).Pause(ctx, "billing")
	require.NoError(t, err)
	require.NoError(t, a.stop())
	m = scrape()
	assert.Equal(t, 1.0, m["ddblease_job_paused"]["ddblease_job=billing"])
	assert.Equal(t, 0.0, m["ddblease_job_has_leader"]["ddblease_job=billing"], "the leader resigned as it stopped")
}

// A pool's balance: each live member should hold its share.
func TestUIPoolBalance(t *testing.T) {
	t.Parallel()
	now := time.Now()
	live, dead := now.Add(time.Minute), now.Add(-time.Minute)
	for _, c := range []struct {
		name      string
		pool      uiPool
		low, high int
		off       int
	}{
		{"balanced", uiPool{Members: []uiMember{{"a", live, []string{"j1", "j2"}, nil}, {"b", live, []string{"j3"}, nil}}}, 1, 2, 0},
		{"one holds all", uiPool{Members: []uiMember{{"a", live, []string{"j1", "j2", "j3", "j4"}, nil}, {"b", live, nil, nil}}}, 2, 2, 2},
		{"a dead member's jobs move", uiPool{Members: []uiMember{{"a", live, []string{"j1"}, nil}, {"b", dead, []string{"j2", "j3"}, nil}}}, 3, 3, 2},
		{"unheld jobs count in the share", uiPool{Members: []uiMember{{"a", live, []string{"j1"}, nil}, {"b", live, nil, nil}},
			Unheld: []string{"j2", "j3", "j4"}}, 2, 2, 3},
		{"no live member", uiPool{Members: []uiMember{{"b", dead, []string{"j1"}, nil}}}, 0, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			v := poolView(c.pool, now, time.Second)
			assert.Equal(t, c.low, v.Low, "low")
			assert.Equal(t, c.high, v.High, "high")
			assert.Equal(t, c.off, v.OffBy, "off by")
		})
	}
}

// Bad flags and queries are refused with a clear message.
func TestUIBadInput(t *testing.T) {
	t.Parallel()
	table := srv.NewTable(t)
	fails(t, cli(t, baseEnv(), "--table", table, "ui", "--refresh", "0s"), 2, "--refresh 0s must be positive")
	fails(t, cli(t, baseEnv(), "--table", table, "ui", "--max-runs", "0"), 2, "--max-runs 0 must be positive")
	fails(t, cli(t, baseEnv(), "--table", table, "ui", "extra"), 2, "ui: takes no arguments")
	fails(t, cli(t, baseEnv(), "--table", table, "ui", "--addr", "127.0.0.1:99999"), 1, "ui: listen tcp")
	p := startUI(t, baseEnv(), srv.URL, table)
	code, body := p.do(t, "GET", "/api/state?range=-1h", nil, "")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, `range \"-1h\" must be a duration`)
	code, body = p.do(t, "GET", "/api/state?to=yesterday", nil, "")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "RFC 3339")
}

// Pools in /metrics: live members, and the jobs each member holds.
func TestUIMetricsPools(t *testing.T) {
	t.Parallel()
	now := time.Now()
	pool := uiPool{Name: "tenants", Members: []uiMember{
		{"a", now.Add(time.Minute), []string{"t1", "t2", "t3"}, nil}, {"b", now.Add(time.Minute), nil, nil}, {"c", now.Add(-time.Minute), nil, nil}}}
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(uiCollector{uiState{Now: now, Pools: []uiPoolView{poolView(pool, now, time.Second)}}}))
	fams, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			key := f.GetName()
			for _, l := range m.GetLabel() {
				key += "," + l.GetName() + "=" + l.GetValue()
			}
			got[key] = m.GetGauge().GetValue()
		}
	}
	assert.Equal(t, map[string]float64{
		"ddblease_pool_members,ddblease_pool=tenants":                      2,
		"ddblease_pool_member_jobs,ddblease_owner=a,ddblease_pool=tenants": 3,
		"ddblease_pool_member_jobs,ddblease_owner=b,ddblease_pool=tenants": 0,
		"ddblease_pool_member_jobs,ddblease_owner=c,ddblease_pool=tenants": 0,
		"ddblease_pool_jobs_off_balance,ddblease_pool=tenants":             1,
		"ddblease_table_read_ok":                                           1,
	}, got)
}

// docs/observability.md lists the metrics /metrics serves, and its alert
// rules use only those.
func TestUIMetricsInDocs(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../docs/observability.md")
	require.NoError(t, err)
	doc := string(b)
	i := strings.Index(doc, "### `/metrics`")
	require.GreaterOrEqual(t, i, 0, "the /metrics section")
	doc = doc[i:]
	doc = doc[:strings.Index(doc, "\n## ")]
	ch := make(chan *prometheus.Desc, 32)
	uiCollector{}.Describe(ch)
	close(ch)
	var served []string
	for d := range ch {
		served = append(served, regexp.MustCompile(`fqName: "([a-z_]+)"`).FindStringSubmatch(d.String())[1])
	}
	var listed []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_]+)").FindAllStringSubmatch(doc, -1) {
		listed = append(listed, m[1])
	}
	assert.ElementsMatch(t, served, listed, "the table of metrics")
	rules := doc[strings.Index(doc, "```yaml"):]
	rules = rules[:strings.Index(rules[3:], "```")]
	for _, name := range regexp.MustCompile(`ddblease_[a-z_]+`).FindAllString(rules, -1) {
		if !strings.HasPrefix(name, "ddblease_job_") && !strings.HasPrefix(name, "ddblease_table_") {
			continue // a label or a group's name
		}
		assert.Contains(t, served, name, "a metric the alert rules use")
	}
}

// A real pool of four jobs over two replicas: /api/state lists its
// members and the jobs each holds, balanced, and /metrics says so.
func TestUIPoolOfTwoReplicas(t *testing.T) {
	t.Parallel()
	table := srv.NewTable(t)
	jobs := []string{"tenant-1", "tenant-2", "tenant-3", "tenant-4"}
	var pools []*ddblease.Pool
	for _, owner := range []string{"replica-a", "replica-b"} {
		pools = append(pools, startPool(t, table, "tenants", jobs, owner))
	}
	waitFor(t, "each replica leads two jobs", func() bool {
		n := map[int]int{}
		for i, p := range pools {
			for _, j := range jobs {
				if p.Lease(j).IsLeader() {
					n[i]++
				}
			}
		}
		return n[0] == 2 && n[1] == 2
	})
	ui := startUI(t, baseEnv(), srv.URL, table)
	st := ui.state(t, "")
	require.Len(t, st.Pools, 1)
	pv := st.Pools[0]
	assert.Equal(t, "tenants", pv.Name)
	assert.Equal(t, 4, pv.Jobs)
	assert.Zero(t, pv.OffBy, "balanced")
	assert.Empty(t, pv.Unheld)
	require.Len(t, pv.Members, 2)
	held := map[string][]string{}
	for _, m := range pv.Members {
		held[m.Owner] = m.Jobs
	}
	for i, owner := range []string{"replica-a", "replica-b"} {
		var want []string
		for _, j := range jobs {
			if pools[i].Lease(j).IsLeader() {
				want = append(want, j)
			}
		}
		assert.ElementsMatch(t, want, held[owner], owner)
	}
	code, body := ui.do(t, "GET", "/metrics", nil, "")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, body, `ddblease_pool_members{ddblease_pool="tenants"} 2`)
	assert.Contains(t, body, `ddblease_pool_member_jobs{ddblease_owner="replica-a",ddblease_pool="tenants"} 2`)
	assert.Contains(t, body, `ddblease_pool_jobs_off_balance{ddblease_pool="tenants"} 0`)
}

// startPool runs a pool of jobs in table as owner until the test ends;
// its function holds each job until it is stopped.
func startPool(t *testing.T, table, name string, jobs []string, owner string) *ddblease.Pool {
	t.Helper()
	p, err := ddblease.NewPool(srv.Client(nil), table, name, jobs, fast(owner))
	require.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- p.Run(ctx, func(ctx context.Context, _ string, _ int64) error { <-ctx.Done(); return nil })
	}()
	t.Cleanup(func() { stop(); assert.NoError(t, <-done) })
	return p
}

// startReplicaIn runs RunSchedule for job under layout until the test
// ends.
func startReplicaIn(t *testing.T, table string, layout ddblease.Layout, job, owner string) *replica {
	t.Helper()
	l, err := ddblease.New(srv.Client(nil), table, job, fast(owner), func(o *ddblease.Options) { o.Layout = layout })
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- l.RunSchedule(ctx, farSchedule, func(context.Context, *ddblease.JobRun) error { return nil })
	}()
	r := &replica{l: l, stop: sync.OnceValue(func() error { cancel(); return <-done })}
	t.Cleanup(func() { assert.NoError(t, r.stop()) })
	return r
}

func adminIn(t *testing.T, table string, layout ddblease.Layout) *ddblease.Admin {
	t.Helper()
	a, err := ddblease.NewAdmin(srv.Client(nil), table, func(o *ddblease.AdminOptions) { o.Layout = layout })
	require.NoError(t, err)
	return a
}

// act posts one of the page's actions as the page does, as alice.
func (p *uiProc) act(t *testing.T, token, action, job string, fence int64) (int, string) {
	t.Helper()
	host := strings.TrimSuffix(strings.TrimPrefix(p.url, "http://"), "/")
	return p.do(t, "POST", "/api/action", map[string]string{uiTokenHeader: token, "Origin": "http://" + host},
		fmt.Sprintf(`{"job":%q,"action":%q,"fence":%d,"asker":"alice"}`, job, action, fence))
}

// The actions act on the job the page shows: with --key-prefix, team B's
// nightly, never the default layout's nightly in the same table, also
// when both tenures have the same fence.
func TestUILayoutActionsKeyPrefix(t *testing.T) {
	t.Parallel()
	table := srv.NewTable(t)
	teamB := ddblease.Layout{Prefix: "teamb#"}
	a := startReplicaIn(t, table, ddblease.Layout{}, "nightly", "team-a")
	b := startReplicaIn(t, table, teamB, "nightly", "team-b")
	waitFor(t, "both lead", func() bool { return a.l.IsLeader() && b.l.IsLeader() })
	fenceA, fenceB := a.l.State().Fence, b.l.State().Fence
	require.Equal(t, fenceA, fenceB, "the same fence: a resignation by fence alone cannot tell them apart")
	adminA, adminB := adminIn(t, table, ddblease.Layout{}), adminIn(t, table, teamB)
	job := func(a *ddblease.Admin) ddblease.JobStatus {
		st, err := a.Job(context.Background(), "nightly")
		require.NoError(t, err)
		return st
	}

	env := append(baseEnv(), uiTokenEnv+"=layout-token")
	p := startUI(t, env, srv.URL, table, "--key-prefix", "teamb#", "--allow-actions")
	st := p.state(t, "")
	require.Len(t, st.Jobs, 1)
	assert.Equal(t, "team-b", st.Jobs[0].Holder, "the page shows team B's nightly")

	code, body := p.act(t, "layout-token", "pause", "nightly", 0)
	require.Equal(t, http.StatusOK, code, body)
	assert.True(t, job(adminB).Lease.Control.Paused, "team B's nightly paused")
	assert.False(t, job(adminA).Lease.Control.Paused, "team A's nightly untouched")
	assert.Equal(t, "alice via ddblease ui", job(adminB).Lease.Control.PausedBy)

	code, body = p.act(t, "layout-token", "resume", "nightly", 0)
	require.Equal(t, http.StatusOK, code, body)
	assert.False(t, job(adminB).Lease.Control.Paused)
	assert.Empty(t, job(adminA).Lease.Control.ResumedBy, "team A's nightly untouched")

	code, body = p.act(t, "layout-token", "trigger", "nightly", 0)
	require.Equal(t, http.StatusOK, code, body)
	waitFor(t, "team B's triggered run", func() bool {
		runs, err := adminB.Runs(context.Background(), "nightly", ddblease.RunRange{})
		require.NoError(t, err)
		return len(runs) == 1 && runs[0].Status == ddblease.RunSucceeded
	})
	runs, err := adminA.Runs(context.Background(), "nightly", ddblease.RunRange{})
	require.NoError(t, err)
	assert.Empty(t, runs, "team A's nightly did not run")
	assert.Zero(t, job(adminA).Lease.Control.Triggers)

	code, body = p.act(t, "layout-token", "resign", "nightly", fenceB)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `asked \"team-b\"`)
	waitFor(t, "team B's holder resigned and took the lease back", func() bool { return b.l.State().Fence > fenceB })
	assert.True(t, a.l.IsLeader(), "team A's holder still leads")
	assert.Equal(t, fenceA, a.l.State().Fence, "team A's tenure is the same")
	assert.Empty(t, job(adminA).Lease.Control.ResignBy, "no resignation asked of team A")
}

// The actions work on a table whose keys are not pk and sk.
func TestUILayoutActionsCustomKeys(t *testing.T) {
	t.Parallel()
	layout := ddblease.Layout{PartitionKey: "id", SortKey: "rk"}
	table := srv.NewTable(t, func(l *ddblease.Layout) { *l = layout })
	r := startReplicaIn(t, table, layout, "nightly", "replica-a")
	waitFor(t, "a leads", r.l.IsLeader)
	admin := adminIn(t, table, layout)
	env := append(baseEnv(), uiTokenEnv+"=keys-token")
	p := startUI(t, env, srv.URL, table, "--partition-key", "id", "--sort-key", "rk", "--allow-actions")
	require.Len(t, p.state(t, "").Jobs, 1)
	for _, action := range []string{"pause", "resume", "trigger", "resign"} {
		code, body := p.act(t, "keys-token", action, "nightly", r.l.State().Fence)
		assert.Equal(t, http.StatusOK, code, "%s: %s", action, body)
	}
	st, err := admin.Job(context.Background(), "nightly")
	require.NoError(t, err)
	assert.Equal(t, "alice via ddblease ui", st.Lease.Control.ResumedBy)
}

// The first response holds the state: a plain GET of / names every job
// and holder, escaped, and every pool, without script.
func TestUIFirstPaint(t *testing.T) {
	t.Parallel()
	table := srv.NewTable(t)
	history(t, table, "billing", time.Now().Add(-30*time.Minute), 3)
	const odd = `<img src=x onerror=alert(1)>&"`
	a := startReplica(t, table, odd, "replica-<a>", func(context.Context, *ddblease.JobRun) error { return nil })
	b := startReplica(t, table, "nightly-report", "replica-b", func(context.Context, *ddblease.JobRun) error { return nil })
	pool := startPool(t, table, "tenants", []string{"tenant-1"}, "replica-c")
	waitFor(t, "all lead", func() bool { return a.l.IsLeader() && b.l.IsLeader() && pool.Lease("tenant-1").IsLeader() })
	p := startUI(t, baseEnv(), srv.URL, table)

	code, page := p.do(t, "GET", "/", nil, "")
	require.Equal(t, http.StatusOK, code)
	rows := regexp.MustCompile(`(?s)<tr data-job="([^"]*)"><th class="job">([^<]*)</th>\s*<td class="owner">([^<]*)</td>`).
		FindAllStringSubmatch(page, -1)
	got := map[string]string{}
	for _, r := range rows {
		assert.Equal(t, r[1], r[2])
		got[r[2]] = r[3]
	}
	esc := "&lt;img src=x onerror=alert(1)&gt;&amp;&#34;"
	assert.Equal(t, map[string]string{"billing": "—", "nightly-report": "replica-b", esc: "replica-&lt;a&gt;",
		"tenant-1": "replica-c"}, got, "every job and its holder, in the HTML")
	assert.NotContains(t, page, odd, "escaped")
	assert.NotContains(t, page, "replica-<a>", "escaped")
	assert.Contains(t, page, `<div class="pool" data-pool="tenants">`)
	assert.Regexp(t, `<td class="last"><span class="badge s-succeeded">succeeded</span> \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC</td>`, page)
	assert.Contains(t, page, `<span id="span">from `)

	// The state the script starts from is in the page too, as JSON.
	m := regexp.MustCompile(`(?s)<script type="application/json" id="initial-state">(.*?)</script>`).FindStringSubmatch(page)
	require.NotNil(t, m, "the state for the script")
	var st uiState
	require.NoError(t, json.Unmarshal([]byte(m[1]), &st))
	assert.Len(t, st.Jobs, 4)
	assert.NotContains(t, m[1], "<img", "no markup in the JSON")
}

// The range comes from the address, an hour by default; a wrong one is a
// clear 400, on the page and in the API.
func TestUIRangeInAddress(t *testing.T) {
	t.Parallel()
	table := srv.NewTable(t)
	history(t, table, "billing", time.Now().Add(-50*time.Minute), 1)
	p := startUI(t, baseEnv(), srv.URL, table)
	span := func(st uiState) time.Duration { return st.To.Sub(st.From) }
	assert.Equal(t, time.Hour, span(p.state(t, "")), "the default range")
	assert.Equal(t, 15*time.Minute, span(p.state(t, "range=15m")))

	code, page := p.do(t, "GET", "/?range=15m", nil, "")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, page, `<option value="15m" selected>15 minutes</option>`)
	from := regexp.MustCompile(`<span id="span">from ([^<]+) to ([^<]+)</span>`).FindStringSubmatch(page)
	require.NotNil(t, from, page)
	t0, err := time.Parse("2006-01-02 15:04:05 UTC", from[1])
	require.NoError(t, err)
	t1, err := time.Parse("2006-01-02 15:04:05 UTC", from[2])
	require.NoError(t, err)
	assert.Equal(t, 15*time.Minute, t1.Sub(t0).Round(time.Second))
	code, page = p.do(t, "GET", "/", nil, "")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, page, `<option value="" selected>1 hour (default)</option>`)
	code, page = p.do(t, "GET", "/?range=90m&to=2026-01-02T03:04:05Z", nil, "")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, page, `<option value="90m" selected>90m</option>`, "a range not among the choices is kept")
	assert.Contains(t, page, "from 2026-01-02 01:34:05 UTC to 2026-01-02 03:04:05 UTC")

	for _, q := range []string{"range=banana", "range=0s", "range=800h", "to=yesterday"} {
		code, page := p.do(t, "GET", "/?"+q, nil, "")
		assert.Equal(t, http.StatusBadRequest, code, q)
		assert.Regexp(t, `<div id="errors" role="alert"><p>(range|to) &#34;[^&]+&#34; must be `, page, q)
		code, body := p.do(t, "GET", "/api/state?"+q, nil, "")
		assert.Equal(t, http.StatusBadRequest, code, q)
		assert.Contains(t, body, "must be", q)
	}
}
