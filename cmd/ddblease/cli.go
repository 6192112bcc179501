package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/logging"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/ddblease/ddblease"
)

// usageError is bad input on the command line: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

const usage = `usage: ddblease [flags] <command> [command flags] [args]

commands:
  status [JOB... | --pool P]         holder, fence, held for, expiry, draining, paused, last run
                                     and last failure (--pool: of the jobs of pool P)
  pools                              each pool's members: renewal age, jobs led, job list hash
  runs JOB [--since D] [--last N] [--status S]
                                     the job's runs, newest last, and the slots missed between them
  create-table [--print]             create the lease table, or print its CloudFormation and Terraform
  resign JOB                         ask the holder to hand the lease over at its next heartbeat
  force-release JOB --yes [--dead]   take the lease from its holder: the fence goes up, a standby
                                     leads after the holder's expiry (--dead: at once)
  pause JOB                          stop RunSchedule on every replica from firing slots
  resume JOB [--catch-up]            fire slots again; --catch-up runs the latest one skipped
  trigger JOB [--wait]               run the job once now, as an extra run; --wait for its outcome,
                                     at most --wait-timeout (5m; exit 3 then)
  watch JOB                          follow holder and run changes until interrupted
  exec JOB [--every D] -- COMMAND    run COMMAND while leading, or once per slot (see docs/exec.md)
  ui [--addr A] [--allow-actions]    serve a page of the jobs, their runs and pools, and /metrics
  local [--addr HOST:PORT]           serve the in-process test server on 127.0.0.1:8000, for
                                     development only
  version                            the command's version and the commit it was built from

flags (before or after the command):
`

// globals are the flags every command takes.
type globals struct {
	table    string
	endpoint string
	region   string
	json     bool
	skew     time.Duration
	timeout  time.Duration
	debug    bool
	layout   ddblease.Layout
	logs     string // --log-format: text or json
}

func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.table, "table", os.Getenv("DDBLEASE_TABLE"), "lease table `name` (default $DDBLEASE_TABLE)")
	fs.StringVar(&g.endpoint, "endpoint", "", "DynamoDB endpoint `URL` (default: the SDK's, or $AWS_ENDPOINT_URL_DYNAMODB); "+
		"for a loopback one (localhost, 127.0.0.0/8, [::1]) without a region or credentials, "+localRegion+" and dummy credentials")
	fs.StringVar(&g.region, "region", "", "AWS `region` (default: the SDK's, from $AWS_REGION or the profile)")
	fs.BoolVar(&g.json, "json", false, "print JSON instead of a table")
	fs.DurationVar(&g.skew, "max-clock-skew", ddblease.DefaultMaxClockSkew, "the replicas' MaxClockSkew, shown with expiry times")
	fs.BoolVar(&g.debug, "debug", false, "log the SDK's requests, responses and retries on stderr")
	fs.DurationVar(&g.timeout, "timeout", 30*time.Second, "bound on each command but watch and trigger --wait (0: none)")
	fs.StringVar(&g.layout.PartitionKey, "partition-key", os.Getenv("DDBLEASE_PARTITION_KEY"),
		"the table's partition key `attribute` (default pk, or $DDBLEASE_PARTITION_KEY)")
	fs.StringVar(&g.layout.SortKey, "sort-key", os.Getenv("DDBLEASE_SORT_KEY"),
		"the table's sort key `attribute` (default sk, or $DDBLEASE_SORT_KEY)")
	fs.StringVar(&g.layout.Prefix, "key-prefix", os.Getenv("DDBLEASE_KEY_PREFIX"),
		"`prefix` of the library's partition keys, as the replicas' Layout.Prefix (default none, or $DDBLEASE_KEY_PREFIX)")
	fs.StringVar(&g.logs, "log-format", "text", "the `format` of stderr: text, or json (one object per line); in text, an error is one plain line and exec's log is slog's key=value lines")
}

