package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/ddbleasetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

var (
	srv *ddbleasetest.Server
	bin string // the built command
)

// TestMain builds the command once and starts the test server (the
// in-process one, or the one DDBLEASE_TEST_ENDPOINT names).
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ddblease-cli")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "ddblease")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building the command: %v\n%s", err, out)
		os.Exit(1)
	}
	srv = ddbleasetest.Start()
	code := m.Run()
	srv.Close()
	_ = os.RemoveAll(dir)
	if code == 0 {
		if err := findLeaks(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// leakOptions are goleak's, with the goroutines of package os/signal (a
// test of SIGTERM handling leaves its loop running) ignored.
var leakOptions = []goleak.Option{
	goleak.IgnoreAnyFunction("os/signal.loop"),
	goleak.IgnoreAnyFunction("os/signal.signal_recv"),
	goleak.IgnoreAnyFunction("runtime.ensureSigM"),
}

// findLeaks gives goroutines winding down (closing connections, returning
// from a cancelled call) a few seconds: goleak.Find retries for about two.
func findLeaks() error {
	err := goleak.Find(leakOptions...)
	for i := 0; err != nil && i < 2; i++ {
		err = goleak.Find(leakOptions...)
	}
	return err
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// baseEnv is an environment with test credentials and nothing else from
// the user's AWS set-up.
func baseEnv() []string {
	return []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.TempDir(),
		"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test", "AWS_REGION=us-east-1",
		"AWS_CONFIG_FILE=/nonexistent", "AWS_SHARED_CREDENTIALS_FILE=/nonexistent",
		"AWS_EC2_METADATA_DISABLED=true", "USER=tester",
	}
}

type result struct {
	stdout, stderr string
	code           int
}

// cli runs the command with args, --endpoint set to the test server.
func cli(t *testing.T, env []string, args ...string) result {
	t.Helper()
	return cliAt(t, env, srv.URL, args...)
}

// cliAt runs the command with args, --endpoint set to endpoint.
func cliAt(t *testing.T, env []string, endpoint string, args ...string) result {
	t.Helper()
	return cliRaw(t, env, append([]string{"--endpoint", endpoint}, args...)...)
}

// cliRaw runs the command with args in env, and nothing else.
func cliRaw(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return result{out.String(), errb.String(), code}
}

func ok(t *testing.T, r result) string {
	t.Helper()
	require.Equal(t, 0, r.code, "exit status; stderr: %s", r.stderr)
	return r.stdout
}

// fails checks a clear one-line error naming want, and the exit status.
func fails(t *testing.T, r result, code int, want string) {
	t.Helper()
	assert.Equal(t, code, r.code, "exit status; stdout %q stderr %q", r.stdout, r.stderr)
	lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
	assert.Len(t, lines, 1, "one line on stderr: %q", r.stderr)
	assert.True(t, strings.HasPrefix(r.stderr, "ddblease: "), "stderr %q", r.stderr)
	assert.Contains(t, r.stderr, want)
}

func fast(owner string) func(*ddblease.Options) {
	return func(o *ddblease.Options) {
		o.Owner = owner
		o.LeaseDuration = 2 * time.Second
		o.HeartbeatInterval = 500 * time.Millisecond
		o.RetryInterval = 50 * time.Millisecond
		o.MaxClockSkew = 150 * time.Millisecond
		o.CallTimeout = 400 * time.Millisecond
		o.Logger = quiet
	}
}

// replica runs RunSchedule for job in the test process until stopped.
type replica struct {
	l    *ddblease.Lease
	stop func() error
}

// farSchedule's one slot is in the year 9000: no slot falls due while a
// test runs, at any time of day (a daily schedule's midnight slot is due
// in the first CatchUpWindow of every UTC day).
var farSchedule = ddblease.ScheduleFunc(func(t time.Time) time.Time {
	if slot := time.Date(9000, 1, 1, 0, 0, 0, 0, time.UTC); t.Before(slot) {
		return slot
	}
	return time.Time{}
})

func startReplica(t *testing.T, table, job, owner string, fn func(context.Context, *ddblease.JobRun) error) *replica {
	t.Helper()
	l, err := ddblease.New(srv.Client(nil), table, job, fast(owner))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.RunSchedule(ctx, farSchedule, fn) }()
	r := &replica{l: l, stop: sync.OnceValue(func() error { cancel(); return <-done })}
	t.Cleanup(func() { assert.NoError(t, r.stop()) })
	return r
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func statusJSON(t *testing.T, env []string, table string, jobs ...string) []jobView {
	t.Helper()
	out := ok(t, cli(t, env, append([]string{"--table", table, "status", "--json"}, jobs...)...))
	var v []jobView
	require.NoError(t, json.Unmarshal([]byte(out), &v), out)
	return v
}

// Every subcommand, end to end, against the test server.
func TestCommands(t *testing.T) {
	t.Parallel()
	env := baseEnv()
	table := "ddblease-cli-" + ddbleasetest.RandomID()
	out := ok(t, cli(t, env, "create-table", "--table", table))
	assert.Contains(t, out, "is ready")
	ok(t, cli(t, env, "--table", table, "create-table")) // an existing table is accepted
	r := cli(t, env, "--table", table, "status")
	ok(t, r)
	assert.Contains(t, r.stderr, "no jobs")

	var mu sync.Mutex
	var ran []string
	fn := func(ctx context.Context, run *ddblease.JobRun) error {
		mu.Lock()
		ran = append(ran, run.Trigger())
		mu.Unlock()
		if len(ran) == 2 {
			return fmt.Errorf("second run fails")
		}
		return nil
	}
	a := startReplica(t, table, "billing", "replica-a", fn)
	waitFor(t, "a leads", a.l.IsLeader)
	fenceA := a.l.State().Fence

	// status: table and JSON.
	out = ok(t, cli(t, env, "--table", table, "status"))
	assert.Contains(t, out, "JOB")
	assert.Contains(t, out, "billing")
	assert.Contains(t, out, "replica-a")
	v := statusJSON(t, env, table, "billing")
	require.Len(t, v, 1)
	assert.Equal(t, "held", v[0].State)
	assert.Equal(t, "replica-a", v[0].Holder)
	assert.Equal(t, fenceA, v[0].Fence)
	require.NotNil(t, v[0].ExpiresInSeconds)
	assert.Greater(t, *v[0].ExpiresInSeconds, 0.0)
	assert.Equal(t, 1.0, v[0].MaxClockSkewSeconds)
	fails(t, cli(t, env, "--table", table, "status", "billing", "nosuchjob"), 1, `unknown job: "nosuchjob"`)

	// trigger --wait, then trigger without waiting.
	out = ok(t, cli(t, env, "--table", table, "trigger", "billing", "--wait"))
	assert.Contains(t, out, "succeeded on \"replica-a\"")
	r = cli(t, env, "--table", table, "trigger", "--wait", "billing")
	fails(t, r, 1, "failed: second run fails")
	out = ok(t, cli(t, env, "--table", table, "trigger", "billing", "--json"))
	var tr map[string]string
	require.NoError(t, json.Unmarshal([]byte(out), &tr))
	assert.Len(t, tr["trigger"], 16)

	// runs
	waitFor(t, "three runs", func() bool {
		var rs []runView
		out := ok(t, cli(t, env, "--table", table, "runs", "billing", "--json"))
		return json.Unmarshal([]byte(out), &rs) == nil && len(rs) == 3 && rs[2].Status != "running"
	})
	out = ok(t, cli(t, env, "--table", table, "runs", "billing"))
	assert.Contains(t, out, "SLOT")
	assert.Contains(t, out, "second run fails")
	var rs []runView
	require.NoError(t, json.Unmarshal([]byte(ok(t, cli(t, env, "--table", table, "runs", "billing", "--status", "failed", "--json"))), &rs))
	require.Len(t, rs, 1)
	assert.Equal(t, fenceA, rs[0].Fence)
	assert.Equal(t, "replica-a", rs[0].Owner)
	fails(t, cli(t, env, "--table", table, "runs", "billing", "--status", "bogus"), 2, `unknown --status "bogus"`)
	fails(t, cli(t, env, "--table", table, "runs"), 2, "want exactly one JOB")
	fails(t, cli(t, env, "--table", table, "runs", "nosuchjob"), 1, "unknown job")
	fails(t, cli(t, env, "--table", table, "runs", "billing", "--since", "yesterday"), 2, "invalid value")

	// pause / resume
	out = ok(t, cli(t, env, "--table", table, "pause", "billing"))
	assert.Contains(t, out, "paused by tester@")
	v = statusJSON(t, env, table, "billing")
	assert.True(t, v[0].Paused)
	assert.True(t, strings.HasPrefix(v[0].PausedBy, "tester@"))
	require.NotNil(t, v[0].PausedAt)
	assert.Contains(t, ok(t, cli(t, env, "--table", table, "status")), "yes, by tester@")
	out = ok(t, cli(t, env, "--table", table, "resume", "billing", "--catch-up"))
	assert.Contains(t, out, "latest slot skipped by the pause will be run")
	fails(t, cli(t, env, "--table", table, "resume", "billing"), 1, "not paused")
	fails(t, cli(t, env, "--table", table, "pause", "nosuchjob"), 1, "unknown job")

	// resign: a standby takes over, and a does not take the lease back.
	b := startReplica(t, table, "billing", "replica-b", fn)
	out = ok(t, cli(t, env, "--table", table, "resign", "billing"))
	assert.Contains(t, out, `asked "replica-a"`)
	waitFor(t, "b leads", b.l.IsLeader)
	v = statusJSON(t, env, table, "billing")
	assert.Equal(t, "replica-b", v[0].Holder)
	assert.Greater(t, v[0].Fence, fenceA)

	// force-release: refused without --yes, and says what it would do.
	r = cli(t, env, "--table", table, "force-release", "billing")
	fails(t, r, 2, "would release billing by force")
	assert.Contains(t, r.stderr, "--yes")
	assert.Equal(t, v[0].Fence, statusJSON(t, env, table, "billing")[0].Fence, "nothing was done")
	out = ok(t, cli(t, env, "--table", table, "force-release", "billing", "--yes"))
	assert.Contains(t, out, fmt.Sprintf("fence is now %d", v[0].Fence+1))
	assert.Contains(t, out, "no other replica leads before its recorded expiry plus --max-clock-skew")
	assert.Equal(t, "released", statusJSON(t, env, table, "billing")[0].State, "no one leads until the holder's expiry")
	var v2 []jobView
	waitFor(t, "a replica leads again", func() bool {
		v2 = statusJSON(t, env, table, "billing")
		return v2[0].State == "held"
	})
	assert.Equal(t, v[0].Fence+2, v2[0].Fence)
	assert.Equal(t, "replica-a", v2[0].Holder, "the released replica lets the other lead")

	// force-release --dead: the standby leads at once.
	r = cli(t, env, "--table", table, "force-release", "billing", "--dead")
	fails(t, r, 2, "if the holder is alive, two replicas believe they lead")
	out = ok(t, cli(t, env, "--table", table, "force-release", "billing", "--yes", "--dead"))
	assert.Contains(t, out, fmt.Sprintf("fence is now %d", v2[0].Fence+1))
	assert.Contains(t, out, "a standby leads at once")
	waitFor(t, "b leads again", func() bool {
		v2 = statusJSON(t, env, table, "billing")
		return v2[0].State == "held" && v2[0].Holder == "replica-b"
	})
	out = ok(t, cli(t, env, "force-release", "-h"))
	assert.Contains(t, out, "Without --dead, the holder's recorded expiry is kept")
	assert.Contains(t, out, "With --dead, the expiry is set to zero")

	// watch: follows holder and run changes until interrupted.
	var wout, werr lockedBuffer
	w := exec.Command(bin, "--endpoint", srv.URL, "--table", table, "watch", "billing", "--interval", "100ms")
	w.Env = env
	w.Stdout, w.Stderr = &wout, &werr
	require.NoError(t, w.Start())
	defer func() { _ = w.Process.Kill() }()
	waitFor(t, "watch shows the lease", func() bool { return strings.Contains(wout.String(), "lease billing: held") })
	ok(t, cli(t, env, "--table", table, "trigger", "billing"))
	waitFor(t, "watch shows the triggered run", func() bool { return strings.Contains(wout.String(), "succeeded") })
	ok(t, cli(t, env, "--table", table, "pause", "billing"))
	waitFor(t, "watch shows the pause", func() bool { return strings.Contains(wout.String(), "paused=true") })
	require.NoError(t, w.Process.Signal(syscall.SIGINT))
	require.NoError(t, w.Wait(), "watch exits 0 on an interrupt; stderr %q", werr.String())
}

// freeAddr returns a local address no one listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// lockedBuffer is a bytes.Buffer safe for a writer and a reader.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Bad input: each a clear one-line error and a non-zero exit status.
func TestBadInput(t *testing.T) {
	t.Parallel()
	env := baseEnv()
	table := "ddblease-cli-" + ddbleasetest.RandomID()
	ok(t, cli(t, env, "create-table", "--table", table))
	for _, c := range []struct {
		name string
		env  []string
		args []string
		code int
		want string
	}{
		{"no command", env, nil, 2, "no command given"},
		{"unknown command", env, []string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{"unknown flag", env, []string{"--table", table, "status", "--frob"}, 2, "flag provided but not defined: -frob"},
		{"unknown global flag", env, []string{"--frob", "status"}, 2, "flag provided but not defined: -frob"},
		{"no table", env, []string{"status"}, 2, "no table given"},
		{"bad table name", env, []string{"--table", "a/b", "status"}, 2, "table name"},
		{"unknown job", env, []string{"--table", table, "status", "billing"}, 1, `unknown job: "billing"`},
		{"unknown job: resign", env, []string{"--table", table, "resign", "billing"}, 1, "unknown job"},
		{"unknown job: force-release", env, []string{"--table", table, "force-release", "billing", "--yes"}, 1, "unknown job"},
		{"unknown job: trigger", env, []string{"--table", table, "trigger", "billing"}, 1, "unknown job"},
		{"unknown job: watch", env, []string{"--table", table, "watch", "billing"}, 1, "unknown job"},
		{"unknown job: resume", env, []string{"--table", table, "resume", "billing"}, 1, "unknown job"},
		{"two jobs", env, []string{"--table", table, "pause", "a", "b"}, 2, "want exactly one JOB"},
		{"bad duration", env, []string{"--table", table, "--timeout", "soon", "status"}, 2, "invalid value"},
		{"negative since", env, []string{"--table", table, "runs", "x", "--since", "-1h"}, 2, "negative"},
		{"create-table args", env, []string{"--table", table, "create-table", "extra"}, 2, "takes no arguments"},
	} {
		t.Run(c.name, func(t *testing.T) {
			fails(t, cli(t, c.env, c.args...), c.code, c.want)
		})
	}
	out := ok(t, cli(t, env, "-h"))
	assert.Contains(t, out, "force-release JOB --yes")
}

// Every command that reads or writes the table says, on a missing table,
// one short line naming the table and "not found", with exit status 1.
func TestMissingTable(t *testing.T) {
	t.Parallel()
	env := baseEnv()
	table := "ddblease-missing-" + ddbleasetest.RandomID()
	for _, args := range [][]string{
		{"status"}, {"status", "billing"}, {"status", "--json"}, {"runs", "billing"},
		{"resign", "billing"}, {"force-release", "billing"}, {"force-release", "billing", "--yes"},
		{"force-release", "billing", "--yes", "--dead"}, {"pause", "billing"}, {"resume", "billing"},
		{"trigger", "billing"}, {"trigger", "billing", "--wait"}, {"watch", "billing"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			r := cli(t, env, append([]string{"--table", table}, args...)...)
			fails(t, r, 1, fmt.Sprintf("table %q not found at %s", table, srv.URL))
			assert.Contains(t, r.stderr, "create it with: ddblease create-table")
			assert.NotContains(t, r.stderr, "RequestID", "no SDK noise")
			assert.NotContains(t, r.stderr, "billing", "the table is named, not the job")
			assert.LessOrEqual(t, len(r.stderr), 120+len(table)+len(srv.URL), "one short line: %q", r.stderr)
			assert.Empty(t, r.stdout)
		})
	}
}

func noCredentials() []string {
	var env []string
	for _, kv := range baseEnv() {
		if !strings.HasPrefix(kv, "AWS_ACCESS_KEY_ID=") && !strings.HasPrefix(kv, "AWS_SECRET_ACCESS_KEY=") {
			env = append(env, kv)
		}
	}
	return env
}

func noRegion() []string {
	var env []string
	for _, kv := range baseEnv() {
		if !strings.HasPrefix(kv, "AWS_REGION=") {
			env = append(env, kv)
		}
	}
	return env
}
