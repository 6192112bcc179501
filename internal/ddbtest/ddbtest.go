// Package ddbtest starts the DynamoDB-compatible server the tests run
// against, gives each test a fresh table, and decorates the HTTP transport
// to count requests and inject faults.
//
// The server and the fault-injecting transport are the public ones of
// package ddbleasetest: by default github.com/truora/minidyn's HTTP server,
// in process; with DDBLEASE_TEST_ENDPOINT=http://host:port the same tests
// run against any other server (dynalite, DynamoDB Local, LocalStack).
package ddbtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease/ddbleasetest"
)

// EndpointEnv names the environment variable that selects an external server.
const EndpointEnv = ddbleasetest.EndpointEnv

// Server is a DynamoDB-compatible endpoint: the public test server
// (ddbleasetest.Server) with the capability probes the library's own tests
// need.
type Server struct {
	*ddbleasetest.Server
}

// Start returns the server named by DDBLEASE_TEST_ENDPOINT, or starts an
// in-process one.
func Start() *Server { return &Server{ddbleasetest.Start()} }

// Endpoint returns a Server for an endpoint that is already running.
func Endpoint(url string) *Server { return &Server{ddbleasetest.Endpoint(url)} }

// CreateRawTable creates a table with the given partition key and waits
// until it is usable.
func CreateRawTable(ctx context.Context, db *dynamodb.Client, name, key string, typ types.ScalarAttributeType) error {
	return ddbleasetest.CreateKeyTable(ctx, db, name, key, typ)
}

// RandomID returns 8 random hex characters.
func RandomID() string { return ddbleasetest.RandomID() }

// Capabilities of the server that some tests need.
type Capabilities struct {
	Transactions bool // TransactWriteItems
	AllOld       bool // ReturnValuesOnConditionCheckFailure=ALL_OLD is honoured
}

var (
	capsOnce sync.Once
	caps     Capabilities
)

// Caps probes the server once for optional capabilities.
func (s *Server) Caps(t testing.TB) Capabilities {
	t.Helper()
	capsOnce.Do(func() {
		table := s.NewTable(t)
		db := s.Client(nil)
		ctx := context.Background()
		key := map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "probe"},
			"sk": &types.AttributeValueMemberS{Value: "probe"}}
		_, _ = db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: map[string]types.AttributeValue{
			"pk": key["pk"], "sk": key["sk"], "v": &types.AttributeValueMemberN{Value: "1"}}})
		_, err := db.PutItem(ctx, &dynamodb.PutItemInput{
			TableName: aws.String(table), Item: key,
			ConditionExpression:                 aws.String("attribute_not_exists(pk)"),
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		})
		var ccf *types.ConditionalCheckFailedException
		caps.AllOld = errors.As(err, &ccf) && len(ccf.Item) > 0
		_, err = db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{{
			Put: &types.Put{TableName: aws.String(table), Item: map[string]types.AttributeValue{
				"pk": &types.AttributeValueMemberS{Value: "probe2"}, "sk": &types.AttributeValueMemberS{Value: "probe"}}},
		}}})
		caps.Transactions = err == nil
	})
	return caps
}

// Require skips the test unless have is true, naming the capability.
func (s *Server) Require(t testing.TB, have bool, what string) {
	t.Helper()
	if !have {
		t.Skip(fmt.Sprintf("server %s lacks %s", s.Name, what))
	}
}
