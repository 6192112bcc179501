package ddblease

import (
	"fmt"
	"maps"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// This file owns the fence mark of a guarded item (marker): the attributes
// in which every guarded write finds and sets the highest fence it
// accepted (DefaultGuardFenceAttribute, DefaultGuardTokenAttribute), the
// conditions that refuse a lower one, and the checks of the caller's own
// expressions and transaction items that the mark relies on. guard.go's
// forms and JobRun.Commit write through it.

// marker keeps the fence high-water mark of guarded items: the attributes
// in which every guarded Put, Update and Delete finds and sets it, and the
// conditions that refuse a lower fence. A Guard has one (GuardOptions), and
// JobRun.Commit makes one (CommitOptions); every form writes the mark
// through it, so that forms mixed on one item agree.
type marker struct {
	fence string // the mark's attribute (GuardOptions.FenceAttribute)
	token string // the write token's attribute (GuardOptions.TokenAttribute)
}

// newMarker checks the names of a mark's attributes, taking the defaults
// for empty ones; what names the options for errors.
func newMarker(what, fence, token string) (marker, error) {
	if fence == "" {
		fence = DefaultGuardFenceAttribute
	}
	if token == "" {
		token = DefaultGuardTokenAttribute
	}
	if err := checkName(what+".FenceAttribute", fence, 255); err != nil {
		return marker{}, err
	}
	if err := checkName(what+".TokenAttribute", token, 255); err != nil {
		return marker{}, err
	}
	if fence == token {
		return marker{}, invalid("%s: TokenAttribute and FenceAttribute are both %q", what, fence)
	}
	return marker{fence: fence, token: token}, nil
}

// condition adds the fence high-water check and, unless tok is empty, the
// token check to a user's condition, after checking that it cannot escape
// them.
func (m marker) condition(what string, cond *string, names map[string]string, values map[string]types.AttributeValue,
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
	names[fenceName], values[fenceValue] = m.fence, avN(fence)
	c := "(attribute_not_exists(" + fenceName + ") OR " + fenceName + " <= " + fenceValue + ")"
	if tok != "" {
		names[tokenName], values[tokenValue] = m.token, avS(tok)
		c += " AND (attribute_not_exists(" + tokenName + ") OR " + tokenName + " <> " + tokenValue + ")"
	}
	if uc != "" {
		c += " AND (" + uc + ")"
	}
	return aws.String(c), names, values, nil
}

// item returns a copy of a Put's item carrying the mark and the token; an
// item that holds the token attribute already is refused.
func (m marker) item(what string, item map[string]types.AttributeValue, fence int64, tok string) (map[string]types.AttributeValue, error) {
	if _, ok := item[m.token]; ok {
		return nil, invalid("%s: the item holds attribute %q, which the guard reserves for its write token (TokenAttribute)", what, m.token)
	}
	item = maps.Clone(item)
	item[m.fence] = avN(fence)
	item[m.token] = avS(tok)
	return item, nil
}

// update returns an Update's expression with the assignments of the mark
// and the token added; one that uses the guard's placeholders, or refers to
// the mark's or the token's attribute at the top level (which could lower
// or remove the mark), is refused.
func (m marker) update(what string, expr *string, names map[string]string) (*string, error) {
	e := aws.ToString(expr)
	if reservedIn(e) {
		return nil, invalid("%s: the UpdateExpression uses a placeholder starting with #%s or :%s, which the guard reserves",
			what, reservedPrefix, reservedPrefix)
	}
	for _, a := range []string{m.fence, m.token} {
		if ref, ok := refersTo(e, names, a); ok {
			return nil, invalid("%s: the UpdateExpression refers to attribute %q (as %s), which the guard keeps", what, a, ref)
		}
	}
	return aws.String(withFenceSet(e)), nil
}

// transactItems returns items as a guarded transaction writes them: every
// Put and Update sets the mark to fence and the token to tok, and every
// Put, Update and Delete carries the high-water condition (and, but for
// Delete, the token condition) before its own, and returns the stored item
// when a condition fails. ConditionChecks are left as they are. what names
// the call for errors.
func (m marker) transactItems(what string, items []types.TransactWriteItem, fence int64, tok string) ([]types.TransactWriteItem, error) {
	out := make([]types.TransactWriteItem, len(items))
	for i, it := range items {
		w := fmt.Sprintf("%s: item %d", what, i)
		var err error
		switch {
		case it.Put != nil:
			p := *it.Put
			if p.Item, err = m.item(w, it.Put.Item, fence, tok); err == nil {
				p.ConditionExpression, p.ExpressionAttributeNames, p.ExpressionAttributeValues, err =
					m.condition(w, p.ConditionExpression, p.ExpressionAttributeNames, p.ExpressionAttributeValues, fence, tok)
			}
			p.ReturnValuesOnConditionCheckFailure = types.ReturnValuesOnConditionCheckFailureAllOld
			it.Put = &p
		case it.Update != nil:
			u := *it.Update
			if u.UpdateExpression, err = m.update(w, it.Update.UpdateExpression, it.Update.ExpressionAttributeNames); err == nil {
				u.ConditionExpression, u.ExpressionAttributeNames, u.ExpressionAttributeValues, err =
					m.condition(w, u.ConditionExpression, u.ExpressionAttributeNames, u.ExpressionAttributeValues, fence, tok)
			}
			u.ReturnValuesOnConditionCheckFailure = types.ReturnValuesOnConditionCheckFailureAllOld
			it.Update = &u
		case it.Delete != nil:
			d := *it.Delete
			d.ConditionExpression, d.ExpressionAttributeNames, d.ExpressionAttributeValues, err =
				m.condition(w, d.ConditionExpression, d.ExpressionAttributeNames, d.ExpressionAttributeValues, fence, "")
			d.ReturnValuesOnConditionCheckFailure = types.ReturnValuesOnConditionCheckFailureAllOld
			it.Delete = &d
		}
		if err != nil {
			return nil, err
		}
		out[i] = it
	}
	return out, nil
}

// above reports whether a stored item's mark is above fence, and returns
// the mark; an item without a mark has none above any fence.
func (m marker) above(item map[string]types.AttributeValue, fence int64) (int64, bool, error) {
	if _, ok := item[m.fence]; !ok {
		return 0, false, nil
	}
	mark, err := num(item, m.fence)
	if err != nil {
		return 0, false, fmt.Errorf("%w: target item: %v", ErrMalformedItem, err)
	}
	return mark, mark > fence, nil
}

// carries reports whether a stored item carries the write token tok.
func (m marker) carries(item map[string]types.AttributeValue, tok string) bool {
	t, ok := item[m.token].(*types.AttributeValueMemberS)
	return ok && tok != "" && t.Value == tok
}

// markRefusal explains a cancelled guarded transaction w whose guarded
// items are items, from action off on: applied when an item that failed
// its condition carries tok (an earlier attempt of the transaction landed,
// and its answer was lost); otherwise the mark above fence of the first
// item refused by it (mark > 0), or neither (a condition of the caller's
// failed, or the transaction was not cancelled by a condition). A
// malformed mark, or a stored item that cannot be read, is an error.
func (m marker) markRefusal(w *written, off int, items []types.TransactWriteItem, fence int64, tok string) (applied bool, mark int64, rerr error) {
	for i, it := range items {
		if _, failed := w.fails[off+i]; !failed || it.ConditionCheck != nil {
			continue
		}
		got, err := w.stored(off + i)
		if err != nil {
			return false, 0, fmt.Errorf("cannot tell why item %d was refused: %w", i, err)
		}
		if m.carries(got, tok) {
			return true, 0, nil
		}
		hw, up, aerr := m.above(got, fence)
		if aerr != nil {
			return false, 0, fmt.Errorf("item %d: %w", i, aerr)
		}
		if up && mark == 0 {
			mark = hw
		}
	}
	return false, mark, nil
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
		if !sameTable(aws.ToString(t), table) {
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
		if same(target(it)) {
			return i
		}
	}
	return -1
}

// libraryItem returns the index of the first of items that acts on an
// item the library keeps in the lease table (the lease or job-run item of
// any job), or -1: the guard's mark would write over their fence.
func libraryItem(items []types.TransactWriteItem, table string, y Layout) int {
	for i, it := range items {
		if t, k := target(it); it.ConditionCheck == nil && keptItem(t, k, table, y) {
			return i
		}
	}
	return -1
}

// keptItem reports whether the item of key k in table t is a lease or
// job-run item of the lease table.
func keptItem(t *string, k map[string]types.AttributeValue, table string, y Layout) bool {
	if !sameTable(aws.ToString(t), table) {
		return false
	}
	pk, pok := k[y.PartitionKey].(*types.AttributeValueMemberS)
	sk, sok := k[y.SortKey].(*types.AttributeValueMemberS)
	return pok && sok && strings.HasPrefix(pk.Value, y.jobPartition("")) &&
		(sk.Value == skLease || strings.HasPrefix(sk.Value, skRunPrefix))
}

// sameTable reports whether a and b name one table, each given as a name
// or as a table's ARN (arn:PARTITION:dynamodb:REGION:ACCOUNT:table/NAME),
// which DynamoDB accepts as a TableName: they are compared by name. The
// region and account of an ARN are not compared (the guard does not know
// its client's), so a same-named table elsewhere counts as the lease
// table: the refusals that use this fail closed.
func sameTable(a, b string) bool {
	return tableName(a) == tableName(b)
}

// tableName is the name of the table that s gives as a TableName: the
// name of a DynamoDB table ARN, or s itself when it is not one (a name,
// or a malformed ARN, which DynamoDB refuses).
func tableName(s string) string {
	rest, ok := strings.CutPrefix(s, "arn:")
	if !ok {
		return s
	}
	f := strings.SplitN(rest, ":", 5) // partition, service, region, account, resource
	if len(f) != 5 || f[0] == "" || f[1] != "dynamodb" {
		return s
	}
	name, ok := strings.CutPrefix(f[4], "table/")
	if !ok {
		return s
	}
	// A table's ARN ends with its name; a longer resource (an index, a
	// stream) is no TableName, but is compared by its table's name so that
	// it cannot pass a refusal either.
	name, _, _ = strings.Cut(name, "/")
	if name == "" {
		return s
	}
	return name
}

// reservedIn reports whether s holds a placeholder reserved for the guard:
// one starting with #ddblease or :ddblease, in any case.
func reservedIn(s string) bool {
	l := strings.ToLower(s)
	return strings.Contains(l, "#"+reservedPrefix) || strings.Contains(l, ":"+reservedPrefix)
}

// Placeholders with which Put and Update refer to the fence high-water mark
// and the write token. Every placeholder starting with #ddblease or
// :ddblease is reserved.
const (
	fenceName      = "#ddbleaseFence"
	fenceValue     = ":ddbleaseFence"
	tokenName      = "#ddbleaseToken"
	tokenValue     = ":ddbleaseToken"
	reservedPrefix = "ddblease"
)

// withFenceSet adds the guard's fence and token assignments to the SET
// clause of an update expression, creating the clause if there is none.
func withFenceSet(expr string) string {
	const set = fenceName + " = " + fenceValue + ", " + tokenName + " = " + tokenValue
	if strings.TrimSpace(expr) == "" {
		return "SET " + set
	}
	if i := setKeyword(expr); i >= 0 {
		return expr[:i+3] + " " + set + "," + expr[i+3:]
	}
	return "SET " + set + " " + expr
}

// setKeyword returns the index of the SET keyword in an update expression,
// or -1. SET is a reserved word, so outside placeholders it is the keyword.
func setKeyword(expr string) int {
	isName := func(c byte) bool {
		return c == '_' || c == '#' || c == ':' || c == '.' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
	}
	for i := 0; i+3 <= len(expr); i++ {
		if !strings.EqualFold(expr[i:i+3], "SET") || i > 0 && isName(expr[i-1]) {
			continue
		}
		if i+3 == len(expr) || !isName(expr[i+3]) || expr[i+3] == '#' || expr[i+3] == ':' {
			return i
		}
	}
	return -1
}

// DefaultGuardFenceAttribute is the default of GuardOptions.FenceAttribute
// and CommitOptions.FenceAttribute: the attribute of a guarded item that
// holds its fence high-water mark.
const DefaultGuardFenceAttribute = "fence"

// DefaultGuardTokenAttribute is the default of GuardOptions.TokenAttribute
// and CommitOptions.TokenAttribute: the attribute of a guarded item that
// holds the token of the write that wrote it last.
const DefaultGuardTokenAttribute = "fenceWrite"
