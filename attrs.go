package ddblease

import (
	"encoding/hex"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/feature/dynamodb/attributevalue"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// This file owns the attributes of the library's items: their names (one
// list, itemAttributes, that a Layout's key names must avoid), the typed
// getters that name what is missing or malformed, and the values the
// library writes (avS, avN, randomID).

// The items of the table are records: Go structs whose fields carry
// dynamodbav tags (leaseItem, controlItem, runItem), decoded with
// attributevalue.UnmarshalMap and validated after decoding. Their fields are
// the strict scalars below: decoding never fails on them; each remembers
// whether its attribute was there and whether it had the type the protocol
// writes, so that validation names the attribute and the problem
// (ErrMalformedItem), where attributevalue would convert a number into a
// string field or report a type error without the attribute's name.

// sAttr is a string (S) attribute.
type sAttr struct {
	v        string
	set, bad bool
}

// UnmarshalDynamoDBAttributeValue implements attributevalue.Unmarshaler.
func (a *sAttr) UnmarshalDynamoDBAttributeValue(av types.AttributeValue) error {
	s, ok := av.(*types.AttributeValueMemberS)
	*a = sAttr{set: true, bad: !ok}
	if ok {
		a.v = s.Value
	}
	return nil
}

// get returns the value of a required attribute.
func (a sAttr) get(name string) (string, error) {
	switch {
	case !a.set:
		return "", fmt.Errorf("attribute %s is missing", name)
	case a.bad:
		return "", fmt.Errorf("attribute %s is not a string", name)
	}
	return a.v, nil
}

// opt returns the value of an optional attribute; "" when absent.
func (a sAttr) opt(name string) (string, error) {
	if !a.set {
		return "", nil
	}
	return a.get(name)
}

// nAttr is an integer number (N) attribute.
type nAttr struct {
	v        string
	set, bad bool
}

// UnmarshalDynamoDBAttributeValue implements attributevalue.Unmarshaler.
func (a *nAttr) UnmarshalDynamoDBAttributeValue(av types.AttributeValue) error {
	n, ok := av.(*types.AttributeValueMemberN)
	*a = nAttr{set: true, bad: !ok}
	if ok {
		a.v = n.Value
	}
	return nil
}

// get returns the value of a required attribute.
func (a nAttr) get(name string) (int64, error) {
	switch {
	case !a.set:
		return 0, fmt.Errorf("attribute %s is missing", name)
	case a.bad:
		return 0, fmt.Errorf("attribute %s is not a number", name)
	}
	return parseInt(name, a.v)
}

// opt returns the value of an optional attribute; 0 when absent.
func (a nAttr) opt(name string) (int64, error) {
	if !a.set {
		return 0, nil
	}
	return a.get(name)
}

// boolAttr is a boolean (BOOL) attribute.
type boolAttr struct {
	v, set, bad bool
}

// UnmarshalDynamoDBAttributeValue implements attributevalue.Unmarshaler.
func (a *boolAttr) UnmarshalDynamoDBAttributeValue(av types.AttributeValue) error {
	b, ok := av.(*types.AttributeValueMemberBOOL)
	*a = boolAttr{set: true, bad: !ok}
	if ok {
		a.v = b.Value
	}
	return nil
}

// opt returns the value of an optional attribute; false when absent.
func (a boolAttr) opt(name string) (bool, error) {
	if a.bad {
		return false, fmt.Errorf("attribute %s is not a boolean", name)
	}
	return a.v, nil
}

// unmarshalItem decodes item into out, a pointer to a record struct, with
// attributevalue.UnmarshalMap. attributevalue gives an attribute that no
// field names exactly to a field whose name differs only in case; the
// table's attribute names are case-sensitive, so such attributes are left
// out first (a copy of item is made only when there are any).
func unmarshalItem(item map[string]types.AttributeValue, out any) error {
	names := tagNames(reflect.TypeOf(out).Elem())
	for k := range item {
		if _, ok := names.exact[k]; ok {
			continue
		}
		if _, ok := names.folded[strings.ToLower(k)]; ok {
			item = exactOnly(item, names.exact)
			break
		}
	}
	return attributevalue.UnmarshalMap(item, out)
}

// exactOnly returns the attributes of item whose names are in names.
func exactOnly(item map[string]types.AttributeValue, names map[string]struct{}) map[string]types.AttributeValue {
	c := make(map[string]types.AttributeValue, len(names))
	for k, v := range item {
		if _, ok := names[k]; ok {
			c[k] = v
		}
	}
	return c
}

type fieldNames struct {
	exact, folded map[string]struct{}
}

var tagCache sync.Map // reflect.Type → fieldNames

// tagNames returns the attribute names of a record struct's fields (their
// dynamodbav tags, embedded structs included), as they are and in lower
// case.
func tagNames(t reflect.Type) fieldNames {
	if v, ok := tagCache.Load(t); ok {
		return v.(fieldNames)
	}
	n := fieldNames{exact: map[string]struct{}{}, folded: map[string]struct{}{}}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("dynamodbav"), ",")
			if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
				walk(f.Type)
				continue
			}
			if name == "" || name == "-" {
				name = f.Name
			}
			n.exact[name] = struct{}{}
			n.folded[strings.ToLower(name)] = struct{}{}
		}
	}
	walk(t)
	tagCache.Store(t, n)
	return n
}

