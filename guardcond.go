package ddblease

import (
	"fmt"
	"maps"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// fenceCondition adds the fence high-water check and the token check to a
// user's condition, after checking that it cannot escape them.
func (g *Guard) fenceCondition(what string, cond *string, names map[string]string, values map[string]types.AttributeValue,
	fence int64, tok string) (*string, map[string]string, map[string]types.AttributeValue, error) {
	for k := range names {
		if reservedIn(k) {
			return nil, nil, nil, invalid("%s: the placeholder %s is reserved for the guard (every #%s... and :%s... is)", what, k, reservedPrefix, reservedPrefix)
		}
	}
	for k := range values {
		if reservedIn(k) {
			return nil, nil, nil, invalid("%s: the placeholder %s is reserved for the guard (every #%s... and :%s... is)", what, k, reservedPrefix, reservedPrefix)
		}
	}
	uc := strings.TrimSpace(aws.ToString(cond))
	if err := checkCondition(uc); err != nil {
		return nil, nil, nil, fmt.Errorf("%s: ConditionExpression: %w", what, err)
	}
	names = maps.Clone(names)
	if names == nil {
		names = map[string]string{}
	}
	values = maps.Clone(values)
	if values == nil {
		values = map[string]types.AttributeValue{}
	}
	names[fenceName], names[tokenName] = g.opts.FenceAttribute, g.opts.TokenAttribute
	values[fenceValue], values[tokenValue] = avN(fence), avS(tok)
	c := "(attribute_not_exists(" + fenceName + ") OR " + fenceName + " <= " + fenceValue + ") AND " +
		"(attribute_not_exists(" + tokenName + ") OR " + tokenName + " <> " + tokenValue + ")"
	if uc != "" {
		c += " AND (" + uc + ")"
	}
	return aws.String(c), names, values, nil
}

// checkCondition refuses a caller's condition expression that could escape
// the parentheses it is put in: one that closes a parenthesis it did not
// open, leaves one open, or uses the guard's reserved placeholders.
// DynamoDB expressions have no string literals (values are placeholders),
// so every parenthesis in the text is one of the grammar's.
func checkCondition(cond string) error {
	depth := 0
	for i := 0; i < len(cond); i++ {
		switch cond[i] {
		case '(':
			depth++
		case ')':
			depth--
			if depth < 0 {
				return invalid("%q closes a parenthesis it did not open (byte %d)", cond, i)
			}
		}
	}
	if depth > 0 {
		return invalid("%q leaves %d parenthes%s open", cond, depth, map[bool]string{true: "is", false: "es"}[depth == 1])
	}
	if reservedIn(cond) {
		return invalid("%q uses a placeholder starting with #%s or :%s, which the guard reserves", cond, reservedPrefix, reservedPrefix)
	}
	return nil
}

// refersTo reports whether an update expression refers to the top-level
// attribute attr, by name or through a placeholder of names, and how. A
// nested attribute of the same name (a.fence) does not count.
func refersTo(expr string, names map[string]string, attr string) (string, bool) {
	isName := func(c byte) bool {
		return c == '_' || c == '#' || c == ':' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
	}
	prev := byte(' ') // the last byte before the token, spaces skipped
	for i := 0; i < len(expr); {
		if !isName(expr[i]) {
			if expr[i] != ' ' && expr[i] != '\t' && expr[i] != '\n' && expr[i] != '\r' {
				prev = expr[i]
			}
			i++
			continue
		}
		j := i
		for j < len(expr) && isName(expr[j]) {
			j++
		}
		tok := expr[i:j]
		head := prev != '.'
		prev, i = 'a', j
		if !head || tok[0] == ':' {
			continue
		}
		if tok[0] == '#' {
			if n, ok := names[tok]; ok && n == attr {
				return tok, true
			}
			continue
		}
		if tok == attr {
			return tok, true
		}
	}
	return "", false
}

// onItem returns the index of the first of items that acts on the item key
// of table, or -1.
func onItem(items []types.TransactWriteItem, table string, key map[string]types.AttributeValue) int {
	same := func(t *string, k map[string]types.AttributeValue) bool {
		if aws.ToString(t) != table {
			return false
		}
		for n, v := range key {
			s, ok := k[n].(*types.AttributeValueMemberS)
			if !ok || s.Value != v.(*types.AttributeValueMemberS).Value {
				return false
			}
		}
		return true
	}
	for i, it := range items {
		switch {
		case it.Put != nil && same(it.Put.TableName, it.Put.Item),
			it.Update != nil && same(it.Update.TableName, it.Update.Key),
			it.Delete != nil && same(it.Delete.TableName, it.Delete.Key),
			it.ConditionCheck != nil && same(it.ConditionCheck.TableName, it.ConditionCheck.Key):
			return i
		}
	}
	return -1
}

// reservedIn reports whether s holds a placeholder reserved for the guard:
// one starting with #ddblease or :ddblease, in any case.
func reservedIn(s string) bool {
	l := strings.ToLower(s)
	return strings.Contains(l, "#"+reservedPrefix) || strings.Contains(l, ":"+reservedPrefix)
}
