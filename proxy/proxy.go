// Package proxy is confshim's HTTP handler: it forwards every Admin API request to
// APISIX unchanged, except PUT /apisix/admin/configs, which it reads, decides with the
// rewrite package against what internal/dataplane believes, and forwards as one
// complete request through internal/apisix (contract §4–§6); when APISIX rejects an
// item it holds it back and forwards the rest (§8.5; the sync is internal/syncmachine's
// state machine, drive.go its driver). It also serves
// /debug/config (§7). The watcher (internal/reseed) runs beside it.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"path"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/rs/zerolog"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/internal/dataplane"
	"github.com/confshim/confshim/internal/reseed"
	"github.com/confshim/confshim/internal/syncmachine"
	"github.com/confshim/confshim/metrics"
	"github.com/confshim/confshim/rewrite"
)

// Config is everything the proxy needs; main fills it from flags.
type Config struct {
	Upstream string   // APISIX Admin API base URL, http or https
	Preserve []string // sections owned by out-of-band writers
	Merge    []string // sections shared item by item with out-of-band writers (§8.6)
	Fallback bool     // --fallback backfill (§8.5)
	// FallbackAnswer is --fallback-answer: what the client is told when items were held
	// back ("" is rejection).
	FallbackAnswer FallbackAnswer
	// FallbackBudget bounds a sync with fallback work (0: fallbackBudget, 10 s); tests
	// shorten it.
	FallbackBudget  time.Duration
	MaxBodyBytes    int64         // larger request bodies get 413
	UpstreamTimeout time.Duration // per upstream request
	AdminKey        string        // for confshim's own background requests, never a caller's
	// BodyBudgetBytes bounds the request bodies buffered at once (0: 4 × MaxBodyBytes);
	// a body that does not fit waits BodyBudgetWait, then gets 503.
	BodyBudgetBytes int64
	BodyBudgetWait  time.Duration
	// ReadyWindow: one upstream answer keeps Ready true this long (0: 10 s, contract §7).
	ReadyWindow time.Duration
	// ReseedInterval is --reseed-interval: how often the watch (internal/reseed) pings
	// the data plane to notice a restart; it looks at the configuration on a sign of one
	// and as often as the look's cost allows, and re-seeds it when lost. 0: no watch and
	// no kept configuration. StateDir, when set, also keeps the configuration on disk.
	ReseedInterval time.Duration
	StateDir       string
	// WatchSafetyInterval is the longest the watch goes without looking at the
	// configuration (0: a minute); between ReseedInterval and it, the looks follow their
	// cost (the watcher's lookInterval). Tests compress it.
	WatchSafetyInterval time.Duration
	// AllowCIDRs, when not empty, is who may talk to the Admin API through confshim,
	// checked against the TCP peer (never X-Forwarded-For).
	AllowCIDRs []netip.Prefix
	// SkipItemLists leaves out the ids each sync touched (§7): the benchmarks' baseline.
	SkipItemLists bool
	// TrustConnection is --trust-connection: when a sync may be decided without reading
	// the data plane (§5.4). "" is auto.
	TrustConnection TrustMode

	UpstreamCAFile             string
	UpstreamInsecureSkipVerify bool
	UpstreamClientCertFile     string // optional, for APISIX's admin_api_mtls
	UpstreamClientKeyFile      string

	Logger  zerolog.Logger
	Metrics *metrics.Metrics
	// Transport overrides the transport built from the TLS settings (tests).
	Transport http.RoundTripper
}

// Proxy is the confshim reverse proxy: the configs PUT's stages (syncer) and the
// stream of everything else to APISIX.
type Proxy struct {
	cfg      Config
	upstream *url.URL
	api      *apisix.Client
	rp       *httputil.ReverseProxy
	handler  http.Handler

	// dp is what confshim believes about the data plane; its PUT lock serialises
	// configs PUTs.
	dp     *dataplane.Belief
	watch  *reseed.Watcher // nil with --reseed-interval 0
	sync   *syncer         // the configs PUT
	states *stateReader
	notes  notes
	replies

	lastAnswer atomic.Int64 // unix nanos of the upstream's last HTTP answer
}

