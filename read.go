package ddblease

import (
	"context"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

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
