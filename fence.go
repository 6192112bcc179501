package ddblease

import (
	"fmt"
	"math"
	"strconv"
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

// decodeLease reads a lease item. Every attribute the protocol relies on must
// be present with the right type; anything else is ErrMalformedItem.
func decodeLease(item map[string]types.AttributeValue) (Record, error) {
	var r Record
	var err error
	key, _ := str(item, attrPK)
	fail := func(e error) (Record, error) {
		return Record{}, fmt.Errorf("%w: lease item %q: %v", ErrMalformedItem, key, e)
	}
	if r.Owner, err = str(item, attrOwner); err != nil {
		return fail(err)
	}
	if r.Fence, err = num(item, attrFence); err != nil {
		return fail(err)
	}
	if r.Fence < 1 {
		return fail(fmt.Errorf("fence %d is below 1", r.Fence))
	}
	exp, err := num(item, attrExpires)
	if err != nil {
		return fail(err)
	}
	if exp != 0 {
		r.ExpiresAt = time.UnixMilli(exp)
	}
	if r.version, err = str(item, attrVersion); err != nil {
		return fail(err)
	}
	if ms, err := optNum(item, attrLeaseMs); err != nil {
		return fail(err)
	} else if ms < 0 {
		return fail(fmt.Errorf("%s %d is negative", attrLeaseMs, ms))
	} else {
		r.Duration = time.Duration(ms) * time.Millisecond
	}
	if ms, err := optNum(item, attrAcquiredAt); err != nil {
		return fail(err)
	} else if ms != 0 {
		r.AcquiredAt = time.UnixMilli(ms)
	}
	if ms, err := optNum(item, attrRenewedAt); err != nil {
		return fail(err)
	} else if ms != 0 {
		r.RenewedAt = time.UnixMilli(ms)
	}
	if v, ok := item[attrDraining]; ok {
		b, ok := v.(*types.AttributeValueMemberBOOL)
		if !ok {
			return fail(fmt.Errorf("%s is not a boolean", attrDraining))
		}
		r.Draining = b.Value
	}
	if r.Control, err = decodeControl(item); err != nil {
		return fail(err)
	}
	return r, nil
}

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

// num reads an integer number attribute. Servers that compute in float64 may
// return integers in exponent form, so integral floats up to 2^53 are
// accepted too.
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

func optNum(item map[string]types.AttributeValue, name string) (int64, error) {
	if _, ok := item[name]; !ok {
		return 0, nil
	}
	return num(item, name)
}

func avS(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }

func avN(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}

func avBool(b bool) types.AttributeValue { return &types.AttributeValueMemberBOOL{Value: b} }
