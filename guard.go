package ddblease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// This file owns Guard: every guarded form (Check, Do, Put, Update,
// TransactWrite), its condition, and the guarded transaction; the fence mark
// is guardmark.go's.

// StaleFenceError reports a refused fence. errors.Is(err, ErrStaleFence)
// reports true for it; the SDK's error, if there was one, stays in the chain
// for errors.As.
type StaleFenceError struct {
	Job   string
	Fence int64 // the fence that was refused
	// Current is the newer fence that refused it: the job's current fence
	// (0 if the job has no lease item), the high-water mark of an item that
	// the write targeted (Guard.Put, Guard.Update, an action of
	// Guard.TransactWrite or JobRun.Commit), or, for JobRun.Finish and
	// JobRun.Commit, the fence of the tenure that claimed the slot again or
	// abandoned the run.
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

// defaultGuardCallTimeout is the default of GuardOptions.CallTimeout.
const defaultGuardCallTimeout = 5 * time.Second

// MaxGuardedItems is the most writes Guard.TransactWrite accepts: DynamoDB's
// 100 actions per transaction, less the guard's check.
const MaxGuardedItems = 99

// GuardOptions configures a Guard. A zero field takes its default.
type GuardOptions struct {
	// CallTimeout bounds each DynamoDB call, and the retries of a guarded
	// write that conflicted with a transaction using its item (see
	// Guard.TransactWrite). Default 5s; negative is an error.
	CallTimeout time.Duration

	// FenceAttribute names the attribute in which Put, Update and the
	// actions of TransactWrite keep the target item's fence high-water mark
	// (a number). Every writer of an item must use the same name: a
	// JobRun.Commit of the same items too (CommitOptions). Default "fence".
	FenceAttribute string

	// TokenAttribute names the attribute in which Put, Update and the
	// actions of TransactWrite store a random token of each write (a
	// string) on the item they write, so that a write whose answer was
	// lost, or whose SDK retry failed its condition because the first
	// attempt had landed, is recognised as applied. Guarded items carry it
	// as long as they carry the fence mark. It must differ from
	// FenceAttribute. Default "fenceWrite".
	TokenAttribute string

	// Observer, if not nil, is told of every write the guard refuses for a
	// stale fence (EventStaleFence) and of every DynamoDB request it makes
	// (EventCall). Events are delivered one at a time, in the order they
	// happened, by the goroutine that made the request (or, when methods
	// run concurrently, by one already delivering). It must not block: a
	// slow observer delays the guarded call. A panic in it is not
	// recovered. Default nil.
	Observer func(Event)

	// Layout names the lease table's key attributes and the prefix of the
	// library's keys: the replicas' Options.Layout. Default: the zero
	// Layout.
	Layout Layout
}

// Guard refuses side effects of stale leaders of one job. It is the sink
// side of the protocol, and may run in another service than the leader,
// with its own client. Its methods are safe for concurrent use.
//
// The forms differ in what they refuse:
//
//   - TransactWrite (and, for a schedule slot, JobRun.Commit) checks the
//     lease item's fence in the same transaction as the writes: it refuses
//     any fence but the job's current one.
//   - Put and Update keep a fence high-water mark in the item they write:
//     they refuse a fence lower than the highest fence that wrote THAT
//     item. A stale leader may still write an item that no newer fence has
//     written (under NeverRerun, a newer tenure never writes the slot it
//     abandons). They need no transactions.
//   - Every form that writes an item keeps the same mark: the Put and
//     Update actions of TransactWrite and Commit set it, under the same
//     condition, and their Delete actions are refused by a higher one. A
//     sink may mix the forms on one item; the newer write is never lost.
//   - Check and Do read the lease item and refuse any fence but the current
//     one, but are not atomic with what follows: they are for sinks outside
//     DynamoDB.
//
// Every form fails closed: any error (a timeout, a cancelled context, a
// missing or malformed lease item) rejects.
type Guard struct {
	db    DynamoDBAPI
	table string
	job   string
	key   map[string]types.AttributeValue
	opts  GuardOptions
	mark  marker
	keys  sync.Map // table name -> []string, its key attributes
	obs   notifier
}

// NewGuard returns a guard for job, whose lease is in table. It makes no
// call.
func NewGuard(db DynamoDBAPI, table, job string, optFns ...func(*GuardOptions)) (*Guard, error) {
	if err := CheckClient(db); err != nil {
		return nil, fmt.Errorf("NewGuard: %w", err)
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
		o.CallTimeout = defaultGuardCallTimeout
	}
	m, err := newMarker("GuardOptions", o.FenceAttribute, o.TokenAttribute)
	if err != nil {
		return nil, err
	}
	o.FenceAttribute, o.TokenAttribute = m.fence, m.token
	if o.Layout, err = o.Layout.withDefaults("GuardOptions"); err != nil {
		return nil, err
	}
	g := &Guard{db: db, table: table, job: job, key: o.Layout.leaseKey(job),
		opts: o, mark: m, obs: notifier{to: observerTo(o.Observer)}}
	if o.Observer != nil {
		g.db = observedDB{db: db, now: time.Now, sink: g}
	}
	return g, nil
}

// reportCall reports a request to Options.Observer (observedDB).
func (g *Guard) reportCall(e Event) {
	e.Kind, e.Job, e.Time = EventCall, g.job, time.Now()
	g.obs.emit(e)
}

// callAnswered is observedDB's: a Guard does not track it.
func (g *Guard) callAnswered() {}

// Job returns the job name.
func (g *Guard) Job() string { return g.job }

// Check reads the job's lease item with a strongly consistent read and
// returns nil only if its fence equals fence. Otherwise it returns a
// *StaleFenceError (a newer fence exists, or the job has no lease item), or
// the error that prevented the read: it fails closed. A context that has
// ended, before or during the read, refuses with an error wrapping its
// cause. One GetItem request (none when ctx has already ended).
//
// Check looks at the fence only, not at the lease's expiry: a fence stays
// current until a newer one is issued, so the writes of a leader that is
// draining, or whose lease lapsed with no one taking over, are accepted.
// Check is not atomic with what follows it: a newer leader may take over
// just after. Use it only for sinks outside DynamoDB (see Do).
func (g *Guard) Check(ctx context.Context, fence int64) error {
	return g.check(ctx, "Check", fence)
}

func (g *Guard) check(ctx context.Context, op string, fence int64) error {
	if fence < 1 {
		return invalid("%s: fence %d is below 1", op, fence)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("ddblease: guard %q: %s refused: %w", g.job, op, ended(ctx))
	}
	item, err := getItem(ctx, g.db, g.table, g.key, g.opts.CallTimeout)
	if ctx.Err() != nil {
		// The read may have succeeded, but the caller's context ended: what
		// follows would run with a dead context.
		return fmt.Errorf("ddblease: guard %q: %s refused: %w", g.job, op, errors.Join(ended(ctx), err))
	}
	if err != nil {
		return fmt.Errorf("ddblease: guard %q: read lease: %w", g.job, explainTableError(ctx, g.db, g.table, g.opts.Layout, err))
	}
	cur, err := fenceOf(g.opts.Layout, item)
	if err != nil {
		return fmt.Errorf("ddblease: guard %q: %w", g.job, err)
	}
	if cur != fence {
		return g.stale(op, &StaleFenceError{Job: g.job, Fence: fence, Current: cur})
	}
	return nil
}

// Do calls fn(ctx, fence) if Check accepts fence, and returns Check's error
// without calling fn otherwise. fn is never called with a context that
// has ended.
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
	if err := g.check(ctx, "Do", fence); err != nil {
		return err
	}
	return fn(ctx, fence)
}

