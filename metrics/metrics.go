// Package metrics owns every confshim collector. Collectors register on the registry
// handed to New; nothing is global.
package metrics

import (
	"github.com/confshim/confshim/internal/sections"
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics are confshim's collectors (contract §7, §8).
type Metrics struct {
	Requests          *prometheus.CounterVec
	SectionRewrites   *prometheus.CounterVec
	ConflictRetries   prometheus.Counter
	UpstreamErrors    *prometheus.CounterVec
	ClientDisconnects prometheus.Counter
	RequestDuration   *prometheus.HistogramVec
	RewriteDuration   prometheus.Histogram
	Untouched         *prometheus.CounterVec
	Refused           *prometheus.CounterVec
	NoopPuts          prometheus.Counter
	ThinnedBytes      prometheus.Counter
	Reseeds           *prometheus.CounterVec
	ReseedDuration    prometheus.Histogram
	FallbackPuts      *prometheus.CounterVec
	HeldBackItems     *prometheus.GaugeVec
	OutOfBandWrites   *prometheus.CounterVec
	ConfigTooBig      *prometheus.CounterVec
	ConfigTooBigBytes prometheus.Gauge
}

// ConfigTooBigBy is a value of confshim_config_too_big_total{answered_by}: who found
// that the configuration does not fit APISIX's standalone-config dict.
type ConfigTooBigBy string

// APISIX refused it (it decoded and validated all of it first); confshim answered a
// repeat of it without sending it.
const (
	TooBigByAPISIX   ConfigTooBigBy = "apisix"
	TooBigByConfshim ConfigTooBigBy = "confshim"
)

// Label values are typed, so that a typo is a compile error, not a new series.

// UpstreamErrorKind is a value of confshim_upstream_errors_total{kind}.
type UpstreamErrorKind string

// The kinds of contract §7.
const (
	Unreachable UpstreamErrorKind = "unreachable"
	Timeout     UpstreamErrorKind = "timeout"
	TLS         UpstreamErrorKind = "tls"
	Reset       UpstreamErrorKind = "reset"
	OtherError  UpstreamErrorKind = "other"
)

// UpstreamErrorKinds are the values of confshim_upstream_errors_total{kind}.
var UpstreamErrorKinds = []UpstreamErrorKind{Unreachable, Timeout, TLS, Reset, OtherError}

// UntouchedReason is a value of confshim_configs_put_untouched_total{reason}.
type UntouchedReason string

// Why a configs PUT went to APISIX without a rewrite.
const (
	UntouchedRefused UntouchedReason = "refused" // APISIX refused the caller's credentials
	UntouchedEncoded UntouchedReason = "encoded" // a Content-Encoding confshim does not decode (APISIX neither)
	UntouchedInvalid UntouchedReason = "invalid" // not parseable, or a non-numeric version: APISIX rejects it whole
)

// untouchedReasons are the values of confshim_configs_put_untouched_total{reason}.
var untouchedReasons = []UntouchedReason{UntouchedRefused, UntouchedEncoded, UntouchedInvalid}

// RefusedReason is a value of confshim_refused_requests_total{reason}.
type RefusedReason string

// Why confshim answered a request itself.
const (
	RefusedAllowCIDRs   RefusedReason = "allow_cidrs"
	RefusedUpgrade      RefusedReason = "upgrade"
	RefusedBodyBudget   RefusedReason = "body_budget"
	RefusedUnrepairable RefusedReason = "unrepairable"
)

// refusedReasons are the values of confshim_refused_requests_total{reason}.
var refusedReasons = []RefusedReason{RefusedAllowCIDRs, RefusedUpgrade, RefusedBodyBudget, RefusedUnrepairable}

// ReseedResult is a value of confshim_reseeds_total{result}.
type ReseedResult string

// The results of one re-seed.
const (
	ReseedRestored ReseedResult = "restored"
	ReseedFailed   ReseedResult = "failed"
	ReseedSkipped  ReseedResult = "skipped"
)

// reseedResults are the values of confshim_reseeds_total{result}.
var reseedResults = []ReseedResult{ReseedRestored, ReseedFailed, ReseedSkipped}

// FallbackResult is a value of confshim_fallback_puts_total{result} (contract §8.5).
type FallbackResult string

// What one fallback came to.
const (
	FallbackApplied     FallbackResult = "applied"     // the corrected PUT was accepted
	FallbackRejected    FallbackResult = "rejected"    // APISIX rejected the corrected PUT too
	FallbackUnavailable FallbackResult = "unavailable" // APISIX could not say which items (validate failed)
)

// fallbackResults are the values of confshim_fallback_puts_total{result}.
var fallbackResults = []FallbackResult{FallbackApplied, FallbackRejected, FallbackUnavailable}

// Route is a value of the route label.
type Route string

// The two routes: the intercepted configs PUT and everything else.
const (
	RouteConfigsPut  Route = "configs_put"
	RoutePassthrough Route = "passthrough"
)

// routes are the values of the route label.
var routes = []Route{RouteConfigsPut, RoutePassthrough}

// UpstreamError counts an upstream request that got no HTTP answer.
func (m *Metrics) UpstreamError(k UpstreamErrorKind) {
	m.UpstreamErrors.WithLabelValues(string(k)).Inc()
}

// Untouch counts a configs PUT forwarded without a rewrite.
func (m *Metrics) Untouch(r UntouchedReason) { m.Untouched.WithLabelValues(string(r)).Inc() }

// Refuse counts a request confshim answered itself.
func (m *Metrics) Refuse(r RefusedReason) { m.Refused.WithLabelValues(string(r)).Inc() }

// Reseed counts one re-seed.
func (m *Metrics) Reseed(r ReseedResult) { m.Reseeds.WithLabelValues(string(r)).Inc() }

// FallbackPut counts a configs PUT the fallback corrected, or could not (§8.5).
func (m *Metrics) FallbackPut(r FallbackResult) { m.FallbackPuts.WithLabelValues(string(r)).Inc() }

// New registers confshim's collectors, the Go and process collectors and a build-info
// gauge on reg. Every label value that alerts and dashboards use starts at 0, so that
// rate() and absent() work from the first scrape.
func New(reg prometheus.Registerer, version string) *Metrics {
	const ns = "confshim"
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help})
	}
	counterVec := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help}, labels)
	}
	m := &Metrics{
		Requests: counterVec("requests_total",
			"Requests answered, by method, route (configs_put or passthrough) and status code.", "method", "route", "code"),
		SectionRewrites: counterVec("section_rewrites_total",
			"Sections changed in forwarded configs PUTs, by section and action (raised, bumped, preserved, settled, merged, backfilled).", "section", "action"),
		ConflictRetries: counter("conflict_retries_total",
			"Configs PUTs retried once after APISIX rejected a *_conf_version that a concurrent write had raised."),
		UpstreamErrors: counterVec("upstream_errors_total",
			"Upstream requests that got no HTTP answer, by kind (unreachable, timeout, tls, reset, other).", "kind"),
		ClientDisconnects: counter("client_disconnects_total",
			"Requests abandoned because the client went away (never counted as upstream errors)."),
		RequestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "request_duration_seconds",
			Help:    "Time to answer a request, by route.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"route"}),
		RewriteDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Name: "rewrite_duration_seconds",
			Help:    "Time spent deciding on and rewriting one configs PUT body (no I/O).",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
		Untouched: counterVec("configs_put_untouched_total",
			"Configs PUTs forwarded without a rewrite, by reason (refused: APISIX refused the caller; encoded; invalid: APISIX rejects the body itself).", "reason"),
		Refused: counterVec("refused_requests_total",
			"Requests confshim answered itself without forwarding, by reason (allow_cidrs, upgrade, body_budget, unrepairable).", "reason"),
		NoopPuts: counter("noop_puts_total",
			"Configs PUTs that changed nothing on the data plane and were answered 204 with its own digest."),
		ThinnedBytes: counter("thinned_bytes_total",
			"Bytes of unchanged sections' items left out of forwarded configs PUTs (APISIX does not re-validate them)."),
		Reseeds: counterVec("reseeds_total",
			"Re-seeds of a data plane found empty, by result (restored, failed, skipped).", "result"),
		FallbackPuts: counterVec("fallback_puts_total",
			"Configs PUTs corrected after APISIX rejected an item (--fallback backfill), by result (applied, rejected, unavailable).", "result"),
		OutOfBandWrites: counterVec("out_of_band_writes_total",
			"Sections confshim learnt were written behind it, straight on the data plane (a version conflict, the watch's look, a re-read before a PUT), by section.", "section"),
		ConfigTooBig: counterVec("config_too_big_total",
			"Configs PUTs that do not fit APISIX's standalone-config shared dict, by who answered (apisix: it refused the configuration; confshim: the same configuration again on the same data plane within a minute, not sent).", "answered_by"),
		ConfigTooBigBytes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "config_too_big_bytes",
			Help: "Size of the last configuration APISIX could not store, as sent; 0 once a sync lands."}),
		HeldBackItems: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "held_back_items",
			Help: "Items held back (backfilled or left out) in the last accepted sync, by section."}, []string{"section"}),
		ReseedDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Name: "reseed_duration_seconds",
			Help:    "Time from finding the data plane empty to its configuration restored.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2, 5, 10, 30},
		}),
	}
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Name: "build_info",
		Help: "A constant 1, labelled with confshim's version and the Go version that built it.",
	}, []string{"version", "goversion"})
	buildInfo.WithLabelValues(version, runtime.Version()).Set(1)
	reg.MustRegister(m.Requests, m.SectionRewrites, m.ConflictRetries, m.UpstreamErrors,
		m.ClientDisconnects, m.RequestDuration, m.RewriteDuration, m.Untouched, m.Refused,
		m.NoopPuts, m.ThinnedBytes, m.Reseeds, m.ReseedDuration, m.FallbackPuts, m.HeldBackItems, m.OutOfBandWrites, m.ConfigTooBig, m.ConfigTooBigBytes, buildInfo,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, k := range UpstreamErrorKinds {
		m.UpstreamErrors.WithLabelValues(string(k))
	}
	for _, r := range untouchedReasons {
		m.Untouched.WithLabelValues(string(r))
	}
	for _, r := range refusedReasons {
		m.Refused.WithLabelValues(string(r))
	}
	for _, r := range reseedResults {
		m.Reseeds.WithLabelValues(string(r))
	}
	for _, r := range fallbackResults {
		m.FallbackPuts.WithLabelValues(string(r))
	}
	for _, by := range []ConfigTooBigBy{TooBigByAPISIX, TooBigByConfshim} {
		m.ConfigTooBig.WithLabelValues(string(by))
	}
	for _, s := range SectionLabels() {
		m.HeldBackItems.WithLabelValues(s)
		m.OutOfBandWrites.WithLabelValues(s)
	}
	for _, s := range append(SectionLabels(), "other") {
		for _, a := range actionLabels {
			m.SectionRewrites.WithLabelValues(s, a)
		}
	}
	for _, r := range routes {
		route := string(r)
		m.RequestDuration.WithLabelValues(route)
		for _, code := range []string{"200", "202", "204", "400", "401", "403", "413", "502", "503", "504"} {
			method := "GET"
			if route == "configs_put" {
				method = "PUT"
			}
			m.Requests.WithLabelValues(method, route, code)
		}
	}
	return m
}

// actionLabels are the header words a rewrite reports; a test holds them equal to the
// rewrite package's. The section labels are the table of sections' (internal/sections).
var actionLabels = []string{"raised", "bumped", "preserved", "settled", "merged", "backfilled"}

// SectionLabels are the values a section label takes besides "other": the known sections.
func SectionLabels() []string { return sections.APISIX().Names() }

// SectionLabel bounds the section label to APISIX's known sections plus "other".
func SectionLabel(section string) string {
	if sections.APISIX().Known(section) {
		return section
	}
	return "other"
}

// MethodLabel bounds the method label.
func MethodLabel(method string) string {
	switch method {
	case "GET", "HEAD", "PUT", "POST", "DELETE", "PATCH", "OPTIONS":
		return method
	}
	return "other"
}
