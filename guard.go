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

// DefaultGuardTokenAttribute is the default of GuardOptions.TokenAttribute.
const DefaultGuardTokenAttribute = "fenceWrite"

// MaxGuardedItems is the most writes Guard.TransactWrite accepts: DynamoDB's
// 100 actions per transaction, less the guard's check.
const MaxGuardedItems = 99

// GuardOptions configures a Guard. A zero field takes its default.
type GuardOptions struct {
	// CallTimeout bounds each DynamoDB call, and the retries of a guarded
	// write that conflicted with a transaction using its item (see
	// Guard.TransactWrite). Default 5s; negative is an error.
	CallTimeout time.Duration

	// FenceAttribute names the attribute in which Put and Update keep the
	// target item's fence high-water mark (a number). Default "fence".
	FenceAttribute string

	// TokenAttribute names the attribute in which Put and Update store a
	// random token of each write (a string) on the item they write, so that
	// a write whose answer was lost, or whose SDK retry failed its
	// condition because the first attempt had landed, is recognised as
	// applied. Guarded items carry it as long as they carry the fence mark.
	// It must differ from FenceAttribute. Default "fenceWrite".
	TokenAttribute string

	// Observer, if not nil, is told of every write the guard refuses for a
	// stale fence (EventStaleFence) and of every DynamoDB request it makes
	// (EventCall). Events are delivered one at a time, in the order they
	// happened, by the goroutine that made the request (or, when methods
	// run concurrently, by one already delivering). It must not block: a slow observer delays the guarded
	// call. A panic in it is not recovered. Default nil.
	Observer func(Event)
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
	keys  sync.Map // table name -> []string, its key attributes
	obs   notifier
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
	if o.TokenAttribute == "" {
		o.TokenAttribute = DefaultGuardTokenAttribute
	}
	if err := checkName("FenceAttribute", o.FenceAttribute, 255); err != nil {
		return nil, err
	}
	if err := checkName("TokenAttribute", o.TokenAttribute, 255); err != nil {
		return nil, err
	}
	if o.TokenAttribute == o.FenceAttribute {
		return nil, invalid("GuardOptions: TokenAttribute and FenceAttribute are both %q", o.FenceAttribute)
	}
	g := &Guard{db: db, table: table, job: job, key: map[string]types.AttributeValue{attrPK: avS(leaseKey(job))},
		opts: o, obs: notifier{fn: o.Observer}}
	if o.Observer != nil {
		g.db = observedDB{db: db, now: time.Now, report: func(e Event) {
			e.Kind, e.Job, e.Time = EventCall, job, time.Now()
			g.obs.emit(e)
		}}
	}
	return g, nil
}

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
	cctx, cancel := context.WithTimeout(ctx, g.opts.CallTimeout)
	item, err := g.get(cctx, g.table, g.key)
	cancel()
	if ctx.Err() != nil {
		// The read may have succeeded, but the caller's context ended: what
		// follows would run with a dead context.
		return fmt.Errorf("ddblease: guard %q: %s refused: %w", g.job, op, errors.Join(ended(ctx), err))
	}
	if err != nil {
		return fmt.Errorf("ddblease: guard %q: read lease: %w", g.job, err)
	}
	cur, err := fenceOf(item)
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
// any fence but the current one, whichever items it writes. When a newer
// fence exists, nothing is written and the error is a *StaleFenceError
// carrying the current fence (from the check's ALL_OLD item, or a
// consistent read). A failed condition among items is returned as the
// SDK's TransactionCanceledException (errors.As), whose CancellationReasons
// list the guard's check first and then items in order. An item acting on
// the job's lease item is an error wrapping ErrInvalid. A server without
// transactions gets an error wrapping ErrTransactionsUnsupported; use Put
// or Update there.
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
// was lost and then report the retry's conditions failing.
//
// One request per attempt (each costs twice the write units of plain
// writes, as every transaction does).
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
	all := make([]types.TransactWriteItem, 0, len(items)+1)
	all = append(all, types.TransactWriteItem{ConditionCheck: fenceCheck(g.table, g.key, fence)})
	all = append(all, items...)
	err := transactRetrying(ctx, g.db, all, g.retry())
	if err == nil {
		return nil
	}
	if item, ok := conditionFailed(err, 0); ok {
		cur, cerr := fenceOf(item)
		if cerr != nil || len(item) == 0 {
			var got map[string]types.AttributeValue
			if got, cerr = g.readItem(ctx, g.table, g.key); cerr == nil {
				cur, cerr = fenceOf(got)
			}
		}
		return errors.Join(g.stale("TransactWrite", &StaleFenceError{Job: g.job, Fence: fence, Current: cur, err: err}), cerr)
	}
	return fmt.Errorf("ddblease: guarded transaction %q: %w", g.job, err)
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

