package ddblease

import (
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// fenceCheck is a ConditionCheck that the lease item holds exactly fence.
func fenceCheck(table string, key map[string]types.AttributeValue, fence int64) *types.ConditionCheck {
	return &types.ConditionCheck{
		TableName:                           aws.String(table),
		Key:                                 key,
		ConditionExpression:                 aws.String("#fence = :fence"),
		ExpressionAttributeNames:            map[string]string{"#fence": attrFence},
		ExpressionAttributeValues:           map[string]types.AttributeValue{":fence": avN(fence)},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
}

// fenceOf returns the fence of a lease item; 0 for no item.
func fenceOf(item map[string]types.AttributeValue) (int64, error) {
	if len(item) == 0 {
		return 0, nil
	}
	f, err := num(item, attrFence)
	if err == nil && f < 1 {
		err = fmt.Errorf("fence %d is below 1", f)
	}
	if err != nil {
		key, _ := str(item, attrPK)
		return 0, fmt.Errorf("%w: lease item %q: %v", ErrMalformedItem, key, err)
	}
	return f, nil
}
