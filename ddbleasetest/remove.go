package ddbleasetest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// The in-process server (minidyn v0.8.2) ignores a top-level REMOVE in an
// update expression, and cannot answer with an empty map or list: it
// stores one, but returns it as {}, which the SDK decodes as NULL or as
// another attribute's value. So that a test passes here only where it
// would pass on DynamoDB, the handler applies the REMOVE clause of
// UpdateItem and of TransactWriteItems' Update actions itself, as DynamoDB
// does: it checks the clause (key attributes, overlapping paths, document
// paths that cannot be followed), sends the request on without it (a
// REMOVE alone becomes a SET of a scratch attribute, so that the
// condition is still checked and a missing item still made), then, once
// the write is applied, rewrites the item without the removed paths and
// makes the returned attributes match. A write that would store an empty
// map or list is refused (errEmptyValue); an update that might (one with
// an empty operand, or a REMOVE) is undone if it did. All of it happens
// while the handler serves no other request.

// update is an update the handler watches: its REMOVE clause, if any, and
// the item it writes as it was before.
type update struct {
	table string
	key   map[string]json.RawMessage
	paths [][]pathStep               // the REMOVE clause's, in the order they are removed
	dels  []setDelete                // the DELETE clause's
	named map[string]bool            // the attributes the update's paths begin with
	rest  string                     // the update expression without the REMOVE and DELETE clauses
	old   map[string]json.RawMessage // the item before the update; nil if none
}

// pathStep is one step of a document path: an attribute or map key, or a
// list index.
type pathStep struct {
	name  string
	index int // when name is ""
}

const (
	scratchName  = "#ddbleasetest_remove"
	scratchValue = ":ddbleasetest_remove"
	scratchAttr  = "ddbleasetest:remove" // no attribute of a test's own, one hopes
)

// errValidation is a ValidationException to answer, as DynamoDB words it.
type errValidation string

func (e errValidation) Error() string { return string(e) }

// serveWrite serves a write (PutItem, UpdateItem, TransactWriteItems,
// BatchWriteItem) through h when the server alone would get it wrong: it
// refuses to store an empty map or list value (errEmptyValue), and applies the
// REMOVE clauses of updates itself. It reports false, having written
// nothing, for any other request.
func serveWrite(h http.Handler, w http.ResponseWriter, op string, body []byte) bool {
	var req map[string]json.RawMessage
	if json.Unmarshal(body, &req) != nil {
		return false
	}
	var status int
	var resp []byte
	var err error
	switch op {
	case "PutItem", "BatchWriteItem":
		if !emptyValue(req["Item"]) && !emptyValue(req["RequestItems"]) {
			return false
		}
		err = errEmptyValue
	case "UpdateItem":
		var u *update
		if u, err = parseUpdate(h, req); u == nil && err == nil {
			return false
		}
		if err == nil {
			status, resp, err = updateItem(h, req, u)
		}
	case "TransactWriteItems":
		var handled bool
		status, resp, handled, err = transactWrite(h, req)
		if !handled && err == nil {
			return false
		}
	default:
		return false
	}
	if err != nil {
		var v errValidation
		if !errors.As(err, &v) {
			v = errValidation("ddbleasetest: applying an update: " + err.Error())
		}
		status, resp = http.StatusBadRequest, mustJSON(map[string]string{
			"__type": "com.amazon.coral.validate#ValidationException", "message": string(v)})
	}
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	w.WriteHeader(status)
	_, _ = w.Write(resp)
	return true
}

