package ddbleasetest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/ddblease/ddblease/ddbleasetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// removeFixture is the item each case of TestRemove starts from.
var removeFixture = map[string]any{
	"a": 1, "b": 2, "l": []any{1, 2, 3},
	"m": map[string]any{"x": 1, "y": map[string]any{"z": 3}},
}

// TestRemove checks that an update's REMOVE clause does on the test server
// what it does on DynamoDB (each case was checked on DynamoDB Local 3.3.1),
// or is refused loudly where the in-process server cannot store the
// result: minidyn v0.8.2 alone ignores a top-level REMOVE and corrupts a
// map whose last entry a nested one removes.
func TestRemove(t *testing.T) {
	srv := ddbleasetest.NewServer(t)
	db := srv.Client()
	table := srv.NewKeyTable(t, "pk")
	names := map[string]string{"#a": "a", "#m": "m", "#x": "x", "#y": "y", "#q": "q", "#l": "l"}
	for _, tc := range []struct {
		name, expr string
		rv         types.ReturnValue
		missing    bool           // the item does not exist before the update
		want       map[string]any // the item after it (pk left out)
		returned   map[string]any // the attributes returned, if checked
		invalid    string         // a ValidationException containing this, the item unchanged
	}{
		{name: "top-level", expr: "REMOVE a", rv: types.ReturnValueUpdatedOld,
			want:     map[string]any{"b": 2, "l": []any{1, 2, 3}, "m": removeFixture["m"]},
			returned: map[string]any{"a": 1}},
		{name: "placeholder, beside SET", expr: "SET b = :v REMOVE #a", rv: types.ReturnValueAllNew,
			want:     map[string]any{"b": 5, "l": []any{1, 2, 3}, "m": removeFixture["m"]},
			returned: map[string]any{"pk": "placeholder, beside SET", "b": 5, "l": []any{1, 2, 3}, "m": removeFixture["m"]}},
		{name: "REMOVE first, lower case", expr: "remove a, b set #q = :v", rv: types.ReturnValueUpdatedNew,
			want:     map[string]any{"q": 5, "l": []any{1, 2, 3}, "m": removeFixture["m"]},
			returned: map[string]any{"q": 5}},
		{name: "missing attribute", expr: "REMOVE #q", rv: types.ReturnValueNone, want: removeFixture},
		{name: "missing item", expr: "REMOVE a", missing: true, want: map[string]any{}},
		{name: "map entry", expr: "REMOVE #m.#x", want: map[string]any{"a": 1, "b": 2, "l": []any{1, 2, 3},
			"m": map[string]any{"y": map[string]any{"z": 3}}}},
		{name: "list elements", expr: "REMOVE #l[0], #l[2]", want: map[string]any{"a": 1, "b": 2, "l": []any{2},
			"m": removeFixture["m"]}},
		{name: "list element past the end", expr: "REMOVE #l[7]", want: removeFixture},
		{name: "missing parent", expr: "REMOVE #q.#x", invalid: "document path provided in the update expression is invalid"},
		{name: "parent not a map", expr: "REMOVE #a.#x", invalid: "document path provided in the update expression is invalid"},
		{name: "overlap", expr: "REMOVE a SET a = :v", invalid: "Two document paths overlap"},
		{name: "nested overlap", expr: "REMOVE #m.#x SET #m = :v", invalid: "Two document paths overlap"},
		{name: "key", expr: "REMOVE pk", invalid: "Cannot update attribute pk"},
		{name: "two REMOVE sections", expr: "REMOVE a REMOVE b", invalid: `The "REMOVE" section can only be used once`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if !tc.missing {
				putFixture(t, db, table, tc.name)
			}
			in := &dynamodb.UpdateItemInput{
				TableName: aws.String(table), Key: pkKey(tc.name), UpdateExpression: aws.String(tc.expr),
				ExpressionAttributeNames: used(names, tc.expr), ReturnValues: tc.rv,
			}
			if containsWord(tc.expr, ":v") {
				in.ExpressionAttributeValues = map[string]types.AttributeValue{":v": &types.AttributeValueMemberN{Value: "5"}}
			}
			out, err := db.UpdateItem(ctx, in)
			if tc.invalid != "" {
				requireValidation(t, err, tc.invalid)
				assert.Equal(t, removeFixture, readItem(t, db, table, tc.name), "the refused update changed the item")
				return
			}
			require.NoError(t, err)
			got := readItem(t, db, table, tc.name)
			if tc.name == "list elements" && !srv.InProcess() && assert.ObjectsAreEqual([]any{2, 3}, got["l"]) {
				t.Skipf("server %s removes list elements one after another, so that the indexes shift "+
					"(dynalite 4.0.0 does); DynamoDB removes the elements the indexes name", srv.Name)
			}
			assert.Equal(t, tc.want, got)
			if tc.returned != nil {
				assert.Equal(t, tc.returned, plain(t, out.Attributes))
			}
		})
	}
}

// A REMOVE whose condition fails removes nothing; in a transaction it
// removes as in UpdateItem.
func TestRemoveConditionAndTransaction(t *testing.T) {
	srv := ddbleasetest.NewServer(t)
	db := srv.Client()
	table := srv.NewKeyTable(t, "pk")
	ctx := context.Background()
	putFixture(t, db, table, "cond")
	_, err := db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(table), Key: pkKey("cond"), UpdateExpression: aws.String("REMOVE a"),
		ConditionExpression:       aws.String("b = :three"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":three": &types.AttributeValueMemberN{Value: "3"}},
	})
	var ccf *types.ConditionalCheckFailedException
	require.ErrorAs(t, err, &ccf)
	assert.Equal(t, removeFixture, readItem(t, db, table, "cond"))

	putFixture(t, db, table, "txn")
	_, err = db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{Update: &types.Update{TableName: aws.String(table), Key: pkKey("txn"), UpdateExpression: aws.String("REMOVE a, #m.#x"),
			ExpressionAttributeNames: map[string]string{"#m": "m", "#x": "x"}}},
		{Put: &types.Put{TableName: aws.String(table), Item: pkKey("other")}},
	}})
	var unknown interface{ ErrorCode() string }
	if errors.As(err, &unknown) && unknown.ErrorCode() == "UnknownOperationException" {
		t.Skipf("server %s has no transactions", srv.Name)
	}
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"b": 2, "l": []any{1, 2, 3}, "m": map[string]any{"y": map[string]any{"z": 3}}},
		readItem(t, db, table, "txn"))
}

