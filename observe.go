package ddblease

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// This file owns events: Event, the notifier that delivers them to
// Options.Observer after locks are released, the outcome of each DynamoDB
// call (callOutcome), and the events' log lines.

// EventKind says what an Event reports.
type EventKind uint8

// The kinds of Event. The fields each kind sets are listed beside it; Job,
// Owner and Time are always set, but for a pool's membership events (Pool
// set, Job empty).
const (
	// EventCampaign: Run, RunSchedule or Acquire began to campaign.
	EventCampaign EventKind = iota + 1
	// EventAcquired: this handle took the lease. Fence, Latency (of the
	// write that took it).
	EventAcquired
	// EventRenewed: a heartbeat landed. Fence, Latency, Margin (how long
	// the tenure had left before its local deadline when the renewal was
	// confirmed: the early warning before a loss).
	EventRenewed
	// EventLost: a tenure ended other than by this handle resigning.
	// Fence, Reason, Err.
	EventLost
	// EventDraining: Run's context ended while leading, or an operator
	// asked the tenure to resign (Admin.RequestResign); the leader context
	// is cancelled and the lease is kept while fn returns. Fence.
	EventDraining
	// EventResigned: this handle is giving the lease up: its tenure has
	// ended (IsLeader is false) and the resignation is about to be written.
	// Fence. A write that fails is reported as EventRetry with Op "resign";
	// if it never lands, the lease lapses at its expiry.
	EventResigned
	// EventLeaderSeen: a standby saw a holder it had not seen before.
	// Holder, Fence.
	EventLeaderSeen
	// EventRunClaimed: a job run was claimed. Slot, Fence.
	EventRunClaimed
	// EventRunFinished: a job run's outcome was recorded. Slot, Fence,
	// Status, Duration (from the claim), Err (fn's error, if any). A slot
	// that fell due while the job was paused is reported with Status
	// RunSkippedByPause, and no EventRunClaimed before it.
	EventRunFinished
	// EventSlotsMissed: a catch-up skipped slots that no tenure ran. Slot
	// (the slot fired instead), Missed (-1 when unknown).
	EventSlotsMissed
	// EventStaleFence: a Guard refused a write. Fence (the one presented),
	// Current (the one in force, when known), Op (the guard form).
	EventStaleFence
	// EventCall: a DynamoDB request finished. Op ("GetItem", "UpdateItem",
	// ...), Outcome, Latency, Err.
	EventCall
	// EventRetry: a step failed and will be tried again. Op names the
	// step: "acquire" (a standby's poll or an acquisition), "heartbeat",
	// "resign", "claim" or "finish" (RunSchedule's claim of a slot and
	// record of its outcome). Err is the failure, Fence the tenure if any,
	// Slot the slot for a claim or finish.
	EventRetry
	// EventStopped: Run or RunSchedule returned. Err is what it returned
	// (logged at Debug level only: the caller has it).
	EventStopped
)

var eventNames = [...]string{
	EventCampaign: "campaign", EventAcquired: "acquired", EventRenewed: "renewed", EventLost: "lost",
	EventDraining: "draining", EventResigned: "resigned", EventLeaderSeen: "leader-seen",
	EventRunClaimed: "run-claimed", EventRunFinished: "run-finished", EventSlotsMissed: "slots-missed",
	EventStaleFence: "stale-fence", EventCall: "call", EventRetry: "retry", EventStopped: "stopped",
}

// String returns the kind's name in lower case, such as "acquired".
func (k EventKind) String() string {
	if int(k) < len(eventNames) && eventNames[k] != "" {
		return eventNames[k]
	}
	return "unknown"
}

// LossReason says why a tenure ended (EventLost).
type LossReason string

// The reasons a tenure ends other than by this handle's resignation.
const (
	// LossDeposed: the lease item names another owner or fence.
	LossDeposed LossReason = "deposed"
	// LossDeadline: the local deadline passed without a confirmed renewal.
	LossDeadline LossReason = "deadline"
	// LossResignedElsewhere: Resign (or ResignOnSignal) was called on this
	// handle while Run led, or the handle gave the lease up on an operator's
	// request.
	LossResignedElsewhere LossReason = "resigned-elsewhere"
	// LossPanic: the function given to Run panicked, or exited without
	// returning (runtime.Goexit, as t.FailNow does).
	LossPanic LossReason = "panic"
)

// CallOutcome classifies a finished DynamoDB request (EventCall).
type CallOutcome string

