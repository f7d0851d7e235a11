// Command confshim is a reverse proxy in front of APISIX's standalone Admin API that
// repairs stale *_conf_version values in PUT /apisix/admin/configs. main parses flags,
// wires the proxy and the metrics listener, and handles signals; nothing else.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/metrics"
	"github.com/confshim/confshim/proxy"
)

// version is stamped at build time: -ldflags "-X main.version=…".
var version = "dev"

// hooks are what run takes besides its arguments and surroundings that a test may
// change; main passes defaultHooks, the contract's values.
type hooks struct {
	ready             func(proxyAddr, metricsAddr string) // when set, learns the bound addresses
	readyWindow       time.Duration                       // one upstream answer keeps /readyz 200 this long (§7)
	certCheckInterval time.Duration                       // how often the TLS files are checked for a rotation (0: at every handshake)
}

func defaultHooks() hooks {
	return hooks{readyWindow: 10 * time.Second, certCheckInterval: time.Second}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr, defaultHooks())
	stop()
	os.Exit(code)
}

// run is the whole program.
func run(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer, h hooks) int {
	opts, err := parseOptions(args, lookupEnv)
	if errors.Is(err, errVersion) {
		fmt.Fprintf(stdout, "confshim %s\n", version)
		return 0
	}
	if errors.Is(err, errHelp) {
		fmt.Fprint(stdout, usage())
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	logger := opts.logger(stderr)
	reg := prometheus.NewRegistry()
	m := metrics.New(reg, version)

	p, err := proxy.New(proxy.Config{
		Upstream:                   opts.upstream,
		Preserve:                   opts.preserve,
		Merge:                      opts.merge,
		Fallback:                   opts.fallback,
		FallbackAnswer:             opts.fallbackAnswer,
		TrustConnection:            opts.trustConnection,
		MaxBodyBytes:               opts.maxBodyBytes,
		BodyBudgetBytes:            opts.bodyBudgetBytes,
		ReadyWindow:                h.readyWindow,
		ReseedInterval:             opts.reseedInterval,
		StateDir:                   opts.stateDir,
		UpstreamTimeout:            opts.upstreamTimeout,
		AdminKey:                   opts.adminKey,
		AllowCIDRs:                 opts.allowCIDRs,
		UpstreamCAFile:             opts.upstreamCAFile,
		UpstreamInsecureSkipVerify: opts.upstreamInsecure,
		UpstreamClientCertFile:     opts.upstreamClientCert,
		UpstreamClientKeyFile:      opts.upstreamClientKey,
		Logger:                     logger,
		Metrics:                    m,
	})
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	if opts.upstreamInsecure {
		logger.Warn().Msg("--upstream-insecure-skip-verify: APISIX's certificate is NOT verified; anyone on the path can read the admin key and the configuration")
	}
	var tlsConfig *tls.Config
	if opts.tlsCertFile != "" {
		reloader, err := newCertReloader(opts.tlsCertFile, opts.tlsKeyFile, h.certCheckInterval, logger)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 2
		}
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: reloader.GetCertificate}
	}

	// Open both listeners first: a bind error fails fast, before anything serves.
	proxyLn, err := net.Listen("tcp", opts.listen)
	if err != nil {
		fmt.Fprintf(stderr, "--listen: %v\n", err)
		return 1
	}
	metricsLn, err := net.Listen("tcp", opts.metricsListen)
	if err != nil {
		proxyLn.Close()
		fmt.Fprintf(stderr, "--metrics-listen: %v\n", err)
		return 1
	}
	if tlsConfig != nil {
		proxyLn = tls.NewListener(proxyLn, tlsConfig)
	}

	var shuttingDown atomic.Bool
	proxySrv := &http.Server{
		Handler:           p,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       5 * time.Minute, // a 64 MiB body over a slow link
		// the probe and the PUT's one deadline, each --upstream-timeout, and a minute
		// for the body's arrival and the wait for the PUT lock
		WriteTimeout:   2*opts.upstreamTimeout + time.Minute,
		IdleTimeout:    125 * time.Second, // longer than ADC keeps idle sockets (100–120 s)
		MaxHeaderBytes: 64 << 10,
		ErrorLog:       proxy.StdLogger(logger),
	}
	metricsSrv := &http.Server{
		Handler:           internalHandler(reg, p, &shuttingDown),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          proxy.StdLogger(logger),
	}
	bgCtx, stopBackground := context.WithCancel(context.Background())
	defer stopBackground()
	p.StartBackground(bgCtx)
	errc := make(chan error, 2)
	go func() { errc <- proxySrv.Serve(proxyLn) }()
	go func() { errc <- metricsSrv.Serve(metricsLn) }()
	logger.Info().Str("listen", proxyLn.Addr().String()).Str("metrics_listen", metricsLn.Addr().String()).
		Str("upstream", redacted(opts.upstream)).Strs("preserve", opts.preserve).Strs("merge", opts.merge).Str("version", version).Msg("confshim started")
	if trusted, why := p.TrustConnection(); !trusted {
		logger.Info().Str("trust_connection", string(opts.trustConnection)).Str("why", why).Msg("syncs are decided on a fresh look at the data plane (HEAD /apisix/admin/configs) before each PUT")
	} else {
		logger.Info().Str("trust_connection", string(opts.trustConnection)).Str("why", why).Msg("syncs may be decided on confshim's belief without a read while the connection it was confirmed on stays open")
		if opts.reseedInterval == 0 || opts.reseedInterval >= apisix.DecideIdleLimit {
			limit := apisix.DecideIdleLimit.String()
			logger.Warn().Dur("reseed_interval", opts.reseedInterval).Msg("the watch does not ping often enough to keep the decide connection open (" + limit + "): a sync more than " + limit + " after the last answer reads the state first")
		}
	}
	if h.ready != nil {
		h.ready(proxyLn.Addr().String(), metricsLn.Addr().String())
	}

	code := 0
	select {
	case <-ctx.Done():
	case err := <-errc:
		logger.Error().Err(err).Msg("listener failed")
		code = 1
	}
	// Drain: /readyz turns 503 at once, the metrics listener stays up meanwhile.
	shuttingDown.Store(true)
	logger.Info().Dur("timeout", opts.shutdownTimeout).Msg("shutting down, draining in-flight requests")
	drainCtx, cancel := context.WithTimeout(context.Background(), opts.shutdownTimeout)
	defer cancel()
	if err := proxySrv.Shutdown(drainCtx); err != nil {
		logger.Warn().Err(err).Msg("drain did not finish in time; closing")
		proxySrv.Close()
	}
	// the PUTs have finished: the watch stops, the last accepted configuration is written
	stopBackground()
	p.Wait()
	_ = metricsSrv.Shutdown(drainCtx)
	logger.Info().Msg("stopped")
	return code
}

// internalHandler serves /metrics, /healthz, /readyz and /debug/config — never the
// proxied API.
func internalHandler(reg *prometheus.Registry, p *proxy.Proxy, shuttingDown *atomic.Bool) http.Handler {
	r := chi.NewRouter()
	r.Method(http.MethodGet, "/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	r.Get("/readyz", func(w http.ResponseWriter, r *http.Request) {
		switch {
		case shuttingDown.Load():
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
		case !p.Ready(r.Context()):
			http.Error(w, "data plane unreachable", http.StatusServiceUnavailable)
		default:
			_, _ = io.WriteString(w, "ok\n")
		}
	})
	r.Method(http.MethodGet, "/debug/config", p.DebugHandler())
	return r
}

// redacted hides a password in --upstream (http://user:pass@…) from the log.
func redacted(upstream string) string {
	u, err := url.Parse(upstream)
	if err != nil {
		return "(unparseable)"
	}
	return u.Redacted()
}

func (o *options) logger(w io.Writer) zerolog.Logger {
	out := w
	if o.logFormat == "console" {
		out = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339}
	}
	return zerolog.New(out).Level(o.logLevel).With().Timestamp().Logger()
}
