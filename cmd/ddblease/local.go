package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"time"

	"github.com/ddblease/ddblease/ddbleasetest"
)

const localAbout = `Serves the in-process DynamoDB-compatible server of the package
ddbleasetest (github.com/truora/minidyn's, the one the tests use) over HTTP
on --addr until interrupted, for development only: two replicas of an
example in two terminals, a try of the commands. It keeps everything in
memory and loses it when it stops, checks no credentials (any will do), and
is not DynamoDB: docs/testing.md lists where it differs.`

func localCommand() *command {
	var addr string
	return &command{
		name: "local", args: "[--addr HOST:PORT]", about: localAbout,
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&addr, "addr", "127.0.0.1:8000", "serve on this `address` (host:port)")
		},
		needsAPI: func() bool { return false },
		long:     true,
		run:      func(e *env, ctx context.Context, args []string) error { return e.local(ctx, args, addr) },
	}
}

// local serves ddbleasetest's in-process server on addr until ctx ends.
// That server listens on a port of its own choosing: local relays to it
// from addr.
func (e *env) local(ctx context.Context, args []string, addr string) error {
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
	hs := &http.Server{Handler: proxy, ReadHeaderTimeout: 10 * time.Second, ErrorLog: errLog}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	fmt.Fprintf(e.out, "serving the in-process test server at http://%s, for development only (in memory; stop with Ctrl-C)\n", ln.Addr())
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
