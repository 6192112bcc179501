package ddblease

import (
	"fmt"
	"math"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Attribute names of the lease item. Several are DynamoDB reserved words, so
// expressions always refer to them through expression attribute names.
const (
	attrPK         = "pk"
	attrOwner      = "owner"
	attrFence      = "fence"
	attrExpires    = "expiresAt"  // N: writer's wall clock, Unix ms
	attrVersion    = "rv"         // S: renewal version, new on every write
	attrLeaseMs    = "leaseMs"    // N: lease duration written, ms
	attrAcquiredAt = "acquiredAt" // N: Unix ms
	attrRenewedAt  = "renewedAt"  // N: Unix ms
	attrDraining   = "draining"   // BOOL: the holder is about to resign
)

func leaseKey(job string) string { return "lease#" + job }

// Record is a lease item as stored in the table.
type Record struct {
	Owner      string
	Fence      int64
	ExpiresAt  time.Time     // recorded expiry, by the writer's clock; zero once resigned
	Duration   time.Duration // lease duration the writer used
	AcquiredAt time.Time
	RenewedAt  time.Time
	Draining   bool // the holder announced it is about to resign
	// Control is the operator state kept in the item (see Admin).
	Control Control

	version string
}

// leaseItem is the lease item as stored: the record that decodeLease
// decodes with attributevalue and then validates.
type leaseItem struct {
	PK         sAttr    `dynamodbav:"pk"`
	Owner      sAttr    `dynamodbav:"owner"`
	Fence      nAttr    `dynamodbav:"fence"`
	ExpiresAt  nAttr    `dynamodbav:"expiresAt"`
	Version    sAttr    `dynamodbav:"rv"`
	LeaseMs    nAttr    `dynamodbav:"leaseMs"`
	AcquiredAt nAttr    `dynamodbav:"acquiredAt"`
	RenewedAt  nAttr    `dynamodbav:"renewedAt"`
	Draining   boolAttr `dynamodbav:"draining"`
	controlItem
}

// decodeLease reads a lease item. Every attribute the protocol relies on must
// be present with the right type; anything else is ErrMalformedItem.
func decodeLease(item map[string]types.AttributeValue) (Record, error) {
	var it leaseItem
	key, _ := str(item, attrPK)
	fail := func(e error) (Record, error) {
		return Record{}, fmt.Errorf("%w: lease item %q: %v", ErrMalformedItem, key, e)
	}
	if err := unmarshalItem(item, &it); err != nil {
		return fail(err)
	}
	var r Record
	var err error
	if r.Owner, err = it.Owner.get(attrOwner); err != nil {
		return fail(err)
	}
	if r.Fence, err = it.Fence.get(attrFence); err != nil {
		return fail(err)
	}
	if r.Fence < 1 {
		return fail(fmt.Errorf("fence %d is below 1", r.Fence))
	}
	exp, err := it.ExpiresAt.get(attrExpires)
	if err != nil {
		return fail(err)
	}
	if exp != 0 {
		r.ExpiresAt = time.UnixMilli(exp)
	}
	if r.version, err = it.Version.get(attrVersion); err != nil {
		return fail(err)
	}
	if ms, err := it.LeaseMs.opt(attrLeaseMs); err != nil {
		return fail(err)
	} else if ms < 0 {
		return fail(fmt.Errorf("%s %d is negative", attrLeaseMs, ms))
	} else if ms > int64(math.MaxInt64/time.Millisecond) {
		return fail(fmt.Errorf("%s %d is out of range (at most %d ms)", attrLeaseMs, ms, int64(math.MaxInt64/time.Millisecond)))
	} else {
		r.Duration = time.Duration(ms) * time.Millisecond
	}
	if ms, err := it.AcquiredAt.opt(attrAcquiredAt); err != nil {
		return fail(err)
	} else if ms != 0 {
		r.AcquiredAt = time.UnixMilli(ms)
	}
	if ms, err := it.RenewedAt.opt(attrRenewedAt); err != nil {
		return fail(err)
	} else if ms != 0 {
		r.RenewedAt = time.UnixMilli(ms)
	}
	if r.Draining, err = it.Draining.opt(attrDraining); err != nil {
		return fail(err)
	}
	if r.Control, err = it.controlItem.decode(item); err != nil {
		return fail(err)
	}
	return r, nil
}
