package ddblease

import (
	"maps"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// attr builds an attribute of the kind chosen by k from s.
func attr(k byte, s string) (types.AttributeValue, bool) {
	switch k % 6 {
	case 0:
		return nil, false
	case 1:
		return &types.AttributeValueMemberS{Value: s}, true
	case 2:
		return &types.AttributeValueMemberN{Value: s}, true
	case 3:
		return &types.AttributeValueMemberBOOL{Value: len(s)%2 == 0}, true
	case 4:
		return &types.AttributeValueMemberNULL{Value: true}, true
	default:
		return &types.AttributeValueMemberL{Value: []types.AttributeValue{&types.AttributeValueMemberS{Value: s}}}, true
	}
}

// fuzzAttr is one attribute of a fuzzed item: its name, the kind chosen by
// k and the text s (see attr).
type fuzzAttr struct {
	name string
	k    byte
	s    string
}

// setAttrs sets the attributes of as that attr makes in item.
func setAttrs(item map[string]types.AttributeValue, as ...fuzzAttr) {
	for _, a := range as {
		if v, ok := attr(a.k, a.s); ok {
			item[a.name] = v
		}
	}
}

// FuzzDecodeLease feeds lease items of arbitrary shape to the decoder: it
// must return an error or a record that keeps the invariants, never panic.
func FuzzDecodeLease(f *testing.F) {
	f.Add(byte(1), "a", byte(2), "1", byte(2), "1764470000000", byte(1), "v", byte(2), "30000", byte(3))
	f.Add(byte(1), "a", byte(2), "1e3", byte(2), "0", byte(1), "v", byte(0), "", byte(0))
	f.Add(byte(1), "a", byte(2), "9223372036854775808", byte(2), "-1", byte(1), "", byte(2), "-5", byte(1))
	f.Fuzz(func(t *testing.T, ko byte, owner string, kf byte, fence string, ke byte, exp string,
		kv byte, rv string, kl byte, leaseMs string, kd byte) {
		item := defaultLayout.leaseKey("job")
		setAttrs(item, []fuzzAttr{
			{attrOwner, ko, owner}, {attrFence, kf, fence}, {attrExpires, ke, exp},
			{attrVersion, kv, rv}, {attrLeaseMs, kl, leaseMs}, {attrDraining, kd, rv},
		}...)
		r, err := decodeLease(defaultLayout, item)
		if err != nil {
			return
		}
		if r.Fence < 1 || r.Duration < 0 || r.Owner != owner || r.version != rv {
			t.Fatalf("decoded an invalid record %+v from %v", r, item)
		}
	})
}

// FuzzNew feeds arbitrary names and durations to New: it must return an
// error or a handle whose options keep the documented invariants.
func FuzzNew(f *testing.F) {
	f.Add("leases", "job", "owner", int64(0), int64(0), int64(0), int64(0), int64(0), int64(0))
	f.Add("t", "", "", int64(-1), int64(5), int64(0), int64(1), int64(0), int64(0))
	f.Add("leases", "j\x00b", "o", int64(30e9), int64(15e9), int64(1e9), int64(1e9), int64(1e9), int64(9e9))
	f.Add("0", "0", "0", int64(30e9), int64(1), int64(59), int64(1e9), int64(5), int64(0)) // a 1ns heartbeat once made a 0 CallTimeout
	// Never called: a client New accepts.
	db := dynamodb.New(dynamodb.Options{})
	f.Fuzz(func(t *testing.T, table, job, owner string, lease, hb, retry, skew, drain, call int64) {
		l, err := New(db, table, job, func(o *Options) {
			o.Owner = owner
			o.LeaseDuration, o.HeartbeatInterval = time.Duration(lease), time.Duration(hb)
			o.RetryInterval, o.MaxClockSkew = time.Duration(retry), time.Duration(skew)
			o.DrainTimeout, o.CallTimeout = time.Duration(drain), time.Duration(call)
		})
		if err != nil {
			if l != nil {
				t.Fatal("handle returned with an error")
			}
			return
		}
		o := l.Options()
		if o.LeaseDuration <= 0 || o.HeartbeatInterval <= 0 || 2*o.HeartbeatInterval >= o.LeaseDuration ||
			o.RetryInterval < time.Millisecond || o.MaxClockSkew <= 0 || o.MaxClockSkew >= o.LeaseDuration ||
			o.DrainTimeout <= 0 || o.CallTimeout <= 0 || o.CallTimeout >= o.HeartbeatInterval ||
			o.Owner == "" || job == "" || len(job) > MaxJobLength {
			t.Fatalf("accepted invalid options %+v for job %q", o, job)
		}
	})
}

// FuzzDecodeRun feeds job-run items of arbitrary shape to the decoder: it
// must return an error or a record that keeps the invariants, never panic.
func FuzzDecodeRun(f *testing.F) {
	f.Add("job", byte(1), "2026-11-30T02:00:00Z", byte(2), "3", byte(1), "succeeded", byte(2), "1764470000000", byte(2), "2", byte(1), "boom")
	f.Add("a#b", byte(1), "2026-11-30T02:00:00.5Z", byte(2), "1e2", byte(1), "running", byte(1), "x", byte(0), "", byte(3), "")
	f.Add("", byte(1), "not a time", byte(2), "-1", byte(1), "weird", byte(2), "NaN", byte(2), "-7", byte(2), "1")
	f.Add("job", byte(1), "2026-11-30T02:00:00Z", byte(2), "3", byte(1), "skipped-by-pause", byte(2), "1764470000000", byte(2), "1", byte(0), "")
	f.Fuzz(func(t *testing.T, job string, ks byte, slot string, kf byte, fence string, kst byte, status string,
		kt byte, started string, kc byte, claims string, ke byte, errText string) {
		sk, err := runSKOf(slot)
		if err != nil {
			sk = skRunPrefix + slot
		}
		item := defaultLayout.runKey(job, sk)
		maps.Copy(item, map[string]types.AttributeValue{
			attrJob:   &types.AttributeValueMemberS{Value: job},
			attrOwner: &types.AttributeValueMemberS{Value: "o"},
			attrClaim: &types.AttributeValueMemberS{Value: "c"},
		})
		setAttrs(item, []fuzzAttr{
			{attrSlot, ks, slot}, {attrFence, kf, fence}, {attrStatus, kst, status}, {attrStartedAt, kt, started},
			{attrClaims, kc, claims}, {attrError, ke, errText}, {attrMissed, kc, claims}, {RunTTLAttribute, kt, started},
		}...)
		r, err := decodeRun(defaultLayout, item)
		if err != nil {
			return
		}
		switch {
		case r.Fence < 1, r.Claims < 1, r.Missed < 0, r.Job != job, r.Slot.IsZero():
			t.Fatalf("decoded an invalid run %+v from %v", r, item)
		case r.Status != RunRunning && r.Status != RunSucceeded && r.Status != RunFailed && r.Status != RunAbandoned &&
			r.Status != RunSkippedByPause:
			t.Fatalf("decoded an unknown status %q", r.Status)
		}
	})
}
