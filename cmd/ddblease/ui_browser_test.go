package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/ddbleasetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// chromium returns the browser to drive: $DDBLEASE_CHROMIUM, or chromium
// on the PATH. Without one the test fails under CI=true and is skipped
// elsewhere.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{os.Getenv("DDBLEASE_CHROMIUM"), "chromium", "chromium-browser"} {
		if name == "" {
			continue
		}
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium not found: the page's test needs it in CI (.ci/run installs Debian's chromium)")
	}
	t.Skip("chromium not found (apt-get install chromium, or set DDBLEASE_CHROMIUM): the page's test needs a browser")
	return ""
}

// browser starts a headless chromium in a fresh profile, in the time zone
// Europe/Berlin, and returns a tab's context and a func that returns the
// errors and uncaught exceptions the tab's console received. The browser
// is closed when the test ends.
func browser(t *testing.T) (context.Context, func() []string) {
	t.Helper()
	var out lockedBuffer
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromium(t)), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true), chromedp.NoFirstRun, chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1000), chromedp.CombinedOutput(&out))
	ctx, cancel := chromedp.NewContext(actx)
	require.NoError(t, chromedp.Do(ctx), "starting chromium: %s", out.String())
	var mu sync.Mutex
	var bad []string
	done := make(chan struct{})
	console := chromedp.Console(ctx)
	go func() {
		defer close(done)
		for m, err := range console {
			if err != nil {
				return
			}
			if m.IsException() || m.Type == chromedp.ConsoleError {
				mu.Lock()
				bad = append(bad, m.String())
				mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { cancel(); cancelAlloc(); <-done })
	_, err := chromedp.Call(ctx, emulation.SetTimezoneOverride, emulation.SetTimezoneOverrideParams{TimezoneID: "Europe/Berlin"})
	require.NoError(t, err)
	return ctx, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(bad)
	}
}

// page drives the page in a tab.
type page struct {
	t   *testing.T
	ctx context.Context
	ui  *uiProc
}

// js evaluates expr in the page.
func js[T any](p page, expr string) T {
	p.t.Helper()
	v, err := chromedp.Run(p.ctx, chromedp.Evaluate[T](expr))
	require.NoError(p.t, err, expr)
	return v
}

// until waits for the JavaScript expression to be true, and fails the test
// with the page's text if it is not within 20 s.
func (p page) until(what, expr string) {
	p.t.Helper()
	_, err := chromedp.Run(p.ctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(20*time.Second),
		chromedp.WithPollingInterval(100*time.Millisecond)))
	if err != nil {
		p.t.Fatalf("the page did not show %s (%v); it shows:\n%s\nddblease ui's stderr:\n%s", what, err,
			js[string](p, "document.body.innerText"), p.ui.stderr.String())
	}
}

func (p page) click(sel string) {
	p.t.Helper()
	require.NoError(p.t, chromedp.Do(p.ctx, chromedp.Click(chromedp.CSS(sel))), sel)
}

// act clicks an action's button on the job's row and confirms it as
// "tester".
func (p page) act(job, action string) {
	p.t.Helper()
	p.click(fmt.Sprintf(`#jobs tr[data-job=%q] button[data-action=%q]`, job, action))
	p.until("the confirmation of "+action, `document.querySelector('#confirm').open`)
	if js[string](p, `document.querySelector('#asker').value`) == "" {
		require.NoError(p.t, chromedp.Do(p.ctx, chromedp.SendKeys(chromedp.CSS("#asker"), "tester")))
	}
	p.click("#confirm-ok")
	p.until("the dialog closed after "+action, `!document.querySelector('#confirm').open`)
}

// cell is the expression of the text of a cell of a job's row.
func cell(job, class string) string {
	return fmt.Sprintf(`(document.querySelector('#jobs tr[data-job=%q] td.%s')?.textContent ?? '')`, job, class)
}

// startScheduled runs RunSchedule for job on sched in the test process
// until stopped.
func startScheduled(t *testing.T, table, job, owner string, sched ddblease.Schedule,
	fn func(context.Context, *ddblease.JobRun) error) *replica {
	t.Helper()
	l, err := ddblease.New(srv.Client(nil), table, job, fast(owner))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.RunSchedule(ctx, sched, fn) }()
	r := &replica{l: l, stop: sync.OnceValue(func() error { cancel(); return <-done })}
	t.Cleanup(func() { assert.NoError(t, r.stop()) })
	return r
}

