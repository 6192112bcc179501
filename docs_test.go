package ddblease_test

// Checks that the README, docker-compose.yml, docs/testing.md and ./test
// say and do the same things.

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

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

// readRepoFile returns a file of the repository as text.
func readRepoFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// The README reads in one pass: at most 400 lines (details belong in
// docs/*), no line wider than 100 characters, and each term it relies on
// links, where it is first used, to its definition under "Terms".
func TestREADMEReadsInOnePass(t *testing.T) {
	readme := readRepoFile(t, "README.md")
	if n := strings.Count(readme, "\n"); n > 400 {
		t.Errorf("README.md has %d lines, more than 400: move details to docs/* and link them", n)
	}
	for i, line := range strings.Split(readme, "\n") {
		if n := utf8.RuneCountInString(line); n > 100 {
			t.Errorf("README.md:%d is %d characters long: %s", i+1, n, line)
		}
	}
	flat := strings.Join(strings.Fields(readme), " ")
	_, glossary, ok := strings.Cut(flat, "## Terms ")
	require.True(t, ok, `README.md has no "## Terms" section`)
	glossary, _, _ = strings.Cut(glossary, " ## ")
	for _, term := range []string{"tenure", "fence", "slot", "drain", "high-water mark", "session"} {
		first := regexp.MustCompile(`(?i)\b` + strings.ReplaceAll(regexp.QuoteMeta(term), " ", `\s+`) + `(s|ed|ing)?\b`).
			FindStringIndex(flat)
		require.NotNil(t, first, "README.md never says %q", term)
		used := flat[first[0]:first[1]]
		if !strings.HasSuffix(flat[:first[0]], "[") || !strings.HasPrefix(flat[first[1]:], "](#terms)") {
			t.Errorf("README.md first says %q in %q, without a link to its definition under Terms ([%s](#terms))",
				used, flat[max(0, first[0]-60):min(len(flat), first[1]+40)], used)
		}
		assert.Contains(t, glossary, "- **"+term+"**:", "Terms does not define %q", term)
	}

	// The caveat of Guard.Put is said in prose, not only in a table cell.
	assert.Contains(t, flat, "a stale leader's write is accepted when no newer tenure wrote that item")
	for i, line := range strings.Split(readme, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "|") && strings.Contains(line, "Guard.Put") {
			t.Errorf("README.md:%d: Guard.Put in a table cell: %s", i+1, line)
		}
	}

	// The quick start says why it imports a test package.
	_, quick, _ := strings.Cut(flat, "## Quick start ")
	quick, _, _ = strings.Cut(quick, "```go")
	assert.Contains(t, quick, "imports `ddbleasetest`", "the quick start does not say why it imports ddbleasetest")
}

// docker-compose.yml starts the servers on the ports docs/testing.md
// gives, with dynalite behind ddbrelay and DynamoDB Local warmed.
func TestComposeMatchesTheDocs(t *testing.T) {
	services := map[string]string{}
	var name string
	for _, line := range strings.Split(readRepoFile(t, "docker-compose.yml"), "\n") {
		switch {
		case line == "" || strings.HasPrefix(strings.TrimSpace(line), "#"):
		case !strings.HasPrefix(line, " "):
			name = ""
		case strings.HasPrefix(line, "  ") && !strings.HasPrefix(line, "   ") && strings.HasSuffix(line, ":"):
			name = strings.TrimSuffix(strings.TrimSpace(line), ":")
		case name != "":
			services[name] += strings.TrimSpace(line) + "\n"
		}
	}
	require.Contains(t, services, "dynamodb-local")
	assert.Contains(t, services["dynamodb-local"], `- "8000:8000"`)
	assert.Contains(t, services["dynamodb-local"], `"-sharedDb"`)
	var warm, relay string
	for n, s := range services {
		if strings.Contains(s, "./internal/cmd/ddbwarm") {
			warm = n
		}
		if strings.Contains(s, "./internal/cmd/ddbrelay") {
			relay = n
		}
	}
	require.NotEmpty(t, warm, "no service runs internal/cmd/ddbwarm")
	assert.Contains(t, services[warm], `"-endpoint", "http://dynamodb-local:8000"`)
	require.NotEmpty(t, relay, "no service runs internal/cmd/ddbrelay")
	assert.Contains(t, services[relay], `"-upstream", "http://dynalite:4567"`)
	assert.Contains(t, services[relay], `- "8123:8123"`)
	require.Contains(t, services, "dynalite")
	assert.Contains(t, services["dynalite"], `"4567"`)
	assert.NotContains(t, services["dynalite"], "ports:", "dynalite is reached only through the relay")

	doc := readRepoFile(t, "docs/testing.md")
	assert.Contains(t, doc, "DDBLEASE_TEST_ENDPOINT=http://127.0.0.1:8000 ./test  # DynamoDB Local")
	assert.Contains(t, doc, "DDBLEASE_TEST_ENDPOINT=http://127.0.0.1:8123 ./test  # dynalite, through ddbrelay")
	assert.Contains(t, doc, "docker compose up -d && docker compose wait dynamodb-local-warm   # DynamoDB Local on 8000, dynalite through ddbrelay on 8123")
	assert.Equal(t, "dynamodb-local-warm", warm)
}
