package main

import (
	"bufio"
	"encoding/json"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ddblease/ddblease/ddbleasetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Each command's -h shows its own flags, as the docs write them (--name),
// apart from the global ones.
func TestCommandHelp(t *testing.T) {
	env := baseEnv()
	for cmd, flags := range map[string][]string{
		"runs":          {"--since", "--status"},
		"force-release": {"--yes", "--dead"},
		"resume":        {"--catch-up"},
		"trigger":       {"--wait"},
		"watch":         {"--interval"},
		"exec":          {"--every", "--schedule", "--drain-timeout"},
		"local":         {"--addr"},
	} {
		t.Run(cmd, func(t *testing.T) {
			out := ok(t, cli(t, env, cmd, "-h"))
			own, global, found := strings.Cut(out, "global flags")
			require.True(t, found, "the global flags under their own heading:\n%s", out)
			for _, f := range flags {
				assert.Contains(t, own, "  "+f, "%s -h", cmd)
			}
			assert.Contains(t, global, "  --table", "%s -h", cmd)
			assert.NotContains(t, own, "--table")
		})
	}
	out := ok(t, cli(t, env, "-h"))
	assert.Contains(t, out, "  --log-format")
	assert.Contains(t, out, "  version")
	assert.Contains(t, out, "  local")
}

// version prints the module's version and the commit it was built from,
// as the binary's build information records them.
func TestVersion(t *testing.T) {
	info, err := exec.Command("go", "version", "-m", bin).Output()
	require.NoError(t, err)
	setting := func(key string) string {
		m := regexp.MustCompile(`(?m)^\s+(?:mod|build)\s+` + regexp.QuoteMeta(key) + `[\s=](\S+)`).FindSubmatch(info)
		if m == nil {
			return ""
		}
		return string(m[1])
	}
	out := ok(t, cli(t, baseEnv(), "version"))
	assert.Contains(t, out, "github.com/ddblease/ddblease/cmd/ddblease")
	m := regexp.MustCompile(`(?m)^\s+mod\s+\S+\s+(\S+)`).FindSubmatch(info)
	require.NotNil(t, m, "%s", info)
	assert.Contains(t, out, string(m[1]), "the module's version")
	if rev := setting("vcs.revision"); rev != "" {
		assert.Contains(t, out, rev, "the commit")
	} else {
		assert.Contains(t, out, "commit unknown")
	}
	var v map[string]any
	require.NoError(t, json.Unmarshal([]byte(ok(t, cli(t, baseEnv(), "version", "--json"))), &v))
	assert.Equal(t, string(m[1]), v["version"])
	assert.Equal(t, setting("vcs.revision"), v["commit"])
}

var slogText = regexp.MustCompile(`^time=\S+ level=(DEBUG|INFO|WARN|ERROR) msg=`)

// exec's log is one format, slog's text or, with --log-format json, one
// JSON object per line; the other commands take --log-format json too.
func TestLogFormat(t *testing.T) {
	env := baseEnv()
	table := newTableFor(t)
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			r := cli(t, env, "--table", table, "--log-format", format, "exec", "worker", "--", "sh", "-c", "echo from-command >&2; exit 7")
			assert.Equal(t, 7, r.code)
			sc := bufio.NewScanner(strings.NewReader(r.stderr))
			n := 0
			for sc.Scan() {
				line := sc.Text()
				if line == "from-command" { // COMMAND's own stderr, passed through
					continue
				}
				n++
				if format == "text" {
					assert.Regexp(t, slogText, line)
					continue
				}
				var rec map[string]any
				if assert.NoError(t, json.Unmarshal([]byte(line), &rec), line) {
					assert.Contains(t, rec, "time")
					assert.Contains(t, rec, "level")
					assert.Contains(t, rec, "msg")
				}
			}
			assert.GreaterOrEqual(t, n, 4, "campaigning, leading, started, exited, resigned:\n%s", r.stderr)
			assert.Contains(t, r.stderr, "from-command")
			assert.Contains(t, r.stderr, "exited with status 7")
		})
	}
	r := cli(t, env, "--table", table, "--log-format", "json", "status", "nosuchjob")
	assert.Equal(t, 1, r.code)
	var rec map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stderr), &rec), r.stderr)
	assert.Equal(t, "ERROR", rec["level"])
	assert.Contains(t, rec["msg"], `unknown job: "nosuchjob"`)
	fails(t, cli(t, env, "--log-format", "xml", "status"), 2, `--log-format "xml"`)
}

func newTableFor(t *testing.T) string {
	t.Helper()
	table := "ddblease-cli-" + ddbleasetest.RandomID()
	ok(t, cli(t, baseEnv(), "create-table", "--table", table))
	return table
}

// local serves the in-process test server on a fixed address until
// interrupted: the other commands and the library work against it.
func TestLocal(t *testing.T) {
	addr := freeAddr(t)
	var out, errb lockedBuffer
	c := exec.Command(bin, "local", "--addr", addr)
	c.Env = append(baseEnv(), "DDBLEASE_TEST_ENDPOINT=http://127.0.0.1:1") // not served instead
	c.Stdout, c.Stderr = &out, &errb
	require.NoError(t, c.Start())
	defer func() { _ = c.Process.Kill() }()
	waitFor(t, "local serves", func() bool { return strings.Contains(out.String(), "http://"+addr) })
	assert.Contains(t, out.String(), "development only")

	env := baseEnv()
	cmd := func(args ...string) result { return cliAt(t, env, "http://"+addr, args...) }
	assert.Contains(t, ok(t, cmd("--table", "leases", "create-table")), "is ready")
	r := cmd("--table", "leases", "exec", "worker", "--", "true")
	assert.Equal(t, 0, r.code, r.stderr)
	assert.Contains(t, ok(t, cmd("--table", "leases", "status", "--json")), `"job": "worker"`)

	require.NoError(t, c.Process.Signal(syscall.SIGINT))
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case err := <-done:
		assert.NoError(t, err, "local exits 0 on an interrupt; stderr %q", errb.String())
	case <-time.After(20 * time.Second):
		t.Fatal("local did not stop")
	}
	fails(t, cli(t, env, "local", "--addr", "nowhere"), 2, `--addr "nowhere"`)
}