// Put writes in.Item, setting its fence attribute (GuardOptions.
// FenceAttribute) to fence and its token attribute (GuardOptions.
// TokenAttribute) to a random token of this write, on condition that the
// item stored under that key has no fence attribute or one not above fence
// — and that in's own ConditionExpression, if any, holds.
//
// What it refuses: a fence lower than the highest fence that wrote THIS
// item, with a *StaleFenceError whose Current is that high-water mark. It
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
// token attribute. in is not modified.
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
	if _, ok := in.Item[g.opts.TokenAttribute]; ok {
		return nil, invalid("Put: the item holds attribute %q, which the guard reserves for its write token (GuardOptions.TokenAttribute)", g.opts.TokenAttribute)
	}
	tok := randomID(16)
	p := *in
	p.Item = maps.Clone(in.Item)
	p.Item[g.opts.FenceAttribute] = avN(fence)
	p.Item[g.opts.TokenAttribute] = avS(tok)
	var err error
	if p.ConditionExpression, p.ExpressionAttributeNames, p.ExpressionAttributeValues, err =
		g.fenceCondition("Put", in.ConditionExpression, in.ExpressionAttributeNames, in.ExpressionAttributeValues, fence, tok); err != nil {
		return nil, err
	}
	p.ReturnValuesOnConditionCheckFailure = types.ReturnValuesOnConditionCheckFailureAllOld
	var out *dynamodb.PutItemOutput
	err = retryConflicts(ctx, g.retry(), func(ctx context.Context) (err error) {
		out, err = g.db.PutItem(ctx, &p)
		return err
	})
	if err == nil {
		return out, nil
	}
	table := *in.TableName
	if _, err := g.resolve(ctx, "Put", fence, tok, err, func() (map[string]types.AttributeValue, error) {
		return g.keyOf(ctx, table, in.Item)
	}, table); err != nil {
		return nil, err
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
// an error wrapping ErrInvalid, before any request. in is not modified.
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
	if reservedIn(aws.ToString(in.UpdateExpression)) {
		return nil, invalid("Update: the UpdateExpression uses a placeholder starting with #%s or :%s, which the guard reserves",
			reservedPrefix, reservedPrefix)
	}
	for _, a := range []string{g.opts.FenceAttribute, g.opts.TokenAttribute} {
		if ref, ok := refersTo(aws.ToString(in.UpdateExpression), in.ExpressionAttributeNames, a); ok {
			return nil, invalid("Update: the UpdateExpression refers to attribute %q (as %s), which the guard keeps", a, ref)
		}
	}
	tok := randomID(16)
	u := *in
	u.UpdateExpression = aws.String(withFenceSet(aws.ToString(in.UpdateExpression)))
	var err error
	if u.ConditionExpression, u.ExpressionAttributeNames, u.ExpressionAttributeValues, err =
		g.fenceCondition("Update", in.ConditionExpression, in.ExpressionAttributeNames, in.ExpressionAttributeValues, fence, tok); err != nil {
		return nil, err
	}
	u.ReturnValuesOnConditionCheckFailure = types.ReturnValuesOnConditionCheckFailureAllOld
	var out *dynamodb.UpdateItemOutput
	err = retryConflicts(ctx, g.retry(), func(ctx context.Context) (err error) {
		out, err = g.db.UpdateItem(ctx, &u)
		return err
	})
	if err == nil {
		return out, nil
	}
	item, err := g.resolve(ctx, "Update", fence, tok, err, func() (map[string]types.AttributeValue, error) {
		return in.Key, nil
	}, *in.TableName)
	if err != nil {
		return nil, err
	}
	res := &dynamodb.UpdateItemOutput{}
	if in.ReturnValues == types.ReturnValueAllNew {
		res.Attributes = item
	}
	return res, nil
}

