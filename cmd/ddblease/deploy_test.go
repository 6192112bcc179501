package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/ddbtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

func deployDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../docs/deploy.md")
	require.NoError(t, err)
	return string(b)
}

// codeBlocks returns the fenced code blocks of a Markdown text in the given
// language.
func codeBlocks(doc, lang string) []string {
	var out []string
	var cur *strings.Builder
	for _, line := range strings.SplitAfter(doc, "\n") {
		trimmed := strings.TrimRight(line, "\n")
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```"):
			if strings.TrimPrefix(trimmed, "```") == lang {
				cur = &strings.Builder{}
			} else {
				cur = &strings.Builder{}
				cur.WriteString("\x00") // a block in another language
			}
		case cur != nil && trimmed == "```":
			if b := cur.String(); !strings.HasPrefix(b, "\x00") {
				out = append(out, b)
			}
			cur = nil
		case cur != nil:
			cur.WriteString(line)
		}
	}
	return out
}

// The definitions in docs/deploy.md are the command's own output.
func TestTableDefinitionsInDocs(t *testing.T) {
	defs := tableDefinitions("leases")
	cfn, tf, found := strings.Cut(defs, "\n# Terraform")
	require.True(t, found)
	tf = "# Terraform" + tf
	doc := deployDoc(t)
	assert.Equal(t, []string{cfn}, codeBlocks(doc, "yaml"))
	assert.Equal(t, []string{tf}, codeBlocks(doc, "hcl"))
	assert.Equal(t, defs, ok(t, cli(t, baseEnv(), "create-table", "--print", "--table", "leases")))
}

// The CloudFormation and Terraform definitions agree with the table that
// CreateTable makes: attribute names and types, key schema, billing.
func TestTableDefinitionsAgreeWithCreateTable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// What CreateTable asks for, from its request as sent, and what the
	// server reports it made.
	rec := &recorder{}
	db := srv.Client(rec.wrap)
	table := "ddblease-def-" + ddbtest.RandomID()
	require.NoError(t, ddblease.CreateTable(ctx, db, table))
	var sent struct {
		AttributeDefinitions []struct{ AttributeName, AttributeType string }
		KeySchema            []struct{ AttributeName, KeyType string }
		BillingMode          string
	}
	require.NoError(t, json.Unmarshal(rec.body("CreateTable"), &sent))
	type kv struct{ Name, Type string }
	var attrs, keys []kv
	for _, a := range sent.AttributeDefinitions {
		attrs = append(attrs, kv{a.AttributeName, a.AttributeType})
	}
	for _, k := range sent.KeySchema {
		keys = append(keys, kv{k.AttributeName, k.KeyType})
	}
	out, err := db.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
	require.NoError(t, err)
	d := out.Table
	var made []kv
	for _, k := range d.KeySchema {
		made = append(made, kv{aws.ToString(k.AttributeName), string(k.KeyType)})
	}
	assert.Equal(t, keys, made, "the server made the key schema asked for")
	for _, a := range d.AttributeDefinitions { // not reported by minidyn
		assert.Contains(t, attrs, kv{aws.ToString(a.AttributeName), string(a.AttributeType)})
	}

	defs := tableDefinitions(table)
	cfnText, tfText, _ := strings.Cut(defs, "\n# Terraform")
	var cfn struct {
		Resources map[string]struct {
			Type       string `yaml:"Type"`
			Properties struct {
				TableName            string `yaml:"TableName"`
				BillingMode          string `yaml:"BillingMode"`
				AttributeDefinitions []struct {
					AttributeName string `yaml:"AttributeName"`
					AttributeType string `yaml:"AttributeType"`
				} `yaml:"AttributeDefinitions"`
				KeySchema []struct {
					AttributeName string `yaml:"AttributeName"`
					KeyType       string `yaml:"KeyType"`
				} `yaml:"KeySchema"`
				TimeToLiveSpecification struct {
					AttributeName string `yaml:"AttributeName"`
					Enabled       bool   `yaml:"Enabled"`
				} `yaml:"TimeToLiveSpecification"`
			} `yaml:"Properties"`
		} `yaml:"Resources"`
	}
	require.NoError(t, yaml.Unmarshal([]byte(cfnText), &cfn))
	res := cfn.Resources["LeaseTable"]
	assert.Equal(t, "AWS::DynamoDB::Table", res.Type)
	p := res.Properties
	assert.Equal(t, table, p.TableName)
	var cAttrs, cKeys []kv
	for _, a := range p.AttributeDefinitions {
		cAttrs = append(cAttrs, kv{a.AttributeName, a.AttributeType})
	}
	for _, k := range p.KeySchema {
		cKeys = append(cKeys, kv{k.AttributeName, k.KeyType})
	}
	assert.Equal(t, attrs, cAttrs)
	assert.Equal(t, keys, cKeys)
	assert.Equal(t, ddblease.RunTTLAttribute, p.TimeToLiveSpecification.AttributeName)
	assert.True(t, p.TimeToLiveSpecification.Enabled)
	if d.BillingModeSummary != nil { // not reported by minidyn
		assert.Equal(t, string(d.BillingModeSummary.BillingMode), p.BillingMode)
	}
	assert.Equal(t, sent.BillingMode, p.BillingMode)

	field := func(block, name string) []string {
		var out []string
		for _, m := range regexp.MustCompile(`(?m)^\s*`+name+`\s*=\s*"([^"]*)"`).FindAllStringSubmatch(block, -1) {
			out = append(out, m[1])
		}
		return out
	}
	attrBlocks := regexp.MustCompile(`(?s)attribute \{(.*?)\}`).FindAllStringSubmatch(tfText, -1)
	var tAttrs []kv
	for _, b := range attrBlocks {
		tAttrs = append(tAttrs, kv{field(b[1], "name")[0], field(b[1], "type")[0]})
	}
	assert.Equal(t, attrs, tAttrs)
	assert.Equal(t, []string{table}, field(tfText, "name")[:1])
	require.Len(t, keys, 1)
	assert.Equal(t, "HASH", keys[0].Type)
	assert.Equal(t, []string{keys[0].Name}, field(tfText, "hash_key"))
	assert.Equal(t, []string{p.BillingMode}, field(tfText, "billing_mode"))
	assert.Equal(t, []string{ddblease.RunTTLAttribute}, field(tfText, "attribute_name"))
}

