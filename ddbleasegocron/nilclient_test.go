package ddbleasegocron_test

import (
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/ddbleasegocron"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A client variable that was declared and never assigned is refused by the
// constructors, as an untyped nil is, instead of panicking in the SDK later.
func TestConstructorsRefuseTypedNilClient(t *testing.T) {
	var db *dynamodb.Client
	lk, err := ddbleasegocron.NewLocker(db, "leases")
	require.ErrorIs(t, err, ddblease.ErrInvalid)
	assert.ErrorContains(t, err, "nil *dynamodb.Client")
	assert.Nil(t, lk)
	el, err := ddbleasegocron.NewElector(db, "leases", "job")
	require.ErrorIs(t, err, ddblease.ErrInvalid)
	assert.ErrorContains(t, err, "nil *dynamodb.Client")
	assert.Nil(t, el)
}