// str reads a string attribute of an item decoded by hand (an item of the
// user's, or one attribute of ours).
func str(item map[string]types.AttributeValue, name string) (string, error) {
	v, ok := item[name]
	if !ok {
		return "", fmt.Errorf("attribute %s is missing", name)
	}
	s, ok := v.(*types.AttributeValueMemberS)
	if !ok {
		return "", fmt.Errorf("attribute %s is not a string", name)
	}
	return s.Value, nil
}

// num reads an integer number attribute of an item decoded by hand (an
// item of the user's, or one attribute of ours).
func num(item map[string]types.AttributeValue, name string) (int64, error) {
	v, ok := item[name]
	if !ok {
		return 0, fmt.Errorf("attribute %s is missing", name)
	}
	n, ok := v.(*types.AttributeValueMemberN)
	if !ok {
		return 0, fmt.Errorf("attribute %s is not a number", name)
	}
	return parseInt(name, n.Value)
}

// parseInt reads an integer number. Servers that compute in float64 may
// return integers in exponent form, so integral floats up to 2^53 are
// accepted too.
func parseInt(name, s string) (int64, error) {
	if i, err := strconv.ParseInt(s, 10, 64); err == nil {
		return i, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return 0, fmt.Errorf("attribute %s is %q, not an integer", name, s)
	}
	return int64(f), nil
}

func avS(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }

func avN(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}

func avBool(b bool) types.AttributeValue { return &types.AttributeValueMemberBOOL{Value: b} }

// Attribute names of a job-run item (owner and fence as in the lease
// item). Several are reserved words: expressions use expression attribute
// names throughout.
const (
	attrJob         = "job"
	attrSlot        = "slot"        // S: the slot, RFC 3339 in UTC
	attrClaim       = "claim"       // S: random token of the claim
	attrStatus      = "status"      // S: a RunStatus
	attrStartedAt   = "startedAt"   // N: Unix ms, claimant's clock
	attrFinishedAt  = "finishedAt"  // N: Unix ms
	attrError       = "error"       // S: error text of a failed run
	attrClaims      = "claims"      // N: claims made, 1 + re-runs
	attrMissed      = "missed"      // N: slots found missed by the catch-up; -1: unknown
	attrAbandonedBy = "abandonedBy" // N: fence of the tenure that abandoned it
	attrTrigger     = "trigger"     // S: id of the trigger request of a triggered run
	// attrUnswept lists slots (as in their keys) whose runs an older tenure
	// may have left running, which the claimant's catch-up could not mark
	// abandoned: a later catch-up that stops at this run reads them back.
	attrUnswept = "unswept" // SS
	// attrSkippedIn is, on a run skipped by a pause, when that pause began
	// (the lease item's pausedAt, Unix ms): a slot recorded skipped by a
	// leader whose wall clock ran ahead, though it came due after the
	// pause ended, is run after all (runprotocol.go).
	attrSkippedIn = "skippedIn" // N
)

// Attribute names of the lease item. Several are DynamoDB reserved words, so
// expressions always refer to them through expression attribute names.
const (
	attrOwner      = "owner"
	attrFence      = "fence"
	attrExpires    = "expiresAt"  // N: writer's wall clock, Unix ms
	attrVersion    = "rv"         // S: renewal version, new on every write
	attrLeaseMs    = "leaseMs"    // N: lease duration written, ms
	attrAcquiredAt = "acquiredAt" // N: Unix ms
	attrRenewedAt  = "renewedAt"  // N: Unix ms
	attrDraining   = "draining"   // BOOL: the holder is about to resign
	// attrListed records that the job's directory entry was written
	// (Lease.list): until it is, each acquisition writes it.
	attrListed = "listed" // BOOL
	// attrLastFailed is the sort key of the latest run of the job
	// recorded failed (JobRun.Finish), so that an operator reads the last
	// failure by key (Admin.Run) whatever the runs since. It only grows.
	attrLastFailed = "lastFailed" // S
)

