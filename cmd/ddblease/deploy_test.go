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
	"github.com/ddblease/ddblease/ddbleasetest"
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
	t.Parallel()
	defs, err := tableDefinitions("leases", ddblease.Layout{})
	require.NoError(t, err)
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
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// What CreateTable asks for, from its request as sent, and what the
	// server reports it made.
	rec := &recorder{}
	db := srv.Client(rec.wrap)
	table := "ddblease-def-" + ddbleasetest.RandomID()
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

	defs, err := tableDefinitions(table, ddblease.Layout{})
	require.NoError(t, err)
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
	require.Len(t, keys, 2)
	assert.Equal(t, "HASH", keys[0].Type)
	assert.Equal(t, "RANGE", keys[1].Type)
	assert.Equal(t, []string{keys[0].Name}, field(tfText, "hash_key"))
	assert.Equal(t, []string{keys[1].Name}, field(tfText, "range_key"))
	assert.Equal(t, []string{p.BillingMode}, field(tfText, "billing_mode"))
	assert.Equal(t, []string{ddblease.RunTTLAttribute}, field(tfText, "attribute_name"))
}

type policy struct {
	Statement []statement
}

type statement struct {
	Sid       string
	Effect    string
	Action    []string
	Resource  string
	Condition map[string]map[string][]string
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

// access is one IAM action a request needs, with the partition keys it
// touches (dynamodb:LeadingKeys).
type access struct {
	action string
	keys   []string
}

// allows evaluates p as IAM does for one access on the table: some Allow
// statement lists the action, and, if it has a LeadingKeys condition
// (ForAllValues:StringLike), every leading key matches one of its
// patterns. A request with no leading key (a Scan) passes such a
// condition: ForAllValues over an empty set is true.
func (p policy) allows(a access) bool {
	for _, s := range p.Statement {
		if s.Effect != "Allow" || !slices.Contains(s.Action, a.action) {
			continue
		}
		patterns, conditioned := s.Condition["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
		if !conditioned || !slices.ContainsFunc(a.keys, func(k string) bool {
			return !slices.ContainsFunc(patterns, func(p string) bool { return stringLike(p, k) })
		}) {
			return true
		}
	}
	return false
}

// accessLog records, for every request a client sends, the IAM actions it
// needs and the partition keys they touch.
type accessLog struct {
	base http.RoundTripper
	mu   sync.Mutex
	log  []access
}

func (l *accessLog) wrap(rt http.RoundTripper) http.RoundTripper {
	l.base = rt
	return l
}

func (l *accessLog) RoundTrip(req *http.Request) (*http.Response, error) {
	b, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	_ = req.Body.Close()
	req.Body = io.NopCloser(bytes.NewReader(b))
	accesses, err := accessesOf(ddbleasetest.Op(req), b)
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.log = append(l.log, accesses...)
	l.mu.Unlock()
	return l.base.RoundTrip(req)
}

func (l *accessLog) all() []access {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.log)
}

// keyJSON is an item key or an item as sent: its pk.
type keyJSON struct {
	Pk struct{ S string } `json:"pk"`
}

// accessesOf reads the IAM actions and leading keys of a request of
// operation op with body b (the default layout: the partition key is pk,
// and a Query names its value :pk).
func accessesOf(op string, b []byte) ([]access, error) {
	var in struct {
		Key, Item                 *keyJSON
		RequestItems              map[string]struct{ Keys []keyJSON }
		ExpressionAttributeValues map[string]struct{ S string }
		TransactItems             []map[string]struct {
			Key  *keyJSON
			Item *keyJSON
		}
	}
	if err := json.Unmarshal(b, &in); err != nil {
		return nil, err
	}
	switch op {
	case "GetItem", "UpdateItem", "DeleteItem":
		return []access{{"dynamodb:" + op, []string{in.Key.Pk.S}}}, nil
	case "PutItem":
		return []access{{"dynamodb:PutItem", []string{in.Item.Pk.S}}}, nil
	case "BatchGetItem":
		var keys []string
		for _, r := range in.RequestItems {
			for _, k := range r.Keys {
				keys = append(keys, k.Pk.S)
			}
		}
		return []access{{"dynamodb:BatchGetItem", keys}}, nil
	case "Query":
		return []access{{"dynamodb:Query", []string{in.ExpressionAttributeValues[":pk"].S}}}, nil
	case "TransactWriteItems":
		var out []access
		names := map[string]string{"ConditionCheck": "ConditionCheckItem", "Update": "UpdateItem", "Put": "PutItem", "Delete": "DeleteItem"}
		for _, it := range in.TransactItems {
			for kind, a := range it {
				k := a.Key
				if k == nil {
					k = a.Item
				}
				out = append(out, access{"dynamodb:" + names[kind], []string{k.Pk.S}})
			}
		}
		return out, nil
	}
	return []access{{"dynamodb:" + op, nil}}, nil // no leading key
}

// The policies of docs/deploy.md, evaluated as IAM would against every
// request the library and the command really make: the service's replicas
// (two jobs and a pool) are allowed every request they make, and refused
// every request another service's replicas make on their jobs and pools;
// the operator is allowed every request of the command, the listings
// included, by key.
func TestIAMPolicies(t *testing.T) {
	t.Parallel()
	blocks := codeBlocks(deployDoc(t), "json")
	var pols []policy
	for _, b := range blocks {
		var p policy
		if json.Unmarshal([]byte(b), &p) == nil && len(p.Statement) > 0 {
			pols = append(pols, p)
		}
	}
	require.Len(t, pols, 2, "the service policy and the operator policy")
	svc, ops := pols[0], pols[1]
	for _, p := range pols {
		for _, s := range p.Statement {
			assert.Equal(t, "arn:aws:dynamodb:eu-west-1:123456789012:table/leases", s.Resource)
			assert.NotContains(t, s.Action, "dynamodb:*")
			assert.NotContains(t, s.Action, "dynamodb:Scan", "a Scan has no leading key")
		}
	}
	for _, s := range svc.Statement {
		assert.NotEmpty(t, s.Condition["ForAllValues:StringLike"]["dynamodb:LeadingKeys"], "%s is confined to keys", s.Sid)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	table := "ddblease-iam-" + ddbleasetest.RandomID()
	require.NoError(t, ddblease.CreateTable(ctx, srv.Client(nil), table))

	// The billing service runs its two jobs and its pool; another service
	// runs jobs whose names start alike, and a pool of its own.
	svcLog, otherLog := &accessLog{}, &accessLog{}
	svcDB, otherDB := srv.Client(svcLog.wrap), srv.Client(otherLog.wrap)
	var mu sync.Mutex
	fired := map[string]int{}
	fn := func(_ context.Context, run *ddblease.JobRun) error {
		mu.Lock()
		fired[run.Job()]++
		mu.Unlock()
		return nil
	}
	background := func(run func(context.Context) error) {
		jctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- run(jctx) }()
		t.Cleanup(func() { stop(); assert.NoError(t, <-done) })
	}
	startJob := func(db ddblease.DynamoDBAPI, job string) {
		l, err := ddblease.New(db, table, job, fast("svc-"+job))
		require.NoError(t, err)
		background(func(ctx context.Context) error { return l.RunSchedule(ctx, ddblease.Every(300*time.Millisecond), fn) })
	}
	startPool := func(db ddblease.DynamoDBAPI, name string, jobs []string) {
		p, err := ddblease.NewPool(db, table, name, jobs, fast("pool-"+name))
		require.NoError(t, err)
		background(func(ctx context.Context) error {
			return p.Run(ctx, func(ctx context.Context, job string, _ int64) error {
				mu.Lock()
				fired[job]++
				mu.Unlock()
				<-ctx.Done()
				return nil
			})
		})
	}
	own := []string{"billing-nightly", "billing-retry"}
	for _, j := range own {
		startJob(svcDB, j)
	}
	startPool(svcDB, "billing-shards", []string{"billing-shard-1", "billing-shard-2"})
	for _, j := range []string{"billing-nightly-eu", "billing", "payments"} {
		startJob(otherDB, j)
	}
	startPool(otherDB, "billing-shards-eu", []string{"billing-shard", "payments-shard-1"})

	opsLog := &accessLog{}
	admin, err := ddblease.NewAdmin(srv.Client(opsLog.wrap), table)
	require.NoError(t, err)
	waitFor(t, "every job runs", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(fired) == 9
	})
	// Operator actions on one of the service's jobs: a pause (slots
	// skipped), a resume with catch-up, a trigger, a resign request; the
	// listings of status, runs and watch.
	_, err = admin.Pause(ctx, own[0])
	require.NoError(t, err)
	waitFor(t, "a slot skipped by the pause", func() bool {
		runs, err := admin.Runs(ctx, own[0], ddblease.RunRange{})
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
	jobs, err := admin.Jobs(ctx)
	require.NoError(t, err)
	assert.Len(t, jobs, 9, "the directory lists every job")
	pools, err := admin.Pools(ctx)
	require.NoError(t, err)
	assert.Len(t, pools, 2)
	_, err = admin.Runs(ctx, own[1], ddblease.RunRange{Newest: true, Limit: 5})
	require.NoError(t, err)

	svcAccess, otherAccess := svcLog.all(), otherLog.all()
	actions := map[string]bool{}
	for _, a := range svcAccess {
		actions[a.action] = true
		assert.True(t, svc.allows(a), "the service's %s on %v is allowed", a.action, a.keys)
	}
	for _, a := range []string{"dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:PutItem", "dynamodb:Query", "dynamodb:BatchGetItem"} {
		assert.True(t, actions[a], "the service's replicas made a %s, so the policy was evaluated for it", a)
	}
	refused := 0
	for _, a := range otherAccess {
		if a.action == "dynamodb:PutItem" && slices.Equal(a.keys, []string{"directory"}) {
			continue // the directory is shared: an entry fences nothing
		}
		assert.False(t, svc.allows(a), "another service's %s on %v is refused", a.action, a.keys)
		refused++
	}
	assert.Greater(t, refused, 10)
	for _, a := range opsLog.all() {
		assert.True(t, ops.allows(a), "the operator's %s on %v is allowed", a.action, a.keys)
		assert.NotEqual(t, "dynamodb:Scan", a.action)
	}
	for _, a := range []string{"dynamodb:CreateTable", "dynamodb:DescribeTable", "dynamodb:UpdateTimeToLive"} {
		assert.True(t, ops.allows(access{a, nil}), "the operator may %s", a)
		assert.False(t, svc.allows(access{a, nil}), "only whoever creates the table may %s", a)
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
	r.bodies[ddbleasetest.Op(req)] = b
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
	t.Parallel()
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
	t.Parallel()
	b, err := os.ReadFile("go.mod")
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		assert.False(t, strings.HasPrefix(strings.TrimSpace(line), "replace"), "go.mod: %s", line)
	}
	w, err := os.ReadFile("go.work")
	require.NoError(t, err)
	assert.Contains(t, string(w), "replace github.com/ddblease/ddblease => ../..")
}
