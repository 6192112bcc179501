package ddblease

import (
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// validLease is a well-formed lease item without operator attributes.
func validLease() map[string]types.AttributeValue {
	return map[string]types.AttributeValue{
		DefaultPartitionKey: avS("job#job"), DefaultSortKey: avS("lease"), attrOwner: avS("a"), attrFence: avN(3), attrExpires: avN(1764470000000),
		attrVersion: avS("v"),
	}
}

func TestDecodeControl(t *testing.T) {
	t.Parallel()
	item := validLease()
	item[attrPaused], item[attrPausedBy], item[attrPausedAt] = avBool(true), avS("ops"), avN(1764470000000)
	item[attrResignFence], item[attrResignBy] = avN(3), avS("ops")
	item[attrReleasedFence] = avN(2)
	item[attrCatchUp], item[attrCatchUpWanted], item[attrCatchUpDone] = avS("t1"), avBool(true), avS("t0")
	item[attrTriggers] = &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
		triggerKeep: avN(0), "00000000000000bb": avN(1764470000002), "00000000000000aa": avN(1764470000001),
	}}
	r, err := decodeLease(defaultLayout, item)
	if err != nil {
		t.Fatal(err)
	}
	c := r.Control
	if !c.Paused || c.PausedBy != "ops" || !c.PausedAt.Equal(time.UnixMilli(1764470000000)) || c.ResignFence != 3 ||
		c.ReleasedFence != 2 || !c.CatchUpPending || c.Triggers != 2 {
		t.Fatalf("decoded %+v", c)
	}
	trs, err := pendingTriggers(item)
	if err != nil || len(trs) != 2 || trs[0].id != "00000000000000aa" {
		t.Fatalf("triggers %+v, %v: want the oldest first", trs, err)
	}
	item[attrCatchUpDone] = avS("t1")
	if r, err := decodeLease(defaultLayout, item); err != nil || r.Control.CatchUpPending {
		t.Fatalf("a handled catch-up is not pending: %+v %v", r.Control, err)
	}

	for name, bad := range map[string]func(map[string]types.AttributeValue){
		"paused not a boolean":  func(m map[string]types.AttributeValue) { m[attrPaused] = avS("yes") },
		"pausedAt not a number": func(m map[string]types.AttributeValue) { m[attrPausedAt] = avS("x") },
		"pausedBy not a string": func(m map[string]types.AttributeValue) { m[attrPausedBy] = avN(1) },
		"negative resign fence": func(m map[string]types.AttributeValue) { m[attrResignFence] = avN(-1) },
		"released fence float": func(m map[string]types.AttributeValue) {
			m[attrReleasedFence] = &types.AttributeValueMemberN{Value: "1.5"}
		},
		"catch-up wanted string": func(m map[string]types.AttributeValue) { m[attrCatchUpWanted] = avS("true") },
		"triggers not a map":     func(m map[string]types.AttributeValue) { m[attrTriggers] = avS("x") },
		"trigger id":             func(m map[string]types.AttributeValue) { m[attrTriggers] = trig("nothex", avN(1)) },
		"trigger slot string":    func(m map[string]types.AttributeValue) { m[attrTriggers] = trig("00000000000000aa", avS("1")) },
		"trigger slot year":      func(m map[string]types.AttributeValue) { m[attrTriggers] = trig("00000000000000aa", avN(-1e15)) },
	} {
		item := validLease()
		bad(item)
		if _, err := decodeLease(defaultLayout, item); !errors.Is(err, ErrMalformedItem) {
			t.Errorf("%s: got %v, want ErrMalformedItem", name, err)
		}
	}
}

func trig(id string, v types.AttributeValue) types.AttributeValue {
	return &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{id: v}}
}

// FuzzDecodeControl feeds lease items with operator attributes of arbitrary
// shape to the decoder: it must return an error or a record whose controls
// keep their invariants, never panic.
func FuzzDecodeControl(f *testing.F) {
	f.Add(byte(3), "ops", byte(2), "1764470000000", byte(2), "3", byte(1), "00000000000000aa", byte(2), "1764470000001", byte(3))
	f.Add(byte(1), "", byte(1), "x", byte(2), "-1", byte(1), "zz", byte(2), "1e300", byte(1))
	f.Add(byte(0), "", byte(0), "", byte(2), "1.5", byte(1), "-", byte(2), "0", byte(5))
	f.Fuzz(func(t *testing.T, kp byte, by string, ka byte, at string, kf byte, fence string, kid byte, id string,
		kts byte, ts string, kw byte) {
		item := validLease()
		setAttrs(item, []fuzzAttr{
			{attrPaused, kp, by}, {attrPausedBy, kp, by}, {attrPausedAt, ka, at}, {attrResignFence, kf, fence},
			{attrReleasedFence, kf, fence}, {attrResumedAt, ka, at}, {attrCatchUp, kid, id}, {attrCatchUpWanted, kw, id},
		}...)
		if kid%2 == 1 {
			m := map[string]types.AttributeValue{}
			if v, ok := attr(kts, ts); ok {
				m[id] = v
			}
			item[attrTriggers] = &types.AttributeValueMemberM{Value: m}
		} else if v, ok := attr(kid, id); ok {
			item[attrTriggers] = v
		}
		r, err := decodeLease(defaultLayout, item)
		if err != nil {
			return
		}
		c := r.Control
		if c.ResignFence < 0 || c.ReleasedFence < 0 || c.Triggers < 0 || r.Fence != 3 {
			t.Fatalf("decoded invalid controls %+v from %v", c, item)
		}
		trs, err := pendingTriggers(item)
		if err != nil || len(trs) != c.Triggers {
			t.Fatalf("triggers %v, %v disagree with the count %d", trs, err, c.Triggers)
		}
		for _, tr := range trs {
			if !validTriggerID(tr.id) || tr.slot.IsZero() {
				t.Fatalf("invalid trigger %+v", tr)
			}
		}
	})
}
