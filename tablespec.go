package ddblease

import "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

// TableSpec describes the lease table: a single string partition key,
// on-demand billing, and time to live on the attribute in which run items
// carry their expiry. CreateTable makes the table from it; infrastructure
// code that creates the table instead must match it (the ddblease command's
// create-table --print renders it as CloudFormation and Terraform).
type TableSpec struct {
	PartitionKey     string                    // "pk"
	PartitionKeyType types.ScalarAttributeType // S
	BillingMode      types.BillingMode         // PAY_PER_REQUEST
	// TTLAttribute is RunTTLAttribute. CreateTable does not enable time to
	// live (the DynamoDBAPI interface has no UpdateTimeToLive); enable it
	// on this attribute for old runs to be deleted.
	TTLAttribute string
}

// LeaseTableSpec returns the specification of the lease table.
func LeaseTableSpec() TableSpec {
	return TableSpec{
		PartitionKey:     attrPK,
		PartitionKeyType: types.ScalarAttributeTypeS,
		BillingMode:      types.BillingModePayPerRequest,
		TTLAttribute:     RunTTLAttribute,
	}
}