// command is one subcommand: its flags and its action.
type command struct {
	name  string
	args  string // synopsis of the positional arguments
	about string // what the command does, for its -h (optional)
	flags func(fs *flag.FlagSet)
	run   func(e *env, ctx context.Context, args []string) error
	// needsAPI reports whether the command needs the table's client (nil:
	// it does; create-table --print, local and version do not).
	needsAPI func() bool
	long     bool // not bounded by --timeout
	// dashDash keeps "--" among the positional arguments, where it ends
	// the flags (exec: what follows is a command line).
	dashDash bool
	// stream marks a command whose stderr is a log (exec): in the text
	// format, slog's key=value lines rather than plain ones.
	stream bool
}

// env is what a command runs with.
type env struct {
	g     globals
	out   io.Writer
	errw  io.Writer
	db    *dynamodb.Client
	admin *ddblease.Admin
	now   func() time.Time
	// log is where messages to the user go (stderr), in the --log-format.
	log *slog.Logger
	// region is the AWS region the client uses.
	region string
	// endpoint is the DynamoDB endpoint the client uses: --endpoint, or
	// the SDK's from the environment or the profile ("": AWS's).
	endpoint string
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	log, err := dispatch(ctx, args, stdout, stderr)
	if err == nil {
		return 0
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	err = explain(err)
	msg := oneLine(err.Error())
	if !strings.HasPrefix(msg, "ddblease: ") {
		msg = "ddblease: " + msg
	}
	log.Error(msg)
	var u *usageError
	if errors.As(err, &u) {
		return 2
	}
	var x interface{ ExitCode() int } // exec: COMMAND's status
	if errors.As(err, &x) {
		return x.ExitCode()
	}
	return 1
}

// dispatch parses the command line and runs the command. It returns the
// logger to report its error with: one plain line, or with --log-format
// json one JSON object, whatever the command's log is (exec's slog lines).
func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) (*slog.Logger, error) {
	cmd, e, pos, err := parse(args, stdout, stderr)
	switch {
	case e == nil:
		return plainLogger(stderr), err
	case err != nil:
		return e.errLog(), err
	}
	if cmd.needsAPI == nil || cmd.needsAPI() {
		if e.g.table == "" {
			return e.errLog(), usagef("%s: no table given: use --table or DDBLEASE_TABLE", cmd.name)
		}
		if err := e.connect(ctx); err != nil {
			return e.errLog(), err
		}
	}
	if e.g.timeout > 0 && !cmd.long {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, e.g.timeout)
		defer cancel()
	}
	return e.errLog(), e.tableMissing(cmd.run(e, ctx, pos))
}

// errLog is the logger a command's error goes to: in the text format a
// plain line, even after a log of slog's key=value lines (exec); in the
// json format one object, as the rest of stderr.
func (e *env) errLog() *slog.Logger {
	if e.g.logs == "json" {
		return e.log
	}
	return plainLogger(e.errw)
}

// parse reads the command line: the command, its env (without a client)
// and its positional arguments. The env is nil when the command line could
// not be read as far as the log format; a -h prints the help and returns
// flag.ErrHelp.
func parse(args []string, stdout, stderr io.Writer) (*command, *env, []string, error) {
	var g globals
	top := flag.NewFlagSet("ddblease", flag.ContinueOnError)
	top.SetOutput(io.Discard)
	g.register(top)
	if err := top.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printUsage(stdout, top)
			return nil, nil, nil, err
		}
		return nil, nil, nil, usagef("%v", err)
	}
	rest := top.Args()
	if len(rest) == 0 {
		return nil, nil, nil, usagef("no command given (try ddblease -h)")
	}
	name := rest[0]
	if name == "help" {
		printUsage(stdout, top)
		return nil, nil, nil, flag.ErrHelp
	}
	cmd, ok := commands()[name]
	if !ok {
		return nil, nil, nil, usagef("unknown command %q (try ddblease -h)", name)
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	// The command's flags start from the values given before the command
	// (registering them resets g to the defaults).
	given := globalArgs(top)
	g.register(fs)
	if err := fs.Parse(given); err != nil {
		return nil, nil, nil, usagef("%v", err)
	}
	if cmd.flags != nil {
		cmd.flags(fs)
	}
	pos, perr := parseInterspersed(fs, rest[1:], cmd.dashDash)
	if cmd.stream {
		stderr = &lockedWriter{w: stderr}
	}
	log, err := newLogger(stderr, g.logs, cmd.stream, slog.LevelInfo)
	if err != nil {
		return nil, nil, nil, err
	}
	e := &env{g: g, out: stdout, errw: stderr, now: time.Now, log: log}
	switch {
	case errors.Is(perr, flag.ErrHelp):
		printCommandHelp(stdout, fs, cmd)
		return cmd, e, nil, perr
	case perr != nil && cmd.dashDash && !slices.Contains(rest, "--"):
		return cmd, e, nil, usagef("%s: %v; %s", name, perr, commandAfterDashes)
	case perr != nil:
		return cmd, e, nil, usagef("%s: %v", name, perr)
	}
	return cmd, e, pos, nil
}