// updateItem sends an UpdateItem without its REMOVE clause, then applies
// the clause.
func updateItem(h http.Handler, req map[string]json.RawMessage, u *update) (int, []byte, error) {
	if err := u.load(h); err != nil {
		return 0, nil, err
	}
	u.strip(req)
	status, resp := call(h, "UpdateItem", mustJSON(req))
	if status != http.StatusOK {
		return status, resp, nil
	}
	item, err := u.apply(h)
	if err != nil {
		return 0, nil, errors.Join(err, u.rollBack(h))
	}
	if len(u.paths) == 0 && len(u.dels) == 0 {
		return status, resp, nil
	}
	var rv string
	_ = json.Unmarshal(req["ReturnValues"], &rv)
	var out map[string]json.RawMessage
	if err := json.Unmarshal(resp, &out); err != nil {
		return 0, nil, err
	}
	var attrs map[string]json.RawMessage
	_ = json.Unmarshal(out["Attributes"], &attrs)
	for n := range attrs { // minidyn also returns attributes the update did not name (number sets)
		if (rv == "UPDATED_NEW" || rv == "UPDATED_OLD") && !u.named[n] {
			delete(attrs, n)
		}
	}
	switch rv {
	case "ALL_NEW":
		attrs = item
	case "UPDATED_NEW":
		delete(attrs, scratchAttr)
		for _, p := range u.paths {
			_ = removePath(attrs, p) // a path not returned is not there to remove
		}
		for _, d := range u.dels { // the set as the DELETE left it, if it is still there
			if v, ok := item[d.path[0].name]; ok {
				if attrs == nil {
					attrs = map[string]json.RawMessage{}
				}
				attrs[d.path[0].name] = v
			} else {
				delete(attrs, d.path[0].name)
			}
		}
	case "UPDATED_OLD":
		for _, p := range append(slices.Clone(u.paths), u.delPaths()...) { // DynamoDB returns the whole attribute
			if !present(u.old, p) {
				continue
			}
			if attrs == nil {
				attrs = map[string]json.RawMessage{}
			}
			attrs[p[0].name] = u.old[p[0].name]
		}
	}
	if attrs != nil {
		out["Attributes"] = mustJSON(attrs)
	}
	return status, mustJSON(out), nil
}

// transactWrite sends a TransactWriteItems whose Update actions' REMOVE
// clauses were taken out, then applies them if it succeeded. It reports
// whether it handled the request: a Put of an empty map or list, or an
// Update it watches.
func transactWrite(h http.Handler, req map[string]json.RawMessage) (int, []byte, bool, error) {
	var actions []map[string]json.RawMessage
	if json.Unmarshal(req["TransactItems"], &actions) != nil {
		return 0, nil, false, nil
	}
	var us []*update
	for _, a := range actions {
		if emptyValue(a["Put"]) {
			return 0, nil, true, errEmptyValue
		}
		var upd map[string]json.RawMessage
		if json.Unmarshal(a["Update"], &upd) != nil {
			continue
		}
		u, err := parseUpdate(h, upd)
		if err != nil {
			return 0, nil, true, err
		}
		if u == nil {
			continue
		}
		if err := u.load(h); err != nil {
			return 0, nil, true, err
		}
		u.strip(upd)
		a["Update"] = mustJSON(upd)
		us = append(us, u)
	}
	if len(us) == 0 {
		return 0, nil, false, nil
	}
	req["TransactItems"] = mustJSON(actions)
	status, resp := call(h, "TransactWriteItems", mustJSON(req))
	if status != http.StatusOK {
		return status, resp, true, nil
	}
	for i, u := range us {
		if _, err := u.apply(h); err != nil {
			for _, u := range us[:i+1] {
				err = errors.Join(err, u.rollBack(h))
			}
			return 0, nil, true, err
		}
	}
	return status, resp, true, nil
}

// strip takes the REMOVE clause out of an update: its update expression
// becomes the rest, or a SET of the scratch attribute when nothing is
// left, and the names that only the clause used are dropped.
func (u *update) strip(upd map[string]json.RawMessage) {
	if len(u.paths) == 0 && len(u.dels) == 0 {
		return
	}
	rest := u.rest
	var names map[string]string
	_ = json.Unmarshal(upd["ExpressionAttributeNames"], &names)
	if rest == "" {
		rest = "SET " + scratchName + " = " + scratchValue
		if names == nil {
			names = map[string]string{}
		}
		names[scratchName] = scratchAttr
		var values map[string]json.RawMessage
		_ = json.Unmarshal(upd["ExpressionAttributeValues"], &values)
		if values == nil {
			values = map[string]json.RawMessage{}
		}
		values[scratchValue] = json.RawMessage(`{"BOOL":true}`)
		upd["ExpressionAttributeValues"] = mustJSON(values)
	}
	upd["UpdateExpression"] = mustJSON(rest)
	var cond string
	_ = json.Unmarshal(upd["ConditionExpression"], &cond)
	for n := range names {
		if !usesName(rest, n) && !usesName(cond, n) {
			delete(names, n)
		}
	}
	if len(names) > 0 {
		upd["ExpressionAttributeNames"] = mustJSON(names)
	} else {
		delete(upd, "ExpressionAttributeNames")
	}
	var values map[string]json.RawMessage // drop the values only the DELETE clause used
	_ = json.Unmarshal(upd["ExpressionAttributeValues"], &values)
	for v := range values {
		if !usesValue(rest, v) && !usesValue(cond, v) {
			delete(values, v)
		}
	}
	if len(values) > 0 {
		upd["ExpressionAttributeValues"] = mustJSON(values)
	} else {
		delete(upd, "ExpressionAttributeValues")
	}
}

