package ddblease_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/ddblease/ddblease"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// iamPolicy is an IAM policy as docs/deploy.md writes them.
type iamPolicy struct {
	Statement []struct {
		Sid, Effect string
		Action      []string
		Condition   map[string]map[string][]string
	}
}

// servicePolicy returns the replicas' least-privilege policy of
// docs/deploy.md: its first JSON block with statements.
func servicePolicy(t *testing.T) iamPolicy {
	t.Helper()
	doc := readRepoFile(t, "docs/deploy.md")
	for _, block := range strings.Split(doc, "```json\n")[1:] {
		var p iamPolicy
		body, _, _ := strings.Cut(block, "```")
		if json.Unmarshal([]byte(body), &p) == nil && len(p.Statement) > 0 {
			return p
		}
	}
	t.Fatal("docs/deploy.md has no IAM policy")
	return iamPolicy{}
}

// allows evaluates p as IAM does for an action on the table touching the
// partitions keys (dynamodb:LeadingKeys, ForAllValues:StringLike): some
// Allow statement lists the action and, if it has the condition, each key
// matches one of its patterns.
func (p iamPolicy) allows(action string, keys []string) bool {
	like := func(pattern, s string) bool {
		re := "^" + strings.ReplaceAll(regexp.QuoteMeta(pattern), `\*`, ".*") + "$"
		return regexp.MustCompile(re).MatchString(s)
	}
	for _, s := range p.Statement {
		if s.Effect != "Allow" || !slices.Contains(s.Action, action) {
			continue
		}
		patterns, conditioned := s.Condition["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
		if !conditioned || !slices.ContainsFunc(keys, func(k string) bool {
			return !slices.ContainsFunc(patterns, func(p string) bool { return like(p, k) })
		}) {
			return true
		}
	}
	return false
}

// policyClient runs the library under an IAM policy: each request the
// policy does not allow is refused as DynamoDB refuses it
// (AccessDeniedException), and recorded.
type policyClient struct {
	ddblease.DynamoDBAPI
	pol     iamPolicy
	mu      sync.Mutex
	refused []string
}

func (c *policyClient) check(op string, keys ...string) error {
	if c.pol.allows("dynamodb:"+op, keys) {
		return nil
	}
	c.mu.Lock()
	c.refused = append(c.refused, fmt.Sprintf("%s on %v", op, keys))
	c.mu.Unlock()
	return &smithy.GenericAPIError{Code: "AccessDeniedException", Fault: smithy.FaultClient,
		Message: fmt.Sprintf("not authorized to perform dynamodb:%s on %v", op, keys)}
}

func (c *policyClient) refusals() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.refused)
}

func pkOf(item map[string]types.AttributeValue) string {
	s, _ := item["pk"].(*types.AttributeValueMemberS)
	if s == nil {
		return ""
	}
	return s.Value
}

func (c *policyClient) GetItem(ctx context.Context, in *dynamodb.GetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	if err := c.check("GetItem", pkOf(in.Key)); err != nil {
		return nil, err
	}
	return c.DynamoDBAPI.GetItem(ctx, in, optFns...)
}

func (c *policyClient) PutItem(ctx context.Context, in *dynamodb.PutItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	if err := c.check("PutItem", pkOf(in.Item)); err != nil {
		return nil, err
	}
	return c.DynamoDBAPI.PutItem(ctx, in, optFns...)
}

func (c *policyClient) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if err := c.check("UpdateItem", pkOf(in.Key)); err != nil {
		return nil, err
	}
	return c.DynamoDBAPI.UpdateItem(ctx, in, optFns...)
}

func (c *policyClient) DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error) {
	if err := c.check("DeleteItem", pkOf(in.Key)); err != nil {
		return nil, err
	}
	return c.DynamoDBAPI.DeleteItem(ctx, in, optFns...)
}

func (c *policyClient) Query(ctx context.Context, in *dynamodb.QueryInput, optFns ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error) {
	if err := c.check("Query", pkOf(map[string]types.AttributeValue{"pk": in.ExpressionAttributeValues[":pk"]})); err != nil {
		return nil, err
	}
	return c.DynamoDBAPI.Query(ctx, in, optFns...)
}

func (c *policyClient) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	var keys []string
	for _, r := range in.RequestItems {
		for _, k := range r.Keys {
			keys = append(keys, pkOf(k))
		}
	}
	if err := c.check("BatchGetItem", keys...); err != nil {
		return nil, err
	}
	return c.DynamoDBAPI.BatchGetItem(ctx, in, optFns...)
}

func (c *policyClient) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, optFns ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	for _, it := range in.TransactItems {
		var err error
		switch {
		case it.ConditionCheck != nil:
			err = c.check("ConditionCheckItem", pkOf(it.ConditionCheck.Key))
		case it.Update != nil:
			err = c.check("UpdateItem", pkOf(it.Update.Key))
		case it.Put != nil:
			err = c.check("PutItem", pkOf(it.Put.Item))
		case it.Delete != nil:
			err = c.check("DeleteItem", pkOf(it.Delete.Key))
		}
		if err != nil {
			return nil, err
		}
	}
	return c.DynamoDBAPI.TransactWriteItems(ctx, in, optFns...)
}

