package reqcount

import (
	"context"
	"sync"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/ddblease/ddblease"
)

// Recorder remembers the last UpdateItem request the library sent, so that
// a raw call can send the very same request (expressions, names, values
// and return-value settings), whatever the library's expressions become.
type Recorder struct {
	ddblease.DynamoDBAPI
	mu   sync.Mutex
	last *dynamodb.UpdateItemInput
}

// UpdateItem records in and forwards it.
func (r *Recorder) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	r.mu.Lock()
	r.last = in
	r.mu.Unlock()
	return r.DynamoDBAPI.UpdateItem(ctx, in, optFns...)
}

// LastUpdate returns the last UpdateItem request sent through r.
func (r *Recorder) LastUpdate() *dynamodb.UpdateItemInput {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}