// TransactWrite applies items in one TransactWriteItems together with a
// ConditionCheck that the job's lease item holds exactly fence: it refuses
// any fence but the current one, whichever items it writes.
//
// Every item it writes carries the fence high-water mark as Put and Update
// keep it, so that the forms can be mixed on one item: each Put and Update
// action sets the item's fence attribute (GuardOptions.FenceAttribute) to
// fence and its token attribute to a token of this call, on condition that
// the stored item has no fence attribute or one not above fence (and does
// not carry this call's token); each Delete action is on the first of these
// conditions. The action's own ConditionExpression is ANDed with them, and
// its expressions are checked as Put's and Update's are (an error wrapping
// ErrInvalid, before any request). A later Put or Update of one of these
// items with a lower fence is refused, and this call refuses to write over
// a mark above fence (left by another job's guard sharing the item).
// ConditionCheck actions are sent as they are. Each action's
// ReturnValuesOnConditionCheckFailure is ALL_OLD. items are not modified.
//
// When a newer fence exists, nothing is written and the error is a
// *StaleFenceError carrying the current fence (from the check's ALL_OLD
// item, or a consistent read); when an item's mark is above fence, the
// same error carrying that mark. A failed condition among items that is
// the caller's own is returned as the SDK's TransactionCanceledException
// (errors.As), whose CancellationReasons list the guard's check first and
// then items in order. An item acting on a lease or job-run item of the
// lease table (any job's; its TableName the table's name or its ARN) is an
// error wrapping ErrInvalid. A server
// without transactions gets an error wrapping ErrTransactionsUnsupported;
// use Put or Update there.
//
// DynamoDB cancels a transaction that touches an item another transaction
// or write is using (TransactionConflict), such as the lease item while its
// holder renews it. Such a cancelled transaction is sent again, with
// jittered back-off, until it goes through or CallTimeout has passed since
// the call began (or ctx ends); then the error says that it kept
// conflicting with other writes and wraps the last
// TransactionCanceledException. Every attempt, the SDK's retries included,
// carries the same ClientRequestToken, so DynamoDB applies the transaction
// at most once (within its ten-minute idempotency window). A server that
// ignores the token (minidyn, dynalite) may apply an attempt whose answer
// was lost; the retry then fails the token condition, and the token found
// on the item shows that the transaction was applied.
//
// One request per attempt (each costs twice the write units of plain
// writes, as every transaction does); when it fails its conditions and the
// server returned no item with the failure, a consistent GetItem of the
// lease item or of the refused item (and the first time for a table a
// DescribeTable).
func (g *Guard) TransactWrite(ctx context.Context, fence int64, items []types.TransactWriteItem) error {
	if fence < 1 {
		return invalid("TransactWrite: fence %d is below 1", fence)
	}
	if len(items) == 0 || len(items) > MaxGuardedItems {
		return invalid("TransactWrite: %d items; between 1 and %d are allowed", len(items), MaxGuardedItems)
	}
	if i := onItem(items, g.table, g.key); i >= 0 {
		return invalid("TransactWrite: item %d acts on the job's lease item", i)
	}
	if i := libraryItem(items, g.table, g.opts.Layout); i >= 0 {
		return invalid("TransactWrite: item %d acts on a lease or job-run item, which the library keeps", i)
	}
	tok := randomID(16)
	marked, err := g.mark.transactItems("TransactWrite", items, fence, tok)
	if err != nil {
		return err
	}
	f := fencedTxn{db: g.db, table: g.table, leaseKey: g.key, layout: g.opts.Layout, job: g.job, fence: fence,
		mark: g.mark, items: items, marked: marked, landedTok: tok,
		keys: &g.keys, watch: -1, retry: g.retry(), timeout: g.opts.CallTimeout}
	out := f.send(ctx)
	switch {
	case out.err == nil:
		return nil
	case out.stale != nil:
		return errors.Join(g.stale("TransactWrite", out.stale), out.rerr)
	}
	applied, mark, merr := f.markRefusal(&out)
	switch {
	case applied:
		return nil
	case mark > 0:
		return g.stale("TransactWrite", &StaleFenceError{Job: g.job, Fence: fence, Current: mark, err: out.err})
	case merr != nil:
		return fmt.Errorf("ddblease: guarded transaction %q refused: %w", g.job, errors.Join(out.err, merr))
	}
	return fmt.Errorf("ddblease: guarded transaction %q: %w", g.job, out.err)
}

