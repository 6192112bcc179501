package ddblease

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
)

var (
	// ErrStaleFence reports a write or check refused because the fence
	// presented is not the job's current one: a newer tenure exists. The
	// error is a *StaleFenceError, which carries both fences.
	ErrStaleFence = errors.New("ddblease: stale fence")

	// ErrTransactionsUnsupported reports that the server answered a
	// TransactWriteItems request with UnknownOperationException (dynalite
	// does, for one).
	ErrTransactionsUnsupported = errors.New("ddblease: server does not support transactions")
)

// StaleFenceError reports a refused fence. errors.Is(err, ErrStaleFence)
// reports true for it; the SDK's error, if there was one, stays in the chain
// for errors.As.
type StaleFenceError struct {
	Job   string
	Fence int64 // the fence that was refused
	// Current is the newer fence that refused it: the job's current fence
	// (0 if the job has no lease item), the high-water mark of the item that
	// Guard.Put or Guard.Update targeted, or, for JobRun.Finish, the fence of
	// the tenure that claimed the slot again or abandoned the run.
	Current int64

	err error
}

// Error names the job, the refused fence and the current one.
func (e *StaleFenceError) Error() string {
	if e.Current == 0 {
		return fmt.Sprintf("ddblease: stale fence: %q fence %d refused: the job has no lease", e.Job, e.Fence)
	}
	return fmt.Sprintf("ddblease: stale fence: %q fence %d refused: the current fence is %d", e.Job, e.Fence, e.Current)
}

// Unwrap returns ErrStaleFence and the SDK's error, if any.
func (e *StaleFenceError) Unwrap() []error {
	if e.err == nil {
		return []error{ErrStaleFence}
	}
	return []error{ErrStaleFence, e.err}
}

// DefaultGuardCallTimeout is the default of GuardOptions.CallTimeout.
const DefaultGuardCallTimeout = 5 * time.Second

// MaxGuardedItems is the most writes Guard.TransactWrite accepts: DynamoDB's
// 100 actions per transaction, less the guard's check.
const MaxGuardedItems = 99

// GuardOptions configures a Guard. A zero field takes its default.
type GuardOptions struct {
	// CallTimeout bounds each DynamoDB call. Default 5s; negative is an
	// error.
	CallTimeout time.Duration

	// FenceAttribute names the attribute in which Put and Update keep the
	// target item's fence high-water mark (a number). Default "fence".
	FenceAttribute string

	// Observer, if not nil, is told of every write the guard refuses for a
	// stale fence (EventStaleFence) and of every DynamoDB request it makes
	// (EventCall), as Options.Observer is. Default nil.
	Observer func(Event)
}

// Guard refuses side effects of stale leaders of one job: a write that
// presents a fence is accepted only while no newer fence has been issued.
// It is the sink side of the protocol, and may run in another service than
// the leader, with its own client. Its methods are safe for concurrent use.
//
// Prefer the atomic forms, in this order: TransactWrite (and, for a
// schedule slot, JobRun.Commit) checks the lease item's fence in the same
// transaction as the writes; Put and Update keep a fence high-water mark in
// the item they write, and work without transactions. Check and Do are for
// sinks outside DynamoDB and are not atomic.
//
// Every form fails closed: any error (a timeout, a missing or malformed
// lease item) rejects.
type Guard struct {
	db    DynamoDBAPI
	table string
	job   string
	key   map[string]types.AttributeValue
	opts  GuardOptions
	keys  sync.Map // table name -> []string, its key attributes
}

// NewGuard returns a guard for job, whose lease is in table. It makes no
// call.
func NewGuard(db DynamoDBAPI, table, job string, optFns ...func(*GuardOptions)) (*Guard, error) {
	if db == nil {
		return nil, invalid("NewGuard: DynamoDB client is nil")
	}
	if err := checkTable(table); err != nil {
		return nil, err
	}
	if err := checkName("job name", job, MaxJobLength); err != nil {
		return nil, err
	}
	var o GuardOptions
	for _, fn := range optFns {
		if fn != nil {
			fn(&o)
		}
	}
	if o.CallTimeout < 0 {
		return nil, invalid("GuardOptions: CallTimeout is negative (%v)", o.CallTimeout)
	}
	if o.CallTimeout == 0 {
		o.CallTimeout = DefaultGuardCallTimeout
	}
	if o.FenceAttribute == "" {
		o.FenceAttribute = attrFence
	}
	if err := checkName("FenceAttribute", o.FenceAttribute, 255); err != nil {
		return nil, err
	}
	return &Guard{db: db, table: table, job: job, key: map[string]types.AttributeValue{attrPK: avS(leaseKey(job))}, opts: o}, nil
}

