package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/internal/reqcount"
)

// Child processes print one event a line on stdout:
//
//	KIND <unix-nanoseconds> [key=value ...]
//
// with the wall-clock time of the event in the child. The parent parses them.

var emitMu sync.Mutex

func emit(kind string, at time.Time, kv ...string) {
	line := fmt.Sprintf("%s %d", kind, at.UnixNano())
	if len(kv) > 0 {
		line += " " + strings.Join(kv, " ")
	}
	emitMu.Lock()
	defer emitMu.Unlock()
	_, _ = os.Stdout.WriteString(line + "\n")
}

// newClient builds an SDK client as internal/ddbtest does: static test
// credentials, a fixed region, the endpoint as base URL, and the given
// transport.
func newClient(endpoint string, rt http.RoundTripper) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(endpoint),
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "test", SecretAccessKey: "test", Source: "ddblease-bench"}, nil
		}),
		HTTPClient: &http.Client{Transport: rt},
	})
}

func newTransport(maxConns int) *http.Transport {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = max(maxConns, 2)
	tr.MaxConnsPerHost = maxConns
	return tr
}

// leaseOptions sets a child's lease options from its flags.
func (cfg config) leaseOptions(o *ddblease.Options) {
	o.LeaseDuration = cfg.set.lease
	o.HeartbeatInterval = cfg.set.hb
	o.RetryInterval = cfg.set.retry
	if cfg.owner != "" {
		o.Owner = cfg.owner
	}
	o.Logger = childLogger()
}

func childLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// runContender is one replica: a Lease on cfg.job driven by Run, with
// SIGTERM cancelling Run's context. Its leader function waits for the
// leader context to end, then keeps running for cfg.drain (a leader that
// drains its work), then returns.
func runContender(cfg config, start time.Time) error {
	emit("START", start, fmt.Sprintf("pid=%d", os.Getpid()))
	wire := &detached{base: newTransport(8)}
	defer wire.wait(10 * time.Second)
	counter := reqcount.New(wire)
	db := newClient(cfg.endpoint, counter)
	l, err := ddblease.New(db, cfg.table, cfg.job, cfg.leaseOptions)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()

	quit := make(chan struct{})
	var wg sync.WaitGroup
	if cfg.report > 0 {
		wg.Go(func() {
			t := time.NewTicker(cfg.report)
			defer t.Stop()
			for {
				select {
				case <-quit:
					return
				case now := <-t.C:
					emit("COUNTS", now, counter.Snapshot().String())
				}
			}
		})
	}
	if cfg.renewals {
		wg.Go(func() {
			var last time.Time
			t := time.NewTicker(20 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-quit:
					return
				case <-t.C:
					if s := l.State(); s.Leader && !s.RenewedAt.Equal(last) {
						last = s.RenewedAt
						emit("RENEWED", last, fmt.Sprintf("fence=%d", s.Fence))
					}
				}
			}
		})
	}

	emit("CALL", time.Now())
	err = l.Run(ctx, func(lctx context.Context, fence int64) error {
		emit("LEADS", time.Now(), fmt.Sprintf("fence=%d", fence), fmt.Sprintf("requests=%d", counter.Snapshot().Total()))
		<-lctx.Done()
		emit("CANCELLED", time.Now(), fmt.Sprintf("lost=%t", errors.Is(context.Cause(lctx), ddblease.ErrLost)))
		if cfg.drain > 0 {
			time.Sleep(cfg.drain) // a leader finishing its work, deaf to ctx
		}
		emit("RETURNED", time.Now())
		return nil
	})
	close(quit)
	wg.Wait()
	emit("COUNTS", time.Now(), counter.Snapshot().String())
	status := "ok"
	if err != nil {
		status = strings.ReplaceAll(err.Error(), " ", "_")
	}
	emit("EXIT", time.Now(), "err="+status)
	return err
}
