package ddbleaserobfig_test

import (
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/ddbleaserobfig"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A client variable that was declared and never assigned is refused by New,
// as an untyped nil is, instead of panicking in the SDK later.
func TestNewRefusesTypedNilClient(t *testing.T) {
	var db *dynamodb.Client
	w, err := ddbleaserobfig.New(db, "leases")
	require.ErrorIs(t, err, ddblease.ErrInvalid)
	assert.ErrorContains(t, err, "nil *dynamodb.Client")
	assert.Nil(t, w)
}