// An update that would leave an empty map is applied on DynamoDB; the
// in-process server cannot store one (minidyn v0.8.2 returns it as a
// value the SDK reads as NULL or as another attribute's value), so it
// refuses it, and any other write that would store an empty map or list,
// loudly, and undoes nothing else.
func TestRemoveLastEntry(t *testing.T) {
	srv := ddbleasetest.NewServer(t)
	db := srv.Client()
	table := srv.NewKeyTable(t, "pk")
	ctx := context.Background()
	putFixture(t, db, table, "last")
	_, err := db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(table), Key: pkKey("last"), UpdateExpression: aws.String("REMOVE #m.#x, #m.#y"),
		ExpressionAttributeNames: map[string]string{"#m": "m", "#x": "x", "#y": "y"},
	})
	if !srv.InProcess() {
		require.NoError(t, err)
		assert.Equal(t, map[string]any{}, readItem(t, db, table, "last")["m"])
		return
	}
	requireValidation(t, err, "cannot store an empty map or list")
	assert.Equal(t, removeFixture, readItem(t, db, table, "last"), "the refused update changed the item")

	_, err = db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: map[string]types.AttributeValue{
		"pk": &types.AttributeValueMemberS{Value: "empty"}, "l": &types.AttributeValueMemberL{Value: []types.AttributeValue{}}}})
	requireValidation(t, err, "cannot store an empty map or list")

	// An empty list as an operand is fine, as long as none is stored.
	values := map[string]types.AttributeValue{
		":empty": &types.AttributeValueMemberL{Value: []types.AttributeValue{}},
		":one":   &types.AttributeValueMemberL{Value: []types.AttributeValue{&types.AttributeValueMemberN{Value: "1"}}},
	}
	_, err = db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(table), Key: pkKey("append"), ExpressionAttributeValues: values,
		UpdateExpression: aws.String("SET l = list_append(if_not_exists(l, :empty), :one)"),
	})
	require.NoError(t, err)
	assert.Equal(t, map[string]any{"l": []any{1}}, readItem(t, db, table, "append"))
	_, err = db.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName: aws.String(table), Key: pkKey("append"), ExpressionAttributeValues: values,
		UpdateExpression: aws.String("SET e = if_not_exists(e, :empty), l = list_append(l, :one)"),
	})
	requireValidation(t, err, "cannot store an empty map or list")
	assert.Equal(t, map[string]any{"l": []any{1}}, readItem(t, db, table, "append"), "the refused update changed the item")
}

func putFixture(t *testing.T, db *dynamodb.Client, table, pk string) {
	t.Helper()
	item, err := attributevalue.MarshalMap(removeFixture)
	require.NoError(t, err)
	item["pk"] = &types.AttributeValueMemberS{Value: pk}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item})
	require.NoError(t, err)
}

func pkKey(pk string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: pk}}
}

// readItem reads the item with a consistent read, as plain values, without
// its key.
func readItem(t *testing.T, db *dynamodb.Client, table, pk string) map[string]any {
	t.Helper()
	out, err := db.GetItem(context.Background(), &dynamodb.GetItemInput{
		TableName: aws.String(table), Key: pkKey(pk), ConsistentRead: aws.Bool(true)})
	require.NoError(t, err)
	require.NotEmpty(t, out.Item, "no item %q", pk)
	m := plain(t, out.Item)
	delete(m, "pk")
	return m
}

// plain decodes attribute values into plain values, numbers as int.
func plain(t *testing.T, item map[string]types.AttributeValue) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, attributevalue.UnmarshalMapWithOptions(item, &m, func(o *attributevalue.DecoderOptions) {
		o.UseNumber = true
	}))
	var conv func(any) any
	conv = func(v any) any {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				v[k] = conv(x)
			}
		case []any:
			for i, x := range v {
				v[i] = conv(x)
			}
		case interface{ Int64() (int64, error) }:
			n, err := v.Int64()
			require.NoError(t, err)
			return int(n)
		}
		return v
	}
	for k, v := range m {
		m[k] = conv(v)
	}
	return m
}

func requireValidation(t *testing.T, err error, contains string) {
	t.Helper()
	var api smithy.APIError
	require.ErrorAs(t, err, &api)
	assert.Equal(t, "ValidationException", api.ErrorCode())
	assert.Contains(t, api.ErrorMessage(), contains)
}

// used returns the names among names that expr uses.
func used(names map[string]string, expr string) map[string]string {
	out := map[string]string{}
	for k, v := range names {
		if containsWord(expr, k) {
			out[k] = v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// containsWord reports whether expr has the placeholder w, not followed
// by a letter, digit or underscore.
func containsWord(expr, w string) bool {
	for i := 0; i+len(w) <= len(expr); i++ {
		if expr[i:i+len(w)] != w {
			continue
		}
		if j := i + len(w); j == len(expr) || !isWordByte(expr[j]) {
			return true
		}
	}
	return false
}

func isWordByte(b byte) bool {
	return b == '_' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
}