// New validates cfg and returns the proxy; every error names the setting at fault.
func New(cfg Config) (*Proxy, error) {
	u, errs := parseUpstream(cfg.Upstream)
	cfg.defaults()
	errs = append(errs, cfg.problems()...)
	tlsCfg := apisix.TLSConfig{CAFile: cfg.UpstreamCAFile, InsecureSkipVerify: cfg.UpstreamInsecureSkipVerify,
		ClientCertFile: cfg.UpstreamClientCertFile, ClientKeyFile: cfg.UpstreamClientKeyFile}
	transport := cfg.Transport
	if transport == nil {
		t, err := apisix.NewTransport(tlsCfg, cfg.UpstreamTimeout)
		if err != nil {
			errs = append(errs, err)
		}
		transport = t
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	p := &Proxy{cfg: cfg, upstream: u}
	p.notes = notes{log: cfg.Logger, m: cfg.Metrics, debug: &debugLog{}}
	p.replies = replies{log: cfg.Logger, m: cfg.Metrics, upstreamTimeout: cfg.UpstreamTimeout}
	api, err := apisix.New(apisix.Config{Upstream: u, Timeout: cfg.UpstreamTimeout, Transport: transport, Logger: cfg.Logger,
		OnAnswer: p.noteAnswer, TLS: tlsCfg})
	if err != nil {
		return nil, err
	}
	p.api = api
	p.dp = p.loadBelief()
	p.states = &stateReader{api: api, trust: cfg.TrustConnection, loopback: isLoopback(u), stateLimit: 4 * cfg.MaxBodyBytes, notes: p.notes}
	if cfg.ReseedInterval > 0 {
		p.watch = reseed.New(reseed.Config{Interval: cfg.ReseedInterval, SafetyInterval: cfg.WatchSafetyInterval, AdminKey: cfg.AdminKey,
			API: api, Belief: p.dp, Metrics: cfg.Metrics, Log: cfg.Logger, Host: watchHost{p}})
	}
	p.sync = p.newSyncer()
	p.rp = p.reverseProxy()
	p.handler = p.routes()
	return p, nil
}

// parseUpstream reads --upstream: an http or https base URL, nothing more.
func parseUpstream(s string) (*url.URL, []error) {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // url.Error quotes the URL, password included
		}
		return nil, []error{fmt.Errorf("--upstream: %v", err)}
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, []error{fmt.Errorf("--upstream: scheme must be http or https, got %q", u.Scheme)}
	case u.Host == "":
		return nil, []error{errors.New("--upstream: missing host")}
	case u.RawQuery != "" || u.Fragment != "":
		return nil, []error{errors.New("--upstream: must not have a query or fragment")}
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	return u, nil
}

// defaults fills what was left zero.
func (cfg *Config) defaults() {
	if cfg.BodyBudgetBytes == 0 {
		cfg.BodyBudgetBytes = 4 * cfg.MaxBodyBytes
	}
	if cfg.ReadyWindow <= 0 {
		cfg.ReadyWindow = 10 * time.Second
	}
	if cfg.BodyBudgetWait <= 0 {
		cfg.BodyBudgetWait = 10 * time.Second
	}
	if cfg.FallbackBudget <= 0 {
		cfg.FallbackBudget = fallbackBudget
	}
	if cfg.FallbackAnswer == "" {
		cfg.FallbackAnswer = AnswerRejection
	}
	if cfg.TrustConnection == "" {
		cfg.TrustConnection = TrustAuto
	}
}

// problems are the settings that cannot work, each named.
func (cfg *Config) problems() []error {
	var errs []error
	if cfg.MaxBodyBytes <= 0 {
		errs = append(errs, errors.New("--max-body-bytes: must be positive"))
	}
	if cfg.UpstreamTimeout <= 0 {
		errs = append(errs, errors.New("--upstream-timeout: must be positive"))
	}
	if cfg.BodyBudgetBytes < cfg.MaxBodyBytes {
		errs = append(errs, errors.New("--body-budget-bytes: must be at least --max-body-bytes"))
	}
	if cfg.Metrics == nil {
		errs = append(errs, errors.New("proxy: Metrics is required"))
	}
	if _, err := ParseFallbackAnswer(string(cfg.FallbackAnswer)); err != nil {
		errs = append(errs, fmt.Errorf("--fallback-answer: %v", err))
	}
	if _, err := ParseTrustMode(string(cfg.TrustConnection)); err != nil {
		errs = append(errs, fmt.Errorf("--trust-connection: %v", err))
	}
	return errs
}

// loadBelief is the data plane's belief, its kept configuration loaded from --state-dir.
func (p *Proxy) loadBelief() *dataplane.Belief {
	cfg := p.cfg
	dp, loadErr := dataplane.New(dataplane.Options{Keep: cfg.ReseedInterval > 0, StateDir: cfg.StateDir,
		// the kept configuration is at most the data plane's state, which confshim reads
		// up to 4 × --max-body-bytes
		MaxFileBytes: 4*cfg.MaxBodyBytes + 1<<20,
		OnStateWrite: func(err error) {
			if err != nil {
				cfg.Logger.Warn().Str("event", "state_file").Str("error", err.Error()).Msg("cannot write the kept configuration to --state-dir")
			}
			p.notes.debug.noteStateWrite(err)
		}})
	switch k := dp.Snapshot().Kept; {
	case loadErr != nil:
		cfg.Logger.Warn().Str("event", "state_file").Str("error", loadErr.Error()).Msg("the kept configuration in --state-dir cannot be read; ignored")
	case k != nil:
		cfg.Logger.Info().Str("event", "state_file").Int("sections", len(k.Versions)).Msg("loaded the kept configuration from --state-dir")
	}
	return dp
}