// fencedTxn is the guarded transaction, the one sequence behind
// Guard.TransactWrite and JobRun.Commit: a check that the job's lease item
// (leaseKey) still carries fence, first, then the library's own actions
// (own: a run's final update), then the caller's items marked with the
// fence (marked), in one TransactWriteItems; and, when it failed, what the
// table says of it.
type fencedTxn struct {
	db       DynamoDBAPI
	table    string
	leaseKey map[string]types.AttributeValue
	layout   Layout
	job      string
	fence    int64

	own           []types.TransactWriteItem
	mark          marker
	items, marked []types.TransactWriteItem // the caller's, and the same marked (marker.transactItems)
	// landedTok is the token whose presence in a refused item says the
	// transaction landed after all (an SDK retry of one that was applied);
	// "" where an own action's item says so instead (mine).
	landedTok string

	keys    *sync.Map                                       // condWrite.keys
	watch   int                                             // condWrite.watch
	mine    func(item map[string]types.AttributeValue) bool // condWrite.mine
	retry   retrier
	timeout time.Duration
}

// fenced is what became of a fencedTxn.
type fenced struct {
	err   error            // the transaction's; nil when it was applied at once
	w     written          // the failure resolved (condWrite.resolve); zero when err is nil or ErrTransactionsUnsupported
	stale *StaleFenceError // the fence check failed: the fence the lease item carries
	rerr  error            // reading the lease item back, for stale, failed
}

