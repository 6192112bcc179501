//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ddblease/ddblease/ddbleasetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// execReplica is one `ddblease exec` process.
type execReplica struct {
	owner  string
	cmd    *exec.Cmd
	stderr *lockedBuffer
	done   chan struct{}
	code   int
}

// startExec starts `ddblease --endpoint endpoint --table table exec args...`
// as owner. The test's cleanup kills it if it still runs.
func startExec(t *testing.T, endpoint, table, owner string, args ...string) *execReplica {
	t.Helper()
	full := append([]string{"--endpoint", endpoint, "--table", table, "exec", "--owner", owner}, args...)
	r := &execReplica{owner: owner, cmd: exec.Command(bin, full...), stderr: &lockedBuffer{}, done: make(chan struct{})}
	r.cmd.Env = baseEnv()
	r.cmd.Stderr = r.stderr
	require.NoError(t, r.cmd.Start())
	go func() {
		defer close(r.done)
		err := r.cmd.Wait()
		r.code = 0
		if ee, ok := err.(*exec.ExitError); ok {
			r.code = ee.ExitCode()
		}
	}()
	t.Cleanup(func() {
		_ = r.cmd.Process.Kill()
		<-r.done
		if t.Failed() {
			t.Logf("stderr of %s:\n%s", owner, r.stderr.String())
		}
	})
	return r
}

// exited waits for the process to exit and returns its status.
func (r *execReplica) exited(t *testing.T) int {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s did not exit; stderr:\n%s", r.owner, r.stderr.String())
	}
	return r.code
}

func (r *execReplica) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, r.cmd.Process.Signal(sig))
}

func lines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// alive reports whether the process pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || !strings.HasPrefix(s[i+1:], " Z")
}

func newTable(t *testing.T) string {
	t.Helper()
	table := "ddblease-exec-" + ddbleasetest.RandomID()
	ok(t, cli(t, baseEnv(), "create-table", "--table", table))
	return table
}

// withFast returns args with the lease options of the replicas in these
// tests.
func withFast(args ...string) []string {
	return append([]string{"--lease-duration", "2s", "--retry-interval", "200ms", "--max-clock-skew", "150ms"}, args...)
}