// tableMissing replaces an error that says the table does not exist with
// one short line naming the table and where it was looked for.
func (e *env) tableMissing(err error) error {
	var nf *types.ResourceNotFoundException
	if !errors.As(err, &nf) {
		return err
	}
	where := "in region " + e.region
	if e.endpoint != "" {
		where = "at " + e.endpoint
	}
	return fmt.Errorf("table %q not found %s (wrong table name, region or endpoint? create it with: ddblease create-table)", e.g.table, where)
}

// globalArgs returns the flags set on fs as arguments, to parse again.
func globalArgs(fs *flag.FlagSet) []string {
	var out []string
	fs.Visit(func(f *flag.Flag) { out = append(out, "-"+f.Name+"="+f.Value.String()) })
	return out
}

// parseInterspersed parses flags anywhere among the positional arguments
// ("--" ends the flags, and is kept among them if keepDash).
func parseInterspersed(fs *flag.FlagSet, args []string, keepDash bool) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" { // Parse took it
			if keepDash {
				pos = append(pos, "--")
			}
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func printUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprint(w, usage)
	printFlags(w, fs, func(string) bool { return true })
}

// printCommandHelp is a command's -h: its synopsis, what it does, its own
// flags, then the global ones.
func printCommandHelp(w io.Writer, fs *flag.FlagSet, cmd *command) {
	fmt.Fprintf(w, "usage: ddblease %s %s\n", cmd.name, cmd.args)
	if cmd.about != "" {
		fmt.Fprintf(w, "\n%s\n", cmd.about)
	}
	global := globalNames()
	var own bool
	fs.VisitAll(func(f *flag.Flag) { own = own || !global[f.Name] })
	if own {
		fmt.Fprint(w, "\nflags:\n")
		printFlags(w, fs, func(name string) bool { return !global[name] })
	}
	fmt.Fprint(w, "\nglobal flags (before or after the command):\n")
	printFlags(w, fs, func(name string) bool { return global[name] })
}

// globalNames returns the names of the flags every command takes.
func globalNames() map[string]bool {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	(&globals{}).register(fs)
	names := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { names[f.Name] = true })
	return names
}

