package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/truora/minidyn/server"
)

// world is one simulated run: the in-memory server, the replicas'
// transports and clocks, and the log of the writes the server applied.
type world struct {
	plan  *Plan
	start time.Time // virtual time at which the run began

	mu      sync.Mutex // serialises the server; guards applied
	h       http.Handler
	applied []appliedWrite
	nreq    int

	resolved sync.Map // fault index -> replica, for faults aimed at the leader

	// A pool session's notes (guarded by mu): per member item, the jobs
	// whose note a renewal has returned and that are still in the item;
	// lostNotes, operator notes merged into one of those, which the
	// holder's next renewal deletes unread (notes).
	returned  map[string]map[string]bool
	lostNotes []lostNote
	// addedBy holds, by member+"\x00"+note, the SDK invocation id of the
	// operator's ADD that first applied the note: the SDK's retries of a
	// request whose answer was lost send it again, with the same id, and
	// add no change the holder has not read.
	addedBy map[string]string
}

// lostNote is an operator's note on job, added to member's notes while
// they held the same element, which a renewal had already returned: the
// set merges the two, and the renewal's DELETE of the note it handled
// takes the new one too, so the holder never reads it (note-lost; each
// note has had an id of its own since seed 381290 found it).
type lostNote struct {
	at          time.Duration
	member, job string
}

// resolve returns the replica a fault aimed at the leader hits, or -3
// (none) before its window opens or when no replica led then.
func (w *world) resolve(fault int) int {
	if v, ok := w.resolved.Load(fault); ok {
		return v.(int)
	}
	return -3
}

var debugReq = os.Getenv("SIM_DEBUG") != ""

// appliedWrite is a write the server accepted (HTTP 200), with the
// attributes the simulated users tag their effects with.
type appliedWrite struct {
	at    time.Duration // since start
	rep   int           // -1: the harness's own client
	op    string
	pk    string
	wf    int64 // fence the user presented (attribute or :wf value); 0 if none
	txn   bool
	lease string // transactions: the lease item their fence check names
	slot  string // effect items: the slot they were written for
	guard bool   // the request carried a guard's fence check
}

func newWorld(p *Plan) *world {
	return &world{plan: p, start: time.Now(), h: server.NewServer()}
}

func (w *world) since() time.Duration { return time.Since(w.start) }

