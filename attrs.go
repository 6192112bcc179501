package ddblease

import (
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// This file owns the reading of item attributes: typed getters that name
// what is missing or malformed.

// The items of the table are records: Go structs whose fields carry
// dynamodbav tags (leaseItem, controlItem, runItem), decoded with
// attributevalue.UnmarshalMap and validated after decoding. Their fields are
// the strict scalars below: decoding never fails on them; each remembers
// whether its attribute was there and whether it had the type the protocol
// writes, so that validation names the attribute and the problem
// (ErrMalformedItem), where attributevalue would convert a number into a
// string field or report a type error without the attribute's name.

// sAttr is a string (S) attribute.
type sAttr struct {
	v        string
	set, bad bool
}

// UnmarshalDynamoDBAttributeValue implements attributevalue.Unmarshaler.
func (a *sAttr) UnmarshalDynamoDBAttributeValue(av types.AttributeValue) error {
	s, ok := av.(*types.AttributeValueMemberS)
	*a = sAttr{set: true, bad: !ok}
	if ok {
		a.v = s.Value
	}
	return nil
}

// get returns the value of a required attribute.
func (a sAttr) get(name string) (string, error) {
	switch {
	case !a.set:
		return "", fmt.Errorf("attribute %s is missing", name)
	case a.bad:
		return "", fmt.Errorf("attribute %s is not a string", name)
	}
	return a.v, nil
}

// opt returns the value of an optional attribute; "" when absent.
func (a sAttr) opt(name string) (string, error) {
	if !a.set {
		return "", nil
	}
	return a.get(name)
}

// nAttr is an integer number (N) attribute.
type nAttr struct {
	v        string
	set, bad bool
}

// UnmarshalDynamoDBAttributeValue implements attributevalue.Unmarshaler.
func (a *nAttr) UnmarshalDynamoDBAttributeValue(av types.AttributeValue) error {
	n, ok := av.(*types.AttributeValueMemberN)
	*a = nAttr{set: true, bad: !ok}
	if ok {
		a.v = n.Value
	}
	return nil
}

// get returns the value of a required attribute.
func (a nAttr) get(name string) (int64, error) {
	switch {
	case !a.set:
		return 0, fmt.Errorf("attribute %s is missing", name)
	case a.bad:
		return 0, fmt.Errorf("attribute %s is not a number", name)
	}
	return parseInt(name, a.v)
}

// opt returns the value of an optional attribute; 0 when absent.
func (a nAttr) opt(name string) (int64, error) {
	if !a.set {
		return 0, nil
	}
	return a.get(name)
}

// boolAttr is a boolean (BOOL) attribute.
type boolAttr struct {
	v, set, bad bool
}

// UnmarshalDynamoDBAttributeValue implements attributevalue.Unmarshaler.
func (a *boolAttr) UnmarshalDynamoDBAttributeValue(av types.AttributeValue) error {
	b, ok := av.(*types.AttributeValueMemberBOOL)
	*a = boolAttr{set: true, bad: !ok}
	if ok {
		a.v = b.Value
	}
	return nil
}

// opt returns the value of an optional attribute; false when absent.
func (a boolAttr) opt(name string) (bool, error) {
	if a.bad {
		return false, fmt.Errorf("attribute %s is not a boolean", name)
	}
	return a.v, nil
}

// unmarshalItem decodes item into out, a pointer to a record struct, with
// attributevalue.UnmarshalMap. attributevalue gives an attribute that no
// field names exactly to a field whose name differs only in case; the
// table's attribute names are case-sensitive, so such attributes are left
// out first (a copy of item is made only when there are any).
func unmarshalItem(item map[string]types.AttributeValue, out any) error {
	names := tagNames(reflect.TypeOf(out).Elem())
	for k := range item {
		if _, ok := names.exact[k]; ok {
			continue
		}
		if _, ok := names.folded[strings.ToLower(k)]; ok {
			item = exactOnly(item, names.exact)
			break
		}
	}
	return attributevalue.UnmarshalMap(item, out)
}

// exactOnly returns the attributes of item whose names are in names.
func exactOnly(item map[string]types.AttributeValue, names map[string]struct{}) map[string]types.AttributeValue {
	c := make(map[string]types.AttributeValue, len(names))
	for k, v := range item {
		if _, ok := names[k]; ok {
			c[k] = v
		}
	}
	return c
}

type fieldNames struct {
	exact, folded map[string]struct{}
}

var tagCache sync.Map // reflect.Type → fieldNames

// tagNames returns the attribute names of a record struct's fields (their
// dynamodbav tags, embedded structs included), as they are and in lower
// case.
func tagNames(t reflect.Type) fieldNames {
	if v, ok := tagCache.Load(t); ok {
		return v.(fieldNames)
	}
	n := fieldNames{exact: map[string]struct{}{}, folded: map[string]struct{}{}}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("dynamodbav"), ",")
			if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
				walk(f.Type)
				continue
			}
			if name == "" || name == "-" {
				name = f.Name
			}
			n.exact[name] = struct{}{}
			n.folded[strings.ToLower(name)] = struct{}{}
		}
	}
	walk(t)
	tagCache.Store(t, n)
	return n
}

// str reads a string attribute of an item decoded by hand (an item of the
// user's, or one attribute of ours).
func str(item map[string]types.AttributeValue, name string) (string, error) {
	v, ok := item[name]
	if !ok {
		return "", fmt.Errorf("attribute %s is missing", name)
	}
	s, ok := v.(*types.AttributeValueMemberS)
	if !ok {
		return "", fmt.Errorf("attribute %s is not a string", name)
	}
	return s.Value, nil
}

// num reads an integer number attribute of an item decoded by hand (an
// item of the user's, or one attribute of ours).
func num(item map[string]types.AttributeValue, name string) (int64, error) {
	v, ok := item[name]
	if !ok {
		return 0, fmt.Errorf("attribute %s is missing", name)
	}
	n, ok := v.(*types.AttributeValueMemberN)
	if !ok {
		return 0, fmt.Errorf("attribute %s is not a number", name)
	}
	return parseInt(name, n.Value)
}

// parseInt reads an integer number. Servers that compute in float64 may
// return integers in exponent form, so integral floats up to 2^53 are
// accepted too.
func parseInt(name, s string) (int64, error) {
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		return i, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return 0, fmt.Errorf("attribute %s is %q, not an integer", name, s)
	}
	return int64(f), nil
}

func avS(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }

func avN(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}

func avBool(b bool) types.AttributeValue { return &types.AttributeValueMemberBOOL{Value: b} }