// send sends the transaction, and resolves a failure.
func (f fencedTxn) send(ctx context.Context) fenced {
	all := make([]types.TransactWriteItem, 0, 1+len(f.own)+len(f.marked))
	all = append(all, types.TransactWriteItem{ConditionCheck: fenceCheck(f.table, f.leaseKey, f.fence)})
	all = append(append(all, f.own...), f.marked...)
	_, err := transactRetrying(ctx, f.db, all, f.retry)
	out := fenced{err: err}
	if err == nil || errors.Is(err, ErrTransactionsUnsupported) {
		return out
	}
	out.w = condWrite{db: f.db, actions: all, keys: f.keys, watch: f.watch, timeout: f.timeout, mine: f.mine}.resolve(ctx, nil, err)
	if _, failed := out.w.fails[0]; failed {
		item, rerr := out.w.stored(0)
		cur, cerr := fenceOf(f.layout, item)
		out.stale = &StaleFenceError{Job: f.job, Fence: f.fence, Current: cur, err: err}
		out.rerr = errors.Join(rerr, cerr)
	}
	return out
}

// markRefusal explains a refusal of the caller's items by the fence marks
// they carry (marker.markRefusal): applied, when one carries landedTok;
// mark, a fence above this one's that one carries.
func (f fencedTxn) markRefusal(out *fenced) (applied bool, mark int64, err error) {
	return f.mark.markRefusal(&out.w, 1+len(f.own), f.items, f.fence, f.landedTok)
}

// refusal explains a failed guarded write from the stored item: a fence
// mark above fence is a *StaleFenceError; otherwise the user's condition
// failed and err is returned.
func (g *Guard) refusal(op string, fence int64, item map[string]types.AttributeValue, err error) error {
	what := strings.ToLower(op)
	mark, up, merr := g.mark.above(item, fence)
	switch {
	case merr != nil:
		return fmt.Errorf("ddblease: guarded %s %q refused: %w (%w)", what, g.job, merr, err)
	case up:
		return g.stale(op, &StaleFenceError{Job: g.job, Fence: fence, Current: mark, err: err})
	}
	return fmt.Errorf("ddblease: guarded %s %q: %w", what, g.job, err)
}

// retry is how the guard retries a write that conflicts with a
// transaction: until CallTimeout has passed since the call began.
func (g *Guard) retry() retrier {
	return retrier{now: time.Now, deadline: time.Now().Add(g.opts.CallTimeout), timeout: g.opts.CallTimeout}
}

// stale reports a refused fence to the observer and returns e.
func (g *Guard) stale(op string, e *StaleFenceError) error {
	g.obs.emit(Event{Kind: EventStaleFence, Job: g.job, Time: time.Now(), Fence: e.Fence, Current: e.Current, Op: op})
	return e
}

