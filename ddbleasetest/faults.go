package ddbleasetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
)

// Action says what Faults does with one request.
type Action int

const (
	// Pass forwards the request and returns the response.
	Pass Action = iota
	// DropResponse forwards the request, lets the server apply it, and
	// returns a connection reset instead of the response: a write whose
	// outcome the client cannot know.
	DropResponse
	// Reset returns a connection reset without forwarding the request.
	Reset
	// ServerError answers HTTP 500 (InternalServerError) without
	// forwarding the request.
	ServerError
	// Throttle answers HTTP 400 ProvisionedThroughputExceededException,
	// which the SDK retries with backoff, without forwarding the request.
	Throttle
	// Hold answers a connection reset at once but keeps the request, and
	// sends it to the server when Release is called: a request abandoned
	// by the client that lands late.
	Hold
	// Conflict answers as DynamoDB does when another transaction holds an
	// item, without forwarding the request: TransactionCanceledException
	// with a TransactionConflict reason for every item of a
	// TransactWriteItems, TransactionConflictException for any other
	// operation.
	Conflict
	// Blackhole forwards nothing and never answers: the request hangs
	// until its context ends (the SDK client's timeout or the caller's
	// context), then fails with the context's error.
	Blackhole
)

var actionNames = [...]string{"Pass", "DropResponse", "Reset", "ServerError", "Throttle", "Hold", "Conflict", "Blackhole"}

// String returns the action's name.
func (a Action) String() string {
	if a >= 0 && int(a) < len(actionNames) {
		return actionNames[a]
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// AnyOp, as the op of Fail, matches every operation.
const AnyOp = ""

// Faults is an http.RoundTripper that counts requests by DynamoDB
// operation and decides what happens to each: first by the pending Fail
// entries for its operation, in the order they were added, then by the rule
// given to Set. With neither, it passes everything. It is safe for
// concurrent use.
type Faults struct {
	// Base is the transport that requests which reach the server go
	// through. Wrap sets it.
	Base http.RoundTripper

	mu      sync.Mutex
	rule    func(op string) Action
	pending []pending
	counts  map[string]int
	faulted map[string]int
	held    []*http.Request
}

type pending struct {
	op   string
	act  Action
	left int // < 0: forever
}

// NewFaults returns a Faults that passes everything; give its Wrap to
// Server.Client.
func NewFaults() *Faults {
	return &Faults{counts: map[string]int{}, faulted: map[string]int{}}
}

// Wrap puts f in front of rt and returns f; it is the decorator that
// Server.Client takes.
func (f *Faults) Wrap(rt http.RoundTripper) http.RoundTripper {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Base = rt
	f.init()
	return f
}

func (f *Faults) init() {
	if f.counts == nil {
		f.counts = map[string]int{}
	}
	if f.faulted == nil {
		f.faulted = map[string]int{}
	}
}

// Set replaces the rule that decides requests no Fail entry matches; nil
// passes everything. The rule is called with f's lock held and must not
// call f's methods.
func (f *Faults) Set(rule func(op string) Action) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rule = rule
}

// Fail applies act to the next times requests of the operation op (for
// example "PutItem", "TransactWriteItems"; AnyOp for all); times < 0 means
// every request from now on. Entries added later apply after earlier ones
// for the same operation are used up.
func (f *Faults) Fail(op string, act Action, times int) {
	if times == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pending = append(f.pending, pending{op: op, act: act, left: times})
}

// Clear removes the rule and every pending Fail entry: from now on f passes
// everything. Counts are kept.
func (f *Faults) Clear() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rule = nil
	f.pending = nil
}

// Count returns how many requests of op went through f, faulted or not.
func (f *Faults) Count(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counts[op]
}

// Faulted returns how many requests of op got an action other than Pass.
func (f *Faults) Faulted(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.faulted[op]
}

// Counts returns a copy of the request counts by operation.
func (f *Faults) Counts() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := make(map[string]int, len(f.counts))
	for k, v := range f.counts {
		m[k] = v
	}
	return m
}

// Op returns the DynamoDB operation named in a request's X-Amz-Target
// header, for example "PutItem".
func Op(r *http.Request) string {
	t := r.Header.Get("X-Amz-Target")
	return t[strings.LastIndexByte(t, '.')+1:]
}

