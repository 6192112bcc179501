package ddbleasetest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease/ddbleasetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// txnModes are the ways to send an update the server takes: alone, and
// in a transaction where it has them (dynalite has none).
func txnModes(t *testing.T, db *dynamodb.Client, table string) []bool {
	t.Helper()
	_, err := db.TransactWriteItems(context.Background(), &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{Put: &types.Put{TableName: aws.String(table), Item: pkKey("transactions-probe")}},
	}})
	var unknown interface{ ErrorCode() string }
	if errors.As(err, &unknown) && unknown.ErrorCode() == "UnknownOperationException" {
		return []bool{false}
	}
	require.NoError(t, err, "a transaction's Put")
	return []bool{false, true}
}

// setItem puts an item with key pk, a string set notes and the given
// string attributes.
func setItem(t *testing.T, db *dynamodb.Client, table, pk string, notes []string, attrs map[string]string) {
	t.Helper()
	item := pkKey(pk)
	if notes != nil {
		item["notes"] = &types.AttributeValueMemberSS{Value: notes}
	}
	for k, v := range attrs {
		item[k] = &types.AttributeValueMemberS{Value: v}
	}
	_, err := db.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: aws.String(table), Item: item})
	require.NoError(t, err)
}

// rawItem reads the item as the SDK decodes it.
func rawItem(t *testing.T, db *dynamodb.Client, table, pk string) map[string]types.AttributeValue {
	t.Helper()
	out, err := db.GetItem(context.Background(), &dynamodb.GetItemInput{
		TableName: aws.String(table), Key: pkKey(pk), ConsistentRead: aws.Bool(true)})
	require.NoError(t, err)
	require.NotEmpty(t, out.Item, "no item %q", pk)
	return out.Item
}

// setAndDelete is an update that SETs n attributes a0..a(n-1) and DELETEs
// the elements dels from the set notes: the shape of a pool session's
// renewal once it has handled an operator's note.
func setAndDelete(table, pk string, n int, dels []string) (expr string, names map[string]string,
	values map[string]types.AttributeValue) {
	names = map[string]string{"#n": "notes"}
	values = map[string]types.AttributeValue{":s": &types.AttributeValueMemberSS{Value: dels}}
	expr = "SET "
	for i := 0; i < n; i++ {
		if i > 0 {
			expr += ", "
		}
		expr += fmt.Sprintf("#a%d = :a%d", i, i)
		names[fmt.Sprintf("#a%d", i)] = fmt.Sprintf("a%d", i)
		values[fmt.Sprintf(":a%d", i)] = &types.AttributeValueMemberS{Value: fmt.Sprintf("V%d", i)}
	}
	return expr + " DELETE #n :s", names, values
}

// wantSet checks the item holds a0..a(n-1) as set and notes as want
// (removed if want is empty), and nothing else.
func wantSet(t *testing.T, item map[string]types.AttributeValue, n int, want []string, old map[string]string) {
	t.Helper()
	for i := 0; i < n; i++ {
		assert.Equal(t, &types.AttributeValueMemberS{Value: fmt.Sprintf("V%d", i)}, item[fmt.Sprintf("a%d", i)], "a%d", i)
	}
	if len(want) == 0 {
		assert.NotContains(t, item, "notes", "the set emptied by DELETE is still there")
	} else if assert.IsType(t, &types.AttributeValueMemberSS{}, item["notes"], "notes") {
		assert.ElementsMatch(t, want, item["notes"].(*types.AttributeValueMemberSS).Value, "notes")
	}
	for k, v := range old {
		assert.Equal(t, &types.AttributeValueMemberS{Value: v}, item[k], k)
	}
	assert.Len(t, item, 1+n+len(old)+min(1, len(want)), "attributes: %v", item)
}

// An update that SETs attributes and DELETEs a set's last element removes
// the set and sets the attributes, in UpdateItem and in a transaction,
// however many attributes and whatever the order of maps (minidyn v0.8.2
// alone stores the emptied set, which it returns as another attribute's
// value).
func TestDeleteLastElementBesideSet(t *testing.T) {
	srv := ddbleasetest.NewServer(t)
	db := srv.Client()
	table := srv.NewKeyTable(t, "pk")
	ctx := context.Background()
	modes := txnModes(t, db, table)
	for _, n := range []int{1, 2, 5, 12} {
		for round := 0; round < 8; round++ {
			for _, txn := range modes {
				pk := fmt.Sprintf("n%d-r%d-txn%v", n, round, txn)
				old := map[string]string{"keep": "K", "other": "O"}
				setItem(t, db, table, pk, []string{"x"}, old)
				expr, names, values := setAndDelete(table, pk, n, []string{"x"})
				var err error
				if txn {
					_, err = db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
						{Update: &types.Update{TableName: aws.String(table), Key: pkKey(pk), UpdateExpression: aws.String(expr),
							ExpressionAttributeNames: names, ExpressionAttributeValues: values}},
					}})
				} else {
					_, err = db.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: pkKey(pk),
						UpdateExpression: aws.String(expr), ExpressionAttributeNames: names, ExpressionAttributeValues: values})
				}
				require.NoError(t, err, pk)
				wantSet(t, rawItem(t, db, table, pk), n, nil, old)
			}
		}
	}
}

