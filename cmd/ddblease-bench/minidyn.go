package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/truora/minidyn/server"
)

// runMinidyn serves github.com/truora/minidyn's DynamoDB-compatible server
// on a free loopback port, one request at a time (as internal/ddbtest does:
// minidyn does not guard its table map), until SIGTERM. It prints
// READY <ns> url=... once it listens.
func runMinidyn() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	h := server.NewServer()
	var mu sync.Mutex
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		h.ServeHTTP(w, r)
	})}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	go func() {
		<-sig
		_ = srv.Close()
	}()
	emit("READY", time.Now(), fmt.Sprintf("url=http://%s", ln.Addr()))
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		return err
	}
	return nil
}
