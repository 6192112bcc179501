// Package ddbleasetest gives tests of code that uses ddblease a
// DynamoDB-compatible server, a client for it and fresh tables, plus an
// http.RoundTripper that injects the faults a real network and a real
// DynamoDB produce: a response lost after the server applied the request,
// a request that never returns, throttling, HTTP 500, a connection reset, a
// transaction conflict. It needs no Docker, Java or npm: the server is
// github.com/truora/minidyn's, in process.
//
// In a test:
//
//	func TestNightly(t *testing.T) {
//		srv := ddbleasetest.NewServer(t) // closed when the test ends
//		faults := ddbleasetest.NewFaults()
//		db := srv.Client(faults.Wrap)
//		table := srv.NewTable(t) // a ddblease table, deleted when the test ends
//		faults.Fail("UpdateItem", ddbleasetest.ServerError, -1) // heartbeats fail from now on
//		// ... run your job with ddblease.New(db, table, "nightly") ...
//	}
//
// With DDBLEASE_TEST_ENDPOINT=http://host:port set, the same tests run
// against that server instead (DynamoDB Local, dynalite, LocalStack).
//
// Where minidyn v0.8.2 alone would differ from DynamoDB in ways a test
// could pass on and a service fail on, the in-process server applies
// DynamoDB's rule or refuses the request: it applies the REMOVE clause of
// an update as DynamoDB does (minidyn ignores a top-level one), and the
// DELETE clause (minidyn keeps a set DELETE empties and returns it as
// another attribute's value, and stores the operand of a DELETE on a
// missing attribute); it refuses an ADD or DELETE whose operand DynamoDB
// refuses (ADD of a string, DELETE of a non-set, DELETE on a value that is
// not a set of the operand's type); and it
// answers a write that would store an empty map or list, which minidyn
// returns as a value the SDK misreads, with a ValidationException that
// says so. It keeps a table's time-to-live setting (UpdateTimeToLive,
// DescribeTimeToLive), which minidyn has no call for, but deletes no
// expired item (DynamoDB does so only eventually), and answers any other
// operation minidyn lacks with UnknownOperationException. Its other gaps
// (numbers in float64) are listed in the repository's docs/testing.md.
//
// The client this package builds has a fixed region and static dummy
// credentials, so the SDK never looks for real credentials (no instance
// metadata calls).
package ddbleasetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/truora/minidyn/server"
)

// EndpointEnv names the environment variable that selects an external
// server instead of the in-process one.
const EndpointEnv = "DDBLEASE_TEST_ENDPOINT"

// Region is the region of the clients this package builds.
const Region = "us-east-1"

// Server is a DynamoDB-compatible endpoint: an in-process minidyn server,
// or an external one.
type Server struct {
	// URL is the endpoint, for example http://127.0.0.1:41234.
	URL string
	// Name is "minidyn" for the in-process server, else the endpoint.
	Name string

	transport *http.Transport
	srv       *httptest.Server
	closeOnce sync.Once
}

// Start returns the server named by DDBLEASE_TEST_ENDPOINT if it is set,
// else starts an in-process one. Call Close when done, or use NewServer in
// a test.
func Start() *Server {
	if ep := os.Getenv(EndpointEnv); ep != "" {
		return Endpoint(ep)
	}
	s := &Server{transport: newTransport()}
	s.srv = httptest.NewServer(serialized(server.NewServer()))
	s.URL, s.Name = s.srv.URL, "minidyn"
	return s
}

// NewServer is Start for one test: the server is closed when t ends.
func NewServer(t testing.TB) *Server {
	t.Helper()
	s := Start()
	t.Cleanup(s.Close)
	return s
}

// Endpoint returns a Server for an endpoint that is already running, such
// as DynamoDB Local on http://localhost:8000.
func Endpoint(url string) *Server {
	return &Server{URL: url, Name: url, transport: newTransport()}
}

func newTransport() *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	return tr
}

// InProcess reports whether the server is the in-process one.
func (s *Server) InProcess() bool { return s.srv != nil }

// Close stops an in-process server and closes the idle connections of its
// clients. It may be called more than once: each call closes the
// connections that went idle since the last (a request that ended after
// it).
func (s *Server) Close() {
	s.transport.CloseIdleConnections()
	s.closeOnce.Do(func() {
		if s.srv != nil {
			s.srv.Close()
		}
	})
}

