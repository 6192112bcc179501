package ddblease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// ErrTableSchema reports a table whose key schema is not a single string
// partition key named pk.
var ErrTableSchema = errors.New("ddblease: table has the wrong key schema")

// tableCallTimeout bounds each call CreateTable makes.
const tableCallTimeout = 10 * time.Second

// CreateTable creates the lease table (on-demand billing, string partition
// key pk) and waits until it is active, or ctx ends. An existing table with that key
// schema is accepted as it is; one with another schema is an error wrapping
// ErrTableSchema. Infrastructure code may create the table instead. Job-run
// items carry their expiry in RunTTLAttribute; enable DynamoDB's time to
// live on it for old runs to be deleted (lease items never carry it).
func CreateTable(ctx context.Context, db DynamoDBAPI, table string) error {
	if err := CheckClient(db); err != nil {
		return err
	}
	if err := checkTable(table); err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, tableCallTimeout)
	spec := LeaseTableSpec()
	_, err := db.CreateTable(cctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(table),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String(spec.PartitionKey), AttributeType: spec.PartitionKeyType}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String(spec.PartitionKey), KeyType: types.KeyTypeHash}},
		BillingMode:          spec.BillingMode,
	})
	cancel()
	var inUse *types.ResourceInUseException
	if err != nil && !errors.As(err, &inUse) {
		return fmt.Errorf("ddblease: create table %q: %w", table, err)
	}
	for {
		cctx, cancel := context.WithTimeout(ctx, tableCallTimeout)
		out, err := db.DescribeTable(cctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
		cancel()
		if err != nil {
			return fmt.Errorf("ddblease: describe table %q: %w", table, err)
		}
		if err := checkSchema(table, out.Table); err != nil {
			return err
		}
		switch out.Table.TableStatus {
		case types.TableStatusActive, types.TableStatusUpdating, "":
			// Some test servers report no status; their tables are usable.
			return nil
		case types.TableStatusCreating:
		default:
			return fmt.Errorf("ddblease: table %q is %s", table, out.Table.TableStatus)
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return fmt.Errorf("ddblease: waiting for table %q: %w", table, err)
		}
	}
}

func checkSchema(table string, d *types.TableDescription) error {
	if d == nil {
		return fmt.Errorf("ddblease: describe table %q: no description returned", table)
	}
	ks := d.KeySchema
	if len(ks) != 1 || aws.ToString(ks[0].AttributeName) != attrPK || ks[0].KeyType != types.KeyTypeHash {
		return fmt.Errorf("%w: table %q must have only a partition key %q", ErrTableSchema, table, attrPK)
	}
	for _, a := range d.AttributeDefinitions {
		if aws.ToString(a.AttributeName) == attrPK && a.AttributeType != types.ScalarAttributeTypeS {
			return fmt.Errorf("%w: table %q: key %q is of type %s, not S", ErrTableSchema, table, attrPK, a.AttributeType)
		}
	}
	return nil
}

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
