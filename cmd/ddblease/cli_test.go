package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
	env := baseEnv()
	table := newTableFor(t)
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			r := cli(t, env, "--table", table, "--log-format", format, "exec", "worker", "--", "sh", "-c", "echo from-command >&2; exit 7")
			assert.Equal(t, 7, r.code)
			lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
			last := lines[len(lines)-1]
			n := 0
			for _, line := range lines {
				if line == "from-command" { // COMMAND's own stderr, passed through
					continue
				}
				n++
				switch {
				case format == "text" && line == last: // the command's error: one plain line
					assert.Equal(t, "ddblease: exec worker: COMMAND exited with status 7", line)
				case format == "text":
					assert.Regexp(t, slogText, line)
				default:
					var rec map[string]any
					if assert.NoError(t, json.Unmarshal([]byte(line), &rec), line) {
						assert.Contains(t, rec, "time")
						assert.Contains(t, rec, "level")
						assert.Contains(t, rec, "msg")
						if line == last {
							assert.Equal(t, "ERROR", rec["level"])
							assert.Equal(t, "ddblease: exec worker: COMMAND exited with status 7", rec["msg"])
						}
					}
				}
			}
			assert.GreaterOrEqual(t, n, 4, "campaigning, leading, started, exited, resigned:\n%s", r.stderr)
			assert.Contains(t, r.stderr, "from-command")
			assert.Contains(t, r.stderr, "exited with status 7")
		})
	}
	// exec's errors before its log starts: one plain line too.
	fails(t, cli(t, env, "--table", table, "exec", "worker", "--", "/nonexistent/cmd"), 2, `exec: command "/nonexistent/cmd"`)
	fails(t, cli(t, env, "--table", table, "exec", "worker"), 2, "exec: ")
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
	t.Parallel()
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

// emptyEnv is an environment with no AWS set-up at all: no AWS_ variable,
// and a home without ~/.aws.
func emptyEnv(t *testing.T, extra ...string) []string {
	return append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "USER=tester"}, extra...)
}