// The outcomes of a DynamoDB request.
const (
	CallOK              CallOutcome = "ok"
	CallConditionFailed CallOutcome = "condition_failed" // a condition or a transaction's check failed
	CallThrottled       CallOutcome = "throttled"
	CallError           CallOutcome = "error"    // refused: the request certainly did not apply
	CallInDoubt         CallOutcome = "in_doubt" // no answer: a write may or may not have applied
)

// Event is one thing that happened to a lease or guard, as reported to
// Options.Observer and GuardOptions.Observer. Which fields are set depends
// on Kind.
type Event struct {
	Kind  EventKind
	Job   string
	Owner string    // this handle's owner id ("" for a Guard)
	Time  time.Time // Options.Now when it happened

	Fence    int64
	Reason   LossReason    // EventLost
	Err      error         // EventLost, EventRunFinished, EventCall, EventRetry, EventStopped
	Holder   string        // EventLeaderSeen: the new holder's owner id
	Margin   time.Duration // EventRenewed
	Latency  time.Duration // EventAcquired, EventRenewed, EventCall
	Op       string        // EventCall, EventStaleFence, EventRetry
	Outcome  CallOutcome   // EventCall
	Slot     time.Time     // EventRunClaimed, EventRunFinished, EventSlotsMissed, EventRetry
	Status   RunStatus     // EventRunFinished
	Duration time.Duration // EventRunFinished
	Missed   int           // EventSlotsMissed
	Current  int64         // EventStaleFence
	Pool     string        // EventRetry of a pool's membership (Op "membership"): the pool; Job is empty
}

// notifier delivers events to an observer in the order they were queued,
// one at a time, never while a lock of the library's state is held.
//
// Events are queued by the goroutine that made the change, under the lock
// that guards it, so that their order is the order of the changes; the same
// goroutine then delivers whatever is queued. A goroutine that finds another
// delivering leaves its events to it. While a write to the lease item is in
// progress (hold), nothing is delivered: the writer holds the lease's write
// lock, which an observer calling back into the handle may need, and it
// delivers what was queued once it has released that lock.
type notifier struct {
	to eventSink // nil: events go nowhere

	mu         sync.Mutex
	queue      []Event
	delivering bool
	held       int32 // writes in progress
}

// push adds e to the queue. The caller then calls flush.
func (n *notifier) push(e Event) {
	if n.to == nil {
		return
	}
	n.mu.Lock()
	n.queue = append(n.queue, e)
	n.mu.Unlock()
}

// hold defers deliveries until the matching release.
func (n *notifier) hold() {
	n.mu.Lock()
	n.held++
	n.mu.Unlock()
}

// release ends a hold; the caller then calls flush.
func (n *notifier) release() {
	n.mu.Lock()
	n.held--
	n.mu.Unlock()
}

// flush delivers the queued events, unless another goroutine is doing so
// or a write is in progress.
func (n *notifier) flush() {
	if n.to == nil {
		return
	}
	for {
		n.mu.Lock()
		if n.delivering || n.held > 0 || len(n.queue) == 0 {
			n.mu.Unlock()
			return
		}
		q := n.queue
		n.queue = nil
		n.delivering = true
		n.mu.Unlock()
		n.deliver(q)
	}
}

func (n *notifier) deliver(q []Event) {
	defer func() {
		n.mu.Lock()
		n.delivering = false
		n.mu.Unlock()
	}()
	for _, e := range q {
		n.to.deliver(e)
	}
}

// eventSink is what a notifier delivers its events to: a handle's health,
// log and observer (leaseEvents), or a user's Observer (observerSink).
type eventSink interface{ deliver(Event) }

// observerSink is an Options.Observer as an eventSink.
type observerSink func(Event)

func (f observerSink) deliver(e Event) { f(e) }

// observerTo returns f as an eventSink; nil if f is.
func observerTo(f func(Event)) eventSink {
	if f == nil {
		return nil
	}
	return observerSink(f)
}

// emit queues e and delivers it at once, or as soon as no write is in
// progress.
func (n *notifier) emit(e Event) {
	n.push(e)
	n.flush()
}

// observedDB reports every request to its sink, as EventCall. It marks
// the errors of requests that the SDK client never sent (unsentError), and
// tells the sink of each request that went out: answered, or failed in
// transit (a connection refused or reset, a timeout), which the SDK
// reports as a response error with no status.
type observedDB struct {
	db   DynamoDBAPI
	now  func() time.Time
	sink callSink
}

// callSink is what an observedDB reports to: a Lease or a Guard, itself,
// so that a handle needs no closure for it.
type callSink interface {
	reportCall(Event) // a request finished
	callAnswered()    // a request went out
}

var _ DynamoDBAPI = observedDB{}