// Two replicas run a job every second; the leader is sent SIGTERM in the
// middle, and the other, leading by then, is killed later. Every slot in
// between runs once, under fences that never go down; the killed
// replica's COMMAND is gone before its tenure's deadline; `ddblease runs`
// shows each slot's exit status.
func TestExecSchedule(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	dir := t.TempDir()
	out, done := filepath.Join(dir, "slots"), filepath.Join(dir, "done")
	// Slots at an even second fail with status 3 and a line on stderr.
	// Each run leaves a process behind in the background.
	script := `sleep 30 &
echo "$DDBLEASE_FENCE $DDBLEASE_SLOT $$ $! $DDBLEASE_JOB $DDBLEASE_TABLE $DDBLEASE_IDEMPOTENCY_KEY" >> ` + out + `
s=${DDBLEASE_SLOT%Z}; s=${s##*:}; s=${s%%.*}; s=${s#0}
sleep 0.4
echo "$DDBLEASE_SLOT" >> ` + done + `
if [ $((s % 2)) -eq 0 ]; then echo "even slot $DDBLEASE_SLOT" >&2; exit 3; fi`
	args := withFast("nightly", "--every", "1s", "--drain-timeout", "5s", "--", "sh", "-c", script)
	reps := map[string]*execReplica{
		"r1": startExec(t, srv.URL, table, "r1", args...),
		"r2": startExec(t, srv.URL, table, "r2", args...),
	}
	waitFor(t, "three slots", func() bool { return len(lines(t, out)) >= 3 })
	st := statusJSON(t, baseEnv(), table, "nightly")[0]
	leader, fenceA := reps[st.Holder], st.Fence
	require.NotNil(t, leader)
	leader.signal(t, syscall.SIGTERM)
	assert.Equal(t, 0, leader.exited(t), "a replica stopped by SIGTERM exits 0")
	var other *execReplica
	for _, r := range reps {
		if r != leader {
			other = r
		}
	}
	waitFor(t, "the other replica runs three slots", func() bool {
		n := 0
		for _, l := range lines(t, out) {
			if f, _ := strconv.ParseInt(strings.Fields(l)[0], 10, 64); f > fenceA {
				n++
			}
		}
		return n >= 3
	})
	// Kill the other as soon as a slot's COMMAND has started.
	n := len(lines(t, out))
	waitFor(t, "a slot starts", func() bool { return len(lines(t, out)) > n })
	other.signal(t, syscall.SIGKILL)
	other.exited(t)
	st = statusJSON(t, baseEnv(), table, "nightly")[0]
	require.NotNil(t, st.ExpiresAt)
	ls := lines(t, out)
	last := strings.Fields(ls[len(ls)-1])
	pid, err := strconv.Atoi(last[2])
	require.NoError(t, err)
	bg, err := strconv.Atoi(last[3])
	require.NoError(t, err)
	waitFor(t, "the killed replica's COMMAND and its child are gone", func() bool { return !alive(pid) && !alive(bg) })
	gone := time.Now() // both
	assert.NotContains(t, lines(t, done), last[1], "the killed replica's COMMAND was stopped, not left to finish")
	// The tenure's deadline is a tenth of the lease before the expiry
	// written by its last renewal.
	assert.True(t, gone.Before(st.ExpiresAt.Add(-200*time.Millisecond)),
		"COMMAND gone at %v, the tenure's deadline is %v", gone, st.ExpiresAt.Add(-200*time.Millisecond))

	// Every slot once, a second apart; fences never go down.
	var slots []time.Time
	var fences []int64
	for _, l := range ls {
		f := strings.Fields(l)
		require.Len(t, f, 7, l)
		fence, err := strconv.ParseInt(f[0], 10, 64)
		require.NoError(t, err)
		slot, err := time.Parse(time.RFC3339Nano, f[1])
		require.NoError(t, err, l)
		assert.Equal(t, "nightly", f[4])
		assert.Equal(t, table, f[5])
		assert.Equal(t, "nightly#"+f[1], f[6], "DDBLEASE_IDEMPOTENCY_KEY")
		bg, err := strconv.Atoi(f[3])
		require.NoError(t, err)
		assert.False(t, alive(bg), "what the run of %v left behind is gone", slot)
		if len(slots) > 0 {
			assert.Equal(t, time.Second, slot.Sub(slots[len(slots)-1]), "slot %v follows %v", slot, slots[len(slots)-1])
			assert.GreaterOrEqual(t, fence, fences[len(fences)-1], "fences never go down")
		}
		slots, fences = append(slots, slot), append(fences, fence)
	}
	assert.Greater(t, fences[len(fences)-1], fences[0], "the other replica took over")

	// Each slot's exit status is in its run.
	var runs []runView
	require.NoError(t, json.Unmarshal([]byte(ok(t, cli(t, baseEnv(), "--table", table, "runs", "nightly", "--json"))), &runs))
	bySlot := map[time.Time]runView{}
	for _, r := range runs {
		bySlot[r.Slot] = r
	}
	signalled := 0
	for i, slot := range slots {
		r, found := bySlot[slot]
		if !assert.True(t, found, "a run for slot %v", slot) {
			continue
		}
		assert.Equal(t, fences[i], r.Fence, "slot %v", slot)
		switch {
		case i == len(slots)-1:
			assert.Equal(t, "running", r.Status, "the killed replica's run is left running")
		case strings.Contains(r.Error, "killed by SIGTERM"):
			signalled++ // the run that SIGTERM stopped
			assert.Equal(t, "failed", r.Status)
		case slot.Second()%2 == 0:
			assert.Equal(t, "failed", r.Status, "slot %v", slot)
			assert.Contains(t, r.Error, "exited with status 3")
			assert.Contains(t, r.Error, "even slot "+slot.Format(time.RFC3339Nano))
		default:
			assert.Equal(t, "succeeded", r.Status, "slot %v: %s", slot, r.Error)
		}
	}
	assert.LessOrEqual(t, signalled, 1)
	assert.Len(t, runs, len(slots), "no run without its line")
	assert.Contains(t, leader.stderr.String(), "received SIGTERM: stopping")
	assert.Contains(t, leader.stderr.String(), "resigned fence")
}

// faultProxy is an HTTP endpoint in front of the test server whose
// requests go through faults: a `ddblease exec` process given its URL can
// be cut off from DynamoDB.
func faultProxy(t *testing.T, faults *ddbleasetest.Faults) string {
	t.Helper()
	target, err := url.Parse(srv.URL)
	require.NoError(t, err)
	p := httputil.NewSingleHostReverseProxy(target)
	p.Transport = faults.Wrap(http.DefaultTransport)
	p.ErrorLog = nil
	p.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) { w.WriteHeader(http.StatusBadGateway) }
	// The body is read first, so that the server watches the connection
	// and ends a black-holed request's context when the client gives up.
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(b))
		p.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s.URL
}