// serialized runs one request at a time: minidyn guards items with a lock
// but not its table map, which CreateTable writes. It applies the REMOVE
// clauses of updates itself, which minidyn ignores or mishandles, and
// refuses writes that would store empty maps and lists, which minidyn
// returns wrong (remove.go); it keeps each table's time-to-live setting
// (ttl.go), and answers an operation minidyn lacks as DynamoDB answers
// one it does not know, where minidyn answers with text the SDK cannot
// read. It also adds the X-Amz-Crc32 header that DynamoDB sends and
// minidyn does not: without it, an SDK client that logs
// (config.LoadDefaultConfig's) warns on every response that the checksum
// did not match.
func serialized(h http.Handler) http.Handler {
	var mu sync.Mutex
	ttl := ttls{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body []byte
		op := Op(r)
		switch op {
		case "UpdateItem", "TransactWriteItems", "PutItem", "BatchWriteItem", "DescribeTimeToLive", "UpdateTimeToLive":
			var err error
			if body, err = io.ReadAll(r.Body); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		mu.Lock()
		rec := &recorder{header: http.Header{}, status: http.StatusOK}
		switch {
		case body != nil && (ttl.serve(h, rec, op, body) || serveWrite(h, rec, op, body)):
		case !minidynOps[op]:
			unknownOp(rec, op)
		default:
			h.ServeHTTP(rec, r)
		}
		mu.Unlock()
		for k, v := range rec.header {
			w.Header()[k] = v
		}
		w.Header().Set("X-Amz-Crc32", strconv.FormatUint(uint64(crc32.ChecksumIEEE(rec.body.Bytes())), 10))
		w.Header().Set("Content-Length", strconv.Itoa(rec.body.Len()))
		w.WriteHeader(rec.status)
		_, _ = w.Write(rec.body.Bytes())
	})
}

// recorder is the http.ResponseWriter serialized hands to minidyn.
type recorder struct {
	header      http.Header
	status      int
	wroteHeader bool
	body        bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if !r.wroteHeader {
		r.status, r.wroteHeader = status, true
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.wroteHeader = true
	return r.body.Write(b)
}

// Client returns an SDK client for the server, with region Region and
// static dummy credentials. Each wrap, in order, decorates the HTTP
// transport (pass a Faults' Wrap to inject faults). To change other client
// options, use dynamodb.New(client.Options(), ...).
func (s *Server) Client(wrap ...func(http.RoundTripper) http.RoundTripper) *dynamodb.Client {
	var rt http.RoundTripper = s.transport
	for _, w := range wrap {
		if w != nil {
			rt = w(rt)
		}
	}
	return dynamodb.New(dynamodb.Options{
		Region:       Region,
		BaseEndpoint: aws.String(s.URL),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test", Source: "ddbleasetest"}, nil
		}),
		HTTPClient: &http.Client{Transport: rt},
	})
}

// NewTable creates a fresh ddblease table (ddblease.CreateTable, with the
// Layout optFns set) with a random name and returns the name. The table
// is deleted when t ends.
func (s *Server) NewTable(t testing.TB, optFns ...func(*ddblease.Layout)) string {
	t.Helper()
	name := "ddblease-test-" + RandomID()
	db := s.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ddblease.CreateTable(ctx, db, name, optFns...); err != nil {
		t.Fatalf("ddbleasetest: %v", err)
	}
	s.deleteOnCleanup(t, db, name)
	return name
}

// NewKeyTable creates a fresh table whose partition key is the string
// attribute key, for the items a job writes (an invoices table, a sink),
// and returns its name. The table is deleted when t ends.
func (s *Server) NewKeyTable(t testing.TB, key string) string {
	t.Helper()
	name := "ddblease-test-" + RandomID()
	db := s.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := CreateKeyTable(ctx, db, name, key, types.ScalarAttributeTypeS); err != nil {
		t.Fatalf("ddbleasetest: %v", err)
	}
	s.deleteOnCleanup(t, db, name)
	return name
}

func (s *Server) deleteOnCleanup(t testing.TB, db *dynamodb.Client, name string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = db.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(name)})
	})
}

// CreateKeyTable creates a table with the given partition key (on-demand
// billing) and waits until it is usable.
func CreateKeyTable(ctx context.Context, db *dynamodb.Client, name, key string, typ types.ScalarAttributeType) error {
	_, err := db.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(name),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String(key), AttributeType: typ}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String(key), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	if err != nil {
		return fmt.Errorf("create table %q: %w", name, err)
	}
	for {
		out, err := db.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(name)})
		if err != nil {
			return fmt.Errorf("describe table %q: %w", name, err)
		}
		if st := out.Table.TableStatus; st == types.TableStatusActive || st == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.New("table " + name + " never became active")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// RandomID returns 8 random hex characters, for unique table and job names.
func RandomID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
