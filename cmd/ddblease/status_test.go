package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/ddbleasetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// status shows each job's last run and its last failed run: a job that
// fails every slot does not look healthy.
func TestStatusShowsLastRuns(t *testing.T) {
	t.Parallel()
	env := baseEnv()
	table := "ddblease-cli-" + ddbleasetest.RandomID()
	ok(t, cli(t, env, "create-table", "--table", table))
	var n atomic.Int32
	a := startReplica(t, table, "billing", "replica-a", func(ctx context.Context, run *ddblease.JobRun) error {
		if n.Add(1) == 1 {
			return errors.New("card processor down")
		}
		return nil
	})
	b := startReplica(t, table, "sweeper", "replica-a", func(context.Context, *ddblease.JobRun) error { return nil })
	waitFor(t, "a leads both jobs", func() bool { return a.l.IsLeader() && b.l.IsLeader() })

	v := lastRunsJSON(t, env, table, "billing")
	assert.Nil(t, v[0].LastRun, "no run yet")
	assert.Nil(t, v[0].LastFailure)
	assert.Contains(t, ok(t, cli(t, env, "--table", table, "status")), "LAST RUN")

	fails(t, cli(t, env, "--table", table, "trigger", "billing", "--wait"), 1, "card processor down")
	v = lastRunsJSON(t, env, table, "billing")
	require.NotNil(t, v[0].LastRun)
	require.NotNil(t, v[0].LastFailure)
	assert.Equal(t, "failed", v[0].LastRun.Status)
	assert.Equal(t, "card processor down", v[0].LastFailure.Error)

	ok(t, cli(t, env, "--table", table, "trigger", "billing", "--wait"))
	v = lastRunsJSON(t, env, table)
	require.Len(t, v, 2)
	require.NotNil(t, v[0].LastRun)
	require.NotNil(t, v[0].LastFailure)
	assert.Equal(t, "succeeded", v[0].LastRun.Status, "the newer run")
	assert.Equal(t, "failed", v[0].LastFailure.Status, "the failure stays shown")
	assert.True(t, v[0].LastFailure.Slot.Before(v[0].LastRun.Slot))
	assert.Nil(t, v[1].LastRun, "sweeper has no run")

	out := ok(t, cli(t, env, "--table", table, "status"))
	row := lineWith(t, out, "billing")
	assert.Contains(t, row, "succeeded "+v[0].LastRun.Slot.Format("2006-01-02T15:04:05Z"))
	assert.Contains(t, row, "failed "+v[0].LastFailure.Slot.Format("2006-01-02T15:04:05Z")+": card processor down")
}

// lastRunsView is what status --json shows of a job's runs.
type lastRunsView struct {
	Job         string   `json:"job"`
	LastRun     *runView `json:"lastRun"`
	LastFailure *runView `json:"lastFailure"`
}

func lastRunsJSON(t *testing.T, env []string, table string, jobs ...string) []lastRunsView {
	t.Helper()
	out := ok(t, cli(t, env, append([]string{"--table", table, "status", "--json"}, jobs...)...))
	var v []lastRunsView
	require.NoError(t, json.Unmarshal([]byte(out), &v), out)
	return v
}

// lineWith returns the line of out that contains s.
func lineWith(t *testing.T, out, s string) string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	t.Fatalf("no line with %q in:\n%s", s, out)
	return ""
}

// status A B with B unknown shows A and exits 1 naming B.
func TestStatusUnknownAmongKnown(t *testing.T) {
	t.Parallel()
	env := baseEnv()
	table := "ddblease-cli-" + ddbleasetest.RandomID()
	ok(t, cli(t, env, "create-table", "--table", table))
	a := startReplica(t, table, "billing", "replica-a", func(context.Context, *ddblease.JobRun) error { return nil })
	waitFor(t, "a leads", a.l.IsLeader)
	r := cli(t, env, "--table", table, "status", "billing", "nosuchjob")
	fails(t, r, 1, `unknown job: "nosuchjob"`)
	assert.Contains(t, lineWith(t, r.stdout, "billing"), "replica-a", "the known job is shown")
	assert.NotContains(t, r.stdout, "nosuchjob")
	r = cli(t, env, "--table", table, "status", "nosuchjob")
	fails(t, r, 1, `unknown job: "nosuchjob"`)
	assert.Empty(t, r.stdout, "no table of no job")
}

