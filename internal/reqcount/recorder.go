package reqcount

import (
	"context"
	"maps"
	"sync"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
)

// Recorder remembers the last UpdateItem request of the lease protocol
// the library sent (each sets the renewal version; the write that marks a
// new job listed does not), so that a raw call can send the very same
// request (expressions, names, values and return-value settings),
// whatever the library's expressions become.
type Recorder struct {
	ddblease.DynamoDBAPI
	mu   sync.Mutex
	last *dynamodb.UpdateItemInput
}

// UpdateItem records in and forwards it.
func (r *Recorder) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	if in.ExpressionAttributeValues[":rv"] != nil {
		r.mu.Lock()
		r.last = in
		r.mu.Unlock()
	}
	return r.DynamoDBAPI.UpdateItem(ctx, in, optFns...)
}

// LastUpdate returns the last UpdateItem request sent through r.
func (r *Recorder) LastUpdate() *dynamodb.UpdateItemInput {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// KeepVersion returns a copy of a heartbeat request that writes the renewal
// version held by the item that the acquire request created (":rv" of
// acquire), so that it can be sent again and again: every write of the
// library is conditional on a version it wrote itself, and a heartbeat
// captured right after an acquire accepts the acquire's version.
func KeepVersion(heartbeat, acquire *dynamodb.UpdateItemInput) *dynamodb.UpdateItemInput {
	c := *heartbeat
	c.ExpressionAttributeValues = maps.Clone(heartbeat.ExpressionAttributeValues)
	c.ExpressionAttributeValues[":rv"] = acquire.ExpressionAttributeValues[":rv"]
	return &c
}

// OnKey returns a copy of the request aimed at the lease item of job.
func OnKey(in *dynamodb.UpdateItemInput, job string) *dynamodb.UpdateItemInput {
	c := *in
	c.Key = map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "job#" + job},
		"sk": &types.AttributeValueMemberS{Value: "lease"}}
	return &c
}
