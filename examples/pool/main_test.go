package main

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ddblease/ddblease/ddbleasetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// mainEnv makes the test binary run the program itself, with the
// arguments in argsEnv (space-separated).
const (
	mainEnv = "POOL_TEST_MAIN"
	argsEnv = "POOL_TEST_ARGS"
)

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) == "1" {
		os.Args = append([]string{"pool"}, strings.Fields(os.Getenv(argsEnv))...)
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// poolSection returns the README's section "## Many jobs: a pool".
func poolSection(t *testing.T) string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	m := regexp.MustCompile("(?s)\n## Many jobs: a pool\n(.*?)\n## ").FindSubmatch(readme)
	require.NotNil(t, m, "README.md has no section ## Many jobs: a pool")
	return string(m[1])
}

// TestREADMELinksThisProgram fails when the README's pool section no
// longer links this program.
func TestREADMELinksThisProgram(t *testing.T) {
	assert.Contains(t, poolSection(t), "(examples/pool/main.go)",
		"README.md's pool section does not link examples/pool/main.go")
}

// TestREADMEPoolSnippetCompiles builds the go block of the README's pool
// section as a package of this module, so that the snippet keeps compiling
// as the library changes. The block is a whole function; it may use the
// packages imported below and nothing else.
func TestREADMEPoolSnippetCompiles(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	m := regexp.MustCompile("(?s)```go\n(.*?)```\n").FindStringSubmatch(poolSection(t))
	require.NotNil(t, m, "README.md's pool section has no go block")
	src := `package snippet

import (
	"context"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/ddblease/ddblease"
)

// Each import is used, whatever the snippet uses of them.
var (
	_ context.Context
	_ = fmt.Sprint
	_ = time.Second
	_ *dynamodb.Client
	_ = ddblease.NewPool
)

` + m[1]
	// A folder of this module (so that it builds with this go.mod), which
	// ./... skips for its leading underscore.
	dir, err := os.MkdirTemp(".", "_readme-snippet-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.WriteFile(filepath.Join(dir, "snippet.go"), []byte(src), 0o644))
	out, err := exec.Command(gobin, "vet", "./"+filepath.Base(dir)).CombinedOutput()
	require.NoError(t, err, "README.md's pool snippet does not build:\n%s\n%s", out, m[1])
}

// TestAloneLeadsEveryJob runs the program as a user does with no flags but
// -for: alone on the in-process server, it leads every job and its own
// checks pass.
func TestAloneLeadsEveryJob(t *testing.T) {
	t.Setenv(ddbleasetest.EndpointEnv, "")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	var out bytes.Buffer
	s := settings{table: "leases", pool: "reports", jobs: []string{"a", "b", "c"},
		every: 500 * time.Millisecond, lease: 3 * time.Second, expect: 3}
	require.NoError(t, run(ctx, s, &out), "output:\n%s", out.String())
	assert.Contains(t, out.String(), "leading 3 of 3: a b c\n")
	assert.Contains(t, out.String(), "stopped: left the pool and resigned every job\n")
}

// TestBadFlagsAreRefused: each wrong flag gets exit status 2 and a message
// naming it.
func TestBadFlagsAreRefused(t *testing.T) {
	for _, tc := range []struct{ args, says string }{
		{"-jobs ,", "-jobs names no job"},
		{"-every 0s", "-every 0s: must be positive"},
		{"-for -1s", "-for -1s: must not be negative"},
		{"-expect 5", "-expect 5: must be between 0 and the number of jobs (4)"},
	} {
		t.Run(tc.args, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), mainEnv+"=1", argsEnv+"="+tc.args)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "output:\n%s", out)
			assert.Equal(t, 2, exit.ExitCode())
			assert.Contains(t, string(out), "pool: "+tc.says)
		})
	}
}

// replicaProc is the program run as a process, its output read line by
// line.
type replicaProc struct {
	t     *testing.T
	name  string
	cmd   *exec.Cmd
	lines chan string
	seen  []string
}

// startReplica runs the program as a process with args on the server at
// endpoint.
func startReplica(t *testing.T, name string, args ...string) *replicaProc {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), mainEnv+"=1", argsEnv+"="+strings.Join(append([]string{"-owner", name}, args...), " "))
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	p := &replicaProc{t: t, name: name, cmd: cmd, lines: make(chan string, 1024)}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	return p
}

