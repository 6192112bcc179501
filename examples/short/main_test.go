package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ddblease/ddblease/internal/leakcheck"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := leakcheck.Find(5 * time.Second); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// TestREADMEShowsThisProgram fails when the README's quick start and this
// file differ: the first go block under "## Quick start" must be main.go,
// whole, so that a module made from the README alone builds it.
func TestREADMEShowsThisProgram(t *testing.T) {
	src, err := os.ReadFile("main.go")
	require.NoError(t, err)
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	m := regexp.MustCompile("(?s)\n## Quick start\n.*?```go\n(.*?)```\n").FindSubmatch(readme)
	require.NotNil(t, m, "README.md has no go block under ## Quick start")
	assert.Equal(t, strings.TrimSpace(string(src)), strings.TrimSpace(string(m[1])),
		"README.md's quick start differs from examples/short/main.go; copy the file into the README")
}

// TestWritesOneInvoicePerRun runs the program as a user would, with
// -runs 2, on the in-process server (or DDBLEASE_TEST_ENDPOINT's), and
// reads what it printed: two invoices, then the resignation.
func TestWritesOneInvoicePerRun(t *testing.T) {
	out := runMain(t, "-runs", "2", "-every", "200ms")
	invoices := regexp.MustCompile(`(?m)^wrote invoice billing-nightly#\S+ with fence [1-9][0-9]*$`).FindAllString(out, -1)
	assert.Len(t, invoices, 2, "output:\n%s", out)
	assert.True(t, strings.HasSuffix(out, "stopped and resigned the lease\n"), "output:\n%s", out)
}

// runMain calls main with args, as the command line would, and returns
// what it wrote to standard output.
func runMain(t *testing.T, args ...string) string {
	oldArgs, oldFlags, oldStdout := os.Args, flag.CommandLine, os.Stdout
	r, w, err := os.Pipe()
	require.NoError(t, err)
	read := make(chan string)
	go func() {
		var b bytes.Buffer
		_, _ = io.Copy(&b, r)
		read <- b.String()
	}()
	os.Args = append([]string{"short"}, args...)
	flag.CommandLine = flag.NewFlagSet("short", flag.ExitOnError)
	os.Stdout = w
	defer func() { os.Args, flag.CommandLine, os.Stdout = oldArgs, oldFlags, oldStdout }()
	main()
	require.NoError(t, w.Close())
	return <-read
}
