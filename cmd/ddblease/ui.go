package main

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"html/template"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ddblease/ddblease"
)

// uiFiles are the page: HTML, CSS and script, nothing fetched elsewhere.
//
//go:embed ui/index.html ui/app.js ui/style.css
var uiFiles embed.FS

// uiTokenEnv names the environment variable that gives the actions' token.
const uiTokenEnv = "DDBLEASE_UI_TOKEN"

// uiTokenHeader is the request header that carries the token.
const uiTokenHeader = "X-Ddblease-Token"

// uiOptions are the ui command's flags.
type uiOptions struct {
	addr      string
	hosts     hostList // --allowed-host
	actions   bool
	refresh   time.Duration
	span      time.Duration // the page's default range
	maxRuns   int
	metricsIn time.Duration // /metrics: the window of runs
}

// uiMaxRange is the longest range the page reads.
const uiMaxRange = 31 * 24 * time.Hour

const uiAbout = `Serves a page of the table's jobs: each job's leader (owner, fence, since
when, expiry, draining, paused, released), its latest and next slot, its
latest failure, and a timeline of its runs and hand-overs; and the pools.
The first response holds the state, so the page reads without script
(curl, a text browser); the script then refreshes it, and keeps the last
state, marked stale, with the error and its time, when the table cannot be
read. The range (?range=15m, ?to=) and the selected run live in the
address: a link shows what its sender saw. Times are shown in UTC and in
the browser's zone. /metrics serves the same state in the Prometheus text
format.

Read-only unless --allow-actions: then the page offers pause, resume,
trigger and resign, each confirmed, and each request must carry the token
printed at start (or given in $DDBLEASE_UI_TOKEN). Requests from other
sites are refused, and so is every request whose Host is not a loopback
name (localhost, 127.0.0.1, [::1]) or one given with --allowed-host,
whatever --addr listens on. See docs/observability.md.`

func uiCommand() *command {
	var o uiOptions
	return &command{
		name: "ui", about: uiAbout, long: true,
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&o.addr, "addr", "127.0.0.1:8080", "listen on this `address` (beyond loopback only if you mean it)")
			fs.Var(&o.hosts, "allowed-host", allowedHostUsage)
			fs.BoolVar(&o.actions, "allow-actions", false, "offer pause, resume, trigger and resign, with a token")
			fs.DurationVar(&o.refresh, "refresh", 5*time.Second, "how often the page reads the table")
			fs.DurationVar(&o.span, "range", time.Hour, "the page's default range of runs (the address's ?range= overrides it)")
			fs.IntVar(&o.maxRuns, "max-runs", 500, "the newest runs read per job and refresh")
			fs.DurationVar(&o.metricsIn, "metrics-window", 24*time.Hour, "/metrics counts the runs of this window")
		},
		run: func(e *env, ctx context.Context, args []string) error { return e.ui(ctx, args, o) },
	}
}

// uiServer serves the page, its API and /metrics.
type uiServer struct {
	e     *env
	o     uiOptions
	src   uiSource
	act   func(operator string) (uiActions, error)
	token string // empty: read-only
	log   *slog.Logger
	hosts hostPolicy

	mu   sync.Mutex
	last *uiState // the latest reading that listed the jobs, for when the table cannot be read
}

func (e *env) ui(ctx context.Context, args []string, o uiOptions) error {
	if len(args) != 0 {
		return usagef("ui: takes no arguments")
	}
	for name, d := range map[string]time.Duration{"--refresh": o.refresh, "--range": o.span, "--metrics-window": o.metricsIn} {
		if d <= 0 {
			return usagef("ui: %s %v must be positive", name, d)
		}
	}
	if o.span > uiMaxRange {
		return usagef("ui: --range %v is longer than %v", o.span, uiMaxRange)
	}
	if o.maxRuns <= 0 {
		return usagef("ui: --max-runs %d must be positive", o.maxRuns)
	}
	// Its log, a server's: slog's text lines, or --log-format json.
	log, err := newLogger(e.errw, e.g.logs, true, slog.LevelInfo)
	if err != nil {
		return err
	}
	s := &uiServer{e: e, o: o, src: adminSource{e.admin}, log: log, hosts: newHostPolicy(o.hosts)}
	s.act = func(op string) (uiActions, error) { return e.newAdmin(op) }
	if o.actions {
		s.token = os.Getenv(uiTokenEnv)
		if s.token == "" {
			b := make([]byte, 16)
			_, _ = rand.Read(b)
			s.token = hex.EncodeToString(b)
		}
	}
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fmt.Errorf("ui: %w", err)
	}
	srv := &http.Server{Handler: s.handler(), ReadHeaderTimeout: 10 * time.Second}
	s.announce(ln.Addr())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("ui: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	<-done
	return err
}

