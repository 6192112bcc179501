// Command metrics runs a job under a ddblease lease and serves its
// OpenTelemetry metrics on /metrics, through the OpenTelemetry Prometheus
// exporter, and its liveness on /healthz (ddblease.HealthHandler). It
// needs no DynamoDB: it starts an in-process DynamoDB-compatible server
// unless -endpoint names one. Alone:
//
//	go run . -addr 127.0.0.1:8080
//	curl -s localhost:8080/metrics | grep ^ddblease
//	curl -si localhost:8080/healthz
//
// Two replicas need a server they share (dynalite, DynamoDB Local): start
// each with -endpoint and its own -addr, stop the leader with Ctrl-C, and
// watch the other take over on its /metrics.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/ddbleaseotel"
	"github.com/ddblease/ddblease/ddbleasetest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

var (
	addr     = flag.String("addr", "127.0.0.1:8080", "address to serve /metrics and /healthz on")
	endpoint = flag.String("endpoint", "", "DynamoDB endpoint URL (default: an in-process server)")
	table    = flag.String("table", "ddblease", "lease table (created if missing)")
	jobName  = flag.String("job", "report", "job name")
	lease    = flag.Duration("lease", 10*time.Second, "LeaseDuration")
)

func main() {
	flag.Parse()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "metrics:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *endpoint != "" {
		os.Setenv(ddbleasetest.EndpointEnv, *endpoint) // ddbleasetest.Start honours it
	}
	srv := ddbleasetest.Start()
	defer srv.Close()
	db := srv.Client()
	if err := ddblease.CreateTable(ctx, db, *table); err != nil {
		return err
	}
	r, err := newReplica(db, *table, *jobName, func(o *ddblease.Options) { o.LeaseDuration = *lease })
	if err != nil {
		return err
	}
	defer r.Close()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: r.Handler, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	slog.Info("serving /metrics and /healthz", "addr", ln.Addr().String(), "owner", r.Lease.Owner())

	runErr := r.Run(ctx)
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		return err
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return runErr
}

// replica is one contender for the job: its lease, the metrics of that
// lease, and the HTTP handler that serves them.
type replica struct {
	Lease   *ddblease.Lease
	Handler http.Handler // /metrics and /healthz

	provider *sdkmetric.MeterProvider
	metrics  *ddbleaseotel.Metrics
	untrack  func()
}

// newReplica wires a lease of job to an OpenTelemetry meter provider
// whose reader is a Prometheus exporter with a registry of its own.
func newReplica(db ddblease.DynamoDBAPI, table, job string, optFns ...func(*ddblease.Options)) (*replica, error) {
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, err
	}
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	m, err := ddbleaseotel.New(provider)
	if err != nil {
		return nil, err
	}
	l, err := ddblease.New(db, table, job, append(optFns, m.Instrument)...)
	if err != nil {
		_ = provider.Shutdown(context.Background())
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/healthz", ddblease.HealthHandler(0, l))
	return &replica{Lease: l, Handler: mux, provider: provider, metrics: m, untrack: m.Track(l)}, nil
}

// Run leads the job whenever this replica holds the lease, until ctx ends.
func (r *replica) Run(ctx context.Context) error {
	return r.Lease.Run(ctx, func(ctx context.Context, fence int64) error {
		slog.Info("leading", "job", r.Lease.Job(), "fence", fence)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				slog.Info("no longer leading", "job", r.Lease.Job(), "fence", fence, "cause", context.Cause(ctx))
				return nil
			case <-t.C:
				// The job's work goes here, fenced with fence.
			}
		}
	})
}

// Close stops the metrics of the replica.
func (r *replica) Close() error {
	r.untrack()
	return errors.Join(r.metrics.Close(), r.provider.Shutdown(context.Background()))
}
