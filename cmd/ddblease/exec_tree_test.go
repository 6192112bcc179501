//go:build linux

package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// What COMMAND does once its children have started (escapees' then).
const (
	// drain waits; on SIGTERM, for its drainer to drain (up to 2 s),
	// then exits 0.
	drain = "drain"
	// exit3 exits 3 at once.
	exit3 = "exit 3"
	// ignore ignores SIGTERM and waits.
	ignore = "ignore"
)

// escapees is a COMMAND script whose children leave its process group,
// each the way a real program does: setsid(1) with COMMAND alive as its
// parent, twice (the drainer drains on SIGTERM, writing "term PID" to out;
// the other ignores SIGTERM), setsid(1) through a shell that exits at once
// (an orphan in a session of its own), and, where the interpreters are
// installed, Python's start_new_session=True and Node's detached spawn
// (both orphans). Each writes its pid to pids; COMMAND then writes "ready"
// to out and does what then says.
func escapees(t *testing.T, out, pids, then string) (script string, n int) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "setsid sh -c 'echo $$ >> %s; trap \"echo term $$ >> %s; exit 0\" TERM; while :; do sleep 0.05; done' &\n", pids, out)
	fmt.Fprintf(&b, "setsid sh -c 'echo $$ >> %s; trap \"\" TERM; while :; do sleep 0.05; done' &\n", pids)
	fmt.Fprintf(&b, "setsid sh -c 'sleep 1000 & echo $! >> %s'\n", pids)
	n = 3
	if _, err := exec.LookPath("python3"); err == nil {
		fmt.Fprintf(&b, "python3 -c 'import subprocess; p = subprocess.Popen([\"sleep\", \"1000\"], start_new_session=True); open(\"%s\", \"a\").write(\"%%d\\n\" %% p.pid)'\n", pids)
		n++
	} else {
		t.Log("no python3: its start_new_session child is left out")
	}
	if _, err := exec.LookPath("node"); err == nil {
		fmt.Fprintf(&b, "node -e 'const c = require(\"child_process\").spawn(\"sleep\", [\"1000\"], {detached: true, stdio: \"ignore\"}); require(\"fs\").appendFileSync(\"%s\", c.pid + \"\\n\"); c.unref()'\n", pids)
		n++
	} else {
		t.Log("no node: its detached child is left out")
	}
	fmt.Fprintf(&b, "while [ \"$(wc -l < %s)\" -lt %d ]; do sleep 0.05; done\n", pids, n)
	fmt.Fprintf(&b, "echo ready >> %s\n", out)
	switch then {
	case drain:
		fmt.Fprintf(&b, "trap 'for i in $(seq 40); do grep -q term %s && break; sleep 0.05; done; exit 0' TERM\n", out)
	case ignore:
		b.WriteString("trap '' TERM\n")
	default:
		b.WriteString(then + "\n")
	}
	b.WriteString("while :; do sleep 0.05; done\n")
	return b.String(), n
}

// pidsOf reads the n pids the escapees wrote.
func pidsOf(t *testing.T, path string, n int) []int {
	t.Helper()
	var out []int
	for _, l := range lines(t, path) {
		pid, err := strconv.Atoi(strings.TrimSpace(l))
		require.NoError(t, err, l)
		out = append(out, pid)
	}
	require.Len(t, out, n)
	return out
}

// escaped checks that each process runs in a session other than the
// test's, where ddblease exec and COMMAND run: it left COMMAND's process
// group for a session of its own.
func escaped(t *testing.T, pids []int) {
	t.Helper()
	ours := session(t, "self")
	for _, pid := range pids {
		require.NotEqual(t, ours, session(t, strconv.Itoa(pid)), "pid %d left the test's session", pid)
	}
}

// session returns the session id of /proc/<pid>.
func session(t *testing.T, pid string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	require.NoError(t, err, "pid %s", pid)
	s := string(b)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])[3] // state ppid pgrp session ...
}

func waitGone(t *testing.T, pids []int) time.Duration {
	t.Helper()
	start := time.Now()
	waitFor(t, fmt.Sprintf("every escaped process (%v) is gone", pids), func() bool {
		for _, p := range pids {
			if alive(p) {
				return false
			}
		}
		return true
	})
	return time.Since(start)
}

// SIGKILL to ddblease exec: every process COMMAND started is gone,
// those that left its process group (setsid, start_new_session, a
// detached spawn) included, orphaned or not.
func TestExecKilledStopsEscapedDescendants(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	dir := t.TempDir()
	out, pids := filepath.Join(dir, "out"), filepath.Join(dir, "pids")
	script, n := escapees(t, out, pids, drain)
	r := startExec(t, srv.URL, table, "r1", withFast("worker", "--", "sh", "-c", script)...)
	waitFor(t, "COMMAND and its escaped children start", func() bool { return len(lines(t, out)) == 1 })
	ps := pidsOf(t, pids, n)
	escaped(t, ps)
	r.signal(t, syscall.SIGKILL)
	r.exited(t)
	took := waitGone(t, ps)
	t.Logf("%d escaped processes gone %v after ddblease exec was killed", len(ps), took)
}

// A deploy's SIGTERM reaches the processes that left COMMAND's group
// too; whatever COMMAND leaves behind when it exits is killed, and so is
// everything when COMMAND outlasts the drain timeout.
func TestExecStopsEscapedDescendants(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	dir := t.TempDir()
	for _, c := range []struct {
		then    string
		sigterm bool
		want    int
	}{
		{drain, true, 0},    // COMMAND exits 0 once its drainer has
		{ignore, true, 137}, // killed after the drain timeout
		{exit3, false, 3},   // exits on its own
	} {
		t.Run(c.then, func(t *testing.T) {
			name := strings.ReplaceAll(c.then, " ", "")
			out, pids := filepath.Join(dir, name+"-out"), filepath.Join(dir, name+"-pids")
			script, n := escapees(t, out, pids, c.then)
			r := startExec(t, srv.URL, table, "r1", withFast("worker", "--drain-timeout", "1s", "--", "sh", "-c", script)...)
			if c.sigterm {
				waitFor(t, "COMMAND and its escaped children start", func() bool { return len(lines(t, out)) == 1 })
				escaped(t, pidsOf(t, pids, n))
				r.signal(t, syscall.SIGTERM)
			}
			assert.Equal(t, c.want, r.exited(t))
			ps := pidsOf(t, pids, n)
			if c.sigterm {
				drained := false
				for _, p := range ps {
					drained = drained || slices.Contains(lines(t, out), fmt.Sprintf("term %d", p))
				}
				assert.True(t, drained, "the escaped drainer got the SIGTERM: %q", lines(t, out))
			}
			for _, p := range ps {
				assert.False(t, alive(p), "pid %d outlived ddblease exec", p)
			}
		})
	}
}