// The case of the issue exactly: SET #a = :a, #b = :b DELETE #n :s.
func TestDeleteRawCase(t *testing.T) {
	srv := ddbleasetest.NewServer(t)
	db := srv.Client()
	table := srv.NewKeyTable(t, "pk")
	ctx := context.Background()
	modes := txnModes(t, db, table)
	names := map[string]string{"#a": "a", "#b": "b", "#n": "notes"}
	values := map[string]types.AttributeValue{
		":a": &types.AttributeValueMemberS{Value: "A"}, ":b": &types.AttributeValueMemberS{Value: "B"},
		":s": &types.AttributeValueMemberSS{Value: []string{"note1"}},
	}
	expr := "SET #a = :a, #b = :b DELETE #n :s"
	for i := 0; i < 20; i++ {
		for _, txn := range modes {
			pk := fmt.Sprintf("raw-%d-%v", i, txn)
			setItem(t, db, table, pk, []string{"note1"}, nil)
			var err error
			if txn {
				_, err = db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
					{Update: &types.Update{TableName: aws.String(table), Key: pkKey(pk), UpdateExpression: aws.String(expr),
						ExpressionAttributeNames: names, ExpressionAttributeValues: values}},
					{Put: &types.Put{TableName: aws.String(table), Item: pkKey(pk + "-other")}},
				}})
			} else {
				_, err = db.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: pkKey(pk),
					UpdateExpression: aws.String(expr), ExpressionAttributeNames: names, ExpressionAttributeValues: values})
			}
			require.NoError(t, err, pk)
			assert.Equal(t, map[string]any{"a": "A", "b": "B"}, readItem(t, db, table, pk), pk)
		}
	}
}