func (c *policyClient) DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error) {
	if err := c.check("DescribeTable"); err != nil {
		return nil, err
	}
	return c.DynamoDBAPI.DescribeTable(ctx, in, optFns...)
}

func (c *policyClient) CreateTable(ctx context.Context, in *dynamodb.CreateTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error) {
	if err := c.check("CreateTable"); err != nil {
		return nil, err
	}
	return c.DynamoDBAPI.CreateTable(ctx, in, optFns...)
}

// warnings returns the Warn lines of c whose message contains s.
func warnings(c *logCapture, s string) []logRecord {
	var out []logRecord
	for _, r := range c.all() {
		if r.level == slog.LevelWarn && strings.Contains(r.msg, s) {
			out = append(out, r)
		}
	}
	return out
}

// Two processes that run one pool under one Owner end each other's
// sessions; each says so in a warning, also under the least-privilege
// policy of docs/deploy.md, which grants the pool's replicas a Query of
// its partition and no GetItem there: every request the two make is one
// the policy allows.
func TestPoolTwoProcessesWithOneOwnerWarnUnderTheDocumentedPolicy(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	client := &policyClient{DynamoDBAPI: db, pol: servicePolicy(t)}
	jobs := []string{"billing-shard-1", "billing-shard-2", "billing-shard-3", "billing-shard-4"}
	logs := [2]*logCapture{newLogCapture(), newLogCapture()}
	var stops []func() error
	for i := range logs {
		p, err := ddblease.NewPool(client, table, "billing-shards", jobs, fast("billing-service"),
			func(o *ddblease.Options) { o.Logger = slog.New(logs[i]) })
		require.NoError(t, err)
		stops = append(stops, async(ctx, func(ctx context.Context) error {
			return p.Run(ctx, func(ctx context.Context, _ string, _ int64) error { <-ctx.Done(); return nil })
		}))
	}
	const replaced = "runs this pool under this replica's Owner"
	eventually(t, "both processes warn", func() bool {
		return len(warnings(logs[0], replaced)) > 0 && len(warnings(logs[1], replaced)) > 0
	})
	for _, stop := range stops {
		assert.NoError(t, stop())
	}
	assert.Empty(t, client.refusals(), "requests the documented policy refuses")
	for _, c := range logs {
		assert.Empty(t, warnings(c, "could not read"), "no read failed")
	}
}

// memberReadFails decorates a pool's client: its Query of one member item
// alone (the read of the member whose renewal was refused) fails; the
// read of every member, each renewal's, goes through.
type memberReadFails struct{ ddblease.DynamoDBAPI }

func (c memberReadFails) Query(ctx context.Context, in *dynamodb.QueryInput, optFns ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error) {
	lo, _ := in.ExpressionAttributeValues[":lo"].(*types.AttributeValueMemberS)
	hi, _ := in.ExpressionAttributeValues[":hi"].(*types.AttributeValueMemberS)
	if lo != nil && hi != nil && lo.Value == hi.Value && strings.HasPrefix(lo.Value, "member#") {
		return nil, &smithy.GenericAPIError{Code: "InternalServerError", Message: "injected: the read failed", Fault: smithy.FaultServer}
	}
	return c.DynamoDBAPI.Query(ctx, in, optFns...)
}

// The read that tells whether another process replaced this replica's
// session is not dropped when it fails: the replica says it could not
// tell, with the read's error.
func TestPoolReplacedSessionReadFailureIsLogged(t *testing.T) {
	t.Parallel()
	ctx := withTimeout(t, 60*time.Second)
	table, db := tableAndClient(t)
	jobs := poolJobs(2)
	logs := newLogCapture()
	p := newPool(t, memberReadFails{db}, table, jobs, fast("a"), func(o *ddblease.Options) { o.Logger = slog.New(logs) })
	stop := async(ctx, func(ctx context.Context) error {
		return p.Run(ctx, func(ctx context.Context, _ string, _ int64) error { <-ctx.Done(); return nil })
	})
	eventually(t, "a leads every job", func() bool { return len(leaders(p, jobs)) == 2 })
	// Another process's session replaces a's in its member item.
	_, err := db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(table), Key: map[string]types.AttributeValue{"pk": sAttr("pool#reports"), "sk": sAttr("member#a")},
		UpdateExpression:          aws.String("SET #sid = :sid"),
		ExpressionAttributeNames:  map[string]string{"#sid": "sid"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":sid": sAttr("another-process")},
	})
	require.NoError(t, err)
	eventually(t, "the failed read logged", func() bool { return len(warnings(logs, "could not read")) > 0 })
	w := warnings(logs, "could not read")[0]
	assert.Contains(t, w.attrs["err"], "injected: the read failed")
	assert.Equal(t, "pool#reports/member#a", w.attrs["member"])
	require.NoError(t, stop())
}
