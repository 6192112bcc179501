package ddbtest

import (
	"net/http"

	"github.com/ddblease/ddblease/ddbleasetest"
)

// Action says what Faults does with one request (see ddbleasetest.Action).
type Action = ddbleasetest.Action

// The actions; each is documented in package ddbleasetest.
const (
	Pass         = ddbleasetest.Pass
	DropResponse = ddbleasetest.DropResponse
	Reset        = ddbleasetest.Reset
	ServerError  = ddbleasetest.ServerError
	Throttle     = ddbleasetest.Throttle
	Hold         = ddbleasetest.Hold
	Conflict     = ddbleasetest.Conflict
	Blackhole    = ddbleasetest.Blackhole
)

// Faults is an http.RoundTripper that counts requests by DynamoDB operation
// and applies a rule to each (see ddbleasetest.Faults).
type Faults = ddbleasetest.Faults

// NewFaults returns a Faults in front of base (nil when it will be given
// to Server.Client through Wrap).
func NewFaults(base http.RoundTripper) *Faults {
	f := ddbleasetest.NewFaults()
	f.Base = base
	return f
}

// Op returns the DynamoDB operation named in a request's X-Amz-Target.
func Op(r *http.Request) string { return ddbleasetest.Op(r) }