// The page in a real browser: two replicas run a job every second, one
// slot fails, an operator pauses, resumes, triggers and asks for a
// resignation through the page, and the leader is stopped. The page
// follows it all without a reload.
func TestUIBrowser(t *testing.T) {
	if !srv.InProcess() {
		t.Skip("the page's browser test runs once, on the in-process server: the page reads through Admin, whose calls the library's suites check on every server")
	}
	ctx, consoleErrors := browser(t)
	table := srv.NewTable(t)
	admin := newAdmin(t, table)
	const failure = "card declined: the payment provider answered 402"
	var scheduled atomic.Int32
	fn := func(ctx context.Context, run *ddblease.JobRun) error {
		if run.Trigger() == "" && scheduled.Add(1) == 3 {
			return errors.New(failure)
		}
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
		}
		return nil
	}
	a := startScheduled(t, table, "billing", "replica-a", ddblease.Every(time.Second), fn)
	waitFor(t, "a leads", a.l.IsLeader)
	b := startScheduled(t, table, "billing", "replica-b", ddblease.Every(time.Second), fn)
	startReplica(t, table, "nightly-report", "replica-a", func(context.Context, *ddblease.JobRun) error { return nil })
	pool := startPool(t, table, "tenants", []string{"tenant-1", "tenant-2"}, "replica-a")
	waitFor(t, "the pool leads its jobs", func() bool { return pool.Lease("tenant-1").IsLeader() && pool.Lease("tenant-2").IsLeader() })
	fenceA := a.l.State().Fence

	endpoint, reads := relay(t)
	env := append(baseEnv(), uiTokenEnv+"=browser-token")
	ui := startUI(t, env, endpoint, table, "--allow-actions", "--refresh", "300ms", "--range", "30s")
	p := page{t: t, ctx: ctx, ui: ui}
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(ui.url+"#token=browser-token")))
	origin := js[float64](p, "performance.timeOrigin") // changes if the page is loaded again

	// The job, its leader and fence; times in UTC and in the viewer's zone.
	p.until("replica-a leading billing with its fence", cell("billing", "owner")+` === 'replica-a' && `+
		cell("billing", "fence")+` === '`+strconv.FormatInt(fenceA, 10)+`'`)
	assert.Contains(t, js[string](p, `document.querySelector('#zone').textContent`), "Europe/Berlin")
	assert.Regexp(t, `UTC.*\d\d:\d\d:\d\d GMT\+[12]`, js[string](p, cell("billing", "since")))
	assert.Equal(t, "", js[string](p, `location.hash`), "the token leaves the address bar")

	// The failed slot's error, after a click on its mark.
	failed := `svg[data-job="billing"] rect.s-failed`
	p.until("the failed run's mark", `!!document.querySelector('`+failed+`')`)
	p.click(failed)
	p.until("the failed run's error", `document.querySelector('#detail pre.error')?.textContent === '`+failure+`'`)
	assert.Contains(t, js[string](p, `document.querySelector('#detail').textContent`), "replica-a")

	// The pool: its member and the jobs it holds.
	// (the replica takes its jobs one by one: wait for both)
	p.until("the pool with its member and jobs", `document.querySelector('[data-pool="tenants"]')?.textContent.includes('2: tenant-1, tenant-2')`)
	poolText := js[string](p, `document.querySelector('[data-pool="tenants"]').textContent`)
	assert.Contains(t, poolText, "2: tenant-1, tenant-2")
	assert.Contains(t, poolText, "balanced")

	// Pause, resume, trigger, each through the page and recorded as tester's.
	p.act("billing", "pause")
	p.until("the pause", cell("billing", "state")+`.includes('paused')`)
	st, err := admin.Job(context.Background(), "billing")
	require.NoError(t, err)
	assert.True(t, st.Lease.Control.Paused)
	assert.Equal(t, "tester via ddblease ui", st.Lease.Control.PausedBy)
	p.until("a slot skipped by the pause", `!!document.querySelector('svg[data-job="billing"] rect.s-skipped-by-pause')`)
	p.act("billing", "resume")
	p.until("the resumption", `!`+cell("billing", "state")+`.includes('paused')`)
	p.act("billing", "trigger")
	p.until("the triggered run", `!!document.querySelector('svg[data-job="billing"] rect.trig.s-succeeded')`)

	// Resign through the page: replica-b leads with a higher fence.
	p.act("billing", "resign")
	p.until("replica-b leading after the resignation", cell("billing", "owner")+` === 'replica-b' && +`+
		cell("billing", "fence")+` > `+strconv.FormatInt(fenceA, 10))
	fenceB := b.l.State().Fence

	// The leader stops: replica-a leads again, with a higher fence still.
	require.NoError(t, b.stop())
	p.until("replica-a leading after replica-b stopped", cell("billing", "owner")+` === 'replica-a' && +`+
		cell("billing", "fence")+` > `+strconv.FormatInt(fenceB, 10))
	fenceA2 := a.l.State().Fence
	for _, f := range []int64{fenceB, fenceA2} {
		p.until(fmt.Sprintf("the hand-over to fence %d on the timeline", f),
			fmt.Sprintf(`!!document.querySelector('svg[data-job="billing"] line.handover[data-fence="%d"]')`, f))
	}
	assert.Equal(t, failure, js[string](p, `document.querySelector('#detail pre.error').textContent`), "the selected run stays shown")
	assert.Equal(t, origin, js[float64](p, "performance.timeOrigin"), "no reload")

	// Each refresh is one request, /api/state, and nothing is fetched
	// from elsewhere. Its reads (TestUIReadsPerRefresh counts them without
	// a pool): the job listing (a Query of the directory, a BatchGetItem
	// of the items, one of the sessions the pool's jobs are bound to), a
	// Query per job for its runs, and the pool listing (a Query of the
	// directory, and one per pool for its members).
	fetched := `performance.getEntriesByType('resource').filter(e => e.name.includes('/api/state')).length`
	n0, r0 := js[int](p, fetched), total(reads.Counts())
	time.Sleep(2 * time.Second)
	n1, r1 := js[int](p, fetched), total(reads.Counts())
	t.Logf("%d refreshes, %d reads in 2 s", n1-n0, r1-r0)
	const jobs, pools = 4, 1
	const perRefresh = 3 + jobs + 1 + pools
	assert.GreaterOrEqual(t, r1-r0, (n1-n0-1)*perRefresh, "the listings and one read per job and pool, each refresh: %v", reads.Counts())
	assert.LessOrEqual(t, r1-r0, (n1-n0+1)*perRefresh, "the listings and one read per job and pool, each refresh: %v", reads.Counts())
	names := js[[]string](p, `performance.getEntriesByType('resource').map(e => e.name)`)
	for _, u := range names {
		path := strings.TrimPrefix(u, strings.TrimSuffix(ui.url, "/"))
		assert.Regexp(t, `^/(app\.js|style\.css|favicon\.ico|api/state\?.*|api/action)$`, path, "what the page fetched")
	}
	assert.Empty(t, consoleErrors(), "the console")

	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	dir := os.Getenv("DDBLEASE_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	path := filepath.Join(dir, "ddblease-ui.png")
	require.NoError(t, os.WriteFile(path, shot, 0o644))
	t.Logf("screenshot: %s (%d bytes); page: %d bytes", path, len(shot), pageSize(t))
	assert.True(t, strings.HasPrefix(string(shot), "\x89PNG"))
}

