package ddblease

import (
	"errors"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// The records' dynamodbav tags name the attributes the expressions write
// (the attr constants): a tag that drifted from its constant would leave a
// field never decoded.
// defaultLayout is the default Layout, resolved.
var defaultLayout = func() Layout {
	y, err := Layout{}.withDefaults("Options")
	if err != nil {
		panic(err)
	}
	return y
}()

func TestRecordTags(t *testing.T) {
	for _, c := range []struct {
		record any
		want   []string
	}{
		{leaseItem{}, []string{attrListed, attrOwner, attrFence, attrExpires, attrVersion, attrLeaseMs, attrAcquiredAt, attrRenewedAt, attrDraining,
			attrPaused, attrPausedBy, attrPausedAt, attrResumedBy, attrResumedAt, attrCatchUp, attrCatchUpWanted, attrCatchUpDone,
			attrResignFence, attrResignBy, attrResignAt, attrReleasedFence, attrReleasedBy, attrReleasedAt, attrPool, attrSession, attrLastFailed}},
		{runItem{}, []string{attrJob, attrSlot, attrTrigger, attrFence, attrOwner, attrClaim, attrStatus, attrStartedAt,
			attrFinishedAt, attrError, attrClaims, attrMissed, attrAbandonedBy, RunTTLAttribute, attrUnswept, attrSkippedIn}},
	} {
		got := slices.Sorted(maps.Keys(tagNames(reflect.TypeOf(c.record)).exact))
		slices.Sort(c.want)
		if !slices.Equal(got, c.want) {
			t.Errorf("%T: tags %v, want %v", c.record, got, c.want)
		}
	}
}

// Attribute names are case-sensitive: an attribute whose name differs from
// one of the record's only in case is not decoded into it (attributevalue
// alone would).
func TestDecodeIgnoresOtherCase(t *testing.T) {
	item := map[string]types.AttributeValue{
		DefaultPartitionKey: avS("job#job"), DefaultSortKey: avS("lease"), attrOwner: avS("a"), attrFence: avN(3), attrExpires: avN(0), attrVersion: avS("v"),
		"FENCE": avN(9), "Owner": avN(1), "DRAINING": avS("x"),
	}
	for range 20 { // map order varies: every order must decode alike
		r, err := decodeLease(defaultLayout, item)
		if err != nil {
			t.Fatal(err)
		}
		if r.Fence != 3 || r.Owner != "a" || r.Draining {
			t.Fatalf("decoded %+v", r)
		}
	}
}

// A malformed item is ErrMalformedItem naming the item, the attribute and
// the problem.
func TestDecodeNamesTheProblem(t *testing.T) {
	base := func() map[string]types.AttributeValue {
		return map[string]types.AttributeValue{
			DefaultPartitionKey: avS("job#job"), DefaultSortKey: avS("lease"), attrOwner: avS("a"), attrFence: avN(3), attrExpires: avN(0), attrVersion: avS("v"),
		}
	}
	for _, c := range []struct {
		name string
		edit func(map[string]types.AttributeValue)
		want string
	}{
		{"missing", func(m map[string]types.AttributeValue) { delete(m, attrOwner) }, "attribute owner is missing"},
		{"type", func(m map[string]types.AttributeValue) { m[attrOwner] = avN(1) }, "attribute owner is not a string"},
		{"null", func(m map[string]types.AttributeValue) { m[attrFence] = &types.AttributeValueMemberNULL{Value: true} }, "attribute fence is not a number"},
		{"fence", func(m map[string]types.AttributeValue) { m[attrFence] = avN(0) }, "fence 0 is below 1"},
		{"integer", func(m map[string]types.AttributeValue) { m[attrFence] = &types.AttributeValueMemberN{Value: "1.5"} }, `attribute fence is "1.5", not an integer`},
		{"duration", func(m map[string]types.AttributeValue) { m[attrLeaseMs] = avN(-1) }, "leaseMs -1 is negative"},
		{"bool", func(m map[string]types.AttributeValue) { m[attrPaused] = avS("yes") }, "attribute paused is not a boolean"},
		{"control", func(m map[string]types.AttributeValue) { m[attrResignFence] = avN(-2) }, "resignFence -2 is negative"},
	} {
		item := base()
		c.edit(item)
		_, err := decodeLease(defaultLayout, item)
		if !errors.Is(err, ErrMalformedItem) || !strings.Contains(err.Error(), `lease item "job#job/lease"`) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want ErrMalformedItem naming the item and %q", c.name, err, c.want)
		}
	}
}