// Job returns the job name.
func (g *Guard) Job() string { return g.job }

// Check reads the job's lease item with a strongly consistent read and
// returns nil only if its fence equals fence. Otherwise it returns a
// *StaleFenceError (a newer fence exists, or the job has no lease item), or
// the error that prevented the read: it fails closed. One GetItem request.
//
// Check looks at the fence only, not at the lease's expiry: a fence stays
// current until a newer one is issued, so the writes of a leader that is
// draining, or whose lease lapsed with no one taking over, are accepted.
// Check is not atomic with what follows it: a newer leader may take over
// just after. Use it only for sinks outside DynamoDB (see Do).
func (g *Guard) Check(ctx context.Context, fence int64) error {
	if fence < 1 {
		return invalid("Check: fence %d is below 1", fence)
	}
	cur, err := readFence(ctx, g.db, g.table, g.key, g.opts.CallTimeout)
	if err != nil {
		return fmt.Errorf("ddblease: guard %q: %w", g.job, err)
	}
	if cur != fence {
		return &StaleFenceError{Job: g.job, Fence: fence, Current: cur}
	}
	return nil
}

// Do calls fn(ctx, fence) if Check accepts fence, and returns Check's error
// without calling fn otherwise.
//
// Do is NOT atomic: a newer leader may take over between the check and the
// effect, or while fn runs, and fn will not know. It narrows the window in
// which a stale leader acts; it does not close it. For a sink outside
// DynamoDB, pass the fence to the sink as well, and have the sink refuse a
// fence lower than the highest it has seen (and a slot's
// JobRun.IdempotencyKey it has seen), which makes the sink itself the guard.
func (g *Guard) Do(ctx context.Context, fence int64, fn func(ctx context.Context, fence int64) error) error {
	if fn == nil {
		return invalid("Do: fn is nil")
	}
	if err := g.Check(ctx, fence); err != nil {
		return err
	}
	return fn(ctx, fence)
}

// TransactWrite applies items in one TransactWriteItems together with a
// ConditionCheck that the job's lease item holds exactly fence. When a newer
// fence exists, nothing is written and the error is a *StaleFenceError
// carrying the current fence (from the check's ALL_OLD item, or a
// consistent read). A failed condition among items is returned as the
// SDK's TransactionCanceledException (errors.As), whose CancellationReasons
// list the guard's check first and then items in order. A server without
// transactions gets an error wrapping ErrTransactionsUnsupported; use Put
// or Update there.
//
// One request (it costs twice the write units of plain writes, as every
// transaction does). The SDK may retry it: DynamoDB recognises the retry by
// its client request token, but a server that does not may report a
// condition of items failing because the first attempt was applied.
func (g *Guard) TransactWrite(ctx context.Context, fence int64, items []types.TransactWriteItem) error {
	if fence < 1 {
		return invalid("TransactWrite: fence %d is below 1", fence)
	}
	if len(items) == 0 || len(items) > MaxGuardedItems {
		return invalid("TransactWrite: %d items; between 1 and %d are allowed", len(items), MaxGuardedItems)
	}
	all := make([]types.TransactWriteItem, 0, len(items)+1)
	all = append(all, types.TransactWriteItem{ConditionCheck: fenceCheck(g.table, g.key, fence)})
	all = append(all, items...)
	err := transact(ctx, g.db, g.opts.CallTimeout, all)
	if err == nil {
		return nil
	}
	if item, ok := conditionFailed(err, 0); ok {
		cur, cerr := fenceOf(item)
		if cerr != nil || len(item) == 0 {
			cur, cerr = readFence(ctx, g.db, g.table, g.key, g.opts.CallTimeout)
		}
		return errors.Join(&StaleFenceError{Job: g.job, Fence: fence, Current: cur, err: err}, cerr)
	}
	return fmt.Errorf("ddblease: guarded transaction %q: %w", g.job, err)
}