// newSyncer wires the configs PUT's stages.
func (p *Proxy) newSyncer() *syncer {
	cfg := p.cfg
	rw := rewrite.NewMerging(cfg.Preserve, cfg.Merge)
	bufs := make(buffers, 3) // the PUT being read, the one being rewritten, its output
	return &syncer{
		timeout: cfg.UpstreamTimeout, skipItemLists: cfg.SkipItemLists, fallbackOn: cfg.Fallback,
		api: p.api, rw: rw, dp: p.dp, watch: p.watch,
		bodies: &bodyReader{maxBytes: cfg.MaxBodyBytes, wait: cfg.BodyBudgetWait, budget: newBodyBudget(cfg.BodyBudgetBytes), bufs: bufs, replies: p.replies},
		states: p.states, send: sender{api: p.api}, notes: p.notes, replies: p.replies,
		machine: &syncmachine.Config{Rewriter: rw, Fallback: cfg.Fallback, RejectHeld: cfg.FallbackAnswer == AnswerRejection,
			Budget: cfg.FallbackBudget, Reseeds: p.watch != nil, Buffers: bufs, Layouts: &syncmachine.LayoutMemory{}},
		asItCame: p.passthrough,
	}
}

// reverseProxy streams every other request to APISIX.
func (p *Proxy) reverseProxy() *httputil.ReverseProxy {
	u := p.upstream
	return &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(u) },
		Transport:     p.api.Shared(),
		FlushInterval: -1,
		ErrorHandler:  p.passthroughError,
		ModifyResponse: func(resp *http.Response) error {
			p.api.NoteAnswer(resp)
			if resp.StatusCode == http.StatusOK && resp.Request != nil && strings.HasSuffix(resp.Request.URL.Path, apisix.ConfigsPath) {
				p.dp.SawState(resp.Header.Get("X-Digest"), resp.Header.Get("X-Last-Modified"))
			}
			return nil
		},
		ErrorLog: StdLogger(p.cfg.Logger),
	}
}

// ServeHTTP makes the proxy an http.Handler.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) { p.handler.ServeHTTP(w, r) }

// routes intercepts exactly the path APISIX routes the configuration PUT on (nginx's
// $uri: slashes merged, dot segments resolved); chi never answers in APISIX's place.
func (p *Proxy) routes() http.Handler {
	r := chi.NewRouter()
	r.Use(observe(p.cfg.Logger, p.cfg.Metrics), p.guard, routeOnNormalizedPath)
	r.Put(apisix.ConfigsPath, p.sync.ServeHTTP)
	r.NotFound(p.passthrough)
	r.MethodNotAllowed(p.passthrough)
	return r
}

// guard refuses what must never reach the Admin API: clients outside --allow-cidrs
// (APISIX's own allow_admin sees only confshim's 127.0.0.1), and protocol upgrades
// (h2c or websocket smuggling past the proxy's view of requests).
func (p *Proxy) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(p.cfg.AllowCIDRs) > 0 && !p.allowed(r.RemoteAddr) {
			p.m.Refuse(metrics.RefusedAllowCIDRs)
			p.log.Warn().Str("event", "refused").Str("remote", r.RemoteAddr).Msg("client outside --allow-cidrs")
			writeError(w, http.StatusForbidden, "this client may not use the Admin API (--allow-cidrs)")
			return
		}
		if r.Header.Get("Upgrade") != "" || headerHasToken(r.Header, "Connection", "upgrade") {
			p.m.Refuse(metrics.RefusedUpgrade)
			writeError(w, http.StatusBadRequest, "protocol upgrades are not allowed on the Admin API")
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (p *Proxy) allowed(remoteAddr string) bool {
	ap, err := netip.ParseAddrPort(remoteAddr)
	if err != nil {
		return false
	}
	addr := ap.Addr().Unmap()
	for _, prefix := range p.cfg.AllowCIDRs {
		if prefix.Contains(addr) {
			return true
		}
	}
	return false
}

func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// ParseCIDRs reads --allow-cidrs: comma-separated prefixes or single addresses.
func ParseCIDRs(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if prefix, err := netip.ParsePrefix(part); err == nil {
			out = append(out, prefix.Masked())
			continue
		}
		addr, err := netip.ParseAddr(part)
		if err != nil {
			return nil, fmt.Errorf("%q is neither a CIDR nor an address", part)
		}
		out = append(out, netip.PrefixFrom(addr.Unmap(), addr.Unmap().BitLen()))
	}
	return out, nil
}