// resolve explains a guarded write that failed with err: it returns the
// stored item and a nil error when the item carries the write's token (the
// write, or an earlier attempt of it, was applied); otherwise a
// *StaleFenceError when the item's fence mark is above fence, or the error
// of the write.
func (g *Guard) resolve(ctx context.Context, op string, fence int64, tok string, err error,
	keyFn func() (map[string]types.AttributeValue, error), table string) (map[string]types.AttributeValue, error) {
	what := strings.ToLower(op)
	var ccf *types.ConditionalCheckFailedException
	failed := errors.As(err, &ccf)
	if !failed && (refusedOutright(err) || !retryable(err)) {
		// Refused before it could apply (validation, access, a missing
		// table): no earlier attempt of it can have landed either.
		return nil, fmt.Errorf("ddblease: guarded %s %q: %w", what, g.job, err)
	}
	var item map[string]types.AttributeValue
	if failed {
		item = ccf.Item
	}
	if len(item) == 0 {
		// No item came with the answer (dynalite), or no answer came: read
		// it, even when ctx has ended, so that a write that landed is known.
		key, rerr := keyFn()
		if rerr == nil {
			item, rerr = g.readItem(ctx, table, key)
		}
		if rerr != nil {
			if failed {
				return nil, fmt.Errorf("ddblease: guarded %s %q refused; cannot tell why: %w", what, g.job, errors.Join(err, rerr))
			}
			return nil, fmt.Errorf("ddblease: guarded %s %q: outcome unknown: %w", what, g.job, errors.Join(err, rerr))
		}
	}
	if t, ok := item[g.opts.TokenAttribute].(*types.AttributeValueMemberS); ok && t.Value == tok {
		return item, nil
	}
	if !failed {
		return nil, fmt.Errorf("ddblease: guarded %s %q: not applied as far as a consistent read shows: %w", what, g.job, err)
	}
	return nil, g.refusal(op, fence, item, err)
}

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

// refusal explains a failed guarded write from the stored item: a fence
// mark above fence is a *StaleFenceError; otherwise the user's condition
// failed and err is returned.
func (g *Guard) refusal(op string, fence int64, item map[string]types.AttributeValue, err error) error {
	what := strings.ToLower(op)
	if _, ok := item[g.opts.FenceAttribute]; ok {
		mark, merr := num(item, g.opts.FenceAttribute)
		if merr != nil {
			return fmt.Errorf("ddblease: guarded %s %q refused: %w: target item: %v (%w)", what, g.job, ErrMalformedItem, merr, err)
		}
		if mark > fence {
			return g.stale(op, &StaleFenceError{Job: g.job, Fence: fence, Current: mark, err: err})
		}
	}
	return fmt.Errorf("ddblease: guarded %s %q: %w", what, g.job, err)
}

// retry is how the guard retries a write that conflicts with a
// transaction: until CallTimeout has passed since the call began.
func (g *Guard) retry() txRetry {
	return txRetry{now: time.Now, deadline: time.Now().Add(g.opts.CallTimeout), timeout: g.opts.CallTimeout}
}

// stale reports a refused fence to the observer and returns e.
func (g *Guard) stale(op string, e *StaleFenceError) error {
	g.obs.emit(Event{Kind: EventStaleFence, Job: g.job, Time: time.Now(), Fence: e.Fence, Current: e.Current, Op: op})
	return e
}

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
	return g.get(cctx, table, key)
}

// get reads an item with a strongly consistent read.
func (g *Guard) get(ctx context.Context, table string, key map[string]types.AttributeValue) (map[string]types.AttributeValue, error) {
	out, err := g.db.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(table), Key: key, ConsistentRead: aws.Bool(true)})
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