// Attribute names of the operator controls kept in the lease item (see
// Admin). Writes of the lease protocol never touch them, and operator writes
// never touch the protocol's attributes except ForceRelease, which raises
// the fence like an acquisition does.
const (
	attrPaused        = "paused"        // BOOL: RunSchedule fires no slot
	attrPausedBy      = "pausedBy"      // S: operator of the latest pause
	attrPausedAt      = "pausedAt"      // N: Unix ms, operator's clock
	attrResumedBy     = "resumedBy"     // S
	attrResumedAt     = "resumedAt"     // N: Unix ms
	attrCatchUp       = "catchUp"       // S: token of the latest resumption
	attrCatchUpWanted = "catchUpWanted" // BOOL: that resumption asked for a catch-up
	attrCatchUpDone   = "catchUpDone"   // S: token of the latest catch-up handled
	attrResignFence   = "resignFence"   // N: the tenure asked to resign
	attrResignBy      = "resignBy"      // S
	attrResignAt      = "resignAt"      // N: Unix ms
	attrReleasedFence = "releasedFence" // N: the tenure force-released
	attrReleasedBy    = "releasedBy"    // S
	attrReleasedAt    = "releasedAt"    // N: Unix ms
	// attrTriggers maps the id of each pending trigger request to its
	// slot (N, Unix ms). Handled requests are removed from the map with a
	// nested REMOVE. The map keeps a placeholder entry, triggerKeep, so
	// that it is never emptied: minidyn v0.8.2 cannot return an empty map,
	// and ignores top-level REMOVE actions (which is why no other control
	// is cleared by removing an attribute).
	attrTriggers = "triggers" // M
	triggerKeep  = "-"
)

// Attributes of the directory's entries.
const (
	attrPool     = "pool" // S: a pool's entry: the pool's name
	attrPoolJobs = "jobs" // SS: a pool's entry: its jobs, as its last replica to start listed them
)

// Attributes of a pool's member item (and session.go's).
const (
	memberExpiry   = "exp"      // N: the member's expiry, Unix ms, by its clock
	memberView     = "view"     // S: the view it acts on (viewOf)
	memberJobs     = "list"     // S: its job list (listHash)
	memberDeclined = "declined" // S: the jobs it declines, a JSON array of names
)

// Attributes of sessions: in a member item, and in a lease item bound to one.
const (
	memberSession = "sid"     // S: the session's id, new for each Pool.Run
	memberVersion = "sv"      // S: the session's version, new at each renewal
	memberEnded   = "ended"   // S: set once, by the replica that ended the lapsed session
	memberLeaving = "leaving" // BOOL: the replica is leaving the pool: assign it nothing
	memberNotes   = "notes"   // SS: notes on jobs whose lease item an operator changed (Admin; newNote)
	attrSession   = "session" // S, lease item: the id of the session it is bound to
	// The pool of that session is the lease item's attrPool.

	// noSession marks a lease item bound to no session, and a member
	// item's session not ended: the library never relies on REMOVE
	// (minidyn v0.8.2 ignores a top-level REMOVE clause).
	noSession = "-"
)

// itemAttributes are the attributes of the library's items other than
// the key: a key attribute must not be named as one of them.
var itemAttributes = map[string]bool{
	attrOwner: true, attrFence: true, attrExpires: true, attrVersion: true, attrLeaseMs: true,
	attrAcquiredAt: true, attrRenewedAt: true, attrDraining: true, attrListed: true, attrLastFailed: true,
	attrPaused: true, attrPausedBy: true, attrPausedAt: true, attrResumedBy: true, attrResumedAt: true,
	attrCatchUp: true, attrCatchUpWanted: true, attrCatchUpDone: true, attrResignFence: true, attrResignBy: true, attrResignAt: true, attrReleasedFence: true,
	attrReleasedBy: true, attrReleasedAt: true, attrTriggers: true,
	attrJob: true, attrSlot: true, attrClaim: true, attrStatus: true, attrStartedAt: true, attrFinishedAt: true,
	attrError: true, attrClaims: true, attrMissed: true, attrAbandonedBy: true, attrTrigger: true,
	attrUnswept: true, attrSkippedIn: true, RunTTLAttribute: true,
	attrPool: true, attrPoolJobs: true, memberExpiry: true, memberView: true, memberJobs: true, memberDeclined: true,
	memberSession: true, memberVersion: true, memberEnded: true, memberLeaving: true, memberNotes: true, attrSession: true,
}

// randomID returns n random bytes in hex. Renewal versions and owner ids
// need uniqueness, not secrecy: math/rand/v2's generator is seeded from
// the operating system and is far cheaper than crypto/rand.
func randomID(n int) string {
	b := make([]byte, n)
	for i := 0; i < n; i += 8 {
		v := rand.Uint64()
		for j := i; j < min(i+8, n); j++ {
			b[j] = byte(v)
			v >>= 8
		}
	}
	return hex.EncodeToString(b)
}

// RunTTLAttribute is the attribute in which run items carry their expiry,
// in Unix seconds. Enable DynamoDB's time to live on it for old runs to be
// deleted; lease items never carry it.
const RunTTLAttribute = "ttl"