// Put writes in.Item, setting its fence attribute (GuardOptions.
// FenceAttribute) to fence and its token attribute (GuardOptions.
// TokenAttribute) to a random token of this write, on condition that the
// item stored under that key has no fence attribute or one not above fence
// — and that in's own ConditionExpression, if any, holds.
//
// What it refuses: a fence lower than the highest fence that wrote THIS
// item, by any form (TransactWrite's and Commit's actions keep the same
// mark), with a *StaleFenceError whose Current is that high-water mark. It
// does not refuse a stale leader writing an item that no newer fence has
// written: under NeverRerun the newer tenure abandons the slot and never
// writes its item, so a stale leader's Put of that slot's item is
// accepted. Key the items so that every tenure writes the same ones, or
// use TransactWrite (or JobRun.Commit), which refuse any stale fence. This
// is the storage-side check of Kleppmann's "How to do distributed
// locking", and needs no transaction.
//
// in's ConditionExpression is ANDed with the guard's conditions and cannot
// weaken them: one whose parentheses do not balance, or that uses a
// placeholder starting with #ddblease or :ddblease, is refused with an
// error wrapping ErrInvalid before any request. in.Item must not hold the
// token attribute, nor be a lease or job-run item of the lease table
// (whether in.TableName gives the table's name or its ARN). in is not
// modified.
//
// A write is applied at most once, and a write that landed is reported as
// landed: the condition also refuses an item that already carries this
// write's token, so an SDK retry of an attempt that landed fails, and the
// token found on the item then shows that the write was applied. The
// output is then an empty PutItemOutput: the item the write replaced, and
// the consumed capacity, are not known. When the outcome is unknown (the
// answers were lost), the item is read back the same way.
//
// A write refused because a transaction is using the item
// (TransactionConflictException) certainly did not apply, and is sent
// again as TransactWrite's are, until CallTimeout has passed.
//
// One PutItem request; when it fails and the server returned no item with
// the failure (dynalite), or no answer came, a consistent GetItem (and the
// first time for a table a DescribeTable) to tell a landed write, a stale
// fence and in's own condition apart.
func (g *Guard) Put(ctx context.Context, fence int64, in *dynamodb.PutItemInput) (*dynamodb.PutItemOutput, error) {
	if fence < 1 {
		return nil, invalid("Put: fence %d is below 1", fence)
	}
	if in == nil || aws.ToString(in.TableName) == "" || len(in.Item) == 0 {
		return nil, invalid("Put: the input needs a table name and an item")
	}
	if keptItem(in.TableName, in.Item, g.table, g.opts.Layout) {
		return nil, invalid("Put: the item is a lease or job-run item, which the library keeps")
	}
	tok := randomID(16)
	p := *in
	var err error
	if p.Item, err = g.mark.item("Put", in.Item, fence, tok); err != nil {
		return nil, err
	}
	if p.ConditionExpression, p.ExpressionAttributeNames, p.ExpressionAttributeValues, err =
		g.mark.condition("Put", in.ConditionExpression, in.ExpressionAttributeNames, in.ExpressionAttributeValues, fence, tok); err != nil {
		return nil, err
	}
	p.ReturnValuesOnConditionCheckFailure = types.ReturnValuesOnConditionCheckFailureAllOld
	var out *dynamodb.PutItemOutput
	if _, err := g.write(ctx, "Put", fence, tok, types.TransactWriteItem{Put: &types.Put{TableName: in.TableName, Item: in.Item}}, func(ctx context.Context) (err error) {
		out, err = g.db.PutItem(ctx, &p)
		return err
	}); err != nil || out != nil {
		return out, err
	}
	return &dynamodb.PutItemOutput{}, nil
}

