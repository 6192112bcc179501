// Package ddbtest starts the DynamoDB-compatible server the tests run
// against, gives each test a fresh table, and decorates the HTTP transport
// to count requests and inject faults.
//
// By default the server is github.com/truora/minidyn's HTTP server, in
// process. With DDBLEASE_TEST_ENDPOINT=http://host:port the same tests run
// against any other server (dynalite, DynamoDB Local, LocalStack).
package ddbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/truora/minidyn/server"
)

// EndpointEnv names the environment variable that selects an external server.
const EndpointEnv = "DDBLEASE_TEST_ENDPOINT"

// Server is a DynamoDB-compatible endpoint.
type Server struct {
	URL       string
	Name      string // "minidyn" or the external endpoint
	transport *http.Transport
	srv       *httptest.Server
}

// Start returns the server named by DDBLEASE_TEST_ENDPOINT, or starts an
// in-process one.
func Start() *Server {
	s := &Server{transport: http.DefaultTransport.(*http.Transport).Clone()}
	s.transport.MaxIdleConnsPerHost = 64
	if ep := os.Getenv(EndpointEnv); ep != "" {
		s.URL, s.Name = ep, ep
		return s
	}
	s.srv = httptest.NewServer(serialized(server.NewServer()))
	s.URL, s.Name = s.srv.URL, "minidyn"
	return s
}

// InProcess reports whether the server is the in-process one.
func (s *Server) InProcess() bool { return s.srv != nil }

// Close stops an in-process server and closes idle connections.
func (s *Server) Close() {
	s.transport.CloseIdleConnections()
	if s.srv != nil {
		s.srv.Close()
	}
}

// serialized runs one request at a time: minidyn guards items with a lock
// but not its table map, which CreateTable writes.
func serialized(h http.Handler) http.Handler {
	var mu sync.Mutex
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		h.ServeHTTP(w, r)
	})
}

// Client returns an SDK client for the server. wrap, if not nil, decorates
// the HTTP transport (see Faults).
func (s *Server) Client(wrap func(http.RoundTripper) http.RoundTripper) *dynamodb.Client {
	var rt http.RoundTripper = s.transport
	if wrap != nil {
		rt = wrap(rt)
	}
	return dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(s.URL),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test", Source: "ddbtest"}, nil
		}),
		HTTPClient: &http.Client{Transport: rt},
	})
}

// NewTable creates a fresh table with a string partition key pk and returns
// its name. The table is deleted when the test ends.
func (s *Server) NewTable(t testing.TB) string {
	t.Helper()
	name := "ddblease-test-" + RandomID()
	db := s.Client(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := CreateRawTable(ctx, db, name, "pk", types.ScalarAttributeTypeS); err != nil {
		t.Fatalf("create table: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = db.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(name)})
	})
	return name
}

// CreateRawTable creates a table with the given partition key and waits
// until it is usable.
func CreateRawTable(ctx context.Context, db *dynamodb.Client, name, key string, typ types.ScalarAttributeType) error {
	_, err := db.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(name),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String(key), AttributeType: typ}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String(key), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	if err != nil {
		return err
	}
	for {
		out, err := db.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(name)})
		if err != nil {
			return err
		}
		if st := out.Table.TableStatus; st == types.TableStatusActive || st == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.New("table never became active")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// RandomID returns 8 random hex characters.
func RandomID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

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
		key := map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "probe"}}
		_, _ = db.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(table), Item: map[string]types.AttributeValue{
			"pk": key["pk"], "v": &types.AttributeValueMemberN{Value: "1"}}})
		_, err := db.PutItem(ctx, &dynamodb.PutItemInput{
			TableName: aws.String(table), Item: key,
			ConditionExpression:                 aws.String("attribute_not_exists(pk)"),
			ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
		})
		var ccf *types.ConditionalCheckFailedException
		caps.AllOld = errors.As(err, &ccf) && len(ccf.Item) > 0
		_, err = db.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{{
			Put: &types.Put{TableName: aws.String(table), Item: map[string]types.AttributeValue{
				"pk": &types.AttributeValueMemberS{Value: "probe2"}}},
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

// Endpoint returns a Server for an endpoint that is already running.
func Endpoint(url string) *Server {
	return &Server{URL: url, Name: url, transport: http.DefaultTransport.(*http.Transport).Clone()}
}