// routeOnNormalizedPath makes chi match the path as nginx would see it, so that
// //apisix/admin/configs cannot slip a stale PUT past the repair.
func routeOnNormalizedPath(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rctx := chi.RouteContext(r.Context()); rctx != nil {
			rctx.RoutePath = normalizePath(r.URL.Path)
		}
		next.ServeHTTP(w, r)
	})
}

func normalizePath(p string) string {
	if p == "" {
		return "/"
	}
	clean := path.Clean("/" + p)
	if strings.HasSuffix(p, "/") && clean != "/" {
		clean += "/"
	}
	return clean
}

// passthrough streams any other request to APISIX unchanged.
func (p *Proxy) passthrough(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength > p.cfg.MaxBodyBytes {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body of %d bytes is over --max-body-bytes (%d)", r.ContentLength, p.cfg.MaxBodyBytes))
		return
	}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = http.MaxBytesReader(w, r.Body, p.cfg.MaxBodyBytes)
	}
	ctx, cancel := context.WithTimeout(r.Context(), p.cfg.UpstreamTimeout)
	defer cancel()
	p.rp.ServeHTTP(w, r.WithContext(ctx))
}

func (p *Proxy) passthroughError(w http.ResponseWriter, r *http.Request, err error) {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is over --max-body-bytes (%d)", p.cfg.MaxBodyBytes))
		return
	}
	p.upstreamFailed(w, r, err, "forward "+r.Method)
}

// StdLogger adapts zerolog for net/http's ErrorLog (TLS handshake failures, broken
// streams), so that every line confshim writes is JSON. Those messages name no secrets.
func StdLogger(l zerolog.Logger) *log.Logger {
	return log.New(stdWriter{l}, "", 0)
}

type stdWriter struct{ l zerolog.Logger }

func (w stdWriter) Write(p []byte) (int, error) {
	w.l.Warn().Str("event", "http").Msg(strings.TrimSpace(string(p)))
	return len(p), nil
}

// noteAnswer records an HTTP answer from APISIX: readiness, its status.
func (p *Proxy) noteAnswer(status int) {
	p.lastAnswer.Store(time.Now().UnixNano())
	p.notes.debug.noteStatus(status)
}

// TrustConnection says whether syncs may be decided on the belief without a read, and
// why (the start line, /debug/config).
func (p *Proxy) TrustConnection() (trusted bool, why string) { return p.states.trustReason() }

// DebugConfig builds the /debug/config document.
func (p *Proxy) DebugConfig() *debugConfig {
	trusted, why := p.states.trustReason()
	f := debugFacts{url: credentialFreeURL(p.upstream), belief: p.dp.Snapshot(),
		server: p.api.Server(), trust: debugTrust{Mode: string(p.cfg.TrustConnection), Trusted: trusted, Why: why, Intermediary: p.api.Intermediary()}}
	if at := p.lastAnswer.Load(); at != 0 {
		f.lastAnswerAt = time.Unix(0, at)
	}
	return p.notes.debug.document(f)
}

// DebugHandler serves /debug/config; ?id=<id> answers only the recent syncs that
// touched that id (added, changed, removed or held back, in any section).
func (p *Proxy) DebugHandler() http.Handler { return debugHandler(p.DebugConfig) }

// Ready reports whether the data plane answered any request within ReadyWindow or
// answers HEAD /apisix/admin now within 2 s (contract §7).
func (p *Proxy) Ready(ctx context.Context) bool {
	if time.Since(time.Unix(0, p.lastAnswer.Load())) < p.cfg.ReadyWindow {
		return true
	}
	return p.api.Alive(ctx, p.cfg.AdminKey, 2*time.Second)
}

// StartBackground starts the data-plane watch and the state-file writer; they stop
// when ctx ends. Wait returns once they have (the writer after flushing).
func (p *Proxy) StartBackground(ctx context.Context) {
	if p.watch == nil {
		return
	}
	p.dp.StartWriter(ctx)
	p.watch.Start(ctx)
}

// Wait returns when the background work started by StartBackground has stopped, the
// last accepted configuration written to --state-dir.
func (p *Proxy) Wait() {
	if p.watch != nil {
		p.watch.Wait()
	}
	p.dp.Wait()
}

// watchHost is what the watch needs of the handler (reseed.Host).
type watchHost struct{ p *Proxy }

func (h watchHost) ReadState(ctx context.Context, creds apisix.Credentials) (*rewrite.State, string, string, error) {
	return h.p.states.readState(ctx, creds)
}
func (h watchHost) NoteMoves(moves []dataplane.Move, how string) { h.p.notes.moves(moves, how) }
func (h watchHost) NoteReseed(result string, status int, took time.Duration) {
	h.p.notes.debug.noteReseed(result, status, took)
}