// ErrInjectedReset is the error of a request that got DropResponse, Reset
// or Hold. The SDK sees it as a connection reset and retries it.
var ErrInjectedReset = errors.New("read tcp 127.0.0.1: connection reset by peer (injected)")

// decide picks the action for one request of op, and counts it.
func (f *Faults) decide(op string) Action {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.init()
	f.counts[op]++
	act := Pass
	matched := false
	for i := range f.pending {
		p := &f.pending[i]
		if p.left == 0 || (p.op != AnyOp && p.op != op) {
			continue
		}
		act, matched = p.act, true
		if p.left > 0 {
			p.left--
		}
		break
	}
	if !matched && f.rule != nil {
		act = f.rule(op)
	}
	if act != Pass {
		f.faulted[op]++
	}
	return act
}

// RoundTrip implements http.RoundTripper.
func (f *Faults) RoundTrip(r *http.Request) (*http.Response, error) {
	op := Op(r)
	switch f.decide(op) {
	case DropResponse:
		resp, err := f.Base.RoundTrip(r)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		return nil, ErrInjectedReset
	case Hold:
		body, err := readBody(r)
		if err != nil {
			return nil, err
		}
		late := r.Clone(context.Background())
		late.Body = io.NopCloser(bytes.NewReader(body))
		f.mu.Lock()
		f.held = append(f.held, late)
		f.mu.Unlock()
		return nil, ErrInjectedReset
	case Reset:
		closeBody(r)
		return nil, ErrInjectedReset
	case ServerError:
		closeBody(r)
		return answer(r, 500, errorBody("InternalServerError", "injected")), nil
	case Throttle:
		closeBody(r)
		return answer(r, 400, errorBody("ProvisionedThroughputExceededException", "injected")), nil
	case Conflict:
		if op != "TransactWriteItems" {
			closeBody(r)
			return answer(r, 400, errorBody("TransactionConflictException", "Transaction is ongoing for the item (injected)")), nil
		}
		body, err := readBody(r)
		if err != nil {
			return nil, err
		}
		return answer(r, 400, canceledBody(body)), nil
	case Blackhole:
		closeBody(r)
		<-r.Context().Done()
		return nil, r.Context().Err()
	}
	return f.Base.RoundTrip(r)
}

// Release sends the held requests to the server, in order, and returns the
// status of each answer (0 where the request failed).
func (f *Faults) Release() []int {
	f.mu.Lock()
	held := f.held
	f.held = nil
	f.mu.Unlock()
	var codes []int
	for _, r := range held {
		resp, err := f.Base.RoundTrip(r)
		if err != nil {
			codes = append(codes, 0)
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	return codes
}

func readBody(r *http.Request) ([]byte, error) {
	if r.Body == nil {
		return nil, nil
	}
	defer r.Body.Close()
	return io.ReadAll(r.Body)
}

func closeBody(r *http.Request) {
	if r.Body != nil {
		_ = r.Body.Close()
	}
}

func errorBody(typ, msg string) string {
	b, _ := json.Marshal(map[string]string{"__type": "com.amazonaws.dynamodb.v20120810#" + typ, "message": msg})
	return string(b)
}

// canceledBody is DynamoDB's answer to a TransactWriteItems that conflicted
// with another transaction: one cancellation reason per item, in order.
func canceledBody(req []byte) string {
	var in struct {
		TransactItems []json.RawMessage
	}
	_ = json.Unmarshal(req, &in)
	n := max(len(in.TransactItems), 1)
	type reason struct {
		Code    string
		Message string
	}
	reasons := make([]reason, n)
	codes := make([]string, n)
	for i := range reasons {
		reasons[i] = reason{Code: "TransactionConflict", Message: "Transaction is ongoing for the item (injected)"}
		codes[i] = "TransactionConflict"
	}
	b, _ := json.Marshal(struct {
		Type    string   `json:"__type"`
		Message string   `json:"message"`
		Reasons []reason `json:"CancellationReasons"`
	}{
		Type:    "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
		Message: "Transaction cancelled, please refer cancellation reasons for specific reasons [" + strings.Join(codes, ", ") + "]",
		Reasons: reasons,
	})
	return string(b)
}

func answer(r *http.Request, status int, body string) *http.Response {
	return &http.Response{
		StatusCode: status,
		Status:     fmt.Sprintf("%d %s", status, http.StatusText(status)),
		Proto:      "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"application/x-amz-json-1.0"}},
		Body:          io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       r,
	}
}
