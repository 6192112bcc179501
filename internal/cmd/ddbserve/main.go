// Command ddbserve serves the in-process DynamoDB-compatible test server on
// a local port, and makes the Go side of the guard's interop checks: a real
// lease that issues fences, and a Guard.Put with a given fence. The
// TypeScript and Python examples (examples/other-languages-check) use it,
// so that their tests meet the lease item and the guarded items as the
// library writes them instead of forging them.
//
//	ddbserve serve
//	    prints the server's URL on a line of its own, then serves until
//	    SIGINT or SIGTERM.
//	ddbserve acquire -endpoint URL -table T -job J [LAYOUT]
//	    creates the lease table if it is missing, takes the job's lease
//	    (a new fence), resigns it so that the next acquire takes over at
//	    once, and prints the fence. The fence stays the job's current one
//	    until the next acquire.
//	ddbserve put -endpoint URL -table T -job J -fence N -pk K [-v VALUE] [LAYOUT]
//	    writes the item {<partition key>: K, <sort key>: "item", v: VALUE}
//	    into the lease table with Guard.Put and that fence; exits 3 with
//	    the guard's error when it refuses a stale fence.
//
// LAYOUT is -partition-key NAME -sort-key NAME -prefix P (ddblease.Layout;
// the defaults are pk, sk and no prefix).
//
// Exit status: 0 done, 1 failed, 2 bad usage, 3 stale fence (put).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/ddblease/ddblease"
	"github.com/ddblease/ddblease/ddbleasetest"
)

const usage = `usage:
  ddbserve serve
  ddbserve acquire -endpoint URL -table T -job J [LAYOUT]
  ddbserve put -endpoint URL -table T -job J -fence N -pk K [-v VALUE] [LAYOUT]
LAYOUT: [-partition-key NAME] [-sort-key NAME] [-prefix P]`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	if args[0] == "serve" {
		if len(args) > 1 {
			fmt.Fprintln(stderr, "ddbserve serve: takes no arguments")
			return 2
		}
		return serve(stdout)
	}
	fs := flag.NewFlagSet("ddbserve "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	endpoint := fs.String("endpoint", "", "DynamoDB endpoint URL")
	table := fs.String("table", "", "lease table")
	job := fs.String("job", "", "job name")
	fence := fs.Int64("fence", 0, "fence to write with (put)")
	pk := fs.String("pk", "", "key of the item to write (put)")
	v := fs.String("v", "go", "value of the item's attribute v (put)")
	var y ddblease.Layout
	fs.StringVar(&y.PartitionKey, "partition-key", "", "the table's partition key (ddblease.Layout; default pk)")
	fs.StringVar(&y.SortKey, "sort-key", "", "the table's sort key (default sk)")
	fs.StringVar(&y.Prefix, "prefix", "", "the prefix of the library's keys (default none)")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	spec, err := y.TableSpec()
	if err != nil {
		fmt.Fprintf(stderr, "ddbserve %s: %v\n", args[0], err)
		return 2
	}
	layout := func(l *ddblease.Layout) { *l = y }
	if *endpoint == "" || *table == "" || *job == "" || fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ddbserve %s: -endpoint, -table and -job are required, and nothing else\n%s\n", args[0], usage)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := ddbleasetest.Endpoint(*endpoint)
	defer srv.Close()
	db := srv.Client()
	switch args[0] {
	case "acquire":
		f, err := acquire(ctx, db, *table, *job, layout)
		if err != nil {
			fmt.Fprintln(stderr, "ddbserve acquire:", err)
			return 1
		}
		fmt.Fprintln(stdout, f)
		return 0
	case "put":
		if *pk == "" || *fence < 1 {
			fmt.Fprintf(stderr, "ddbserve put: -pk and a -fence of at least 1 are required\n%s\n", usage)
			return 2
		}
		g, err := ddblease.NewGuard(db, *table, *job, func(o *ddblease.GuardOptions) { o.Layout = y })
		if err == nil {
			_, err = g.Put(ctx, *fence, &dynamodb.PutItemInput{TableName: aws.String(*table), Item: map[string]types.AttributeValue{
				spec.PartitionKey: &types.AttributeValueMemberS{Value: *pk}, spec.SortKey: &types.AttributeValueMemberS{Value: "item"},
				"v": &types.AttributeValueMemberS{Value: *v}}})
		}
		switch {
		case errors.Is(err, ddblease.ErrStaleFence):
			fmt.Fprintln(stderr, "ddbserve put:", err)
			return 3
		case err != nil:
			fmt.Fprintln(stderr, "ddbserve put:", err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(stderr, "ddbserve: unknown command %q\n%s\n", args[0], usage)
	return 2
}

// serve runs the in-process server until SIGINT or SIGTERM.
func serve(stdout io.Writer) int {
	// Start serves another endpoint when the variable names one.
	_ = os.Unsetenv(ddbleasetest.EndpointEnv)
	srv := ddbleasetest.Start()
	defer srv.Close()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	fmt.Fprintln(stdout, srv.URL)
	<-sig
	return 0
}

// acquire takes the job's lease with a new fence and resigns it at once:
// the fence stays current (a fence is current until a newer one is issued)
// and the next acquire does not wait for the lease to expire.
func acquire(ctx context.Context, db *dynamodb.Client, table, job string, layout func(*ddblease.Layout)) (int64, error) {
	if err := ddblease.CreateTable(ctx, db, table, layout); err != nil {
		return 0, err
	}
	l, err := ddblease.New(db, table, job, func(o *ddblease.Options) {
		o.Logger = slog.New(slog.DiscardHandler)
		layout(&o.Layout)
	})
	if err != nil {
		return 0, err
	}
	fence, err := l.TryAcquire(ctx)
	if err != nil {
		return 0, err
	}
	if err := l.Resign(ctx); err != nil {
		return 0, err
	}
	return fence, nil
}
