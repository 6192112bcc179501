package main

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
)

// itemCounter counts the items the library writes, by what they are (the
// item classes of ddblease.Layout: a pool's member item, that is its
// session; a job's lease item; a job's run items; the directory), and the
// items its reads return. A transaction counts each item it writes, and
// each item it only checks as a "check".
type itemCounter struct {
	ddblease.DynamoDBAPI

	mu     sync.Mutex
	writes map[string]int64 // by item class
	reads  int64            // items returned by GetItem, BatchGetItem and Query
	reqs   int64            // read requests
}

// itemClasses are the classes itemCounter reports, in the order printed.
var itemClasses = []string{"member", "lease", "run", "check", "directory", "other"}

func newItemCounter(db ddblease.DynamoDBAPI) *itemCounter {
	return &itemCounter{DynamoDBAPI: db, writes: map[string]int64{}}
}

// itemClass names the class of the item with key k (the default Layout).
func itemClass(k map[string]types.AttributeValue) string {
	str := func(name string) string {
		if v, ok := k[name].(*types.AttributeValueMemberS); ok {
			return v.Value
		}
		return ""
	}
	pk, sk := str(ddblease.DefaultPartitionKey), str(ddblease.DefaultSortKey)
	switch {
	case pk == "directory":
		return "directory"
	case strings.HasPrefix(sk, "member#"):
		return "member"
	case sk == "lease":
		return "lease"
	case strings.HasPrefix(sk, "run#"):
		return "run"
	}
	return "other"
}

func (c *itemCounter) wrote(k map[string]types.AttributeValue) {
	c.mu.Lock()
	c.writes[itemClass(k)]++
	c.mu.Unlock()
}

func (c *itemCounter) read(items int) {
	c.mu.Lock()
	c.reads += int64(items)
	c.reqs++
	c.mu.Unlock()
}

func (c *itemCounter) PutItem(ctx context.Context, in *dynamodb.PutItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	c.wrote(in.Item)
	return c.DynamoDBAPI.PutItem(ctx, in, optFns...)
}

func (c *itemCounter) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	c.wrote(in.Key)
	return c.DynamoDBAPI.UpdateItem(ctx, in, optFns...)
}

func (c *itemCounter) DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error) {
	c.wrote(in.Key)
	return c.DynamoDBAPI.DeleteItem(ctx, in, optFns...)
}

func (c *itemCounter) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, optFns ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	for _, it := range in.TransactItems {
		switch {
		case it.Put != nil:
			c.wrote(it.Put.Item)
		case it.Update != nil:
			c.wrote(it.Update.Key)
		case it.Delete != nil:
			c.wrote(it.Delete.Key)
		case it.ConditionCheck != nil:
			c.mu.Lock()
			c.writes["check"]++ // a transaction's check of an item (of the lease item's fence, for a claim)
			c.mu.Unlock()
		}
	}
	return c.DynamoDBAPI.TransactWriteItems(ctx, in, optFns...)
}

func (c *itemCounter) GetItem(ctx context.Context, in *dynamodb.GetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	out, err := c.DynamoDBAPI.GetItem(ctx, in, optFns...)
	n := 0
	if err == nil && out.Item != nil {
		n = 1
	}
	c.read(n)
	return out, err
}

func (c *itemCounter) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	out, err := c.DynamoDBAPI.BatchGetItem(ctx, in, optFns...)
	n := 0
	if err == nil {
		for _, items := range out.Responses {
			n += len(items)
		}
	}
	c.read(n)
	return out, err
}

func (c *itemCounter) Query(ctx context.Context, in *dynamodb.QueryInput, optFns ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error) {
	out, err := c.DynamoDBAPI.Query(ctx, in, optFns...)
	n := 0
	if err == nil {
		n = int(out.Count)
	}
	c.read(n)
	return out, err
}

// fields are the counts as key=value fields of an event line.
func (c *itemCounter) fields() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var kv []string
	for _, k := range itemClasses {
		kv = append(kv, fmt.Sprintf("w_%s=%d", k, c.writes[k]))
	}
	return append(kv, fmt.Sprintf("read_items=%d", c.reads), fmt.Sprintf("read_requests=%d", c.reqs))
}