// After a force-release, status says "released" and names who released
// it until a new holder leads; then it no longer does.
func TestStatusAfterForceRelease(t *testing.T) {
	t.Parallel()
	env := baseEnv()
	table := "ddblease-cli-" + ddbleasetest.RandomID()
	ok(t, cli(t, env, "create-table", "--table", table))
	a := startReplica(t, table, "billing", "replica-a", func(context.Context, *ddblease.JobRun) error { return nil })
	waitFor(t, "a leads", a.l.IsLeader)
	ok(t, cli(t, env, "--table", table, "force-release", "billing", "--yes"))
	v := statusJSON(t, env, table, "billing")
	assert.Equal(t, "released", v[0].State)
	assert.True(t, strings.HasPrefix(v[0].ReleasedBy, "tester@"))
	assert.Contains(t, ok(t, cli(t, env, "--table", table, "status")), "force-released by tester@")
	waitFor(t, "a leads again", func() bool { return statusJSON(t, env, table, "billing")[0].State == "held" })
	v = statusJSON(t, env, table, "billing")
	assert.Empty(t, v[0].ReleasedBy, "a new holder leads")
	assert.NotContains(t, ok(t, cli(t, env, "--table", table, "status")), "force-released")
}

// Durations in --json are numbers of seconds, the unit in the field's
// name (heldForSeconds, expiresInSeconds, maxClockSkewSeconds,
// durationSeconds), in status, runs, trigger --wait and watch; no Go
// duration text is left.
func TestJSONDurationsInSeconds(t *testing.T) {
	t.Parallel()
	env := baseEnv()
	table := "ddblease-cli-" + ddbleasetest.RandomID()
	ok(t, cli(t, env, "create-table", "--table", table))
	a := startReplica(t, table, "billing", "replica-a", func(context.Context, *ddblease.JobRun) error {
		time.Sleep(300 * time.Millisecond)
		return nil
	})
	waitFor(t, "a leads", a.l.IsLeader)
	noDurationText := func(t *testing.T, out string) {
		t.Helper()
		for _, k := range []string{`"heldFor"`, `"expiresIn"`, `"maxClockSkew"`, `"took"`, `"leaseDuration"`} {
			assert.NotContains(t, out, k)
		}
	}

	out := ok(t, cli(t, env, "--table", table, "--max-clock-skew", "1500ms", "status", "--json"))
	noDurationText(t, out)
	var st []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &st), out)
	require.Len(t, st, 1)
	assert.Equal(t, 1.5, st[0]["maxClockSkewSeconds"])
	held, isNum := st[0]["heldForSeconds"].(float64)
	require.True(t, isNum, "heldForSeconds is a number: %s", out)
	assert.GreaterOrEqual(t, held, 0.0)
	assert.Less(t, held, 60.0)
	in, isNum := st[0]["expiresInSeconds"].(float64)
	require.True(t, isNum, "expiresInSeconds is a number: %s", out)
	assert.Greater(t, in, 0.0)
	assert.LessOrEqual(t, in, 2.0, "within the replica's 2s lease")

	out = ok(t, cli(t, env, "--table", table, "trigger", "billing", "--wait", "--json"))
	noDurationText(t, out)
	var run map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &run), out)
	took, isNum := run["durationSeconds"].(float64)
	require.True(t, isNum, "durationSeconds is a number: %s", out)
	assert.GreaterOrEqual(t, took, 0.3, "the run slept 300ms")
	assert.Less(t, took, 10.0)

	out = ok(t, cli(t, env, "--table", table, "runs", "billing", "--json"))
	noDurationText(t, out)
	var runs []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &runs), out)
	require.Len(t, runs, 1)
	assert.Equal(t, took, runs[0]["durationSeconds"])

	out = ok(t, cli(t, env, "--table", table, "status", "billing", "--json"))
	require.NoError(t, json.Unmarshal([]byte(out), &st), out)
	assert.Equal(t, took, st[0]["lastRun"].(map[string]any)["durationSeconds"])

	// watch --json: one object per line, the lease's durations numbers.
	w := exec.Command(bin, "--endpoint", srv.URL, "--table", table, "watch", "billing", "--json", "--interval", "100ms")
	w.Env = env
	var wout lockedBuffer
	w.Stdout = &wout
	require.NoError(t, w.Start())
	defer func() { _ = w.Process.Kill(); _ = w.Wait() }()
	waitFor(t, "watch shows the lease", func() bool { return strings.Contains(wout.String(), "\n") })
	line, _, _ := strings.Cut(wout.String(), "\n")
	noDurationText(t, line)
	var ev struct {
		Kind  string         `json:"kind"`
		Lease map[string]any `json:"lease"`
	}
	require.NoError(t, json.Unmarshal([]byte(line), &ev), line)
	assert.Equal(t, "lease", ev.Kind)
	assert.Equal(t, 1.0, ev.Lease["maxClockSkewSeconds"])
	_, isNum = ev.Lease["expiresInSeconds"].(float64)
	assert.True(t, isNum, "expiresInSeconds is a number: %s", line)
}