var valueRE = regexp.MustCompile(`:[A-Za-z0-9_]+`)

func usesValue(expr, value string) bool {
	return slices.Contains(valueRE.FindAllString(expr, -1), value)
}

var placeholderRE = regexp.MustCompile(`#[A-Za-z0-9_]+`)

func usesName(expr, name string) bool {
	return slices.Contains(placeholderRE.FindAllString(expr, -1), name)
}

// load reads the item as it is before the update, and refuses the
// removal, as DynamoDB would, when one of its paths cannot be followed in
// it (a step before the last is missing or of another type).
func (u *update) load(h http.Handler) error {
	var err error
	if u.old, err = getItem(h, u.table, u.key); err != nil {
		return err
	}
	for _, p := range u.paths {
		if err := removePath(clone(u.old), p); err != nil {
			return errValidation("The document path provided in the update expression is invalid for update")
		}
	}
	for _, d := range u.dels {
		if err := d.check(u.old); err != nil {
			return err
		}
	}
	return nil
}

// apply removes the paths from the item as the update left it and writes
// it back; it returns the item written. It refuses to leave an empty map
// or list, which the server cannot store (the caller undoes the update).
func (u *update) apply(h http.Handler) (map[string]json.RawMessage, error) {
	item, err := getItem(h, u.table, u.key)
	if err != nil {
		return nil, err
	}
	if item == nil {
		return nil, fmt.Errorf("the item updated in %s is gone", u.table)
	}
	delete(item, scratchAttr)
	for _, p := range u.paths {
		if err := removePath(item, p); err != nil {
			return nil, err
		}
	}
	for _, d := range u.dels {
		if err := d.apply(item); err != nil {
			return nil, err
		}
	}
	if emptyValue(mustJSON(item)) {
		return nil, errEmptyValue
	}
	if len(u.paths) == 0 && len(u.dels) == 0 {
		return item, nil
	}
	status, resp := call(h, "PutItem", mustJSON(map[string]any{"TableName": u.table, "Item": item}))
	if status != http.StatusOK {
		return nil, fmt.Errorf("rewriting the item: %s", resp)
	}
	return item, nil
}

// rollBack puts the item back as it was before the update.
func (u *update) rollBack(h http.Handler) error {
	body, op := mustJSON(map[string]any{"TableName": u.table, "Item": u.old}), "PutItem"
	if u.old == nil {
		body, op = mustJSON(map[string]any{"TableName": u.table, "Key": u.key}), "DeleteItem"
	}
	if status, resp := call(h, op, body); status != http.StatusOK {
		return fmt.Errorf("undoing the update: %s", resp)
	}
	return nil
}

// errEmptyValue refuses a write that would store an empty map or list:
// minidyn v0.8.2 returns one as {}, which the SDK reads as NULL or as the
// value of another attribute.
const errEmptyValue = errValidation("ddbleasetest: the in-process server (minidyn v0.8.2) cannot store an empty map or list " +
	"(it would return NULL, or another attribute's value); DynamoDB can: run this test on another server " +
	"(DDBLEASE_TEST_ENDPOINT), or keep an entry in the map or list")