// printFlags writes the flags of fs whose names keep accepts, in order,
// as the docs write them: --name ARG, then what it does and its default.
func printFlags(w io.Writer, fs *flag.FlagSet, keep func(name string) bool) {
	fs.VisitAll(func(f *flag.Flag) {
		if !keep(f.Name) {
			return
		}
		arg, about := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if arg != "" {
			line += " " + arg
		}
		switch f.DefValue {
		case "", "0", "0s", "false":
		default:
			about += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(w, "%s\n    \t%s\n", line, about)
	})
}

// connect loads the AWS default configuration, checks that credentials can
// be had, and makes the client and the Admin. For a loopback endpoint
// (ddblease local, DynamoDB Local), a missing region or missing credentials
// are replaced by the ones ddblease local's export lines give, with a line
// on stderr saying so; never for any other endpoint.
func (e *env) connect(ctx context.Context) error {
	var opts []func(*config.LoadOptions) error
	if e.g.region != "" {
		opts = append(opts, config.WithRegion(e.g.region))
	}
	if !e.g.debug {
		// The SDK's own warnings (a test server's wrong CRC32, IMDSv1 on
		// looking for credentials) would break the one-line error rule;
		// errors are returned anyway.
		opts = append(opts, config.WithLogger(logging.Nop{}))
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cfg, err := config.LoadDefaultConfig(cctx, opts...)
	if err != nil {
		return fmt.Errorf("loading the AWS configuration: %w", err)
	}
	e.endpoint = e.g.endpoint
	if e.endpoint == "" { // $AWS_ENDPOINT_URL_DYNAMODB, $AWS_ENDPOINT_URL or the profile's, as the SDK resolves them
		if p := dynamodb.NewFromConfig(cfg).Options().BaseEndpoint; p != nil {
			e.endpoint = *p
		}
	}
	loopback := isLoopback(e.endpoint)
	var noRegion, noCreds bool
	if cfg.Region == "" {
		if !loopback {
			return usagef("no AWS region: use --region, AWS_REGION or a profile with a region")
		}
		noRegion, cfg.Region = true, localRegion
	}
	e.region = cfg.Region
	switch {
	case cfg.Credentials == nil && !loopback:
		return errors.New("no AWS credentials found: set AWS_PROFILE or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or run with a role")
	case cfg.Credentials == nil:
		noCreds = true
	default:
		if _, err := cfg.Credentials.Retrieve(cctx); err != nil {
			if !loopback {
				return fmt.Errorf("no AWS credentials found (set AWS_PROFILE or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or run with a role): %w", err)
			}
			noCreds = true
		}
	}
	if noCreds {
		cfg.Credentials = aws.NewCredentialsCache(aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: localKey, SecretAccessKey: localKey, Source: "ddblease: dummy credentials for a loopback endpoint"}, nil
		}))
	}
	switch {
	case noRegion && noCreds:
		e.log.Info(fmt.Sprintf("ddblease: no AWS region or credentials; using %s and dummy credentials for the loopback endpoint %s", localRegion, e.endpoint))
	case noRegion:
		e.log.Info(fmt.Sprintf("ddblease: no AWS region; using %s for the loopback endpoint %s", localRegion, e.endpoint))
	case noCreds:
		e.log.Info("ddblease: no AWS credentials; using dummy ones for the loopback endpoint " + e.endpoint)
	}
	if e.g.debug {
		cfg.ClientLogMode = aws.LogRetries | aws.LogRequest | aws.LogResponse
	}
	e.db = dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
		if e.g.endpoint != "" {
			o.BaseEndpoint = aws.String(e.g.endpoint)
		}
	})
	e.admin, err = e.newAdmin("")
	if err != nil {
		return usagef("%v", err)
	}
	return nil
}

