package ddblease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
)

// This file owns the table: CreateTable, Layout.TableSpec, the one check
// of a table's key schema and the explanation of a table error
// (explainTableError), and the reads of many items by key (query,
// batchGet).

// tableCallTimeout bounds each call CreateTable makes.
const tableCallTimeout = 10 * time.Second

// CreateTable creates the lease table (on-demand billing, a string
// partition key and a string sort key named as the Layout says, "pk" and
// "sk" by default) and waits until it is active, or ctx ends. An existing
// table is accepted as it is if its key schema is the one needed; with
// another schema it is an error wrapping ErrTableSchema that names what
// was found and what is needed. optFns set the Layout (the replicas'
// Options.Layout). Infrastructure code may create the table instead (see
// Layout.TableSpec). Job-run items carry their expiry in RunTTLAttribute;
// enable DynamoDB's time to live on it for old runs to be deleted (lease
// items never carry it).
func CreateTable(ctx context.Context, db DynamoDBAPI, table string, optFns ...func(*Layout)) error {
	if err := CheckClient(db); err != nil {
		return err
	}
	if err := checkTable(table); err != nil {
		return err
	}
	var y Layout
	for _, fn := range optFns {
		if fn != nil {
			fn(&y)
		}
	}
	spec, err := y.TableSpec()
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, tableCallTimeout)
	_, err = db.CreateTable(cctx, &dynamodb.CreateTableInput{
		TableName: aws.String(table),
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String(spec.PartitionKey), AttributeType: types.ScalarAttributeTypeS},
			{AttributeName: aws.String(spec.SortKey), AttributeType: types.ScalarAttributeTypeS},
		},
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String(spec.PartitionKey), KeyType: types.KeyTypeHash},
			{AttributeName: aws.String(spec.SortKey), KeyType: types.KeyTypeRange},
		},
		BillingMode: spec.BillingMode,
	})
	cancel()
	var inUse *types.ResourceInUseException
	if err != nil && !errors.As(err, &inUse) {
		return fmt.Errorf("ddblease: create table %q: %w", table, err)
	}
	return waitActive(ctx, db, table, spec.layout)
}

