package ddbleasetest

import (
	"encoding/json"
	"errors"
	"math/big"
	"slices"
)

// The in-process server (minidyn v0.8.2) applies the DELETE clause of an
// update wrong: a set emptied by it stays in the item, and minidyn returns
// it as {}, which the SDK decodes as another attribute's value (which one
// depends on map order); a DELETE on a missing attribute stores the
// operand; a DELETE with an operand that is not a set is applied. So the
// handler applies the DELETE clause of UpdateItem and of TransactWriteItems'
// Update actions itself, as it does REMOVE (remove.go): it checks the
// clause against the item before the update, sends the update on without
// it, then takes the elements out of the sets, removing a set left empty.

// setDelete is one action of a DELETE clause: take the elements of
// operand out of the set at path.
type setDelete struct {
	path    []pathStep
	kind    string   // "SS", "NS" or "BS": the operand's type
	operand []string // its elements as in the request (binary ones in base64)
}

// setKinds names DynamoDB's set types as its messages do.
var setKinds = map[string]string{"SS": "STRING_SET", "NS": "NUMBER_SET", "BS": "BINARY_SET"}

// typeNames names DynamoDB's other types as its messages do.
var typeNames = map[string]string{"S": "STRING", "N": "NUMBER", "B": "BINARY", "BOOL": "BOOLEAN",
	"NULL": "NULL", "L": "LIST", "M": "MAP"}

// newSetDelete reads one DELETE action and refuses it, as DynamoDB does,
// when its operand is not a set value.
func newSetDelete(p []pathStep, operand string, values map[string]json.RawMessage) (setDelete, error) {
	d := setDelete{path: p}
	raw, ok := values[operand]
	if !ok {
		return d, errValidation("Invalid UpdateExpression: An expression attribute value used in expression is not defined; attribute value: " + operand)
	}
	kind, elems, isSet := setValue(raw)
	if !isSet {
		return d, errValidation("Invalid UpdateExpression: Incorrect operand type for operator or function; operator: DELETE, operand type: " + typeName(raw))
	}
	if len(elems) == 0 {
		return d, errValidation("ExpressionAttributeValues contains invalid value: One or more parameter values were invalid: " +
			"An " + setKinds[kind] + " may not be empty for key " + operand)
	}
	d.kind, d.operand = kind, elems
	return d, nil
}

// checkAddOperand refuses an ADD whose operand is neither a number nor a
// set, as DynamoDB does (minidyn adds a string to a string set). An
// operand not defined is left to the server to refuse.
func checkAddOperand(operand string, values map[string]json.RawMessage) error {
	raw, ok := values[operand]
	if !ok {
		return nil
	}
	if _, _, isSet := setValue(raw); isSet || typeName(raw) == "NUMBER" {
		return nil
	}
	return errValidation("Invalid UpdateExpression: Incorrect operand type for operator or function; operator: ADD, operand type: " + typeName(raw))
}

// setValue reads a set attribute value: its type and elements.
func setValue(raw json.RawMessage) (kind string, elems []string, ok bool) {
	var v map[string]json.RawMessage
	if json.Unmarshal(raw, &v) != nil || len(v) != 1 {
		return "", nil, false
	}
	for k, x := range v {
		if _, ok := setKinds[k]; ok && json.Unmarshal(x, &elems) == nil {
			return k, elems, true
		}
	}
	return "", nil, false
}

func typeName(raw json.RawMessage) string {
	var v map[string]json.RawMessage
	_ = json.Unmarshal(raw, &v)
	for k := range v {
		if n, ok := setKinds[k]; ok {
			return n
		}
		if n, ok := typeNames[k]; ok {
			return n
		}
	}
	return "UNKNOWN"
}

func (u *update) delPaths() [][]pathStep {
	var ps [][]pathStep
	for _, d := range u.dels {
		ps = append(ps, d.path)
	}
	return ps
}

var errIncorrectType = errValidation("An operand in the update expression has an incorrect data type")