// newAdmin makes the command's Admin, on its table and layout, recording
// operator as who acts ("": the default, <user>@<hostname>): connect's,
// and one per action of ddblease ui, recording who asked.
func (e *env) newAdmin(operator string) (*ddblease.Admin, error) {
	return ddblease.NewAdmin(e.db, e.g.table, func(o *ddblease.AdminOptions) {
		o.Layout = e.g.layout
		o.Operator = operator
	})
}

// announce prints where the page is and, with actions, the token.
func (s *uiServer) announce(addr net.Addr) {
	url := "http://" + dialHost(addr) + "/"
	switch {
	case s.token == "":
		fmt.Fprintf(s.e.out, "ddblease ui: table %q, read-only, at %s\n", s.e.g.table, url)
	case os.Getenv(uiTokenEnv) != "":
		fmt.Fprintf(s.e.out, "ddblease ui: table %q, actions allowed with the token in $%s, at %s\n", s.e.g.table, uiTokenEnv, url)
	default:
		fmt.Fprintf(s.e.out, "ddblease ui: table %q, actions allowed, at %s#token=%s\n", s.e.g.table, url, s.token)
		fmt.Fprintf(s.e.out, "token: %s\n", s.token)
	}
	if w := s.hosts.listenWarning("ui", addr, "read the table's jobs"); w != "" {
		fmt.Fprintln(s.e.errw, w)
	}
}

// handler routes the page, its API and /metrics, behind the checks that
// every request passes.
func (s *uiServer) handler() http.Handler {
	mux := http.NewServeMux()
	for path, file := range map[string]string{"/app.js": "ui/app.js", "/style.css": "ui/style.css"} {
		mux.HandleFunc("GET "+path, func(w http.ResponseWriter, r *http.Request) { http.ServeFileFS(w, r, uiFiles, file) })
	}
	mux.HandleFunc("GET /{$}", s.page)
	mux.HandleFunc("GET /favicon.ico", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("GET /api/state", s.state)
	mux.HandleFunc("POST /api/action", s.action)
	mux.HandleFunc("GET /metrics", s.metrics)
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.log.Warn("refused a cross-site request", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr,
			"origin", r.Header.Get("Origin"))
		writeStatus(w, http.StatusForbidden, "cross-site request refused")
	}))
	h := s.hosts.handler("ui", s.log, writeStatus, cop.Handler(mux))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "+
			"img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("Cache-Control", "no-store")
		h.ServeHTTP(w, r)
	})
}

// window is the range of runs an address asks for: ?range=DURATION
// (default --range), ending ?to=RFC3339 (default now).
func (s *uiServer) window(r *http.Request) (from, to time.Time, err error) {
	span, to := s.o.span, s.e.now()
	q := r.URL.Query()
	if v := q.Get("range"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second || d > uiMaxRange {
			return from, to, fmt.Errorf("range %q must be a duration from 1s to 744h, such as 15m, 1h or 24h", v)
		}
		span = d
	}
	if v := q.Get("to"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return from, to, fmt.Errorf("to %q must be an RFC 3339 time, such as 2006-01-02T15:04:05Z", v)
		}
		to = t
	}
	return to.Add(-span), to, nil
}