// apply hands one request to the server and records what it applied.
func (w *world) apply(rep int, target string, hdr http.Header, body []byte) *http.Response {
	req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
	for k, v := range hdr {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	w.mu.Lock()
	w.nreq++
	if debugReq && w.nreq%20000 == 0 {
		fmt.Fprintf(os.Stderr, "req %d at %v rep %d %s\n", w.nreq, w.since(), rep, target)
	}
	var merged []lostNote
	inv := hdr.Get("Amz-Sdk-Invocation-Id")
	if target == "DynamoDB_20120810.UpdateItem" && bytes.Contains(body, []byte("member#")) {
		merged = w.mergedNotes(body, inv)
	}
	w.h.ServeHTTP(rec, req)
	if rec.Code == http.StatusOK {
		w.record(rep, target, body)
		if target == "DynamoDB_20120810.UpdateItem" && bytes.Contains(body, []byte("DELETE")) {
			w.dropEmptySets(body)
		}
		if target == "DynamoDB_20120810.UpdateItem" && bytes.Contains(body, []byte("member#")) {
			w.lostNotes = append(w.lostNotes, merged...)
			w.notesAdded(body, inv)
			w.notesRead(body, rec.Body.Bytes())
		}
	}
	w.mu.Unlock()
	return rec.Result()
}

// noteUpdate is what notes and notesRead read of an update of a member
// item and of its answer.
type noteUpdate struct {
	Key                       map[string]map[string]string
	UpdateExpression          string
	ExpressionAttributeValues map[string]struct{ SS []string }
}

func (u noteUpdate) member() string { return u.Key["pk"]["S"] + "/" + u.Key["sk"]["S"] }

// mergedNotes returns the notes an operator's ADD (Admin's noteSession),
// sent by SDK invocation inv, would merge into notes a renewal has
// already returned; a resend of the ADD that applied the note is none.
func (w *world) mergedNotes(body []byte, inv string) []lostNote {
	var u noteUpdate
	if json.Unmarshal(body, &u) != nil || !strings.HasPrefix(u.UpdateExpression, "ADD ") {
		return nil
	}
	var out []lostNote
	for _, e := range u.ExpressionAttributeValues[":job"].SS {
		if by, ok := w.addedBy[u.member()+"\x00"+e]; ok && by == inv && inv != "" {
			continue // the SDK sent the request that applied it again
		}
		if w.returned[u.member()][e] {
			j := e // a job name; or, since each note has an id, "<16 hex>:<job>"
			if len(e) > 17 && e[16] == ':' {
				j = e[17:]
			}
			out = append(out, lostNote{at: w.since(), member: u.member(), job: j})
		}
	}
	return out
}

// notesAdded records the notes an operator's applied ADD, sent by SDK
// invocation inv, added first.
func (w *world) notesAdded(body []byte, inv string) {
	var u noteUpdate
	if json.Unmarshal(body, &u) != nil || !strings.HasPrefix(u.UpdateExpression, "ADD ") {
		return
	}
	if w.addedBy == nil {
		w.addedBy = map[string]string{}
	}
	for _, e := range u.ExpressionAttributeValues[":job"].SS {
		if k := u.member() + "\x00" + e; w.addedBy[k] == "" {
			w.addedBy[k] = inv
		}
	}
}

// notesRead follows, from a renewal of a member item and its answer, the
// notes it deleted and the notes it returned.
func (w *world) notesRead(body, answer []byte) {
	var u noteUpdate
	if json.Unmarshal(body, &u) != nil {
		return
	}
	m := u.member()
	if strings.Contains(u.UpdateExpression, "DELETE ") {
		for _, j := range u.ExpressionAttributeValues[":h"].SS {
			delete(w.returned[m], j)
		}
	}
	var a struct {
		Attributes map[string]struct{ SS []string }
	}
	if json.Unmarshal(answer, &a) != nil {
		return
	}
	for _, j := range a.Attributes["notes"].SS {
		if w.returned == nil {
			w.returned = map[string]map[string]bool{}
		}
		if w.returned[m] == nil {
			w.returned[m] = map[string]bool{}
		}
		w.returned[m][j] = true
	}
}

// dropEmptySets removes the sets an UpdateItem's DELETE left empty, as
// DynamoDB does: minidyn keeps an empty set as a value without a type,
// which fails every later read of the item by an expression, and every
// Query or Scan of the table (a pool session's notes, emptied by the
// renewal that handled them), and which its REMOVE does not remove. The
// item is read and, if it holds such a value, written back without it:
// called with w.mu held, right after the update, so that nothing else
// wrote the item in between.
func (w *world) dropEmptySets(body []byte) {
	var u struct {
		TableName string
		Key       map[string]json.RawMessage
	}
	if json.Unmarshal(body, &u) != nil {
		return
	}
	call := func(target string, in map[string]any) (int, []byte) {
		b, _ := json.Marshal(in)
		req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/x-amz-json-1.0")
		req.Header.Set("X-Amz-Target", target)
		rec := httptest.NewRecorder()
		w.h.ServeHTTP(rec, req)
		return rec.Code, rec.Body.Bytes()
	}
	code, out := call("DynamoDB_20120810.GetItem", map[string]any{"TableName": u.TableName, "Key": u.Key, "ConsistentRead": true})
	var got struct {
		Item map[string]map[string]json.RawMessage
	}
	if code != http.StatusOK || json.Unmarshal(out, &got) != nil || got.Item == nil {
		return
	}
	dropped := false
	for k, av := range got.Item {
		empty := len(av) == 0
		for _, set := range []string{"SS", "NS", "BS"} {
			if v, ok := av[set]; ok && (string(v) == "[]" || string(v) == "null") {
				empty = true
			}
		}
		if empty {
			delete(got.Item, k)
			dropped = true
		}
	}
	if dropped {
		call("DynamoDB_20120810.PutItem", map[string]any{"TableName": u.TableName, "Item": got.Item})
	}
}

type wireAV map[string]json.RawMessage

func (a wireAV) str(k string) string {
	var s string
	_ = json.Unmarshal(a[k], &s)
	return s
}

type wireWrite struct {
	TableName                 string
	Item                      map[string]wireAV
	Key                       map[string]wireAV
	ExpressionAttributeValues map[string]wireAV
	ConditionExpression       string
}

type wireReq struct {
	wireWrite
	TransactItems []struct {
		Put            *wireWrite
		Update         *wireWrite
		ConditionCheck *wireWrite
	}
}

func (w *world) record(rep int, target string, body []byte) {
	op := strings.TrimPrefix(target, "DynamoDB_20120810.")
	if op != "PutItem" && op != "UpdateItem" && op != "TransactWriteItems" || !bytes.Contains(body, []byte(`wf"`)) {
		return
	}
	var r wireReq
	if json.Unmarshal(body, &r) != nil {
		return
	}
	at := w.since()
	var lease string
	one := func(ww *wireWrite, txn, guard bool) {
		if ww == nil {
			return
		}
		var pk, wf string
		if ww.Item != nil {
			pk = ww.Item["pk"].str("S")
			wf = ww.Item["wf"].str("N")
		} else if ww.Key != nil {
			pk = ww.Key["pk"].str("S")
			wf = ww.ExpressionAttributeValues[":wf"].str("N")
		}
		if wf == "" {
			return
		}
		f, _ := strconv.ParseInt(wf, 10, 64)
		a := appliedWrite{at: at, rep: rep, op: op, pk: pk, wf: f, txn: txn, guard: guard, lease: lease}
		if rest, ok := strings.CutPrefix(pk, "eff#"); ok {
			a.slot, _, _ = strings.Cut(rest, "|")
		}
		w.applied = append(w.applied, a)
	}
	if op != "TransactWriteItems" {
		one(&r.wireWrite, false, strings.Contains(r.ConditionExpression, "ddbleaseFence"))
		return
	}
	guard := false
	for _, it := range r.TransactItems {
		if it.ConditionCheck != nil && it.ConditionCheck.Key["sk"].str("S") == "lease" {
			guard, lease = true, it.ConditionCheck.Key["pk"].str("S")
		}
	}
	for _, it := range r.TransactItems {
		one(it.Put, true, guard)
		one(it.Update, true, guard)
	}
}

// Error bodies the SDK parses as DynamoDB's own.
const (
	bodyInternal   = `{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"simulated internal error"}`
	bodyUnavail    = `{"__type":"com.amazonaws.dynamodb.v20120810#ServiceUnavailableException","message":"simulated unavailability"}`
	bodyThrottle   = `{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException","message":"simulated throttling"}`
	bodyThrottle2  = `{"__type":"com.amazon.coral.availability#ThrottlingException","message":"simulated throttling"}`
	bodyConflict   = `{"__type":"com.amazonaws.dynamodb.v20120810#TransactionConflictException","message":"Transaction is ongoing for the item"}`
	bodyTxCanceled = `{"__type":"com.amazonaws.dynamodb.v20120810#TransactionCanceledException","message":"Transaction cancelled, please refer cancellation reasons for specific reasons [%s]","CancellationReasons":[%s]}`
)

var errReset = errors.New("read tcp 10.0.0.1:54321->10.0.0.2:443: read: connection reset by peer")

func errorResponse(code int, body string) *http.Response {
	h := http.Header{}
	h.Set("Content-Type", "application/x-amz-json-1.0")
	return &http.Response{
		StatusCode: code, Status: strconv.Itoa(code) + " " + http.StatusText(code),
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body)),
	}
}

