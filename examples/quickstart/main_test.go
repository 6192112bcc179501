package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease/ddbleasetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mainEnv makes the test binary run the program itself, with the
// arguments in argsEnv (space-separated).
const (
	mainEnv = "QUICKSTART_TEST_MAIN"
	argsEnv = "QUICKSTART_TEST_ARGS"
)

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) == "1" {
		os.Args = append([]string{"quickstart"}, strings.Fields(os.Getenv(argsEnv))...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestREADMELinksThisProgram fails when the README's quick start no longer
// links this program, the full one (the README shows examples/short).
func TestREADMELinksThisProgram(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	m := regexp.MustCompile("(?s)\n## Quick start\n(.*?)\n## ").FindSubmatch(readme)
	require.NotNil(t, m, "README.md has no section ## Quick start")
	assert.Contains(t, string(m[1]), "(examples/quickstart/main.go)",
		"README.md's quick start does not link examples/quickstart/main.go")
}

// TestWritesOneInvoicePerRun runs the program on a server given with
// -endpoint (DDBLEASE_TEST_ENDPOINT's, or an in-process one) and reads
// back what it wrote.
func TestWritesOneInvoicePerRun(t *testing.T) {
	srv := ddbleasetest.NewServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	require.NoError(t, run(ctx, srv.URL, "", time.Second, 2))

	db := srv.Client()
	out, err := db.Scan(ctx, &dynamodb.ScanInput{TableName: aws.String("invoices"), ConsistentRead: aws.Bool(true)})
	require.NoError(t, err)
	// The newest tenure is this run's: count the invoices with its fence.
	byFence := map[int64][]string{}
	var newest int64
	for _, item := range out.Items {
		pk := item["pk"].(*types.AttributeValueMemberS).Value
		require.Contains(t, item, "fence", "the guard stores the fence in invoice %s", pk)
		fence, err := strconv.ParseInt(item["fence"].(*types.AttributeValueMemberN).Value, 10, 64)
		require.NoError(t, err)
		byFence[fence] = append(byFence[fence], pk)
		newest = max(newest, fence)
	}
	assert.Len(t, byFence[newest], 2, "one invoice per run: %v", byFence[newest])
	for _, pk := range byFence[newest] {
		slot, err := time.Parse(time.RFC3339, strings.TrimPrefix(pk, "billing-nightly#"))
		require.NoError(t, err, "invoice key %q", pk)
		assert.False(t, slot.Before(start.Add(-time.Second)), "invoice %s is for a slot before the run", pk)
	}

	lease, err := db.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String("leases"),
		Key: map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "job#billing-nightly"},
			"sk": &types.AttributeValueMemberS{Value: "lease"}}, ConsistentRead: aws.Bool(true)})
	require.NoError(t, err)
	assert.NotEmpty(t, lease.Item, "the lease item is in the leases table")
}

// TestInProcessByDefault runs the program as a user does with no flags.
func TestInProcessByDefault(t *testing.T) {
	t.Setenv(ddbleasetest.EndpointEnv, "")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	assert.NoError(t, run(ctx, "", "", time.Second, 1))
}

// TestSIGTERMStopsAndResigns runs the program as a process and stops it
// with SIGTERM after its first invoice.
func TestSIGTERMStopsAndResigns(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), mainEnv+"=1", argsEnv+"=-every 1s -runs 1000", ddbleasetest.EndpointEnv+"=")
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	sc := bufio.NewScanner(stdout)
	var out []string
	signalled := false
	for sc.Scan() {
		out = append(out, sc.Text())
		if !signalled && strings.Contains(sc.Text(), "wrote invoice") {
			require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
			signalled = true
		}
	}
	require.NoError(t, cmd.Wait(), "output:\n%s", strings.Join(out, "\n"))
	require.True(t, signalled, "no invoice written:\n%s", strings.Join(out, "\n"))
	assert.Contains(t, strings.Join(out, "\n"), "stopped and resigned the lease")
}