// state answers the page's refresh: the jobs, their runs in the range
// (?range=DURATION, ending ?to=RFC3339 or now) and the pools.
func (s *uiServer) state(w http.ResponseWriter, r *http.Request) {
	from, to, err := s.window(r)
	if err != nil {
		writeStatus(w, http.StatusBadRequest, err.Error())
		return
	}
	writeJSONStatus(w, http.StatusOK, s.current(r.Context(), from, to))
}

// current reads the table for the page. When the jobs cannot be listed
// (the table unreachable), it returns the latest reading that listed
// them instead, marked stale with the error and when it happened.
func (s *uiServer) current(ctx context.Context, from, to time.Time) uiState {
	st := s.read(ctx, from, to)
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.failed == nil {
		s.last = &st
		return st
	}
	if s.last == nil {
		return st
	}
	old := *s.last
	old.Stale = &uiStale{Error: oneLine(explain(st.failed).Error()), At: st.Now}
	return old
}

// uiPageTmpl is the page: the state of its first response, which the
// script then refreshes.
var uiPageTmpl = template.Must(template.New("index.html").Funcs(template.FuncMap{
	"utc":  func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") },
	"span": func(d time.Duration) string { return spanText(d) },
	"since": func(now time.Time, t *time.Time) time.Duration {
		return now.Sub(*t)
	},
	"ms":      func(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond },
	"cut":     func(s string, n int) string { return string([]rune(s)[:min(n, len([]rune(s)))]) },
	"oneOf":   func(s string, set ...string) bool { return slices.Contains(set, s) },
	"shareOf": func(p uiPoolView) string { return shareText(p) },
}).ParseFS(uiFiles, "ui/index.html"))

// uiPage is what the template draws.
type uiPage struct {
	State   *uiState // nil: the address was wrong
	Problem string   // what was wrong with it
	Ranges  []uiRangeOption
}

// uiRangeOption is an option of the page's range: "" is --range's.
type uiRangeOption struct {
	Value, Label string
	Selected     bool
}

// uiRanges are the ranges the page offers besides the default.
var uiRanges = []uiRangeOption{{"5m", "5 minutes", false}, {"15m", "15 minutes", false}, {"1h", "1 hour", false},
	{"6h", "6 hours", false}, {"24h", "1 day", false}, {"168h", "7 days", false}}

// page serves the page with the state drawn in it: a browser without
// script, or curl, sees every job and holder.
func (s *uiServer) page(w http.ResponseWriter, r *http.Request) {
	asked := r.URL.Query().Get("range")
	p := uiPage{Ranges: []uiRangeOption{{"", rangeLabel(s.o.span) + " (default)", asked == ""}}}
	known := asked == ""
	for _, o := range uiRanges {
		o.Selected = o.Value == asked
		known = known || o.Selected
		p.Ranges = append(p.Ranges, o)
	}
	if !known {
		p.Ranges = append(p.Ranges, uiRangeOption{asked, asked, true})
	}
	code := http.StatusOK
	if from, to, err := s.window(r); err != nil {
		code, p.Problem = http.StatusBadRequest, err.Error()
	} else {
		st := s.current(r.Context(), from, to)
		p.State = &st
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	if err := uiPageTmpl.Execute(w, p); err != nil {
		s.log.Warn("drawing the page", "err", err)
	}
}

// spanText writes a duration as the page does: 45s, 12m30s, 1h, 3d4h.
func spanText(d time.Duration) string {
	d = d.Abs()
	s := d.Seconds()
	switch {
	case s < 10:
		return strconv.FormatFloat(s, 'f', 1, 64) + "s"
	case s < 60:
		return strconv.FormatFloat(s, 'f', 0, 64) + "s"
	case d < time.Hour:
		return fmt.Sprintf("%dm%ds", int(d/time.Minute), int(d%time.Minute/time.Second))
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d/time.Hour), int(d%time.Hour/time.Minute))
	}
	return fmt.Sprintf("%dd%dh", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
}