// Update applies in, adding to its update expression a SET of the item's
// fence attribute (GuardOptions.FenceAttribute) to fence and of its token
// attribute (GuardOptions.TokenAttribute) to a random token of this write,
// on the conditions Put uses: the stored item has no fence attribute or one
// not above fence, it does not carry this write's token already, and in's
// own ConditionExpression holds (checked as Put checks it). It refuses
// what Put refuses, and only that: a fence lower than the highest fence
// that wrote this item. in's expressions must not use placeholders
// starting with #ddblease or :ddblease, and its UpdateExpression must not
// refer to the fence or token attribute at the top level (by name or
// through a placeholder), which could lower or remove the mark; either is
// an error wrapping ErrInvalid, before any request, as is a key of a lease
// or job-run item of the lease table. in is not modified.
//
// A write that landed is reported as landed, as with Put; the output then
// holds, when in.ReturnValues is ALL_NEW, the item as read back (which
// carries this write's token), and otherwise nothing. Conflicts with
// transactions are retried as Put's are. One UpdateItem
// request, and a consistent GetItem when it fails and the server returned
// no item with the failure, or no answer came.
func (g *Guard) Update(ctx context.Context, fence int64, in *dynamodb.UpdateItemInput) (*dynamodb.UpdateItemOutput, error) {
	if fence < 1 {
		return nil, invalid("Update: fence %d is below 1", fence)
	}
	if in == nil || aws.ToString(in.TableName) == "" || len(in.Key) == 0 {
		return nil, invalid("Update: the input needs a table name and a key")
	}
	if keptItem(in.TableName, in.Key, g.table, g.opts.Layout) {
		return nil, invalid("Update: the item is a lease or job-run item, which the library keeps")
	}
	tok := randomID(16)
	u := *in
	var err error
	if u.UpdateExpression, err = g.mark.update("Update", in.UpdateExpression, in.ExpressionAttributeNames); err != nil {
		return nil, err
	}
	if u.ConditionExpression, u.ExpressionAttributeNames, u.ExpressionAttributeValues, err =
		g.mark.condition("Update", in.ConditionExpression, in.ExpressionAttributeNames, in.ExpressionAttributeValues, fence, tok); err != nil {
		return nil, err
	}
	u.ReturnValuesOnConditionCheckFailure = types.ReturnValuesOnConditionCheckFailureAllOld
	var out *dynamodb.UpdateItemOutput
	item, err := g.write(ctx, "Update", fence, tok, action(*in.TableName, in.Key), func(ctx context.Context) (err error) {
		out, err = g.db.UpdateItem(ctx, &u)
		return err
	})
	if err != nil || out != nil {
		return out, err
	}
	out = &dynamodb.UpdateItemOutput{}
	if in.ReturnValues == types.ReturnValueAllNew {
		out.Attributes = item
	}
	return out, nil
}

// write sends a guarded write of the item of it with send, again while it
// conflicts with a transaction, and returns nil when its answer says it
// was applied. Otherwise it returns the stored item and a nil error when
// the item carries the write's token (the write, or an earlier attempt of
// it, was applied); a *StaleFenceError when the item's fence mark is above
// fence; or the error of the write.
func (g *Guard) write(ctx context.Context, op string, fence int64, tok string, it types.TransactWriteItem, send func(context.Context) error) (map[string]types.AttributeValue, error) {
	err := retryConflicts(ctx, g.retry(), send)
	if err == nil {
		return nil, nil
	}
	what := strings.ToLower(op)
	w := condWrite{db: g.db, actions: []types.TransactWriteItem{it}, keys: &g.keys, watch: 0, timeout: g.opts.CallTimeout,
		mine: func(item map[string]types.AttributeValue) bool { return g.mark.carries(item, tok) },
	}.resolve(ctx, nil, err)
	switch {
	case w.outcome == applied:
		return w.item, nil
	case w.outcome == failed:
		// Refused before it could apply (validation, access, a missing
		// table): no earlier attempt of it can have landed either.
		return nil, fmt.Errorf("ddblease: guarded %s %q: %w", what, g.job, err)
	case w.outcome == refused && w.rerr != nil:
		return nil, fmt.Errorf("ddblease: guarded %s %q refused; cannot tell why: %w", what, g.job, errors.Join(err, w.rerr))
	case w.rerr != nil:
		return nil, fmt.Errorf("ddblease: guarded %s %q: outcome unknown: %w", what, g.job, errors.Join(err, w.rerr))
	case w.outcome == unknown:
		return nil, fmt.Errorf("ddblease: guarded %s %q: not applied as far as a consistent read shows: %w", what, g.job, err)
	}
	return nil, g.refusal(op, fence, w.item, err)
}