// The leader loses its tenure (its heartbeats are black-holed): its
// COMMAND, which ignores SIGTERM, and the COMMAND's own child are killed
// before the standby's COMMAND starts. The standby's COMMAND looks for
// them when it starts.
func TestExecLongRunningStopsChildBeforeStandby(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	dir := t.TempDir()
	out, pids := filepath.Join(dir, "out"), filepath.Join(dir, "pids")
	script := `trap "" TERM
echo "start $DDBLEASE_FENCE $$" >> ` + out + `
for p in $(cat ` + pids + ` 2>/dev/null); do
  s=$(cut -d' ' -f3 /proc/$p/stat 2>/dev/null)
  [ -n "$s" ] && [ "$s" != Z ] && echo "alive $p" >> ` + out + `
done
sleep 1000 &
echo "$$ $!" >> ` + pids + `
wait`
	args := withFast("worker", "--drain-timeout", "30s", "--", "sh", "-c", script)
	faults := ddbleasetest.NewFaults()
	r1 := startExec(t, faultProxy(t, faults), table, "r1", args...)
	waitFor(t, "r1's COMMAND starts", func() bool { return len(lines(t, out)) == 1 })
	r2 := startExec(t, srv.URL, table, "r2", args...)
	waitFor(t, "r2 stands by", func() bool { return strings.Contains(r2.stderr.String(), "standing by: r1 leads with fence 1") })

	faults.Set(func(op string) ddbleasetest.Action {
		if op == "UpdateItem" {
			return ddbleasetest.Blackhole
		}
		return ddbleasetest.Pass
	})
	waitFor(t, "r2's COMMAND starts", func() bool { return len(lines(t, out)) >= 2 })
	ls := lines(t, out)
	assert.Equal(t, "start 1", strings.Join(strings.Fields(ls[0])[:2], " "))
	assert.Equal(t, "start 2", strings.Join(strings.Fields(ls[1])[:2], " "))
	assert.Len(t, ls, 2, "no process of r1's COMMAND was alive when r2's started: %q", ls)
	assert.Contains(t, r1.stderr.String(), "lost the lease (fence 1, deadline)")
	assert.Contains(t, r1.stderr.String(), "did not exit in time: killed")
	for _, l := range lines(t, pids)[:1] {
		for _, p := range strings.Fields(l) {
			pid, err := strconv.Atoi(p)
			require.NoError(t, err)
			assert.False(t, alive(pid), "r1's process %d", pid)
		}
	}

	// A deploy: SIGTERM to r2 goes to its COMMAND (which ignores it), the
	// lease is kept while it drains, and r2 exits once it is killed.
	faults.Clear()
	r2.signal(t, syscall.SIGTERM)
	waitFor(t, "r2 drains", func() bool { return strings.Contains(r2.stderr.String(), "draining fence 2") })
	waitFor(t, "the lease marked draining", func() bool { return statusJSON(t, baseEnv(), table, "worker")[0].Draining })
	// (r1 exits 1 if none of its requests succeeded since it was cut off.)
	r1.signal(t, syscall.SIGTERM)
	r1.exited(t)
	r2.signal(t, syscall.SIGKILL)
	r2.exited(t)
	waitFor(t, "r2's COMMAND is gone", func() bool {
		l := lines(t, pids)
		if len(l) < 2 {
			return false
		}
		pid, _ := strconv.Atoi(strings.Fields(l[1])[0])
		return !alive(pid)
	})
}

// SIGTERM in a deploy: the COMMAND gets it, drains while the lease is
// kept, and the standby's COMMAND starts once it has exited, at once.
// A COMMAND that exits on its own makes ddblease exec resign and exit
// with its status; --restart starts it again instead.
func TestExecLongRunningHandOver(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	script := `trap 'echo "stopped $DDBLEASE_FENCE" >> ` + out + `; exit 0' TERM
echo "start $DDBLEASE_FENCE $DDBLEASE_SLOT" >> ` + out + `
while :; do sleep 0.05; done`
	health := freeAddr(t)
	r1 := startExec(t, srv.URL, table, "r1", withFast("worker", "--health", health, "--", "sh", "-c", script)...)
	waitFor(t, "r1's COMMAND starts", func() bool { return len(lines(t, out)) == 1 })
	resp, err := http.Get("http://" + health + "/healthz")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "ok\n", string(body))

	r2 := startExec(t, srv.URL, table, "r2", withFast("worker", "--", "sh", "-c", script)...)
	waitFor(t, "r2 stands by", func() bool { return strings.Contains(r2.stderr.String(), "standing by") })
	r1.signal(t, syscall.SIGTERM)
	assert.Equal(t, 0, r1.exited(t), "COMMAND exited 0 after SIGTERM")
	waitFor(t, "r2's COMMAND starts", func() bool { return len(lines(t, out)) == 3 })
	assert.Equal(t, []string{"start 1 ", "stopped 1", "start 2 "}, lines(t, out))
	assert.Equal(t, 1, strings.Count(r1.stderr.String(), "leading with fence"), "one line per change of leadership")

	// COMMAND exits on its own: resign, and exit with its status.
	r2.signal(t, syscall.SIGKILL)
	r2.exited(t)
	r3 := startExec(t, srv.URL, table, "r3", withFast("worker", "--", "sh", "-c", "exit 7")...)
	assert.Equal(t, 7, r3.exited(t))
	assert.Contains(t, r3.stderr.String(), "COMMAND exited with status 7")
	assert.Contains(t, r3.stderr.String(), "resigned fence")

	// --restart: COMMAND starts again with the same fence. The third
	// start waits for the forwarded signal and exits 0 (its trap is set
	// before it writes the line the test waits for), so that exec's status
	// is COMMAND's whenever the SIGINT lands.
	count := filepath.Join(dir, "count")
	r4 := startExec(t, srv.URL, table, "r4", withFast("worker", "--restart", "--", "sh", "-c",
		`trap 'exit 0' INT TERM; echo "$DDBLEASE_FENCE" >> `+count+`; if [ "$(wc -l < `+count+`)" -ge 3 ]; then while :; do sleep 0.05; done; fi; exit 1`)...)
	waitFor(t, "three starts", func() bool { return len(lines(t, count)) >= 3 })
	r4.signal(t, syscall.SIGINT)
	assert.Equal(t, 0, r4.exited(t))
	c := lines(t, count)
	assert.Equal(t, c[0], c[len(c)-1], "the same tenure")
}