// Placeholders with which Put and Update refer to the fence high-water mark.
const (
	fenceName  = "#ddbleaseFence"
	fenceValue = ":ddbleaseFence"
)

// Put writes in.Item, setting its fence attribute (GuardOptions.
// FenceAttribute) to fence, on condition that the item stored under that
// key has no fence attribute or one not above fence — and that in's own
// ConditionExpression, if any, holds. The item thus keeps the highest fence
// that wrote it, and a lower fence is refused with a *StaleFenceError whose
// Current is that high-water mark. in is not modified; its placeholders must
// not be #ddbleaseFence or :ddbleaseFence.
//
// This is the storage-side check of Kleppmann's "How to do distributed
// locking", and needs no transaction. It only protects items that the newer
// tenure has written: a stale leader can still create an item that no newer
// fence has touched. Key the items so that every tenure writes the same ones
// (a slot's JobRun.IdempotencyKey, say), or use TransactWrite.
//
// One PutItem request; when it is refused and the server returns no item
// with the failure (dynalite), a consistent GetItem, and the first time for
// a table a DescribeTable, to tell a stale fence from in's own condition.
func (g *Guard) Put(ctx context.Context, fence int64, in *dynamodb.PutItemInput) (*dynamodb.PutItemOutput, error) {
	if fence < 1 {
		return nil, invalid("Put: fence %d is below 1", fence)
	}
	if in == nil || aws.ToString(in.TableName) == "" || len(in.Item) == 0 {
		return nil, invalid("Put: the input needs a table name and an item")
	}
	p := *in
	p.Item = maps.Clone(in.Item)
	p.Item[g.opts.FenceAttribute] = avN(fence)
	var err error
	if p.ConditionExpression, p.ExpressionAttributeNames, p.ExpressionAttributeValues, err =
		g.fenceCondition("Put", in.ConditionExpression, in.ExpressionAttributeNames, in.ExpressionAttributeValues, fence); err != nil {
		return nil, err
	}
	p.ReturnValuesOnConditionCheckFailure = types.ReturnValuesOnConditionCheckFailureAllOld
	cctx, cancel := context.WithTimeout(ctx, g.opts.CallTimeout)
	out, err := g.db.PutItem(cctx, &p)
	cancel()
	if err == nil {
		return out, nil
	}
	var ccf *types.ConditionalCheckFailedException
	if !errors.As(err, &ccf) {
		return nil, fmt.Errorf("ddblease: guarded put %q: %w", g.job, err)
	}
	item := ccf.Item
	if len(item) == 0 {
		key, kerr := g.keyOf(ctx, *in.TableName, in.Item)
		if kerr != nil {
			return nil, fmt.Errorf("ddblease: guarded put %q refused; cannot tell why: %w", g.job, errors.Join(err, kerr))
		}
		if item, kerr = g.readItem(ctx, *in.TableName, key); kerr != nil {
			return nil, fmt.Errorf("ddblease: guarded put %q refused; cannot tell why: %w", g.job, errors.Join(err, kerr))
		}
	}
	return nil, g.refusal("put", fence, item, err)
}