type policy struct {
	Statement []struct {
		Sid       string
		Effect    string
		Action    []string
		Resource  string
		Condition map[string]map[string][]string
	}
}

// stringLike is IAM's StringLike: * matches any run of characters, ? one.
func stringLike(pattern, s string) bool {
	var re strings.Builder
	re.WriteString("^")
	for _, r := range pattern {
		switch r {
		case '*':
			re.WriteString(".*")
		case '?':
			re.WriteString(".")
		default:
			re.WriteString(regexp.QuoteMeta(string(r)))
		}
	}
	re.WriteString("$")
	return regexp.MustCompile(re.String()).MatchString(s)
}

// iamActions maps a DynamoDB operation to the IAM actions it needs.
func iamActions(op string) []string {
	if op == "TransactWriteItems" { // the actions inside it
		return []string{"dynamodb:ConditionCheckItem", "dynamodb:UpdateItem"}
	}
	return []string{"dynamodb:" + op}
}

// The policies of docs/deploy.md, evaluated against what the library does:
// every request a service's replicas and the command make is allowed by
// the actions listed, and the LeadingKeys patterns of the service policy
// match every item key its jobs write and none of another job's.
func TestIAMPolicies(t *testing.T) {
	blocks := codeBlocks(deployDoc(t), "json")
	var pols []policy
	for _, b := range blocks {
		var p policy
		if json.Unmarshal([]byte(b), &p) == nil && len(p.Statement) > 0 {
			pols = append(pols, p)
		}
	}
	require.Len(t, pols, 2, "the service policy and the operator policy")
	svc, ops := pols[0].Statement[0], pols[1]
	patterns := svc.Condition["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
	require.NotEmpty(t, patterns)
	for _, p := range pols {
		for _, s := range p.Statement {
			assert.Equal(t, "arn:aws:dynamodb:eu-west-1:123456789012:table/leases", s.Resource)
			assert.NotContains(t, s.Action, "dynamodb:*")
		}
	}
	assert.NotContains(t, svc.Action, "dynamodb:Scan", "a Scan has no leading key")
	assert.NotContains(t, svc.Action, "dynamodb:Query")

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	table := "ddblease-iam-" + ddbtest.RandomID()
	require.NoError(t, ddblease.CreateTable(ctx, srv.Client(nil), table))

	// The billing service runs its two jobs; another service runs its own.
	svcFaults := ddbtest.NewFaults(nil)
	svcDB := srv.Client(svcFaults.Wrap)
	var mu sync.Mutex
	fired := map[string]int{}
	fn := func(_ context.Context, run *ddblease.JobRun) error {
		mu.Lock()
		fired[run.Job()]++
		mu.Unlock()
		return nil
	}
	startJob := func(db ddblease.DynamoDBAPI, job string) *ddblease.Lease {
		l, err := ddblease.New(db, table, job, fast("svc-"+job))
		require.NoError(t, err)
		jctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- l.RunSchedule(jctx, ddblease.Every(300*time.Millisecond), fn) }()
		t.Cleanup(func() { stop(); assert.NoError(t, <-done) })
		return l
	}
	own := []string{"billing-nightly", "billing-retry"}
	for _, j := range own {
		startJob(svcDB, j)
	}
	for _, j := range []string{"billing-nightly-eu", "billing", "payments"} {
		startJob(srv.Client(nil), j)
	}

	opsFaults := ddbtest.NewFaults(nil)
	admin, err := ddblease.NewAdmin(srv.Client(opsFaults.Wrap), table)
	require.NoError(t, err)
	waitFor(t, "every job runs", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(fired) == 5
	})
	// Operator actions on one of the service's jobs: a pause (slots
	// skipped), a resume with catch-up, a trigger, a resign request.
	_, err = admin.Pause(ctx, own[0])
	require.NoError(t, err)
	waitFor(t, "a slot skipped by the pause", func() bool {
		runs, err := admin.Runs(ctx, own[0], time.Time{})
		return err == nil && slices.ContainsFunc(runs, func(r ddblease.RunRecord) bool { return r.Status == ddblease.RunSkippedByPause })
	})
	_, err = admin.Resume(ctx, own[0], true)
	require.NoError(t, err)
	tr, err := admin.Trigger(ctx, own[0])
	require.NoError(t, err)
	_, err = admin.WaitRun(ctx, tr, 50*time.Millisecond)
	require.NoError(t, err)
	_, err = admin.RequestResign(ctx, own[1], 0)
	require.NoError(t, err)
	_, err = admin.Jobs(ctx)
	require.NoError(t, err)

	// Every key in the table, by job.
	out, err := srv.Client(nil).Scan(ctx, &dynamodb.ScanInput{TableName: aws.String(table)})
	require.NoError(t, err)
	matches := func(key string) bool {
		return slices.ContainsFunc(patterns, func(p string) bool { return stringLike(p, key) })
	}
	var ownKeys, triggered int
	for _, item := range out.Items {
		var key string
		require.NoError(t, attrString(item["pk"], &key))
		job := ""
		if v, ok := item["job"]; ok {
			require.NoError(t, attrString(v, &job))
		} else {
			job = strings.TrimPrefix(key, "lease#")
		}
		if slices.Contains(own, job) {
			ownKeys++
			if strings.Contains(key, "#trigger-") {
				triggered++
			}
			assert.True(t, matches(key), "the service's own key %q is allowed", key)
		} else {
			assert.False(t, matches(key), "another job's key %q is refused", key)
		}
	}
	assert.Greater(t, ownKeys, 4)
	assert.Equal(t, 1, triggered)

	// Every request made is allowed by the listed actions.
	for op := range svcFaults.Counts() {
		for _, a := range iamActions(op) {
			assert.Contains(t, svc.Action, a, "the replicas call %s", op)
		}
	}
	var opActions []string
	for _, s := range ops.Statement {
		opActions = append(opActions, s.Action...)
	}
	for op := range opsFaults.Counts() {
		for _, a := range iamActions(op) {
			assert.Contains(t, opActions, a, "the command calls %s", op)
		}
	}
	for _, a := range []string{"dynamodb:CreateTable", "dynamodb:DescribeTable", "dynamodb:UpdateTimeToLive"} {
		assert.Contains(t, ops.Statement[1].Action, a)
		assert.NotContains(t, svc.Action, a, "only whoever creates the table")
	}
}