// DELETE as DynamoDB applies it: the elements named are taken out of the
// set, those not there are ignored, a missing attribute is left missing,
// and DELETE on a value that is not a set of the operand's type, or with
// an operand that is not a set, is a ValidationException that changes
// nothing.
func TestDeleteFromSet(t *testing.T) {
	srv := ddbleasetest.NewServer(t)
	db := srv.Client()
	table := srv.NewKeyTable(t, "pk")
	ctx := context.Background()
	ss := func(v ...string) types.AttributeValue { return &types.AttributeValueMemberSS{Value: v} }
	fixture := map[string]types.AttributeValue{
		"ss": ss("x", "y", "z"), "ns": &types.AttributeValueMemberNS{Value: []string{"1", "2"}},
		"bs": &types.AttributeValueMemberBS{Value: [][]byte{{1}, {2}}},
		"s":  &types.AttributeValueMemberS{Value: "str"}, "keep": &types.AttributeValueMemberS{Value: "K"},
	}
	for _, tc := range []struct {
		name, expr string
		values     map[string]types.AttributeValue
		rv         types.ReturnValue
		change     map[string]types.AttributeValue // attributes changed; nil value: removed
		returned   map[string]types.AttributeValue
		invalid    string
	}{
		{name: "some elements", expr: "DELETE ss :v", values: map[string]types.AttributeValue{":v": ss("x", "z")},
			rv: types.ReturnValueUpdatedNew, change: map[string]types.AttributeValue{"ss": ss("y")},
			returned: map[string]types.AttributeValue{"ss": ss("y")}},
		{name: "elements not there", expr: "DELETE ss :v", values: map[string]types.AttributeValue{":v": ss("q", "y")},
			change: map[string]types.AttributeValue{"ss": ss("x", "z")}},
		{name: "none there", expr: "DELETE ss :v", values: map[string]types.AttributeValue{":v": ss("q")}},
		{name: "all elements", expr: "DELETE ss :v", values: map[string]types.AttributeValue{":v": ss("x", "y", "z", "q")},
			rv: types.ReturnValueAllNew, change: map[string]types.AttributeValue{"ss": nil}},
		{name: "all, old returned", expr: "DELETE ss :v", values: map[string]types.AttributeValue{":v": ss("x", "y", "z")},
			rv: types.ReturnValueUpdatedOld, change: map[string]types.AttributeValue{"ss": nil},
			returned: map[string]types.AttributeValue{"ss": ss("x", "y", "z")}},
		{name: "all, new returned", expr: "DELETE ss :v SET keep = :k", rv: types.ReturnValueUpdatedNew,
			values:   map[string]types.AttributeValue{":v": ss("x", "y", "z"), ":k": &types.AttributeValueMemberS{Value: "K2"}},
			change:   map[string]types.AttributeValue{"ss": nil, "keep": &types.AttributeValueMemberS{Value: "K2"}},
			returned: map[string]types.AttributeValue{"keep": &types.AttributeValueMemberS{Value: "K2"}}},
		{name: "number set", expr: "DELETE ns :v", values: map[string]types.AttributeValue{":v": &types.AttributeValueMemberNS{Value: []string{"2"}}},
			change: map[string]types.AttributeValue{"ns": &types.AttributeValueMemberNS{Value: []string{"1"}}}},
		{name: "binary set emptied", expr: "DELETE bs :v", values: map[string]types.AttributeValue{":v": &types.AttributeValueMemberBS{Value: [][]byte{{1}, {2}}}},
			change: map[string]types.AttributeValue{"bs": nil}},
		{name: "missing attribute", expr: "DELETE q :v", values: map[string]types.AttributeValue{":v": ss("x")}},
		{name: "with REMOVE and ADD", expr: "REMOVE keep ADD ns :n DELETE ss :v",
			values: map[string]types.AttributeValue{":v": ss("x", "y", "z"), ":n": &types.AttributeValueMemberNS{Value: []string{"7"}}},
			change: map[string]types.AttributeValue{"ss": nil, "keep": nil, "ns": &types.AttributeValueMemberNS{Value: []string{"1", "2", "7"}}}},
		{name: "not a set", expr: "DELETE s :v", values: map[string]types.AttributeValue{":v": ss("x")},
			invalid: "An operand in the update expression has an incorrect data type"},
		{name: "set of another type", expr: "DELETE ns :v", values: map[string]types.AttributeValue{":v": ss("1")},
			invalid: "An operand in the update expression has an incorrect data type"},
		{name: "operand not a set", expr: "DELETE ss :v", values: map[string]types.AttributeValue{":v": &types.AttributeValueMemberS{Value: "x"}},
			invalid: "Incorrect operand type for operator or function; operator: DELETE, operand type: STRING"},
		{name: "ADD of a string to a set", expr: "ADD ss :v", values: map[string]types.AttributeValue{":v": &types.AttributeValueMemberS{Value: "q"}},
			invalid: "Incorrect operand type for operator or function; operator: ADD, operand type: STRING"},
		{name: "two DELETE sections", expr: "DELETE ss :v DELETE ns :n",
			values:  map[string]types.AttributeValue{":v": ss("x"), ":n": &types.AttributeValueMemberNS{Value: []string{"1"}}},
			invalid: `The "DELETE" section can only be used once`},
		{name: "overlap", expr: "SET ss = :k DELETE ss :v",
			values:  map[string]types.AttributeValue{":v": ss("x"), ":k": &types.AttributeValueMemberS{Value: "K2"}},
			invalid: "Two document paths overlap"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			item := pkKey(tc.name)
			for k, v := range fixture {
				item[k] = v
			}
			_, err := db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: item})
			require.NoError(t, err)
			out, err := db.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(table), Key: pkKey(tc.name),
				UpdateExpression: aws.String(tc.expr), ExpressionAttributeValues: tc.values, ReturnValues: tc.rv})
			want := map[string]types.AttributeValue{}
			for k, v := range item {
				want[k] = v
			}
			if tc.invalid != "" {
				requireValidation(t, err, tc.invalid)
			} else {
				require.NoError(t, err)
				for k, v := range tc.change {
					if v == nil {
						delete(want, k)
					} else {
						want[k] = v
					}
				}
			}
			assertItem(t, want, rawItem(t, db, table, tc.name))
			if tc.rv == types.ReturnValueAllNew {
				assertItem(t, want, out.Attributes)
			} else if tc.returned != nil {
				assertItem(t, tc.returned, out.Attributes)
			}
		})
	}
}

// assertItem compares items, sets in any order.
func assertItem(t *testing.T, want, got map[string]types.AttributeValue) {
	t.Helper()
	norm := func(m map[string]types.AttributeValue) map[string]any {
		out := map[string]any{}
		for k, v := range m {
			switch v := v.(type) {
			case *types.AttributeValueMemberSS:
				out[k] = setOf(v.Value)
			case *types.AttributeValueMemberNS:
				out[k] = "NS" + fmt.Sprint(setOf(v.Value))
			case *types.AttributeValueMemberBS:
				var s []string
				for _, b := range v.Value {
					s = append(s, fmt.Sprint(b))
				}
				out[k] = "BS" + fmt.Sprint(setOf(s))
			default:
				out[k] = v
			}
		}
		return out
	}
	assert.Equal(t, norm(want), norm(got))
}

func setOf(v []string) map[string]bool {
	m := map[string]bool{}
	for _, s := range v {
		m[s] = true
	}
	return m
}