// Update applies in, adding to its update expression a SET of the item's
// fence attribute (GuardOptions.FenceAttribute) to fence, on the condition
// Put uses: the stored item has no fence attribute or one not above fence,
// and in's own ConditionExpression holds. The same limits apply: it
// protects only items that a newer fence has written. in is not modified.
// One UpdateItem request, and a consistent GetItem when refused by a server
// that returns no item with the failure.
func (g *Guard) Update(ctx context.Context, fence int64, in *dynamodb.UpdateItemInput) (*dynamodb.UpdateItemOutput, error) {
	if fence < 1 {
		return nil, invalid("Update: fence %d is below 1", fence)
	}
	if in == nil || aws.ToString(in.TableName) == "" || len(in.Key) == 0 {
		return nil, invalid("Update: the input needs a table name and a key")
	}
	u := *in
	u.UpdateExpression = aws.String(withFenceSet(aws.ToString(in.UpdateExpression)))
	var err error
	if u.ConditionExpression, u.ExpressionAttributeNames, u.ExpressionAttributeValues, err =
		g.fenceCondition("Update", in.ConditionExpression, in.ExpressionAttributeNames, in.ExpressionAttributeValues, fence); err != nil {
		return nil, err
	}
	u.ReturnValuesOnConditionCheckFailure = types.ReturnValuesOnConditionCheckFailureAllOld
	cctx, cancel := context.WithTimeout(ctx, g.opts.CallTimeout)
	out, err := g.db.UpdateItem(cctx, &u)
	cancel()
	if err == nil {
		return out, nil
	}
	var ccf *types.ConditionalCheckFailedException
	if !errors.As(err, &ccf) {
		return nil, fmt.Errorf("ddblease: guarded update %q: %w", g.job, err)
	}
	item := ccf.Item
	if len(item) == 0 {
		var rerr error
		if item, rerr = g.readItem(ctx, *in.TableName, in.Key); rerr != nil {
			return nil, fmt.Errorf("ddblease: guarded update %q refused; cannot tell why: %w", g.job, errors.Join(err, rerr))
		}
	}
	return nil, g.refusal("update", fence, item, err)
}

// fenceCondition adds the fence high-water check to a user's condition.
func (g *Guard) fenceCondition(what string, cond *string, names map[string]string, values map[string]types.AttributeValue,
	fence int64) (*string, map[string]string, map[string]types.AttributeValue, error) {
	if _, ok := names[fenceName]; ok {
		return nil, nil, nil, invalid("%s: the placeholder %s is reserved for the guard", what, fenceName)
	}
	if _, ok := values[fenceValue]; ok {
		return nil, nil, nil, invalid("%s: the placeholder %s is reserved for the guard", what, fenceValue)
	}
	names = maps.Clone(names)
	if names == nil {
		names = map[string]string{}
	}
	values = maps.Clone(values)
	if values == nil {
		values = map[string]types.AttributeValue{}
	}
	names[fenceName] = g.opts.FenceAttribute
	values[fenceValue] = avN(fence)
	c := "(attribute_not_exists(" + fenceName + ") OR " + fenceName + " <= " + fenceValue + ")"
	if uc := strings.TrimSpace(aws.ToString(cond)); uc != "" {
		c += " AND (" + uc + ")"
	}
	return aws.String(c), names, values, nil
}

// refusal explains a failed guarded write from the stored item: a fence
// mark above fence is a *StaleFenceError; otherwise the user's condition
// failed and err is returned.
func (g *Guard) refusal(what string, fence int64, item map[string]types.AttributeValue, err error) error {
	if _, ok := item[g.opts.FenceAttribute]; ok {
		mark, merr := num(item, g.opts.FenceAttribute)
		if merr != nil {
			return fmt.Errorf("ddblease: guarded %s %q refused: %w: target item: %v (%w)", what, g.job, ErrMalformedItem, merr, err)
		}
		if mark > fence {
			return &StaleFenceError{Job: g.job, Fence: fence, Current: mark, err: err}
		}
	}
	return fmt.Errorf("ddblease: guarded %s %q: %w", what, g.job, err)
}

// withFenceSet adds "#ddbleaseFence = :ddbleaseFence" to the SET clause of
// an update expression, creating the clause if there is none.
func withFenceSet(expr string) string {
	const set = fenceName + " = " + fenceValue
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

// keyOf returns the key attributes of item in table, learning the table's
// key schema with DescribeTable the first time.
func (g *Guard) keyOf(ctx context.Context, table string, item map[string]types.AttributeValue) (map[string]types.AttributeValue, error) {
	var names []string
	if v, ok := g.keys.Load(table); ok {
		names = v.([]string)
	} else {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.opts.CallTimeout)
		out, err := g.db.DescribeTable(cctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("describe table %q: %w", table, err)
		}
		if out.Table == nil || len(out.Table.KeySchema) == 0 {
			return nil, fmt.Errorf("describe table %q: no key schema returned", table)
		}
		for _, k := range out.Table.KeySchema {
			names = append(names, aws.ToString(k.AttributeName))
		}
		g.keys.Store(table, names)
	}
	key := make(map[string]types.AttributeValue, len(names))
	for _, n := range names {
		v, ok := item[n]
		if !ok {
			return nil, fmt.Errorf("the item lacks key attribute %q", n)
		}
		key[n] = v
	}
	return key, nil
}