func observed[In, Out any](o observedDB, op string, call func(context.Context, In, ...func(*dynamodb.Options)) (Out, error),
	ctx context.Context, in In, optFns []func(*dynamodb.Options)) (Out, error) {
	start := o.now()
	var p sendProbe
	out, err := call(ctx, in, append(optFns[:len(optFns):len(optFns)], p.optFn)...)
	var re *smithyhttp.ResponseError
	switch {
	case err != nil && p.applied.Load() && !p.sent.Load():
		// Never sent: an HTTP response in err is a credentials service's
		// (STS, IMDS), not the table's.
		err = &unsentError{err: err}
	case err == nil, errors.As(err, &re):
		o.sink.callAnswered()
	}
	o.sink.reportCall(Event{Op: op, Outcome: callOutcome(op, err), Latency: o.now().Sub(start), Err: err})
	return out, err
}

// sendProbe finds out whether an SDK client sent a request: optFn adds a
// step just before the transport. A client that is not the SDK's may call
// the option but build no SDK middleware stack (applied stays false):
// nothing is concluded then.
type sendProbe struct{ applied, sent atomic.Bool }

func (p *sendProbe) optFn(o *dynamodb.Options) {
	o.APIOptions = append(o.APIOptions[:len(o.APIOptions):len(o.APIOptions)], func(s *middleware.Stack) error {
		p.applied.Store(true)
		return s.Deserialize.Add(middleware.DeserializeMiddlewareFunc("ddbleaseSent",
			func(ctx context.Context, in middleware.DeserializeInput, next middleware.DeserializeHandler) (middleware.DeserializeOutput, middleware.Metadata, error) {
				p.sent.Store(true)
				return next.HandleDeserialize(ctx, in)
			}), middleware.After)
	})
}

// mayPass reports whether err, of a request that was never sent, looks
// like a passing failure of the network or of a credentials service: a
// connection refused or reset, a timeout, a credentials service throttling
// or failing on its side. A missing credential, a missing region or a
// credentials service refusing the client are not.
func mayPass(err error) bool {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) {
		return true
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		return throttleCodes[api.ErrorCode()] || api.ErrorFault() == smithy.FaultServer
	}
	var re *smithyhttp.ResponseError
	return errors.As(err, &re) && re.HTTPStatusCode() >= 500
}

func (o observedDB) GetItem(ctx context.Context, in *dynamodb.GetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.GetItemOutput, error) {
	return observed(o, "GetItem", o.db.GetItem, ctx, in, optFns)
}

func (o observedDB) PutItem(ctx context.Context, in *dynamodb.PutItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.PutItemOutput, error) {
	return observed(o, "PutItem", o.db.PutItem, ctx, in, optFns)
}

func (o observedDB) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	return observed(o, "UpdateItem", o.db.UpdateItem, ctx, in, optFns)
}

func (o observedDB) DeleteItem(ctx context.Context, in *dynamodb.DeleteItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DeleteItemOutput, error) {
	return observed(o, "DeleteItem", o.db.DeleteItem, ctx, in, optFns)
}

func (o observedDB) Query(ctx context.Context, in *dynamodb.QueryInput, optFns ...func(*dynamodb.Options)) (*dynamodb.QueryOutput, error) {
	return observed(o, "Query", o.db.Query, ctx, in, optFns)
}

func (o observedDB) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	return observed(o, "BatchGetItem", o.db.BatchGetItem, ctx, in, optFns)
}

func (o observedDB) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, optFns ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	return observed(o, "TransactWriteItems", o.db.TransactWriteItems, ctx, in, optFns)
}

func (o observedDB) CreateTable(ctx context.Context, in *dynamodb.CreateTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error) {
	return observed(o, "CreateTable", o.db.CreateTable, ctx, in, optFns)
}

func (o observedDB) DescribeTable(ctx context.Context, in *dynamodb.DescribeTableInput, optFns ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error) {
	return observed(o, "DescribeTable", o.db.DescribeTable, ctx, in, optFns)
}

// callOutcome classifies a finished request for EventCall.
func callOutcome(op string, err error) CallOutcome {
	if err == nil {
		return CallOK
	}
	if len(failedConditions(err)) > 0 {
		return CallConditionFailed
	}
	var api smithy.APIError
	if errors.As(err, &api) && throttleCodes[api.ErrorCode()] {
		return CallThrottled
	}
	switch op {
	case "GetItem", "BatchGetItem", "DescribeTable", "Query":
		return CallError
	}
	if mayHaveApplied(err) {
		return CallInDoubt
	}
	return CallError
}