// waitFor reads the replica's lines until one matches re, and returns its
// submatches.
func (p *replicaProc) waitFor(re string) []string {
	p.t.Helper()
	rx := regexp.MustCompile(re)
	timeout := time.After(time.Minute)
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				p.t.Fatalf("%s ended before printing a line matching %q; it printed:\n%s", p.name, re, strings.Join(p.seen, "\n"))
			}
			p.seen = append(p.seen, line)
			if m := rx.FindStringSubmatch(line); m != nil {
				return m
			}
		case <-timeout:
			p.t.Fatalf("%s printed no line matching %q in a minute; it printed:\n%s", p.name, re, strings.Join(p.seen, "\n"))
		}
	}
}

// waitForRuns reads the replica's lines until it has printed a run of
// each of jobs.
func (p *replicaProc) waitForRuns(jobs []string) {
	p.t.Helper()
	for {
		runs := p.runs()
		if !slices.ContainsFunc(jobs, func(job string) bool { return len(runs[job]) == 0 }) {
			return
		}
		p.waitFor(`^  \S+: slot \S+, fence \d+$`)
	}
}

// stop sends SIGTERM, reads the rest of the output and requires a clean
// exit (the program's own checks passed).
func (p *replicaProc) stop() {
	p.t.Helper()
	require.NoError(p.t, p.cmd.Process.Signal(syscall.SIGTERM))
	for line := range p.lines {
		p.seen = append(p.seen, line)
	}
	require.NoError(p.t, p.cmd.Wait(), "%s printed:\n%s", p.name, strings.Join(p.seen, "\n"))
	out := strings.Join(p.seen, "\n")
	assert.Contains(p.t, out, "stopped: left the pool and resigned every job", p.name)
	assert.Contains(p.t, out, "checked: ", p.name)
}

// runs returns the runs the replica printed: fences by job and slot.
func (p *replicaProc) runs() map[string]map[string]int64 {
	runs := map[string]map[string]int64{}
	rx := regexp.MustCompile(`^  (\S+): slot (\S+), fence (\d+)$`)
	for _, line := range p.seen {
		if m := rx.FindStringSubmatch(line); m != nil {
			fence, _ := strconv.ParseInt(m[3], 10, 64)
			if runs[m[1]] == nil {
				runs[m[1]] = map[string]int64{}
			}
			runs[m[1]][m[2]] = fence
		}
	}
	return runs
}

// TestTwoReplicasShareAndHandOver runs the program twice against one
// server, as the README's two terminals do: the first alone leads the four
// jobs, the second takes two of them when it joins, and takes the other two
// when the first stops. No slot runs on both, and each hand-over raises the
// job's fence.
func TestTwoReplicasShareAndHandOver(t *testing.T) {
	srv := ddbleasetest.NewServer(t)
	table := srv.NewTable(t)
	args := []string{"-endpoint", srv.URL, "-table", table, "-every", "500ms", "-expect", "4"}
	a := startReplica(t, "replica-a", args...)
	a.waitFor(`^leading 4 of 4: `)

	b := startReplica(t, "replica-b", args...)
	b.waitFor(`^members: replica-a, replica-b$`)
	bJobs := strings.Fields(b.waitFor(`^leading 2 of 4: (.*)$`)[1])
	aJobs := strings.Fields(a.waitFor(`^leading 2 of 4: (.*)$`)[1])
	all := append(slices.Clone(aJobs), bJobs...)
	slices.Sort(all)
	assert.Equal(t, []string{"report-acme", "report-globex", "report-initech", "report-umbrella"}, all,
		"the two replicas lead two jobs each: a %v, b %v", aJobs, bJobs)

	a.stop()
	b.waitFor(`^members: replica-b$`)
	b.waitFor(`^leading 4 of 4: `)
	b.waitForRuns(all) // a job taken between two slots runs at the next
	b.stop()

	aRuns, bRuns := a.runs(), b.runs()
	for job, slots := range bRuns {
		var aMax int64
		for slot, fence := range aRuns[job] {
			assert.NotContains(t, slots, slot, "%s: slot %s ran on both replicas", job, slot)
			aMax = max(aMax, fence)
		}
		for slot, fence := range slots {
			assert.Greater(t, fence, aMax, "%s: slot %s ran on b with a fence no higher than a's", job, slot)
		}
	}
	assert.Len(t, bRuns, 4, "b ran every job once it led them all: %v", bRuns)
}