// waitActive waits until table is active, checking its key schema.
func waitActive(ctx context.Context, db DynamoDBAPI, table string, y Layout) error {
	for {
		cctx, cancel := context.WithTimeout(ctx, tableCallTimeout)
		out, err := db.DescribeTable(cctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
		cancel()
		if err != nil {
			return fmt.Errorf("ddblease: describe table %q: %w", table, err)
		}
		if err := checkSchema(table, out.Table, y); err != nil {
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

// checkSchema checks that the key schema of table (described by d) is the
// one y needs.
func checkSchema(table string, d *types.TableDescription, y Layout) error {
	if d == nil {
		return fmt.Errorf("ddblease: describe table %q: no description returned", table)
	}
	typ := map[string]types.ScalarAttributeType{}
	for _, a := range d.AttributeDefinitions {
		typ[aws.ToString(a.AttributeName)] = a.AttributeType
	}
	var found []string
	for _, k := range d.KeySchema {
		n := aws.ToString(k.AttributeName)
		found = append(found, fmt.Sprintf("%s %q (%s)", keyRole(k.KeyType), n, cmp.Or(string(typ[n]), "type not reported")))
	}
	ok := len(d.KeySchema) == 2
	for i, want := range []struct {
		name string
		kt   types.KeyType
	}{{y.PartitionKey, types.KeyTypeHash}, {y.SortKey, types.KeyTypeRange}} {
		// Some test servers report no attribute definitions.
		ok = ok && aws.ToString(d.KeySchema[i].AttributeName) == want.name && d.KeySchema[i].KeyType == want.kt &&
			(typ[want.name] == types.ScalarAttributeTypeS || typ[want.name] == "")
	}
	if ok {
		return nil
	}
	msg := fmt.Sprintf("%v: table %q has %s; the layout in use needs partition key %q (S) and sort key %q (S)",
		ErrTableSchema, table, strings.Join(found, " and "), y.PartitionKey, y.SortKey)
	if len(d.KeySchema) == 1 && aws.ToString(d.KeySchema[0].AttributeName) == DefaultPartitionKey {
		msg += "; a table with a partition key alone was made for an older layout of ddblease, whose items " +
			"this one does not read: create a new table (CreateTable, or ddblease create-table)"
	} else {
		msg += "; set Layout's PartitionKey and SortKey to the table's key names, or use another table"
	}
	return &schemaError{msg: msg}
}

// keyRole names a key type for errors.
func keyRole(t types.KeyType) string {
	if t == types.KeyTypeRange {
		return "sort key"
	}
	return "partition key"
}

// TableSpec describes the lease table of a Layout: a string partition
// key and a string sort key, on-demand billing, and time to live on the
// attribute in which run items carry their expiry. CreateTable makes the
// table from it; infrastructure code that creates the table instead must
// match it (the ddblease command's create-table --print renders it as
// CloudFormation and Terraform).
type TableSpec struct {
	PartitionKey string            // Layout.PartitionKey, type S
	SortKey      string            // Layout.SortKey, type S
	BillingMode  types.BillingMode // PAY_PER_REQUEST
	// TTLAttribute is RunTTLAttribute. CreateTable does not enable time to
	// live (the DynamoDBAPI interface has no UpdateTimeToLive); enable it
	// on this attribute for old runs to be deleted.
	TTLAttribute string

	layout Layout
}

// TableSpec returns the specification of the lease table for l, or an
// error wrapping ErrInvalid if l is not valid.
func (l Layout) TableSpec() (TableSpec, error) {
	y, err := l.withDefaults("Layout")
	if err != nil {
		return TableSpec{}, err
	}
	return TableSpec{
		PartitionKey: y.PartitionKey,
		SortKey:      y.SortKey,
		BillingMode:  types.BillingModePayPerRequest,
		TTLAttribute: RunTTLAttribute,
		layout:       y,
	}, nil
}

// explainTableError adds the table's name to errors the SDK reports
// without it: a missing table, and a key schema that is not ours (checked
// with one DescribeTable).
func explainTableError(ctx context.Context, db DynamoDBAPI, table string, y Layout, err error) error {
	var api smithy.APIError
	if !errors.As(err, &api) {
		return err
	}
	switch api.ErrorCode() {
	case "ResourceNotFoundException":
		return fmt.Errorf("table %q not found (create it with CreateTable or your infrastructure code): %w", table, err)
	case "ValidationException":
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tableCallTimeout)
		defer cancel()
		out, derr := db.DescribeTable(cctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
		if derr != nil {
			return fmt.Errorf("table %q: %w", table, err)
		}
		if serr := checkSchema(table, out.Table, y); serr != nil {
			return fmt.Errorf("%w (the server said: %w)", serr, err)
		}
		return fmt.Errorf("table %q: %w", table, err)
	case "AccessDeniedException", "UnrecognizedClientException", "InvalidSignatureException",
		"MissingAuthenticationTokenException", "InvalidClientTokenId":
		return fmt.Errorf("table %q: access refused, check the credentials and their permissions: %w", table, err)
	}
	return err
}

// batchGet reads the items of keys with strongly consistent BatchGetItem
// requests of up to 100 keys, sending unprocessed keys again, and returns
// the items found. what names the read for errors.
func batchGet(ctx context.Context, db DynamoDBAPI, table string, y Layout, what string, keys []map[string]types.AttributeValue,
	pause, timeout time.Duration) ([]map[string]types.AttributeValue, error) {
	var found []map[string]types.AttributeValue
	for start := 0; start < len(keys); start += 100 {
		req := map[string]types.KeysAndAttributes{table: {Keys: keys[start:min(start+100, len(keys))], ConsistentRead: aws.Bool(true)}}
		again := func(err error) bool { return err == errUnprocessed }
		n, stop, err := retrier{backoff: fixed(pause), again: again, attempts: 11, timeout: timeout}.do(ctx,
			func(ctx context.Context) error {
				out, err := db.BatchGetItem(ctx, &dynamodb.BatchGetItemInput{RequestItems: req})
				if err != nil {
					return fmt.Errorf("ddblease: %s: %w", what, explainTableError(ctx, db, table, y, err))
				}
				found = append(found, out.Responses[table]...)
				if req = out.UnprocessedKeys; len(req) > 0 {
					return errUnprocessed
				}
				return nil
			})
		switch {
		case stop == retryAttempts:
			return nil, fmt.Errorf("ddblease: %s: keys still unprocessed after %d rounds", what, n)
		case stop == retryEnded:
			return nil, fmt.Errorf("ddblease: %s: %w", what, context.Cause(ctx))
		case err != nil:
			return nil, err
		}
	}
	return found, nil
}

// query returns the items of partition pk whose sort key is from lo to
// hi, both included, in sort key order (backwards when newest is set),
// at most limit of them when limit is positive, with strongly consistent
// Query requests. what names the read for errors.
func query(ctx context.Context, db DynamoDBAPI, table string, y Layout, pk, lo, hi string, limit int, newest bool,
	timeout time.Duration, what string) ([]map[string]types.AttributeValue, error) {
	in := &dynamodb.QueryInput{
		TableName:                 aws.String(table),
		KeyConditionExpression:    aws.String("#pk = :pk AND #sk BETWEEN :lo AND :hi"),
		ExpressionAttributeNames:  map[string]string{"#pk": y.PartitionKey, "#sk": y.SortKey},
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": avS(pk), ":lo": avS(lo), ":hi": avS(hi)},
		ConsistentRead:            aws.Bool(true),
		ScanIndexForward:          aws.Bool(!newest),
	}
	var items []map[string]types.AttributeValue
	for {
		if limit > 0 {
			in.Limit = aws.Int32(int32(min(limit-len(items), 1000)))
		}
		cctx, cancel := context.WithTimeout(ctx, timeout)
		out, err := db.Query(cctx, in)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("ddblease: %s: %w", what, explainTableError(ctx, db, table, y, err))
		}
		items = append(items, out.Items...)
		if len(out.LastEvaluatedKey) == 0 || limit > 0 && len(items) >= limit {
			return items, nil
		}
		in.ExclusiveStartKey = out.LastEvaluatedKey
	}
}

// prefixRange returns the bounds of the sort keys that start with prefix.
func prefixRange(prefix string) (lo, hi string) { return prefix, prefix + "\U0010FFFF" }
