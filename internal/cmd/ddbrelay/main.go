// Command ddbrelay forwards HTTP requests to a DynamoDB-compatible server
// and lets every forwarded request finish, even when its client hangs up.
//
// dynalite 4.0.0 throws, and exits, when a client aborts a request while the
// server is still reading or answering it ("Error: aborted" from the
// request's error handler). Clients abort requests as a matter of course: a
// per-call timeout fires, a context is cancelled, a process is killed. CI
// puts this relay in front of dynalite so that the test servers survive
// what the tests do to them. A request that reached the relay is applied by
// the server, as a request that reached DynamoDB would be.
//
//	go run ./internal/cmd/ddbrelay -listen 127.0.0.1:8123 -upstream http://127.0.0.1:9123
package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"log"
	"net/http"
	"strings"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8123", "address to listen on")
	upstream := flag.String("upstream", "http://127.0.0.1:9123", "server to forward to")
	flag.Parse()
	base := strings.TrimRight(*upstream, "/")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return // the client hung up before its request was complete
		}
		// Not r.Context(): the forwarded request must not be aborted when
		// the client goes away.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, r.Method, base+r.URL.RequestURI(), bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		req.Header = r.Header.Clone()
		req.Host = r.Host
		resp, err := client.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		out, err := io.ReadAll(resp.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(out)
	})
	srv := &http.Server{Addr: *listen, Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	log.Printf("ddbrelay: %s -> %s", *listen, base)
	log.Fatal(srv.ListenAndServe())
}
