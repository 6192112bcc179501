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
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
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
	actions   bool
	refresh   time.Duration
	span      time.Duration // the page's default range
	maxRuns   int
	metricsIn time.Duration // /metrics: the window of runs
}

const uiAbout = `Serves a page of the table's jobs: each job's leader (owner, fence, since
when, expiry, draining, paused, released), its latest and next slot, its
latest failure, and a timeline of its runs and hand-overs; and the pools.
The page refreshes itself; times are shown in UTC and in the browser's zone.
/metrics serves the same state in the Prometheus text format.

Read-only unless --allow-actions: then the page offers pause, resume,
trigger and resign, each confirmed, and each request must carry the token
printed at start (or given in $DDBLEASE_UI_TOKEN). Requests from other
sites are refused. See docs/observability.md.`

func uiCommand() *command {
	var o uiOptions
	return &command{
		name: "ui", about: uiAbout, long: true,
		flags: func(fs *flag.FlagSet) {
			fs.StringVar(&o.addr, "addr", "127.0.0.1:8080", "listen on this `address` (beyond loopback only if you mean it)")
			fs.BoolVar(&o.actions, "allow-actions", false, "offer pause, resume, trigger and resign, with a token")
			fs.DurationVar(&o.refresh, "refresh", 5*time.Second, "how often the page reads the table")
			fs.DurationVar(&o.span, "range", 24*time.Hour, "the page's default range of runs")
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
	if o.maxRuns <= 0 {
		return usagef("ui: --max-runs %d must be positive", o.maxRuns)
	}
	s := &uiServer{e: e, o: o, src: adminSource{e.admin}, log: slog.New(slog.NewTextHandler(e.errw, nil))}
	s.act = func(op string) (uiActions, error) {
		return ddblease.NewAdmin(e.db, e.g.table, func(ao *ddblease.AdminOptions) { ao.Operator = op })
	}
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
	srv := &http.Server{Handler: s.handler(ln.Addr()), ReadHeaderTimeout: 10 * time.Second}
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

// announce prints where the page is and, with actions, the token.
func (s *uiServer) announce(addr net.Addr) {
	url := "http://" + addr.String() + "/"
	switch {
	case s.token == "":
		fmt.Fprintf(s.e.out, "ddblease ui: table %q, read-only, at %s\n", s.e.g.table, url)
	case os.Getenv(uiTokenEnv) != "":
		fmt.Fprintf(s.e.out, "ddblease ui: table %q, actions allowed with the token in $%s, at %s\n", s.e.g.table, uiTokenEnv, url)
	default:
		fmt.Fprintf(s.e.out, "ddblease ui: table %q, actions allowed, at %s#token=%s\n", s.e.g.table, url, s.token)
		fmt.Fprintf(s.e.out, "token: %s\n", s.token)
	}
	if ip := addr.(*net.TCPAddr).IP; !ip.IsLoopback() {
		fmt.Fprintf(s.e.errw, "ddblease ui: listening beyond loopback (%s): anyone who can reach it can read the table's jobs\n", addr)
	}
}

// handler routes the page, its API and /metrics, behind the checks that
// every request passes.
func (s *uiServer) handler(addr net.Addr) http.Handler {
	mux := http.NewServeMux()
	for path, file := range map[string]string{"/{$}": "ui/index.html", "/app.js": "ui/app.js", "/style.css": "ui/style.css"} {
		mux.HandleFunc("GET "+path, func(w http.ResponseWriter, r *http.Request) { http.ServeFileFS(w, r, uiFiles, file) })
	}
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
	h := cop.Handler(mux)
	loopback := addr.(*net.TCPAddr).IP.IsLoopback()
	port := strconv.Itoa(addr.(*net.TCPAddr).Port)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "+
			"img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("Cache-Control", "no-store")
		// A page served on loopback answers only to a loopback name: a
		// site whose name an attacker points at 127.0.0.1 (DNS rebinding)
		// is not the page's origin.
		if loopback && !loopbackHost(r.Host, port) {
			writeStatus(w, http.StatusMisdirectedRequest, "unexpected Host "+strconv.Quote(r.Host))
			return
		}
		h.ServeHTTP(w, r)
	})
}

func loopbackHost(host, port string) bool {
	h, p, err := net.SplitHostPort(host)
	if err != nil || p != port {
		return false
	}
	ip := net.ParseIP(h)
	return h == "localhost" || ip != nil && ip.IsLoopback()
}

// state answers the page's refresh: the jobs, their runs in the range
// (?range=DURATION, ending ?to=RFC3339 or now) and the pools.
func (s *uiServer) state(w http.ResponseWriter, r *http.Request) {
	span, to := s.o.span, s.e.now()
	q := r.URL.Query()
	if v := q.Get("range"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 || d > 31*24*time.Hour {
			writeStatus(w, http.StatusBadRequest, "range "+strconv.Quote(v)+" must be a duration from 1s to 744h")
			return
		}
		span = d
	}
	if v := q.Get("to"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			writeStatus(w, http.StatusBadRequest, "to "+strconv.Quote(v)+" must be an RFC 3339 time")
			return
		}
		to = t
	}
	writeJSONStatus(w, http.StatusOK, s.read(r.Context(), to.Add(-span), to))
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