// rangeLabel names a range as the page's choices do: "1 hour", or "90m".
func rangeLabel(d time.Duration) string {
	for _, o := range uiRanges {
		if v, _ := time.ParseDuration(o.Value); v == d {
			return o.Label
		}
	}
	t := d.String()
	for _, zero := range []string{"0s", "0m"} {
		if len(t) > len(zero)+1 && strings.HasSuffix(t, zero) {
			t = strings.TrimSuffix(t, zero)
		}
	}
	return t
}

// shareText is the share each live member of a pool should hold.
func shareText(p uiPoolView) string {
	if p.Low == p.High {
		return strconv.Itoa(p.Low)
	}
	return fmt.Sprintf("%d–%d", p.Low, p.High)
}

// uiActionRequest is the body of POST /api/action.
type uiActionRequest struct {
	Job     string `json:"job"`
	Action  string `json:"action"` // pause, resume, trigger or resign
	Fence   int64  `json:"fence"`  // resign: the tenure shown
	CatchUp bool   `json:"catchUp"`
	Asker   string `json:"asker"` // who asks, recorded as the operator
}

// action does one of the page's actions: one call of Admin.
func (s *uiServer) action(w http.ResponseWriter, r *http.Request) {
	if s.token == "" {
		writeStatus(w, http.StatusForbidden, "actions are off: start ddblease ui with --allow-actions")
		return
	}
	if got := r.Header.Get(uiTokenHeader); subtle.ConstantTimeCompare([]byte(got), []byte(s.token)) != 1 {
		s.log.Warn("refused an action without the token", "remote", r.RemoteAddr)
		writeStatus(w, http.StatusForbidden, "missing or wrong token")
		return
	}
	var req uiActionRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil {
		writeStatus(w, http.StatusBadRequest, "bad request body: "+err.Error())
		return
	}
	if req.Asker == "" || len(req.Asker) > 64 {
		writeStatus(w, http.StatusBadRequest, "say who asks (1 to 64 bytes)")
		return
	}
	if !slices.Contains([]string{"pause", "resume", "trigger", "resign"}, req.Action) {
		writeStatus(w, http.StatusBadRequest, "unknown action "+strconv.Quote(req.Action)+" (pause, resume, trigger or resign)")
		return
	}
	msg, err := s.do(r.Context(), req)
	s.log.Info("action", "action", req.Action, "job", req.Job, "asker", req.Asker, "remote", r.RemoteAddr,
		"result", resultOf(msg, err))
	if err != nil {
		writeStatus(w, actionStatus(err), oneLine(explain(err).Error()))
		return
	}
	writeJSONStatus(w, http.StatusOK, map[string]string{"message": msg})
}

// do makes the one Admin call of req, recording req.Asker as the operator.
func (s *uiServer) do(ctx context.Context, req uiActionRequest) (string, error) {
	a, err := s.act(req.Asker + " via ddblease ui")
	if err != nil {
		return "", err
	}
	switch req.Action {
	case "pause":
		_, err = a.Pause(ctx, req.Job)
		return req.Job + " paused", err
	case "resume":
		_, err = a.Resume(ctx, req.Job, req.CatchUp)
		return req.Job + " resumed", err
	case "trigger":
		t, err := a.Trigger(ctx, req.Job)
		return req.Job + " triggered: run " + t.RunID(), err
	case "resign":
		rec, err := a.RequestResign(ctx, req.Job, req.Fence)
		return fmt.Sprintf("asked %q (fence %d) to resign %s", rec.Owner, rec.Fence, req.Job), err
	}
	return "", fmt.Errorf("unknown action %q", req.Action)
}

func resultOf(msg string, err error) string {
	if err != nil {
		return "error: " + oneLine(err.Error())
	}
	return msg
}

func actionStatus(err error) int {
	switch {
	case errors.Is(err, ddblease.ErrUnknownJob):
		return http.StatusNotFound
	case errors.Is(err, ddblease.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, ddblease.ErrHeld), errors.Is(err, ddblease.ErrNotHeld):
		return http.StatusConflict
	}
	return http.StatusBadGateway
}

func writeStatus(w http.ResponseWriter, code int, msg string) {
	writeJSONStatus(w, code, map[string]string{"error": msg})
}

func writeJSONStatus(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