// isLoopback reports whether endpoint is a URL whose host is localhost or
// a loopback address (127.0.0.0/8, [::1]).
func isLoopback(endpoint string) bool {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return false
	}
	host := u.Hostname()
	if strings.EqualFold(strings.TrimSuffix(host, "."), "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// explain turns the errors an operator meets most into plain words: an
// invalid job name (a usage error), an endpoint that cannot be reached or
// that is not DynamoDB, a missing table, refused credentials.
func explain(err error) error {
	if err == nil {
		return nil
	}
	// The library's ErrInvalid for a job name, as such or in a usage
	// error (exec's).
	var u *usageError
	if msg := oneLine(err.Error()); (errors.Is(err, ddblease.ErrInvalid) || errors.As(err, &u)) &&
		strings.Contains(msg, "ddblease: invalid argument: job name ") {
		msg = strings.ReplaceAll(msg, "ddblease: invalid argument: job name ", "job name ")
		return usagef("%s (%s)", msg, validJobName)
	}
	if errors.Is(err, ddblease.ErrUnknownJob) && unknownNameHasSpace(err.Error()) {
		return fmt.Errorf("%w (the name holds white space: is it two job names quoted as one?)", err)
	}
	if e := unreachable(err); e != nil {
		return e
	}
	var nf *types.ResourceNotFoundException
	if errors.As(err, &nf) {
		return fmt.Errorf("%w (is the table name, region or endpoint wrong? create it with: ddblease create-table)", err)
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		switch api.ErrorCode() {
		case "UnrecognizedClientException", "InvalidSignatureException", "ExpiredTokenException", "AccessDeniedException":
			return fmt.Errorf("%w (check the credentials and the IAM policy: see docs/deploy.md)", err)
		}
	}
	return err
}

// unknownNameHasSpace reports whether the job an unknown-job message
// names ("unknown job: \"a b\" ...") holds white space.
func unknownNameHasSpace(msg string) bool {
	_, rest, ok := strings.Cut(msg, "unknown job: ")
	if !ok {
		return false
	}
	q, err := strconv.QuotedPrefix(rest)
	if err != nil {
		return false
	}
	name, err := strconv.Unquote(q)
	return err == nil && strings.ContainsFunc(name, unicode.IsSpace)
}

// validJobName says what a job name the library accepts is.
var validJobName = fmt.Sprintf("a job name is 1 to %d bytes of UTF-8 without control characters", ddblease.MaxJobLength)

// unreachable returns the error in plain words when err says the endpoint
// could not be reached (refused, no such host, dial timeout, TLS to a
// plain HTTP server) or answered what DynamoDB never answers (a 404, a
// page of HTML); nil for any other error. The SDK's text is left out:
// what it adds is the retries and an empty request id.
func unreachable(err error) error {
	var ue *url.Error
	var re *smithyhttp.ResponseError
	var de *smithy.DeserializationError
	var why, at string
	hint, local := "is the endpoint right?", true // local: ask about ddblease local for a loopback endpoint
	switch {
	case errors.As(err, &ue):
		var op *net.OpError
		var dns *net.DNSError
		var rh tls.RecordHeaderError
		switch {
		case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
			return nil
		case errors.As(err, &dns) && dns.IsNotFound:
			why = fmt.Sprintf("no such host %q", dns.Name)
		case errors.As(err, &dns):
			why = fmt.Sprintf("looking up %q: %s", dns.Name, dns.Err)
		case errors.Is(err, syscall.ECONNREFUSED):
			why = "connection refused"
		case errors.As(err, &rh), strings.Contains(ue.Err.Error(), "server gave HTTP response to HTTPS client"):
			why = "the server does not speak TLS"
			hint, local = "is it http:// rather than https://?", false
		case errors.As(err, &op) && op.Op == "dial":
			why = oneLine(op.Err.Error())
		default:
			return nil
		}
		at = ue.URL
	case errors.As(err, &re) && re.Response != nil && (errors.As(err, &de) || re.HTTPStatusCode() == http.StatusNotFound):
		if re.Response.Request != nil {
			at = re.Response.Request.URL.String()
		}
		what := ""
		if ct := re.Response.Header.Get("Content-Type"); ct != "" {
			what = " with " + ct
		}
		endpoint := baseURL(at)
		if endpoint == "" {
			endpoint = "the endpoint"
		}
		return fmt.Errorf("the server at %s does not answer as DynamoDB does: HTTP %d%s (is the endpoint right?)",
			endpoint, re.HTTPStatusCode(), what)
	default:
		return nil
	}
	endpoint := baseURL(at)
	if local && isLoopback(endpoint) {
		hint += " is ddblease local running?"
	}
	return fmt.Errorf("cannot reach DynamoDB at %s: %s (%s)", endpoint, why, hint)
}

// baseURL is a request's URL without its path: the endpoint as given.
func baseURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" {
		return s
	}
	return u.Scheme + "://" + u.Host
}

// oneLine keeps an error message on one line.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}
