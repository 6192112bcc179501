package main

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// trigger --wait with no replica running gives up at --wait-timeout with
// exit status 3, naming the trigger and where to look; the request stays
// pending, and a replica that starts later runs it.
func TestTriggerWaitGivesUp(t *testing.T) {
	t.Parallel()
	table := srv.NewTable(t)
	env := baseEnv()
	a := startReplica(t, table, "billing", "replica-a", func(context.Context, *ddblease.JobRun) error { return nil })
	waitFor(t, "a leads", a.l.IsLeader)
	require.NoError(t, a.stop())

	start := time.Now()
	r := cli(t, env, "--table", table, "trigger", "billing", "--wait", "--wait-timeout", "1s")
	took := time.Since(start)
	t.Logf("gave up after %v: %s", took, r.stderr)
	fails(t, r, 3, "trigger billing: gave up waiting after 1s (--wait-timeout)")
	assert.Contains(t, r.stderr, "has not started")
	assert.Contains(t, r.stderr, "see: ddblease runs billing")
	assert.Regexp(t, `run \S+#trigger-[0-9a-f]{16} \(trigger [0-9a-f]{16}\)`, r.stderr)
	assert.Less(t, took, 10*time.Second)
	assert.Empty(t, r.stdout)

	// With --json, what it knows on stdout.
	r = cli(t, env, "--table", table, "trigger", "billing", "--wait", "--wait-timeout", "300ms", "--json")
	assert.Equal(t, 3, r.code, r.stderr)
	var v map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v), r.stdout)
	assert.Equal(t, "pending", v["state"])
	assert.Equal(t, "billing", v["job"])
	assert.Len(t, v["trigger"], 16)
	assert.InDelta(t, 0.3, v["waitedSeconds"], 0.001)

	v2 := statusJSON(t, env, table, "billing")
	assert.Equal(t, 2, v2[0].Triggers, "both requests stay pending")

	// A replica that starts runs them.
	b := startReplica(t, table, "billing", "replica-b", func(context.Context, *ddblease.JobRun) error { return nil })
	waitFor(t, "b leads", b.l.IsLeader)
	waitFor(t, "the pending runs succeed", func() bool {
		out := ok(t, cli(t, env, "--table", table, "runs", "billing"))
		return strings.Count(out, "succeeded") == 2
	})

	fails(t, cli(t, env, "--table", table, "trigger", "billing", "--wait", "--wait-timeout", "-1s"), 2, "--wait-timeout -1s is negative")
	help := ok(t, cli(t, env, "trigger", "-h"))
	assert.Contains(t, help, "--wait-timeout")
	assert.Contains(t, help, "exits with status 3")
}

// With a replica running, trigger --wait returns the run's outcome; a run
// still going at --wait-timeout is reported as started, with exit 3.
func TestTriggerWaitRunning(t *testing.T) {
	t.Parallel()
	table := srv.NewTable(t)
	env := baseEnv()
	release := make(chan struct{})
	var slow atomic.Bool
	a := startReplica(t, table, "billing", "replica-a", func(ctx context.Context, _ *ddblease.JobRun) error {
		if slow.Load() {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil
	})
	waitFor(t, "a leads", a.l.IsLeader)

	out := ok(t, cli(t, env, "--table", table, "trigger", "billing", "--wait", "--wait-timeout", "20s"))
	assert.Contains(t, out, `succeeded on "replica-a"`)

	slow.Store(true)
	r := cli(t, env, "--table", table, "trigger", "billing", "--wait", "--wait-timeout", "1500ms")
	fails(t, r, 3, "gave up waiting after 1.5s")
	assert.Contains(t, r.stderr, `has started on "replica-a"`)
	assert.Contains(t, r.stderr, "not finished")
	close(release)
}
