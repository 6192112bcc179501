package ddbleasetest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/ddblease/ddblease/ddbleasetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The in-process server keeps a table's time-to-live setting, which
// `ddblease create-table` enables, and reports it as DynamoDB does.
func TestTimeToLiveSettingIsKept(t *testing.T) {
	srv := ddbleasetest.NewServer(t)
	if !srv.InProcess() {
		t.Skip("the in-process server's time-to-live calls; dynalite has no UpdateTimeToLive")
	}
	db := srv.Client()
	table := srv.NewTable(t)
	ctx := context.Background()
	describe := func() *types.TimeToLiveDescription {
		out, err := db.DescribeTimeToLive(ctx, &dynamodb.DescribeTimeToLiveInput{TableName: aws.String(table)})
		require.NoError(t, err)
		require.NotNil(t, out.TimeToLiveDescription)
		return out.TimeToLiveDescription
	}
	assert.Equal(t, types.TimeToLiveStatusDisabled, describe().TimeToLiveStatus, "a new table")

	_, err := db.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{TableName: aws.String(table),
		TimeToLiveSpecification: &types.TimeToLiveSpecification{AttributeName: aws.String("ttl"), Enabled: aws.Bool(true)}})
	require.NoError(t, err)
	d := describe()
	assert.Equal(t, types.TimeToLiveStatusEnabled, d.TimeToLiveStatus)
	assert.Equal(t, "ttl", aws.ToString(d.AttributeName))

	_, err = db.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{TableName: aws.String(table),
		TimeToLiveSpecification: &types.TimeToLiveSpecification{AttributeName: aws.String("ttl"), Enabled: aws.Bool(false)}})
	require.NoError(t, err)
	assert.Equal(t, types.TimeToLiveStatusDisabled, describe().TimeToLiveStatus, "disabled again")

	_, err = db.DescribeTimeToLive(ctx, &dynamodb.DescribeTimeToLiveInput{TableName: aws.String("no-such-table")})
	var notFound *types.ResourceNotFoundException
	assert.True(t, errors.As(err, &notFound), "a missing table: %v", err)
}

// An operation minidyn does not serve is answered as DynamoDB answers one
// it does not know, which the SDK reads as an error code, not as a body it
// cannot decode.
func TestUnservedOperationIsUnknown(t *testing.T) {
	srv := ddbleasetest.NewServer(t)
	if !srv.InProcess() {
		t.Skip("the in-process server's answer to an operation it lacks")
	}
	_, err := srv.Client().ListTables(context.Background(), &dynamodb.ListTablesInput{})
	var api smithy.APIError
	require.True(t, errors.As(err, &api), "an API error: %v", err)
	assert.Equal(t, "UnknownOperationException", api.ErrorCode())
	assert.Contains(t, api.ErrorMessage(), "ListTables")
}