// emptyValue reports whether a request body or item holds an empty map
// or list value: {"M":{}}, {"L":[]}, or {} as minidyn returns them.
func emptyValue(body []byte) bool {
	var v any
	if json.Unmarshal(body, &v) != nil {
		return false
	}
	var walk func(any) bool
	walk = func(v any) bool {
		switch v := v.(type) {
		case map[string]any:
			if l, ok := v["L"].([]any); len(v) == 0 || ok && len(l) == 0 {
				return true
			}
			for _, x := range v {
				if walk(x) {
					return true
				}
			}
		case []any:
			for _, x := range v {
				if walk(x) {
					return true
				}
			}
		}
		return false
	}
	return walk(v)
}

// getItem reads an item with a consistent read; nil if there is none.
func getItem(h http.Handler, table string, key map[string]json.RawMessage) (map[string]json.RawMessage, error) {
	status, resp := call(h, "GetItem", mustJSON(map[string]any{"TableName": table, "Key": key, "ConsistentRead": true}))
	if status != http.StatusOK {
		return nil, fmt.Errorf("reading the item: %s", resp)
	}
	var out struct{ Item map[string]json.RawMessage }
	if err := json.Unmarshal(resp, &out); err != nil {
		return nil, err
	}
	return out.Item, nil
}

// call sends one request to h and returns its status and body.
func call(h http.Handler, op string, body []byte) (int, []byte) {
	r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
	r.Header.Set("X-Amz-Target", "DynamoDB_20120810."+op)
	r.Header.Set("Content-Type", "application/x-amz-json-1.0")
	rec := &recorder{header: http.Header{}, status: http.StatusOK}
	h.ServeHTTP(rec, r)
	return rec.status, rec.body.Bytes()
}

// mustJSON encodes v, which holds only values decoded from JSON and so
// always encodes.
func mustJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

func clone(item map[string]json.RawMessage) map[string]json.RawMessage {
	out := make(map[string]json.RawMessage, len(item))
	for k, v := range item {
		out[k] = v
	}
	return out
}

func (s pathStep) String() string {
	if s.name == "" {
		return "[" + strconv.Itoa(s.index) + "]"
	}
	return s.name
}

func pathString(p []pathStep) string {
	var b strings.Builder
	for i, s := range p {
		if i > 0 && s.name != "" {
			b.WriteString(", ")
		}
		b.WriteString(s.String())
	}
	return "[" + b.String() + "]"
}

var clauseRE = regexp.MustCompile(`(?i)(?:^|[^#:A-Za-z0-9_])(SET|REMOVE|ADD|DELETE)(?:$|[^A-Za-z0-9_])`)