// check refuses the DELETE, as DynamoDB does, when its path cannot be
// followed in item or leads to a value that is not a set of the operand's
// type. A missing attribute is no error: DELETE leaves it missing.
func (d setDelete) check(item map[string]json.RawMessage) error {
	av, ok, err := getPath(item, d.path)
	if err != nil {
		return errValidation("The document path provided in the update expression is invalid for update")
	}
	if !ok {
		return nil
	}
	if kind, _, isSet := setValue(av); !isSet || kind != d.kind {
		return errIncorrectType
	}
	return nil
}

// apply takes the operand's elements out of the set in item, and the set
// out of item if none is left.
func (d setDelete) apply(item map[string]json.RawMessage) error {
	av, ok, err := getPath(item, d.path)
	if err != nil || !ok {
		return err
	}
	kind, elems, isSet := setValue(av)
	if !isSet || kind != d.kind {
		return errIncorrectType
	}
	elems = slices.DeleteFunc(elems, func(e string) bool {
		return slices.ContainsFunc(d.operand, func(o string) bool { return sameElement(kind, e, o) })
	})
	if len(elems) == 0 {
		return removePath(item, d.path)
	}
	return setPath(item, d.path, mustJSON(map[string][]string{kind: elems}))
}

// sameElement compares set elements: numbers by value, others exactly.
func sameElement(kind, a, b string) bool {
	if kind != "NS" {
		return a == b
	}
	x, okx := new(big.Float).SetString(a)
	y, oky := new(big.Float).SetString(b)
	if !okx || !oky {
		return a == b
	}
	return x.Cmp(y) == 0
}

// getPath returns the value at path p in item and whether it is there; a
// missing or mistyped step before the last is an error.
func getPath(item map[string]json.RawMessage, p []pathStep) (json.RawMessage, bool, error) {
	av, ok := item[p[0].name]
	for i, s := range p[1:] {
		if !ok {
			return nil, false, errors.New("no value at " + pathString(p[:i+1]))
		}
		var v struct {
			M map[string]json.RawMessage
			L []json.RawMessage
		}
		if json.Unmarshal(av, &v) != nil || s.name != "" && v.M == nil || s.name == "" && v.L == nil {
			return nil, false, errors.New("no map or list at " + pathString(p[:i+1]))
		}
		if s.name != "" {
			av, ok = v.M[s.name]
		} else if ok = s.index < len(v.L); ok {
			av = v.L[s.index]
		}
	}
	return av, ok, nil
}

// setPath replaces the value at path p in item, which getPath found.
func setPath(item map[string]json.RawMessage, p []pathStep, val json.RawMessage) error {
	if len(p) == 1 {
		item[p[0].name] = val
		return nil
	}
	out, err := setIn(item[p[0].name], p[1:], val)
	if err != nil {
		return err
	}
	item[p[0].name] = out
	return nil
}

func setIn(av json.RawMessage, rest []pathStep, val json.RawMessage) (json.RawMessage, error) {
	var v struct {
		M map[string]json.RawMessage
		L []json.RawMessage
	}
	if err := json.Unmarshal(av, &v); err != nil {
		return nil, err
	}
	s, child := rest[0], val
	var err error
	if s.name != "" {
		if v.M == nil {
			return nil, errors.New("not a map at " + s.name)
		}
		if len(rest) > 1 {
			if child, err = setIn(v.M[s.name], rest[1:], val); err != nil {
				return nil, err
			}
		}
		v.M[s.name] = child
		return mustJSON(map[string]any{"M": v.M}), nil
	}
	if s.index >= len(v.L) {
		return nil, errors.New("no element " + s.String())
	}
	if len(rest) > 1 {
		if child, err = setIn(v.L[s.index], rest[1:], val); err != nil {
			return nil, err
		}
	}
	v.L[s.index] = child
	return mustJSON(map[string]any{"L": v.L}), nil
}