// readItem reads an item with a strongly consistent read, even when ctx
// has ended.
func (g *Guard) readItem(ctx context.Context, table string, key map[string]types.AttributeValue) (map[string]types.AttributeValue, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.opts.CallTimeout)
	defer cancel()
	out, err := g.db.GetItem(cctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: key, ConsistentRead: aws.Bool(true)})
	if err != nil {
		return nil, err
	}
	return out.Item, nil
}

// fenceCheck is a ConditionCheck that the lease item holds exactly fence.
func fenceCheck(table string, key map[string]types.AttributeValue, fence int64) *types.ConditionCheck {
	return &types.ConditionCheck{
		TableName:                           aws.String(table),
		Key:                                 key,
		ConditionExpression:                 aws.String("#fence = :fence"),
		ExpressionAttributeNames:            map[string]string{"#fence": attrFence},
		ExpressionAttributeValues:           map[string]types.AttributeValue{":fence": avN(fence)},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
}

// fenceOf returns the fence of a lease item; 0 for no item.
func fenceOf(item map[string]types.AttributeValue) (int64, error) {
	if len(item) == 0 {
		return 0, nil
	}
	f, err := num(item, attrFence)
	if err == nil && f < 1 {
		err = fmt.Errorf("fence %d is below 1", f)
	}
	if err != nil {
		key, _ := str(item, attrPK)
		return 0, fmt.Errorf("%w: lease item %q: %v", ErrMalformedItem, key, err)
	}
	return f, nil
}

// readFence reads a lease item's fence with a strongly consistent read,
// even when ctx has ended; 0 when there is no item.
func readFence(ctx context.Context, db DynamoDBAPI, table string, key map[string]types.AttributeValue, timeout time.Duration) (int64, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	out, err := db.GetItem(cctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: key, ConsistentRead: aws.Bool(true)})
	if err != nil {
		return 0, fmt.Errorf("read lease: %w", err)
	}
	return fenceOf(out.Item)
}

// transact sends a TransactWriteItems. A server that does not know the
// operation gets an error wrapping ErrTransactionsUnsupported.
func transact(ctx context.Context, db DynamoDBAPI, timeout time.Duration, items []types.TransactWriteItem) error {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := db.TransactWriteItems(cctx, &dynamodb.TransactWriteItemsInput{TransactItems: items})
	var api smithy.APIError
	if errors.As(err, &api) && api.ErrorCode() == "UnknownOperationException" {
		return fmt.Errorf("%w: %w", ErrTransactionsUnsupported, err)
	}
	return err
}

// conditionFailed reports whether err is a cancelled transaction whose
// action i failed its condition, and returns the item the server sent with
// the failure, if any.
func conditionFailed(err error, i int) (map[string]types.AttributeValue, bool) {
	var tce *types.TransactionCanceledException
	if err == nil || !errors.As(err, &tce) || i >= len(tce.CancellationReasons) {
		return nil, false
	}
	r := tce.CancellationReasons[i]
	return r.Item, aws.ToString(r.Code) == "ConditionalCheckFailed"
}

// retryable is transient, except for this package's verdicts (a lost
// tenure, a taken slot, a stale fence), and also counts as transient a
// transaction cancelled only by conflicts or throttling.
func retryable(err error) bool {
	for _, verdict := range []error{ErrLost, ErrNotLeader, ErrSlotTaken, ErrStaleFence, ErrTransactionsUnsupported} {
		if errors.Is(err, verdict) {
			return false
		}
	}
	var tce *types.TransactionCanceledException
	if !errors.As(err, &tce) {
		return transient(err)
	}
	for _, r := range tce.CancellationReasons {
		switch aws.ToString(r.Code) {
		case "", "None", "TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded", "RequestLimitExceeded":
		default:
			return false
		}
	}
	return true
}