// runs shows the slots a catch-up found without a run: one "missed" line
// per slot, at its time, between the runs around them; with --last N only
// the N latest runs, the missed slots before the first of them as a
// count; --last below 1 is refused.
func TestRunsShowsMissedSlots(t *testing.T) {
	t.Parallel()
	env := baseEnv()
	table := "ddblease-cli-" + ddbleasetest.RandomID()
	ok(t, cli(t, env, "create-table", "--table", table))
	// Fence 1 runs the slots base, base+1m, base+2m, then stops; fence 2
	// starts minutes later, and its catch-up fires the latest slot due
	// and counts the ones between as missed.
	base := time.Now().UTC().Truncate(time.Minute).Add(-6 * time.Minute)
	failingHistory(t, table, "billing", base, 3, -1)
	ran := make(chan time.Time, 10)
	l, err := ddblease.New(srv.Client(nil), table, "billing", fast("replica-b"))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- l.RunSchedule(ctx, ddblease.Every(time.Minute), func(_ context.Context, r *ddblease.JobRun) error {
			ran <- r.Slot()
			return nil
		})
	}()
	t.Cleanup(func() { cancel(); <-done })
	var fired time.Time
	select {
	case fired = <-ran:
	case <-time.After(20 * time.Second):
		t.Fatal("the catch-up fired no slot")
	}
	var views []runView
	waitFor(t, "the fired run finished", func() bool {
		out := ok(t, cli(t, env, "--table", table, "runs", "billing", "--json"))
		views = nil
		return json.Unmarshal([]byte(out), &views) == nil && len(views) == 4 && views[3].Status == "succeeded"
	})
	missed := int(fired.Sub(base.Add(2*time.Minute))/time.Minute) - 1
	require.GreaterOrEqual(t, missed, 3, "slots base+3m.. were due before fence 2 started")
	var want []time.Time
	for k := 1; k <= missed; k++ {
		want = append(want, base.Add(time.Duration(2+k)*time.Minute))
	}
	assert.Equal(t, fired, views[3].Slot)
	assert.Equal(t, missed, views[3].Missed)
	assert.Equal(t, want, views[3].MissedSlots, "the slots named in JSON")

	out := ok(t, cli(t, env, "--table", table, "runs", "billing"))
	t.Logf("runs:\n%s", out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 1+4+missed, "the header, 4 runs, a line per missed slot")
	assert.Contains(t, lines[3], base.Add(2*time.Minute).Format(time.RFC3339))
	for k, s := range want {
		l := lines[4+k]
		assert.True(t, strings.HasPrefix(l, s.Format(time.RFC3339)), "missed slot %v: %q", s, l)
		assert.Regexp(t, `\smissed\s`, l)
		assert.Contains(t, l, "no run")
	}
	assert.True(t, strings.HasPrefix(lines[4+missed], fired.Format(time.RFC3339)), lines[4+missed])
	assert.Contains(t, lines[4+missed], "succeeded")

	// --last 1: the fired run alone, its missed slots as a count.
	out = ok(t, cli(t, env, "--table", table, "runs", "billing", "--last", "1"))
	lines = strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3, out)
	assert.Contains(t, lines[1], fmt.Sprintf("%d slots before %s", missed, fired.Format(time.RFC3339)))
	assert.Regexp(t, `\smissed\s`, lines[1])
	assert.True(t, strings.HasPrefix(lines[2], fired.Format(time.RFC3339)), lines[2])

	// --last N: the N latest, oldest first; with --since, within it.
	require.NoError(t, json.Unmarshal([]byte(ok(t, cli(t, env, "--table", table, "runs", "billing", "--last", "2", "--json"))), &views))
	require.Len(t, views, 2)
	assert.Equal(t, []time.Time{base.Add(2 * time.Minute), fired}, []time.Time{views[0].Slot, views[1].Slot})
	require.NoError(t, json.Unmarshal([]byte(ok(t, cli(t, env, "--table", table, "runs", "billing", "--last", "3",
		"--status", "succeeded", "--json"))), &views))
	require.Len(t, views, 3)
	assert.Equal(t, base.Add(time.Minute), views[0].Slot)
	since := time.Since(base.Add(90 * time.Second)).Round(time.Second)
	require.NoError(t, json.Unmarshal([]byte(ok(t, cli(t, env, "--table", table, "runs", "billing", "--last", "10",
		"--since", since.String(), "--json"))), &views))
	require.Len(t, views, 2, "within --since: base+2m and the fired run")
	assert.Equal(t, base.Add(2*time.Minute), views[0].Slot)

	for _, n := range []string{"0", "-3"} {
		fails(t, cli(t, env, "--table", table, "runs", "billing", "--last", n), 2, "--last "+n+": want at least 1")
	}
	fails(t, cli(t, env, "--table", table, "runs", "billing", "--last", "many"), 2, "invalid value")
	assert.Contains(t, ok(t, cli(t, env, "runs", "-h")), "missed")
}
