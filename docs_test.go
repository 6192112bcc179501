package ddblease_test

// Checks that the README, docker-compose.yml and ./test say and do the
// same things.

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ./test prints each module's output and result as soon as that module's
// tests end, as its comment and docs/testing.md say, not once all have.
// A stand-in for go on PATH makes one module quick and one slow.
func TestTestScriptPrintsEachModuleWhenDone(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	bin := t.TempDir()
	fake := `#!/usr/bin/env bash
case "$PWD" in
*/ddbleaserobfig) sleep 3; echo "ok  slow module"; exit 1 ;;
*) echo "ok  quick module" ;;
esac
`
	require.NoError(t, os.WriteFile(filepath.Join(bin, "go"), []byte(fake), 0o755))
	cmd := exec.Command("./test", "-count=1")
	cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"DDBLEASE_MODULES=ddbleaserobfig ddbleaseotel", "DDBLEASE_TEST_JOBS=2", "DDBLEASE_TEST_RERUN_FAILS=")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = cmd.Stdout
	start := time.Now()
	require.NoError(t, cmd.Start())
	seen := map[string]time.Duration{}
	var lines []string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if strings.HasPrefix(sc.Text(), "--- module ") {
			seen[sc.Text()] = time.Since(start)
		}
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "the slow module fails, so ./test does: %v", lines)
	quick, ok := seen["--- module ddbleaseotel: ok"]
	require.True(t, ok, "no result line for the quick module: %q", lines)
	slow, ok := seen["--- module ddbleaserobfig: FAIL"]
	require.True(t, ok, "no result line for the slow module: %q", lines)
	assert.Less(t, quick, slow-time.Second, "the quick module's result waited for the slow one: %q", lines)
	assert.Contains(t, lines, "ok  quick module")
	assert.Contains(t, lines, "test: FAILED in: ddbleaserobfig")
}
