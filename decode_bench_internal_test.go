package ddblease

import (
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// BenchmarkDecodeLease decodes the lease item that a heartbeat returns
// (ReturnValues ALL_NEW): the decoding cost on the hot path, without the
// request. Compare it with BenchmarkHeartbeat.
func BenchmarkDecodeLease(b *testing.B) {
	item := map[string]types.AttributeValue{
		DefaultPartitionKey: avS("job#heartbeat"), DefaultSortKey: avS("lease"), attrOwner: avS("bench"), attrFence: avN(1), attrExpires: avN(1764470000000),
		attrVersion: avS("0123456789abcdef"), attrLeaseMs: avN(30000), attrAcquiredAt: avN(1764469970000),
		attrRenewedAt: avN(1764469990000), attrDraining: avBool(false),
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeLease(defaultLayout, item); err != nil {
			b.Fatal(err)
		}
	}
}
