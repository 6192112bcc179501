package ddblease

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A job the pool starts just as it stops (or hands the job over) finds its
// context ended when its Run begins: that attempts nothing, and is not an
// error of the pool, whereas Run called so returns one.
func TestPoolJobStartedAsThePoolStopsIsNoError(t *testing.T) {
	db := dynamodb.New(dynamodb.Options{Region: "us-east-1"})
	l, err := New(db, "table", "job", func(o *Options) { o.Owner = "a" })
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	called := false
	fn := func(context.Context, string, int64) error { called = true; return nil }
	assert.NoError(t, runJob(ctx, l, "job", fn))
	assert.False(t, called, "fn ran")
	err = l.Run(ctx, func(context.Context, int64) error { return nil })
	assert.ErrorIs(t, err, context.Canceled, "Run called with an ended context")
	assert.EqualError(t, err, `ddblease: run "job": context canceled`)
}
