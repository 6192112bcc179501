// Command ddblease shows and operates the jobs of a ddblease lease table:
// who leads each job and since when, its runs, and the operator's actions
// (resign, force-release, pause, resume, trigger).
//
// Usage:
//
//	ddblease [flags] <command> [command flags] [args]
//
// Commands:
//
//	status [JOB... | --pool P]      holder, fence, held for, expiry, draining, paused,
//	                                last run and last failure (--pool: of pool P's jobs)
//	pools                           each pool's members: renewal age, jobs led, job list hash
//	runs JOB [--since D] [--last N] [--status S]
//	                                the job's runs, and the slots missed between them
//	create-table [--print]          create the table, or print CloudFormation and Terraform
//	resign JOB                      ask the holder to hand the lease over
//	force-release JOB --yes [--dead]
//	                                take the lease from its holder, raising the fence;
//	                                a standby leads after the holder's expiry (--dead: at once)
//	pause JOB                       stop RunSchedule from firing slots
//	resume JOB [--catch-up]         fire slots again (and run the latest one skipped)
//	trigger JOB [--wait]            run the job once now, outside its schedule; --wait for
//	                                its outcome, at most --wait-timeout (5m; exit 3 then)
//	watch JOB                       follow holder and run changes until interrupted
//	exec JOB [--every D] -- COMMAND run COMMAND while leading, or once per slot
//	ui [--addr A] [--allow-actions] serve a page of the jobs, their runs and pools, and /metrics
//	local [--addr HOST:PORT]        serve the in-process test server, for development only
//	version                         the command's version and the commit it was built from
//
// Flags, accepted before or after the command: --table (or DDBLEASE_TABLE),
// --endpoint (or the SDK's AWS_ENDPOINT_URL_DYNAMODB / AWS_ENDPOINT_URL),
// --region (or AWS_REGION, AWS_DEFAULT_REGION, the profile's region),
// --json, --max-clock-skew, --timeout, --log-format. Credentials come from
// the AWS default chain: environment, shared files and profile
// (AWS_PROFILE), SSO, web identity, container and instance roles. For a
// loopback endpoint (localhost, 127.0.0.0/8, [::1]: ddblease local,
// DynamoDB Local) with no region or no credentials, us-east-1 and dummy
// credentials are used, and a line on stderr says so; never for another
// endpoint.
//
// Errors are one plain line on stderr, and the exit status is 1 (2 for bad
// usage, an invalid job name among it; 3 when trigger --wait gives up at
// its --wait-timeout; exec has its own rule, in docs/exec.md). With
// --log-format json, everything on stderr is one JSON object per line,
// errors included; exec's stderr is a log in slog's text format by
// default, and its error the one plain line after it (logs.go).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
