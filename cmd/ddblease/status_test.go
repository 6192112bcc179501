package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/ddbleasetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// status shows each job's last run and its last failed run: a job that
// fails every slot does not look healthy.
func TestStatusShowsLastRuns(t *testing.T) {
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
