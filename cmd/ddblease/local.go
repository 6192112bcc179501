package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/ddblease/ddblease/ddbleasetest"
)

const localAbout = `Serves the in-process DynamoDB-compatible server of the package
ddbleasetest (github.com/truora/minidyn's, the one the tests use) over HTTP
on --addr until interrupted, for development only: two replicas of an
example in two terminals, a try of the commands. It keeps everything in
memory and loses it when it stops, checks no credentials (any will do), and
is not DynamoDB: docs/testing.md lists where it differs.

It prints the export lines that point a second terminal at it (the
endpoint, a region, credentials that it does not check). It answers only
to requests whose Host is a loopback name (localhost, 127.0.0.1, [::1]) or
one given with --allowed-host, whatever --addr listens on: a site whose
name is pointed at this address cannot read or write it from a browser.`

func localCommand() *command {
	var addr string
	var hosts hostList
	return &command{
		name: "local", args: "[--addr HOST:PORT] [--allowed-host NAME]", about: localAbout,
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&addr, "addr", "127.0.0.1:8000", "serve on this `address` (host:port)")
			fs.Var(&hosts, "allowed-host", allowedHostUsage)
		},
		needsAPI: func() bool { return false },
		long:     true,
		run:      func(e *env, ctx context.Context, args []string) error { return e.local(ctx, args, addr, hosts) },
	}
}

// localRegion and localKey are what the printed export lines give: the
// server checks neither, but the SDK needs both.
const (
	localRegion = "us-east-1"
	localKey    = "local"
)

// local serves ddbleasetest's in-process server on addr until ctx ends.
// That server listens on a port of its own choosing: local relays to it
// from addr, to the requests whose Host the policy admits.
func (e *env) local(ctx context.Context, args []string, addr string, hosts hostList) error {
	if len(args) != 0 {
		return usagef("local: takes no arguments (the address is --addr)")
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return usagef("local: --addr %q: %v", addr, err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("local: %w", err)
	}
	// Start serves another endpoint instead when the variable names one.
	_ = os.Unsetenv(ddbleasetest.EndpointEnv)
	srv := ddbleasetest.Start()
	defer srv.Close()
	target, err := url.Parse(srv.URL)
	if err != nil {
		_ = ln.Close()
		return err
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	errLog := slog.NewLogLogger(e.log.Handler(), slog.LevelWarn)
	proxy.ErrorLog = errLog
	policy := newHostPolicy(hosts)
	hs := &http.Server{Handler: policy.handler("local", e.log, refuseDynamoDB, proxy), ReadHeaderTimeout: 10 * time.Second, ErrorLog: errLog}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	endpoint := "http://" + dialHost(ln.Addr())
	fmt.Fprintf(e.out, "serving the in-process test server at %s, for development only (in memory; stop with Ctrl-C)\n", endpoint)
	fmt.Fprintf(e.out, "\nIn another terminal, for the ddblease command, the AWS SDK and ddbleasetest.Start (the examples):\n\n")
	for _, kv := range [][2]string{{"AWS_ENDPOINT_URL_DYNAMODB", endpoint}, {"AWS_REGION", localRegion},
		{"AWS_ACCESS_KEY_ID", localKey}, {"AWS_SECRET_ACCESS_KEY", localKey}, {ddbleasetest.EndpointEnv, endpoint}} {
		fmt.Fprintf(e.out, "export %s=%s\n", kv[0], shellQuote(kv[1]))
	}
	fmt.Fprintf(e.out, "\nthen, for instance: ddblease --table leases create-table\n")
	if w := policy.listenWarning("local", ln.Addr(), "read and write it"); w != "" {
		e.log.Warn(w)
	}
	select {
	case <-ctx.Done():
	case err := <-served:
		return fmt.Errorf("local: %w", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	<-served
	return nil
}

// refuseDynamoDB answers as DynamoDB answers an error, so that the SDK
// shows the message.
func refuseDynamoDB(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	w.Header().Set("X-Amzn-ErrorType", "MisdirectedRequest")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"__type": "MisdirectedRequest", "message": msg})
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./:@%+=-") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
