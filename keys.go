package ddblease

import (
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// This file owns Layout, the key of every item the library writes, and
// the rule for the names that keys are made of (checkName).

// Default names of the table's key attributes (Layout).
const (
	DefaultPartitionKey = "pk"
	DefaultSortKey      = "sk"
)

// MaxKeyPrefix is the longest Layout.Prefix accepted, in bytes.
const MaxKeyPrefix = 256

// Layout says where in a table the library keeps its items: the names of
// the table's key attributes (both of type S) and a prefix that starts
// every partition key value the library writes, so that its items can
// live in a table of a single-table design beside other items. The zero
// Layout is the default: partition key "pk", sort key "sk", no prefix,
// the table CreateTable makes.
//
// The library's items, as (partition key, sort key):
//
//	a job's lease item    <Prefix>job#<job>      lease
//	a job's run items     <Prefix>job#<job>      run#<slot>[#trigger-<id>]
//	the directory         <Prefix>directory      job#<job>, pool#<pool>
//	a pool's members      <Prefix>pool#<pool>    member#<owner>
//
// A job's items share its partition, the lease item first and then its
// runs in slot order (the slot in UTC with nine fractional digits, so
// that the order of the keys is the order of the slots), so "the runs of
// a job between two times" is one Query. The directory lists each job
// (written once, by the job's first acquisition) and each pool, so that
// listing them costs what they are, not what the table holds. Every read
// the library and the ddblease command make is a GetItem, a BatchGetItem
// or a Query on one of these keys.
//
// Every replica, Admin, Guard and the command must use the same Layout
// for a table's items: with another one they see none of them.
type Layout struct {
	// PartitionKey is the name of the table's partition key attribute.
	// Default "pk".
	PartitionKey string

	// SortKey is the name of the table's sort key attribute. Default
	// "sk".
	SortKey string

	// Prefix starts every partition key value the library writes, at
	// most MaxKeyPrefix bytes (for instance "ddblease#"). Default "".
	Prefix string
}

// withDefaults returns l with its defaults filled in, or an error
// wrapping ErrInvalid naming what is wrong; what names the options.
func (l Layout) withDefaults(what string) (Layout, error) {
	if l.PartitionKey == "" {
		l.PartitionKey = DefaultPartitionKey
	}
	if l.SortKey == "" {
		l.SortKey = DefaultSortKey
	}
	for _, k := range []struct{ field, name string }{{"PartitionKey", l.PartitionKey}, {"SortKey", l.SortKey}} {
		if err := checkName(what+".Layout."+k.field, k.name, 255); err != nil {
			return l, err
		}
		if itemAttributes[k.name] {
			return l, invalid("%s.Layout.%s %q is an attribute of the library's items; choose another name", what, k.field, k.name)
		}
	}
	if l.PartitionKey == l.SortKey {
		return l, invalid("%s.Layout: PartitionKey and SortKey are both %q", what, l.PartitionKey)
	}
	if l.Prefix != "" {
		if err := checkName(what+".Layout.Prefix", l.Prefix, MaxKeyPrefix); err != nil {
			return l, err
		}
	}
	return l, nil
}

// Sort keys and partition key parts of the library's items.
const (
	skLease      = "lease"
	skRunPrefix  = "run#"
	skJobPrefix  = "job#"  // a job's directory entry; a job's partition
	skPoolPrefix = "pool#" // a pool's directory entry; a pool's partition
	skMember     = "member#"
	pkDirectory  = "directory"
)

// key returns the key of the item (pk, sk).
func (l Layout) key(pk, sk string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{l.PartitionKey: avS(pk), l.SortKey: avS(sk)}
}

// jobPartition is the partition key of job's items.
func (l Layout) jobPartition(job string) string { return l.Prefix + skJobPrefix + job }

// leaseKey is the key of job's lease item.
func (l Layout) leaseKey(job string) map[string]types.AttributeValue {
	return l.key(l.jobPartition(job), skLease)
}

// runKey is the key of job's run whose sort key is sk (runSK).
func (l Layout) runKey(job, sk string) map[string]types.AttributeValue {
	return l.key(l.jobPartition(job), sk)
}

// directoryKey is the key of the directory entry of a job or a pool
// (prefix skJobPrefix or skPoolPrefix).
func (l Layout) directoryKey(prefix, name string) map[string]types.AttributeValue {
	return l.key(l.Prefix+pkDirectory, prefix+name)
}

// poolPartition is the partition key of pool's member items.
func (l Layout) poolPartition(pool string) string { return l.Prefix + skPoolPrefix + pool }

// memberKey is the key of owner's member item in pool.
func (l Layout) memberKey(pool, owner string) map[string]types.AttributeValue {
	return l.key(l.poolPartition(pool), skMember+owner)
}

// describe names the key of item, for errors: "pk/sk".
func (l Layout) describe(item map[string]types.AttributeValue) string {
	pk, _ := str(item, l.PartitionKey)
	sk, _ := str(item, l.SortKey)
	return pk + "/" + sk
}

// sortableSlot formats a slot for a sort key: UTC, nine fractional
// digits, so that keys sort as their slots do (years 0001-9999).
func sortableSlot(slot time.Time) string {
	return slot.UTC().Format("2006-01-02T15:04:05.000000000Z")
}

// runSK is the sort key of the run of slot; trigger is the trigger id of
// a triggered run, "" for a schedule slot.
func runSK(slot time.Time, trigger string) string {
	sk := skRunPrefix + sortableSlot(slot)
	if trigger != "" {
		sk += "#trigger-" + trigger
	}
	return sk
}

// runSKOf is the sort key of the run whose id (a slot id, or a triggered
// run's Trigger.RunID) is id.
func runSKOf(id string) (string, error) {
	slot, trigger, _ := strings.Cut(id, "#trigger-")
	t, err := time.Parse(time.RFC3339Nano, slot)
	if err != nil {
		return "", fmt.Errorf("run id %q does not start with an RFC 3339 slot", id)
	}
	return runSK(t, trigger), nil
}

// runIDOfSK is the id of the run whose sort key is sk (runSK): the
// inverse of runSKOf.
func runIDOfSK(sk string) (string, error) {
	rest, ok := strings.CutPrefix(sk, skRunPrefix)
	slot, trigger, _ := strings.Cut(rest, "#trigger-")
	t, err := time.Parse("2006-01-02T15:04:05.000000000Z", slot)
	if !ok || err != nil || (strings.Contains(rest, "#") && !validTriggerID(trigger)) {
		return "", fmt.Errorf("%q is not the sort key of a run", sk)
	}
	if trigger != "" {
		return triggerRunID(t, trigger), nil
	}
	return fmtSlot(t), nil
}

// checkName validates a job or owner name: non-empty, at most max bytes,
// valid UTF-8 without control characters.
func checkName(what, s string, max int) error {
	switch {
	case s == "":
		return invalid("%s is empty", what)
	case len(s) > max:
		return invalid("%s is %d bytes long, over the limit of %d", what, len(s), max)
	case !utf8.ValidString(s):
		return invalid("%s %q is not valid UTF-8", what, s)
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return invalid("%s %q contains a control character", what, s)
		}
	}
	return nil
}

// validTriggerID reports whether id has the form Admin.Trigger gives: 16
// lowercase hex digits.
func validTriggerID(id string) bool {
	if len(id) != 16 {
		return false
	}
	for _, r := range id {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return false
		}
	}
	return true
}

// triggerRunID is the run id of a triggered run: its slot, then the
// trigger id, so that it never collides with a schedule slot.
func triggerRunID(slot time.Time, id string) string { return fmtSlot(slot) + "#trigger-" + id }