// parseUpdate reads an update (UpdateItem's request, or an Update
// action) and returns it if the handler must watch it: it has a REMOVE
// clause, or an empty map or list among its values. A REMOVE clause
// DynamoDB would refuse is an errValidation.
func parseUpdate(h http.Handler, upd map[string]json.RawMessage) (*update, error) {
	var expr string
	var names map[string]string
	if json.Unmarshal(upd["UpdateExpression"], &expr) != nil {
		return nil, nil
	}
	u := &update{rest: expr}
	if json.Unmarshal(upd["TableName"], &u.table) != nil || json.Unmarshal(upd["Key"], &u.key) != nil {
		return nil, nil // the server refuses it
	}
	_ = json.Unmarshal(upd["ExpressionAttributeNames"], &names)
	var values map[string]json.RawMessage
	_ = json.Unmarshal(upd["ExpressionAttributeValues"], &values)
	type clause struct{ kind, body string }
	var clauses []clause
	loc := clauseRE.FindAllStringSubmatchIndex(expr, -1)
	var kept []string
	if len(loc) > 0 {
		kept = append(kept, strings.TrimSpace(expr[:loc[0][2]]))
	}
	count := map[string]int{}
	for i, l := range loc {
		end := len(expr)
		if i+1 < len(loc) {
			end = loc[i+1][2]
		}
		c := clause{strings.ToUpper(expr[l[2]:l[3]]), expr[l[3]:end]}
		if count[c.kind]++; count[c.kind] > 1 {
			return nil, errValidation(`Invalid UpdateExpression: The "` + c.kind + `" section can only be used once in an update expression;`)
		}
		if c.kind != "REMOVE" && c.kind != "DELETE" {
			kept = append(kept, strings.TrimSpace(expr[l[2]:end]))
		}
		clauses = append(clauses, c)
	}
	if count["REMOVE"] == 0 && count["DELETE"] == 0 {
		for _, c := range clauses {
			for _, part := range splitTop(c.body) {
				if f := strings.Fields(part); c.kind == "ADD" && len(f) == 2 {
					if err := checkAddOperand(f[1], values); err != nil {
						return nil, err
					}
				}
			}
		}
		if emptyValue(upd["ExpressionAttributeValues"]) {
			return u, nil
		}
		return nil, nil
	}
	u.rest = strings.TrimSpace(strings.Join(kept, " "))
	var others [][]pathStep
	for _, c := range clauses {
		for _, part := range splitTop(c.body) {
			var operand string
			switch c.kind {
			case "SET":
				part, _, _ = strings.Cut(part, "=")
			case "ADD", "DELETE":
				f := strings.Fields(part + " ")
				if len(f) != 2 {
					return nil, errValidation(fmt.Sprintf("Invalid UpdateExpression: Syntax error; %s takes a path and a value: %q", c.kind, strings.TrimSpace(part)))
				}
				part, operand = f[0], f[1]
			}
			p, err := parsePath(part, names)
			if err != nil {
				return nil, err
			}
			switch c.kind {
			case "REMOVE":
				u.paths = append(u.paths, p)
			case "DELETE":
				d, err := newSetDelete(p, operand, values)
				if err != nil {
					return nil, err
				}
				u.dels = append(u.dels, d)
			case "ADD":
				if err := checkAddOperand(operand, values); err != nil {
					return nil, err
				}
				others = append(others, p)
			default:
				others = append(others, p)
			}
		}
	}
	u.named = map[string]bool{}
	for _, p := range append(append(slices.Clone(u.paths), u.delPaths()...), others...) {
		u.named[p[0].name] = true
	}
	if known, err := u.checkKey(h); !known || err != nil {
		return nil, err // an unknown table: the server refuses the update
	}
	return u, u.checkPaths(others)
}

// checkKey refuses the removal of a key attribute. It reports false if
// the table is not known.
func (u *update) checkKey(h http.Handler) (bool, error) {
	status, resp := call(h, "DescribeTable", mustJSON(map[string]string{"TableName": u.table}))
	if status != http.StatusOK {
		return false, nil
	}
	var out struct {
		Table struct {
			KeySchema []struct{ AttributeName string }
		}
	}
	if err := json.Unmarshal(resp, &out); err != nil {
		return true, err
	}
	for _, k := range out.Table.KeySchema {
		for _, p := range append(slices.Clone(u.paths), u.delPaths()...) {
			if p[0].name == k.AttributeName {
				return true, errValidation("One or more parameter values were invalid: Cannot update attribute " +
					k.AttributeName + ". This attribute is part of the key")
			}
		}
	}
	return true, nil
}

// checkPaths refuses a removed path that overlaps another path of the
// update, and orders the removals so that removing one list element does
// not move another still to be removed.
func (u *update) checkPaths(others [][]pathStep) error {
	mine := append(slices.Clone(u.paths), u.delPaths()...)
	for i, p := range mine {
		for j, q := range append(slices.Clone(mine), others...) {
			if j != i && overlap(p, q) {
				return errValidation(fmt.Sprintf("Invalid UpdateExpression: Two document paths overlap with each other; "+
					"must remove or rewrite one of these paths; path one: %s, path two: %s", pathString(p), pathString(q)))
			}
		}
	}
	slices.SortFunc(u.paths, func(a, b []pathStep) int {
		for i := 0; i < min(len(a), len(b)); i++ {
			switch {
			case a[i].name != b[i].name:
				return strings.Compare(a[i].name, b[i].name)
			case a[i].index != b[i].index:
				return b[i].index - a[i].index // the higher index first
			}
		}
		return 0
	})
	return nil
}

// overlap reports whether one path is a prefix of the other.
func overlap(a, b []pathStep) bool {
	n := min(len(a), len(b))
	return slices.Equal(a[:n], b[:n])
}

