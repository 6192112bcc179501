package ddbtest

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
)

// IgnoreRemove returns a transport in front of base that makes the server
// behind it behave as one that ignores the REMOVE clause of an update
// expression (minidyn v0.8.2 ignores a top-level REMOVE): it drops that
// clause from every UpdateItem request and from every Update action of a
// TransactWriteItems request, and the expression attribute names only it
// used, before the request goes on. A request whose update expression is
// a REMOVE clause alone is sent unchanged. Tests use it to check that the
// library does not depend on REMOVE.
func IgnoreRemove(base http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		op := Op(r)
		if r.Body == nil || op != "UpdateItem" && op != "TransactWriteItems" {
			return base.RoundTrip(r)
		}
		body, err := io.ReadAll(r.Body)
		r.Body.Close()
		if err != nil {
			return nil, err
		}
		if out, ok := dropRemove(op, body); ok {
			body = out
		}
		r = r.Clone(r.Context())
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		r.Header.Set("Content-Length", strconv.Itoa(len(body)))
		r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		return base.RoundTrip(r)
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// dropRemove rewrites an UpdateItem or TransactWriteItems request body.
func dropRemove(op string, body []byte) ([]byte, bool) {
	var req map[string]any
	if json.Unmarshal(body, &req) != nil {
		return nil, false
	}
	changed := false
	if op == "UpdateItem" {
		changed = dropRemoveIn(req)
	} else if items, ok := req["TransactItems"].([]any); ok {
		for _, it := range items {
			if m, ok := it.(map[string]any); ok {
				if upd, ok := m["Update"].(map[string]any); ok && dropRemoveIn(upd) {
					changed = true
				}
			}
		}
	}
	if !changed {
		return nil, false
	}
	out, err := json.Marshal(req)
	return out, err == nil
}

var (
	clauseRE = regexp.MustCompile(`(?i)\b(SET|REMOVE|ADD|DELETE)\b`)
	nameRE   = regexp.MustCompile(`#[A-Za-z0-9_]+`)
)

// dropRemoveIn drops the REMOVE clause of one update (its fields as in
// the request) and the names only that clause used.
func dropRemoveIn(upd map[string]any) bool {
	expr, _ := upd["UpdateExpression"].(string)
	loc := clauseRE.FindAllStringIndex(expr, -1)
	for i, l := range loc {
		if !strings.EqualFold(expr[l[0]:l[1]], "REMOVE") {
			continue
		}
		end := len(expr)
		if i+1 < len(loc) {
			end = loc[i+1][0]
		}
		rest := strings.TrimSpace(expr[:l[0]] + expr[end:])
		if rest == "" {
			return false
		}
		upd["UpdateExpression"] = rest
		names, _ := upd["ExpressionAttributeNames"].(map[string]any)
		used := map[string]bool{}
		for _, field := range []string{"UpdateExpression", "ConditionExpression"} {
			s, _ := upd[field].(string)
			for _, n := range nameRE.FindAllString(s, -1) {
				used[n] = true
			}
		}
		for n := range names {
			if !used[n] {
				delete(names, n)
			}
		}
		return true
	}
	return false
}