func conflictResponse(op string, body []byte) *http.Response {
	if op != "TransactWriteItems" {
		return errorResponse(http.StatusBadRequest, bodyConflict)
	}
	var r wireReq
	_ = json.Unmarshal(body, &r)
	n := max(len(r.TransactItems), 1)
	codes, reasons := make([]string, n), make([]string, n)
	for i := range n {
		codes[i], reasons[i] = "None", `{"Code":"None"}`
	}
	k := int(fnv32(string(body))) % n
	codes[k], reasons[k] = "TransactionConflict", `{"Code":"TransactionConflict","Message":"Transaction is ongoing for the item"}`
	return errorResponse(http.StatusBadRequest, strings.Replace(strings.Replace(bodyTxCanceled, "%s", strings.Join(codes, ", "), 1),
		"%s", strings.Join(reasons, ","), 1))
}

func fnv32(s string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return h.Sum32()
}

// replicaState is what the fault plan does to one replica while it runs.
type replicaState struct {
	id      int
	w       *world
	crashed atomic.Bool   // crashed and not yet wound down: requests black-holed, clock frozen
	crashEl atomic.Int64  // when it crashed (time since the start)
	dead    chan struct{} // closed at wind-down: the crash's freeze ends
	nreq    atomic.Uint64

	mu       sync.Mutex
	bucket   time.Duration
	inBucket int
	busy     string   // the first busy loop seen
	pauses   []window // sorted
	clock    Clock
	steps    []Step
}

