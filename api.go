package ddblease

import (
	"context"
	"reflect"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// This file owns the DynamoDB calls the library makes (DynamoDBAPI), the
// check of a client given to it, and the strongly consistent read of one
// item by key (getItem).

// DynamoDBAPI is the part of the DynamoDB client that this package uses.
// *dynamodb.Client satisfies it; wrap it to count or intercept calls.
type DynamoDBAPI interface {
	GetItem(ctx context.Context, params *dynamodb.GetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error)
	PutItem(ctx context.Context, params *dynamodb.PutItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error)
	UpdateItem(ctx context.Context, params *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error)
	DeleteItem(ctx context.Context, params *dynamodb.DeleteItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error)
	BatchGetItem(ctx context.Context, params *dynamodb.BatchGetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error)
	Query(ctx context.Context, params *dynamodb.QueryInput, optFns ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error)
	TransactWriteItems(ctx context.Context, params *dynamodb.TransactWriteItemsInput, optFns ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error)
	CreateTable(ctx context.Context, params *dynamodb.CreateTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error)
	DescribeTable(ctx context.Context, params *dynamodb.DescribeTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
}

var _ DynamoDBAPI = (*dynamodb.Client)(nil)

// CheckClient returns an error wrapping ErrInvalid when db is nil, or is an
// interface value holding a nil pointer, map, function, channel or
// interface (a `var db *dynamodb.Client` that was never assigned), or is a
// *dynamodb.Client made without dynamodb.New or NewFromConfig (a zero
// Client): its first request would panic inside the SDK. New, NewGuard,
// NewAdmin, CreateTable and the scheduler adapters' constructors refuse
// such a client with it.
func CheckClient(db any) error {
	if db == nil {
		return invalid("DynamoDB client is nil")
	}
	if c, ok := db.(*dynamodb.Client); ok && c != nil && c.Options().HTTPClient == nil {
		return invalid("DynamoDB client is a zero *dynamodb.Client: make it with dynamodb.New or dynamodb.NewFromConfig")
	}
	v := reflect.ValueOf(db)
	switch v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Func, reflect.Chan, reflect.Interface, reflect.Slice:
		if v.IsNil() {
			return invalid("DynamoDB client is a nil %T", db)
		}
	}
	return nil
}

// getItem reads the item under key in table with a strongly consistent
// read bounded by timeout; nil when there is none. Callers that must know
// the outcome of a write even when ctx has ended pass
// context.WithoutCancel(ctx).
func getItem(ctx context.Context, db DynamoDBAPI, table string, key map[string]types.AttributeValue, timeout time.Duration) (map[string]types.AttributeValue, error) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := db.GetItem(cctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: key, ConsistentRead: aws.Bool(true)})
	if err != nil {
		return nil, err
	}
	return out.Item, nil
}