// failsLogged checks exec's clear one-line error naming want, a plain
// line as every command's error (not a line of its slog log), and the
// exit status.
func failsLogged(t *testing.T, r result, code int, want string) {
	t.Helper()
	fails(t, r, code, want)
	assert.NotRegexp(t, slogText, r.stderr)
	assert.NotContains(t, r.stderr, "level=")
}

// Bad input: one line on stderr, exit status 2, and nothing run.
func TestExecBadInput(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	env := baseEnv()
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"no --", []string{"exec", "job", "true"}, "COMMAND goes after --: ddblease exec JOB"},
		{"no -- and COMMAND's flags", []string{"exec", "job", "sh", "-c", "true"}, "flag provided but not defined: -c; COMMAND goes after --"},
		{"no job", []string{"exec", "--", "true"}, "want exactly one JOB"},
		{"two jobs", []string{"exec", "a", "b", "--", "true"}, "want exactly one JOB before --, got 2"},
		{"no command", []string{"exec", "job", "--"}, "no command after --"},
		{"unknown job flag", []string{"exec", "job", "--frob", "--", "true"}, "flag provided but not defined: -frob"},
		{"command not found", []string{"exec", "job", "--", "no-such-command-x"}, `command "no-such-command-x": executable file not found`},
		{"every and schedule", []string{"exec", "job", "--every", "1s", "--schedule", "* * * * *", "--", "true"}, "--every and --schedule both given"},
		{"bad schedule", []string{"exec", "job", "--schedule", "61 * * * *", "--", "true"}, `--schedule "61 * * * *"`},
		{"negative every", []string{"exec", "job", "--every", "-1s", "--", "true"}, "--every -1s is negative"},
		{"restart with a schedule", []string{"exec", "job", "--every", "1s", "--restart", "--", "true"}, "--restart applies only without a schedule"},
		{"bad health address", []string{"exec", "job", "--health", "nowhere", "--", "true"}, `--health "nowhere"`},
		{"bad lease", []string{"exec", "job", "--lease-duration", "1ms", "--", "true"}, "LeaseDuration 1ms"},
	} {
		t.Run(c.name, func(t *testing.T) {
			failsLogged(t, cli(t, env, append([]string{"--table", table}, c.args...)...), 2, c.want)
		})
	}
	assert.Contains(t, ok(t, cli(t, env, "-h")), "exec JOB [--every D] -- COMMAND")
}

// A signal goes to COMMAND's whole process group: here a shell that
// waits for its child, which drains on SIGTERM.
func TestExecSignalsTheGroup(t *testing.T) {
	t.Parallel()
	table := newTable(t)
	out := filepath.Join(t.TempDir(), "out")
	script := `trap ":" TERM
(trap 'echo "grandchild stopped" >> ` + out + `; exit 0' TERM; echo started >> ` + out + `; while :; do sleep 0.05; done) &
wait; wait`
	r := startExec(t, srv.URL, table, "r1", withFast("worker", "--drain-timeout", "30s", "--", "sh", "-c", script)...)
	waitFor(t, "the grandchild starts", func() bool { return len(lines(t, out)) == 1 })
	r.signal(t, syscall.SIGTERM)
	assert.Equal(t, 0, r.exited(t))
	assert.Equal(t, []string{"started", "grandchild stopped"}, lines(t, out))
	assert.NotContains(t, r.stderr.String(), "did not exit in time")
}