// latency is the network's round trip for one request: none (so that a
// request in flight never makes another goroutine of the handle wait on
// the handle's mutex while virtual time cannot advance), or 10ms while the
// replica sends requests in a busy loop (more than busyLimit in 100ms of
// virtual time), which is reported as a violation. Without it a client that
// retries at once would spin for ever at one instant of virtual time.
func (r *replicaState) latency(op string) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.w.since() / (100 * time.Millisecond)
	if b != r.bucket {
		r.bucket, r.inBucket = b, 0
	}
	r.inBucket++
	if r.inBucket <= r.w.busyLimit() {
		return 0
	}
	if r.busy == "" {
		r.busy = fmt.Sprintf("r%d sent more than %d requests within 100ms at %v (%s): a retry loop without a wait",
			r.id, r.w.busyLimit(), r.w.since(), op)
	}
	return 10 * time.Millisecond
}

// busyLimit is how many requests a replica may send in 100ms of virtual
// time: 50, or more where the plan's RetryInterval is so short that the
// library's loops (heartbeat, standby poll, claim and finish retries), each
// waiting about a RetryInterval, send more. A loop that does not wait at
// all spins at one instant and passes any limit. A replica of a pool runs
// a lease for each job, and renews its membership: the limit is that many
// times higher.
func (w *world) busyLimit() int {
	n := 50
	if w.plan.Retry > 0 {
		n = max(50, int(8*100*time.Millisecond/w.plan.Retry))
	}
	if w.plan.Pool {
		n *= len(w.plan.Jobs) + 1
	}
	return n
}

// pausedFrom returns the start of the pause in force at d.
func (r *replicaState) pausedFrom(d time.Duration) time.Duration {
	for _, p := range r.pauses {
		if d >= p.From && d < p.To {
			return p.From
		}
	}
	return d
}

// pausedUntil returns the end of the pause in force at d, or 0.
func (r *replicaState) pausedUntil(d time.Duration) time.Duration {
	for _, p := range r.pauses {
		if d >= p.From && d < p.To {
			return p.To
		}
	}
	return 0
}

// hold blocks while the replica is paused or crashed: its process is not
// running. It returns early when ctx ends (ctx may be nil).
func (r *replicaState) hold(ctx context.Context) {
	for {
		if r.crashed.Load() {
			if ctx == nil {
				<-r.dead
				return
			}
			select {
			case <-r.dead:
			case <-ctx.Done():
			}
			return
		}
		until := r.pausedUntil(r.w.since())
		if until == 0 {
			return
		}
		t := time.NewTimer(until - r.w.since())
		if ctx == nil {
			<-t.C
		} else {
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
		}
	}
}

// now is the replica's Options.Now: its clock's offset and rate, wall
// steps, frozen while it is paused or crashed. Inside the bubble time.Now
// carries no monotonic reading, so a step is a plain shift of what
// Options.Now returns; the library's own timers and runtime clock are the
// bubble's and do not move, as a process's monotonic clock does not move
// when NTP steps the wall clock.
func (r *replicaState) now() time.Time {
	// The clock reads what it read when the process stopped, without
	// blocking: the library may read it while holding its handle's mutex,
	// and a goroutine waiting for that mutex is not durably blocked, so a
	// blocking read would stop virtual time. What a user observes of a
	// stopped process is held instead (hold in fn, in the IsLeader sampler
	// and where a leader context's end is recorded).
	el := r.w.since()
	if r.crashed.Load() && !r.woundDown() {
		el = time.Duration(r.crashEl.Load())
	} else if until := r.pausedUntil(el); until != 0 {
		el = r.pausedFrom(el)
	}
	t := r.w.start.Add(el)
	t = t.Add(r.clock.offsetAt(el))
	r.mu.Lock()
	steps := r.steps
	r.mu.Unlock()
	for _, s := range steps {
		if el >= s.At && el < s.At+s.Dur {
			t = t.Add(s.By)
		}
	}
	return t
}