// For a loopback endpoint, given as --endpoint or in the environment, a
// missing region or missing credentials are ddblease local's (us-east-1,
// dummy keys), and one line on stderr says so; for any other endpoint they
// are errors, as they were.
func TestLoopbackDefaults(t *testing.T) {
	t.Parallel()
	// Not isLoopback: the test would skip when it is wrong.
	if !strings.HasPrefix(srv.URL, "http://127.0.0.1:") && !strings.HasPrefix(srv.URL, "http://localhost:") {
		t.Skipf("the test server %s is not on a loopback address", srv.URL)
	}
	table := "ddblease-cli-" + ddbleasetest.RandomID()
	both := "ddblease: no AWS region or credentials; using us-east-1 and dummy credentials for the loopback endpoint "
	r := cliAt(t, emptyEnv(t), srv.URL, "--table", table, "create-table")
	assert.Contains(t, ok(t, r), "is ready")
	assert.True(t, strings.HasPrefix(r.stderr, both+srv.URL+"\n"), "stderr %q", r.stderr)
	assert.Equal(t, 1, strings.Count(r.stderr, "dummy"), "said once: %q", r.stderr)

	// status: the one line, then its own ("no jobs").
	status := func(env []string, endpoint string) result {
		t.Helper()
		if endpoint == "" {
			return cliRaw(t, env, "--table", table, "status")
		}
		return cliAt(t, env, endpoint, "--table", table, "status")
	}
	localhost := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)
	for _, c := range []struct {
		name, endpoint string
		env            []string
		want           string
	}{
		{"--endpoint", srv.URL, emptyEnv(t), both + srv.URL},
		{"localhost", localhost, emptyEnv(t), both + localhost},
		{"AWS_ENDPOINT_URL_DYNAMODB", "", emptyEnv(t, "AWS_ENDPOINT_URL_DYNAMODB="+srv.URL), both + srv.URL},
		{"AWS_ENDPOINT_URL", "", emptyEnv(t, "AWS_ENDPOINT_URL="+srv.URL), both + srv.URL},
		{"--endpoint over the environment's", srv.URL, emptyEnv(t, "AWS_ENDPOINT_URL_DYNAMODB=http://dynamodb.example.invalid"), both + srv.URL},
		{"no region", srv.URL, emptyEnv(t, "AWS_ACCESS_KEY_ID=local", "AWS_SECRET_ACCESS_KEY=local"),
			"ddblease: no AWS region; using us-east-1 for the loopback endpoint " + srv.URL},
		{"no credentials", srv.URL, emptyEnv(t, "AWS_REGION=us-east-1"),
			"ddblease: no AWS credentials; using dummy ones for the loopback endpoint " + srv.URL},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := status(c.env, c.endpoint)
			ok(t, r)
			assert.Equal(t, c.want+"\nno jobs in table \""+table+"\"\n", r.stderr)
		})
	}
	// Given both, nothing is said.
	r = status(emptyEnv(t, "AWS_REGION=us-east-1", "AWS_ACCESS_KEY_ID=local", "AWS_SECRET_ACCESS_KEY=local"), srv.URL)
	ok(t, r)
	assert.Equal(t, "no jobs in table \""+table+"\"\n", r.stderr)
	// In JSON, the line is an object as the rest.
	r = cliAt(t, emptyEnv(t), srv.URL, "--table", table, "--log-format", "json", "status")
	ok(t, r)
	var rec map[string]any
	require.NoError(t, json.Unmarshal([]byte(strings.SplitN(r.stderr, "\n", 2)[0]), &rec), r.stderr)
	assert.Equal(t, both+srv.URL, rec["msg"])

	// Any other endpoint: no default.
	const far = "http://dynamodb.example.invalid:8000"
	for _, c := range []struct {
		name, endpoint string
		env            []string
		code           int
		want           string
	}{
		{"none", far, emptyEnv(t), 2, "no AWS region: use --region"},
		{"no credentials", far, emptyEnv(t, "AWS_REGION=us-east-1"), 1, "no AWS credentials found"},
		{"AWS_ENDPOINT_URL_DYNAMODB", "", emptyEnv(t, "AWS_ENDPOINT_URL_DYNAMODB="+far), 2, "no AWS region"},
		{"--endpoint over the environment's", far, emptyEnv(t, "AWS_ENDPOINT_URL_DYNAMODB="+srv.URL, "AWS_REGION=us-east-1"), 1, "no AWS credentials found"},
		{"a name that starts like localhost", "http://localhost.example.invalid:8000", emptyEnv(t), 2, "no AWS region"},
		{"an address that is not loopback", "http://10.0.0.1:8000", emptyEnv(t, "AWS_REGION=us-east-1"), 1, "no AWS credentials found"},
	} {
		t.Run("not loopback: "+c.name, func(t *testing.T) {
			r := status(c.env, c.endpoint)
			fails(t, r, c.code, c.want)
			assert.NotContains(t, r.stderr, "dummy")
		})
	}
}

func TestIsLoopback(t *testing.T) {
	t.Parallel()
	for endpoint, want := range map[string]bool{
		"http://localhost:8000": true, "http://LOCALHOST": true, "https://127.0.0.1:8000": true,
		"http://127.1.2.3:8000": true, "http://[::1]:8000": true, "http://localhost.:8000": true,
		"": false, "localhost:8000": false, "http://localhost.example.com": false, "http://10.0.0.1": false,
		"https://dynamodb.us-east-1.amazonaws.com": false, "http://[::2]:8000": false, "http://128.0.0.1": false,
	} {
		assert.Equal(t, want, isLoopback(endpoint), "%q", endpoint)
	}
}