// pageSize is the size of the page's files.
func pageSize(t *testing.T) int {
	n := 0
	for _, f := range []string{"ui/index.html", "ui/app.js", "ui/style.css"} {
		b, err := uiFiles.ReadFile(f)
		require.NoError(t, err)
		n += len(b)
	}
	return n
}

// The first paint names every job and holder without script; the script
// then refreshes it. The range and the selected run live in the address,
// kept on reload.
func TestUIBrowserFirstPaintAndAddress(t *testing.T) {
	if !srv.InProcess() {
		t.Skip("the page's browser tests run on the in-process server")
	}
	ctx, consoleErrors := browser(t)
	table := srv.NewTable(t)
	history(t, table, "billing", time.Now().UTC().Truncate(time.Minute).Add(-40*time.Minute), 5)
	a := startReplica(t, table, "nightly-report", "replica-a", func(context.Context, *ddblease.JobRun) error { return nil })
	waitFor(t, "a leads", a.l.IsLeader)
	ui := startUI(t, baseEnv(), srv.URL, table, "--refresh", "300ms")
	p := page{t: t, ctx: ctx, ui: ui}

	// Without script: the HTML alone.
	_, err := chromedp.Call(ctx, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: true})
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(ui.url)))
	assert.Equal(t, "replica-a", js[string](p, cell("nightly-report", "owner")))
	assert.Equal(t, "—", js[string](p, cell("billing", "owner")), "resigned")
	assert.Contains(t, js[string](p, cell("billing", "last")), "failed", "its latest slot's run failed")
	assert.Equal(t, "Times in UTC.", js[string](p, `document.querySelector('#zone').textContent`), "no script ran")

	// With script: it refreshes what the HTML drew, without a reload.
	_, err = chromedp.Call(ctx, emulation.SetScriptExecutionDisabled, emulation.SetScriptExecutionDisabledParams{Value: false})
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(ui.url+"?range=15m")))
	origin := js[float64](p, "performance.timeOrigin")
	p.until("the script ran", `document.querySelector('#zone').textContent.includes('Europe/Berlin')`)
	assert.Equal(t, "15m", js[string](p, `document.querySelector('#range').value`))
	spanMin := `(() => { const m = document.querySelector('#span').textContent.match(/from (.+) UTC to (.+) UTC/);
		return (Date.parse(m[2].replace(' ', 'T') + 'Z') - Date.parse(m[1].replace(' ', 'T') + 'Z')) / 60000; })()`
	assert.Equal(t, 15.0, js[float64](p, spanMin), "the range of the address")
	_, err = newAdmin(t, table).Pause(context.Background(), "nightly-report")
	require.NoError(t, err)
	p.until("the pause, refreshed by the script", cell("nightly-report", "state")+`.includes('paused')`)
	assert.Equal(t, origin, js[float64](p, "performance.timeOrigin"), "no reload")

	// A choice of range goes into the address, and a reload keeps it.
	require.NoError(t, chromedp.Do(ctx, chromedp.SetValue(chromedp.CSS("#range"), "6h")))
	_, err = chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void](`document.querySelector('#range').dispatchEvent(new Event('change'))`))
	require.NoError(t, err)
	p.until("the 6 h range", spanMin+` === 360`)
	assert.Equal(t, "?range=6h", js[string](p, "location.search"))
	// The selected run too.
	p.until("the failed run's mark", `!!document.querySelector('svg[data-job="billing"] rect.s-failed')`)
	_, err = chromedp.Run(ctx, chromedp.Evaluate[chromedp.Void](
		`document.querySelector('svg[data-job="billing"] rect.s-failed').dispatchEvent(new MouseEvent('click'))`))
	require.NoError(t, err)
	p.until("the failed run's detail", `!document.querySelector('#detail').hidden`)
	search := js[string](p, "location.search")
	assert.Contains(t, search, "job=billing")
	assert.Contains(t, search, "run=")
	require.NoError(t, chromedp.Do(ctx, chromedp.Reload()))
	p.until("the reload", `performance.timeOrigin !== `+strconv.FormatFloat(origin, 'f', -1, 64))
	p.until("the range and run kept by the reload", `document.querySelector('#range').value === '6h' && `+
		`!document.querySelector('#detail').hidden && document.querySelector('#detail pre.error')?.textContent === 'run 4 failed'`)
	assert.Equal(t, 360.0, js[float64](p, spanMin))
	assert.Equal(t, search, js[string](p, "location.search"))
	assert.Empty(t, consoleErrors(), "the console")
}