// stopped reports whether the replica's process is stopped now: paused,
// or crashed and not yet wound down (hold would block).
func (r *replicaState) stopped() bool {
	if r.crashed.Load() {
		return !r.woundDown()
	}
	return r.pausedUntil(r.w.since()) != 0
}

// woundDown reports whether a crashed replica is being wound down: its
// clock runs again (a frozen one would keep a wait judged by Options.Now,
// such as a resignation retried until the tenure's deadline, from ever
// ending), while its network still black-holes new requests.
func (r *replicaState) woundDown() bool {
	select {
	case <-r.dead:
		return true
	default:
		return false
	}
}

// transport is one replica's network: an http.RoundTripper to the
// in-memory server with the replica's faults applied.
type transport struct{ r *replicaState }

func (t transport) RoundTrip(req *http.Request) (*http.Response, error) {
	body, err := io.ReadAll(req.Body)
	_ = req.Body.Close()
	if err != nil {
		return nil, err
	}
	ctx := req.Context()
	r := t.r
	target := req.Header.Get("X-Amz-Target")
	op := strings.TrimPrefix(target, "DynamoDB_20120810.")
	if r.crashed.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	r.hold(ctx)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	n := r.nreq.Add(1)
	if d := r.latency(op); d > 0 && !sleepCtx(ctx, d) {
		return nil, ctx.Err()
	}
	f := r.w.plan.decide(r.id, op, r.w.since(), n, r.w.resolve)
	switch f.Kind {
	case FBlackHole:
		<-ctx.Done()
		return nil, ctx.Err()
	case FReset:
		return nil, errReset
	case F500:
		return errorResponse(500, bodyInternal), nil
	case F503:
		return errorResponse(503, bodyUnavail), nil
	case FThrottle:
		if n%2 == 0 {
			return errorResponse(400, bodyThrottle2), nil
		}
		return errorResponse(400, bodyThrottle), nil
	case FConflict:
		if op == "TransactWriteItems" || op == "PutItem" || op == "UpdateItem" {
			return conflictResponse(op, body), nil
		}
	case FDelay:
		if !sleepCtx(ctx, f.Delay) {
			return nil, ctx.Err()
		}
	}
	resp := r.w.apply(r.id, target, req.Header, body)
	switch f.Kind {
	case FDropHang:
		<-ctx.Done()
		return nil, ctx.Err()
	case FDropReset:
		return nil, errReset
	case FSlowAnswer:
		if !sleepCtx(ctx, f.Delay) {
			return nil, ctx.Err()
		}
	}
	if r.crashed.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	r.hold(ctx)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return resp, nil
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// client returns an SDK client whose requests go through rt.
func client(rt http.RoundTripper, attempts int) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		Region:           "us-east-1",
		BaseEndpoint:     aws.String("http://ddb.sim"),
		Credentials:      aws.AnonymousCredentials{}, // unsigned: the in-memory server does not check
		HTTPClient:       &http.Client{Transport: rt},
		RetryMaxAttempts: attempts,
	})
}

// direct is the harness's own fault-free transport.
type direct struct{ w *world }

func (d direct) RoundTrip(req *http.Request) (*http.Response, error) {
	body, err := io.ReadAll(req.Body)
	_ = req.Body.Close()
	if err != nil {
		return nil, err
	}
	return d.w.apply(-1, req.Header.Get("X-Amz-Target"), req.Header, body), nil
}

// realNow is the wall clock outside the bubble (for debugging output only).
func realNow() time.Time {
	var t time.Time
	done := make(chan struct{})
	go func() { t = time.Now(); close(done) }()
	<-done
	return t
}