// A job name the library refuses is a usage error saying what is wrong
// and what a valid one is, from every command that takes one; a valid one
// without a lease is an unknown job.
func TestInvalidJobName(t *testing.T) {
	t.Parallel()
	env := baseEnv()
	table := newTableFor(t)
	valid := "a job name is 1 to 200 bytes of UTF-8 without control characters"
	for _, c := range []struct{ name, job, want string }{
		{"empty", "", "job name is empty"},
		{"control character", "a\x01b", `job name "a\x01b" contains a control character`},
		{"newline", "a\nb", `job name "a\nb" contains a control character`},
		{"too long", strings.Repeat("x", 201), "job name is 201 bytes long, over the limit of 200"},
		{"not UTF-8", "a\xffb", `job name "a\xffb" is not valid UTF-8`},
	} {
		for _, args := range [][]string{
			{"status", "billing", c.job}, {"runs", c.job}, {"resign", c.job}, {"force-release", c.job, "--yes"},
			{"pause", c.job}, {"resume", c.job}, {"trigger", c.job}, {"watch", c.job}, {"exec", c.job, "--", "true"},
		} {
			t.Run(c.name+"/"+args[0], func(t *testing.T) {
				r := cli(t, env, append([]string{"--table", table}, args...)...)
				fails(t, r, 2, c.want+" ("+valid+")")
				assert.NotContains(t, r.stderr, "unknown job")
				assert.NotContains(t, r.stderr, "invalid argument", "the library's wording is left out")
			})
		}
	}
	// A name with white space is valid but rarely meant: unknown, with a hint.
	r := cli(t, env, "--table", table, "status", "a b")
	fails(t, r, 1, `unknown job: "a b"`)
	assert.Contains(t, r.stderr, "(the name holds white space: is it two job names quoted as one?)")
	// Valid, with no lease: unknown.
	for _, job := range []string{"a b", strings.Repeat("x", 200), "ünïcode/job#1"} {
		fails(t, cli(t, env, "--table", table, "status", job), 1, fmt.Sprintf("unknown job: %q", job))
	}
}

// An endpoint that cannot be reached, or that is not DynamoDB, is said in
// plain words with what to check, not as the SDK's text.
func TestUnreachableEndpoint(t *testing.T) {
	t.Parallel()
	env := baseEnv()
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, "<html><body>Not Found</body></html>")
	}))
	defer page.Close()
	refused := "http://" + freeAddr(t)
	for _, c := range []struct{ name, endpoint, want string }{
		{"connection refused", refused, "cannot reach DynamoDB at " + refused + ": connection refused (is the endpoint right? is ddblease local running?)"},
		{"not DynamoDB", page.URL, "the server at " + page.URL + " does not answer as DynamoDB does: HTTP 404 with text/html (is the endpoint right?)"},
		{"TLS to plain HTTP", strings.Replace(page.URL, "http:", "https:", 1),
			"cannot reach DynamoDB at " + strings.Replace(page.URL, "http:", "https:", 1) + ": the server does not speak TLS (is it http:// rather than https://?)"},
		{"no such host", "http://nosuch.invalid:8000", "cannot reach DynamoDB at http://nosuch.invalid:8000: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, args := range [][]string{{"status"}, {"runs", "billing"}, {"create-table"}} {
				r := cliAt(t, env, c.endpoint, append([]string{"--table", "leases"}, args...)...)
				fails(t, r, 1, c.want)
				assert.NotContains(t, r.stderr, "RequestID", "no SDK text")
				assert.NotContains(t, r.stderr, "operation error")
			}
		})
	}
}

// ui's log, a server's, is slog's text lines or, with --log-format json,
// one JSON object per line.
func TestUILogFormat(t *testing.T) {
	t.Parallel()
	table := newTableFor(t)
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			p := startUI(t, baseEnv(), srv.URL, table, "--log-format", format)
			code, _ := p.do(t, "POST", "/api/action", map[string]string{"Origin": "http://evil.example"}, `{"job":"billing","action":"pause"}`)
			require.Equal(t, http.StatusForbidden, code)
			waitFor(t, "the refusal logged", func() bool { return strings.Contains(p.stderr.String(), "refused a cross-site request") })
			line := strings.Split(strings.TrimRight(p.stderr.String(), "\n"), "\n")[0]
			if format == "text" {
				assert.Regexp(t, slogText, line)
				assert.Contains(t, line, `level=WARN msg="refused a cross-site request"`)
				return
			}
			var rec map[string]any
			require.NoError(t, json.Unmarshal([]byte(line), &rec), line)
			assert.Equal(t, "WARN", rec["level"])
			assert.Equal(t, "refused a cross-site request", rec["msg"])
			assert.Equal(t, "http://evil.example", rec["origin"])
		})
	}
}
