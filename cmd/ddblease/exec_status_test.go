//go:build linux

package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ddblease/ddblease/ddbleasetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The exit status after a deploy's SIGTERM, as a supervisor (systemd,
// ECS) reads it: 0 for a stop that went as asked; without a schedule,
// COMMAND's own status when it did not simply obey the signal.
func TestExecExitStatusAfterSIGTERM(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	dir := t.TempDir()
	for _, c := range []struct {
		name   string
		args   []string
		script string // writes "started" to $OUT, then...
		want   int
	}{
		{"killed by the forwarded SIGTERM", nil, `echo started >> "$OUT"; while :; do sleep 0.05; done`, 0},
		{"exits 0 on SIGTERM", nil, `trap 'exit 0' TERM; echo started >> "$OUT"; while :; do sleep 0.05; done`, 0},
		{"exits 5 on SIGTERM", nil, `trap 'exit 5' TERM; echo started >> "$OUT"; while :; do sleep 0.05; done`, 5},
		{"outlasts the drain timeout", nil, `trap '' TERM; echo started >> "$OUT"; while :; do sleep 0.05; done`, 137},
		{"a schedule's run outlasts the drain timeout", []string{"--every", "1s"},
			`trap '' TERM; echo started >> "$OUT"; while :; do sleep 0.05; done`, 0},
		{"a schedule's run exits 5 on SIGTERM", []string{"--every", "1s"},
			`trap 'exit 5' TERM; echo started >> "$OUT"; while :; do sleep 0.05; done`, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			job := "job-" + strings.ReplaceAll(c.name, " ", "-")
			job = strings.ReplaceAll(job, "'", "")
			out := filepath.Join(dir, job)
			args := append([]string{job, "--drain-timeout", "1s"}, c.args...)
			args = append(args, "--", "sh", "-c", `OUT=`+out+`; `+c.script)
			r := startExec(t, srv.URL, table, "r1", withFast(args...)...)
			waitFor(t, "COMMAND starts", func() bool { return len(lines(t, out)) == 1 })
			r.signal(t, syscall.SIGTERM)
			assert.Equal(t, c.want, r.exited(t), "stderr:\n%s", r.stderr.String())
			if len(c.args) > 0 {
				var runs []runView
				require.NoError(t, json.Unmarshal([]byte(ok(t, cli(t, baseEnv(), "--table", table, "runs", job, "--json"))), &runs))
				require.NotEmpty(t, runs)
				assert.Equal(t, "failed", runs[len(runs)-1].Status, "the stopped run's outcome is in its run")
			}
		})
	}
}

// A standby stopped by SIGTERM exits 0, also when every attempt it made
// to read the lease failed; the failure is logged.
func TestExecStandbyStoppedAfterFailedAttempt(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	faults := ddbleasetest.NewFaults()
	faults.Set(func(string) ddbleasetest.Action { return ddbleasetest.ServerError })
	r := startExec(t, faultProxy(t, faults), table, "r1", withFast("worker", "--", "sh", "-c", "sleep 1000")...)
	// An attempt is an UpdateItem (one try) and a GetItem (the SDK's four
	// tries): once the sixth request has failed, a second attempt has
	// begun, so the first one has failed.
	waitFor(t, "an attempt fails", func() bool { return faults.Faulted("GetItem")+faults.Faulted("UpdateItem") >= 6 })
	r.signal(t, syscall.SIGTERM)
	assert.Equal(t, 0, r.exited(t), "stderr:\n%s", r.stderr.String())
	assert.Contains(t, r.stderr.String(), "stopped while standing by; the last attempt had failed")
	assert.Contains(t, r.stderr.String(), "InternalServerError", "the last failure is logged")
}

// After a lost tenure's deadline, a standby leads no sooner than a tenth
// of a lease later (the holder's deadline is that much before the expiry
// it wrote), and, by the watched-version rule, without waiting for that
// expiry plus MaxClockSkew: here MaxClockSkew is 1.5 s, the lease 2 s.
func TestExecStandbyLeadsAfterDeadline(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	script := `trap 'exit 0' TERM; while :; do sleep 0.05; done`
	args := []string{"worker", "--lease-duration", "2s", "--retry-interval", "200ms", "--max-clock-skew", "1500ms", "--", "sh", "-c", script}
	faults := ddbleasetest.NewFaults()
	r1 := startExec(t, faultProxy(t, faults), table, "r1", args...)
	waitFor(t, "r1 leads", func() bool { return strings.Contains(r1.stderr.String(), "leading with fence 1") })
	r2 := startExec(t, srv.URL, table, "r2", args...)
	waitFor(t, "r2 stands by", func() bool { return strings.Contains(r2.stderr.String(), "standing by") })
	faults.Set(func(op string) ddbleasetest.Action {
		if op == "UpdateItem" {
			return ddbleasetest.Blackhole
		}
		return ddbleasetest.Pass
	})
	var expiry time.Time // r1's last written expiry
	var st jobView
	waitFor(t, "r2 leads", func() bool {
		st = statusJSON(t, baseEnv(), table, "worker")[0]
		if st.Holder == "r1" {
			expiry = *st.ExpiresAt
		}
		return st.Holder == "r2"
	})
	require.False(t, expiry.IsZero())
	require.NotNil(t, st.AcquiredAt)
	deadline := expiry.Add(-200 * time.Millisecond) // LeaseDuration/10 before the expiry
	after := st.AcquiredAt.Sub(deadline)
	t.Logf("r2 led %v after r1's deadline", after)
	assert.GreaterOrEqual(t, after, 200*time.Millisecond, "a standby leads no sooner than a tenth of a lease after the deadline")
	assert.Less(t, after, 200*time.Millisecond+1500*time.Millisecond, "the watched-version rule, not the expiry plus MaxClockSkew")
	r2.signal(t, syscall.SIGTERM)
	r2.exited(t)
	r1.signal(t, syscall.SIGTERM)
	r1.exited(t)
}