// splitTop splits a clause's body at the commas outside parentheses.
func splitTop(body string) []string {
	var parts []string
	depth, start := 0, 0
	for i, r := range body {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				parts = append(parts, body[start:i])
				start = i + 1
			}
		}
	}
	return append(parts, body[start:])
}

var stepRE = regexp.MustCompile(`^(?:(#?[A-Za-z0-9_]+)|\[\s*([0-9]+)\s*\])`)

// parsePath reads a document path (a.#b[2].c), resolving placeholders.
func parsePath(s string, names map[string]string) ([]pathStep, error) {
	s = strings.TrimSpace(s)
	var p []pathStep
	for len(s) > 0 {
		if len(p) > 0 && s[0] == '.' {
			s = strings.TrimSpace(s[1:])
		} else if len(p) > 0 && s[0] != '[' {
			break
		}
		m := stepRE.FindStringSubmatch(s)
		if m == nil || len(p) == 0 && m[1] == "" {
			break
		}
		s = strings.TrimSpace(s[len(m[0]):])
		if m[1] == "" {
			i, err := strconv.Atoi(m[2])
			if err != nil {
				return nil, errValidation("Invalid UpdateExpression: list index " + m[2])
			}
			p = append(p, pathStep{index: i})
			continue
		}
		name := m[1]
		if strings.HasPrefix(name, "#") {
			n, ok := names[name]
			if !ok {
				return nil, errValidation("Invalid UpdateExpression: An expression attribute name used in the document path is not defined; attribute name: " + name)
			}
			name = n
		}
		p = append(p, pathStep{name: name})
	}
	if len(p) == 0 || s != "" {
		return nil, errValidation(fmt.Sprintf("ddbleasetest: cannot read the document path %q in an update expression", s))
	}
	return p, nil
}

// present reports whether path p leads to a value in item.
func present(item map[string]json.RawMessage, p []pathStep) bool {
	av, ok := item[p[0].name]
	for _, s := range p[1:] {
		if !ok {
			return false
		}
		var v struct {
			M map[string]json.RawMessage
			L []json.RawMessage
		}
		if json.Unmarshal(av, &v) != nil {
			return false
		}
		if s.name != "" {
			av, ok = v.M[s.name]
		} else if ok = s.index < len(v.L); ok {
			av = v.L[s.index]
		}
	}
	return ok
}

// removePath removes path p from item. A missing last step is no error;
// a missing or mistyped step before it is.
func removePath(item map[string]json.RawMessage, p []pathStep) error {
	if len(p) == 1 {
		delete(item, p[0].name)
		return nil
	}
	av, ok := item[p[0].name]
	if !ok {
		return errors.New("no attribute " + p[0].name)
	}
	out, err := removeIn(av, p[1:])
	if err != nil {
		return err
	}
	item[p[0].name] = out
	return nil
}

// removeIn removes the path rest from the attribute value av and returns
// the new value.
func removeIn(av json.RawMessage, rest []pathStep) (json.RawMessage, error) {
	var v map[string]json.RawMessage
	if err := json.Unmarshal(av, &v); err != nil {
		return nil, err
	}
	s := rest[0]
	if s.name != "" {
		var err error
		var m map[string]json.RawMessage
		if json.Unmarshal(v["M"], &m) != nil || m == nil {
			return nil, errors.New("not a map at " + s.name)
		}
		if len(rest) == 1 {
			delete(m, s.name)
		} else if child, ok := m[s.name]; !ok {
			return nil, errors.New("no key " + s.name)
		} else if m[s.name], err = removeIn(child, rest[1:]); err != nil {
			return nil, err
		}
		return mustJSON(map[string]any{"M": m}), nil
	}
	var l []json.RawMessage
	if json.Unmarshal(v["L"], &l) != nil || l == nil {
		return nil, errors.New("not a list at " + s.String())
	}
	switch {
	case len(rest) == 1:
		if s.index < len(l) {
			l = slices.Delete(l, s.index, s.index+1)
		}
	case s.index >= len(l):
		return nil, errors.New("no element " + s.String())
	default:
		var err error
		if l[s.index], err = removeIn(l[s.index], rest[1:]); err != nil {
			return nil, err
		}
	}
	return mustJSON(map[string]any{"L": l}), nil
}