// When the table cannot be read, the page keeps the last state, marked
// stale with the error and its time: in the script's refresh and in the
// first response; and when ddblease ui itself is gone.
func TestUIBrowserStale(t *testing.T) {
	if !srv.InProcess() {
		t.Skip("the page's browser tests run on the in-process server")
	}
	ctx, _ := browser(t)
	table := srv.NewTable(t)
	a := startReplica(t, table, "billing", "replica-a", func(context.Context, *ddblease.JobRun) error { return nil })
	waitFor(t, "a leads", a.l.IsLeader)
	endpoint, faults := relay(t)
	ui := startUI(t, baseEnv(), endpoint, table, "--refresh", "300ms")
	p := page{t: t, ctx: ctx, ui: ui}
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(ui.url)))
	p.until("billing's leader", cell("billing", "owner")+` === 'replica-a'`)
	assert.True(t, js[bool](p, `document.querySelector('#stale').hidden`))

	// The table goes away: every request to it fails.
	faults.Set(func(string) ddbleasetest.Action { return ddbleasetest.Reset })
	p.until("the stale mark", `!document.querySelector('#stale').hidden`)
	assert.Contains(t, js[string](p, `document.querySelector('#stale').textContent`), "the table could not be read at")
	assert.Contains(t, js[string](p, `document.querySelector('#stale .stale-error').textContent`), "list jobs: ")
	at := js[string](p, `document.querySelector('#stale .failed-at').textContent`)
	assert.Regexp(t, `^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$`, at)
	assert.Equal(t, "replica-a", js[string](p, cell("billing", "owner")), "the last state stays")

	// The first response, while the table is away: the last state, stale.
	code, html := ui.do(t, "GET", "/", nil, "")
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, html, "<strong>Stale:</strong> the table could not be read at")
	assert.Contains(t, html, "list jobs: ")
	assert.Regexp(t, `<td class="owner">replica-a</td>`, html)

	// Back: the mark goes.
	faults.Set(func(string) ddbleasetest.Action { return ddbleasetest.Pass })
	p.until("the stale mark gone", `document.querySelector('#stale').hidden`)

	// ddblease ui stops: the script keeps what it had.
	require.NoError(t, ui.stop())
	p.until("the stale mark, ddblease ui gone", `document.querySelector('#stale .stale-error')?.textContent.includes('cannot reach ddblease ui')`)
	assert.Equal(t, "replica-a", js[string](p, cell("billing", "owner")), "the last state stays")
}