func attrString(v types.AttributeValue, dst *string) error {
	s, ok := v.(*types.AttributeValueMemberS)
	if !ok {
		return fmt.Errorf("not a string: %T", v)
	}
	*dst = s.Value
	return nil
}

// recorder keeps the body of each request, by operation.
type recorder struct {
	mu     sync.Mutex
	base   http.RoundTripper
	bodies map[string][]byte
}

func (r *recorder) wrap(rt http.RoundTripper) http.RoundTripper {
	r.base = rt
	return r
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	b, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	_ = req.Body.Close()
	req.Body = io.NopCloser(bytes.NewReader(b))
	r.mu.Lock()
	if r.bodies == nil {
		r.bodies = map[string][]byte{}
	}
	r.bodies[ddbtest.Op(req)] = b
	r.mu.Unlock()
	return r.base.RoundTrip(req)
}

func (r *recorder) body(op string) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bodies[op]
}

// The command summary in docs/deploy.md is the command's own usage text.
func TestUsageInDocs(t *testing.T) {
	blocks := codeBlocks(deployDoc(t), "")
	i := slices.IndexFunc(blocks, func(b string) bool { return strings.HasPrefix(b, "ddblease [flags] <command>") })
	require.GreaterOrEqual(t, i, 0, "the usage block")
	want := strings.TrimPrefix(usage, "usage: ")
	want = strings.Replace(want, "\ncommands:\n", "\n", 1)
	want = strings.TrimSuffix(want, "\nflags (before or after the command):\n")
	assert.Equal(t, want, blocks[i])
}

// go.mod must not replace anything: `go install …@version` refuses a module
// whose go.mod does (the workspace in go.work links the library instead).
func TestGoModHasNoReplace(t *testing.T) {
	b, err := os.ReadFile("go.mod")
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		assert.False(t, strings.HasPrefix(strings.TrimSpace(line), "replace"), "go.mod: %s", line)
	}
	w, err := os.ReadFile("go.work")
	require.NoError(t, err)
	assert.Contains(t, string(w), "replace github.com/ddblease/ddblease => ../..")
}
