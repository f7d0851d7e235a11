// Package metrics owns every confshim collector. Collectors register on the registry
// handed to New; nothing is global.
package metrics

import (
	"runtime"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics are confshim's collectors (contract §7).
type Metrics struct {
	Requests          *prometheus.CounterVec
	SectionRewrites   *prometheus.CounterVec
	ConflictRetries   prometheus.Counter
	UpstreamErrors    *prometheus.CounterVec
	ClientDisconnects prometheus.Counter
	RequestDuration   *prometheus.HistogramVec
	RewriteDuration   prometheus.Histogram
	Passthrough       *prometheus.CounterVec
	Refused           *prometheus.CounterVec
}

// UpstreamErrorKinds are the values of confshim_upstream_errors_total{kind}.
var UpstreamErrorKinds = []string{"unreachable", "timeout", "tls", "reset", "other"}

// knownSections bound the section label: a client may send any *_conf_version key.
var knownSections = []string{
	"routes", "services", "upstreams", "consumers", "consumer_groups", "ssls",
	"global_rules", "plugin_configs", "plugin_metadata", "protos", "secrets",
	"stream_routes", "plugins",
}

// New registers confshim's collectors, the Go and process collectors and a build-info
// gauge on reg.
func New(reg prometheus.Registerer, version string) *Metrics {
	const ns = "confshim"
	m := &Metrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "requests_total",
			Help: "Requests answered, by method, route (configs_put or passthrough) and status code.",
		}, []string{"method", "route", "code"}),
		SectionRewrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "section_rewrites_total",
			Help: "Sections changed in forwarded configs PUTs, by section and action (raised, bumped, preserved).",
		}, []string{"section", "action"}),
		ConflictRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "conflict_retries_total",
			Help: "Configs PUTs retried once after APISIX rejected a *_conf_version that a concurrent write had raised.",
		}),
		UpstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "upstream_errors_total",
			Help: "Upstream requests that got no HTTP answer, by kind (unreachable, timeout, tls, reset, other).",
		}, []string{"kind"}),
		ClientDisconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: ns, Name: "client_disconnects_total",
			Help: "Requests abandoned because the client went away (never counted as upstream errors).",
		}),
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
		Passthrough: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "configs_put_untouched_total",
			Help: "Configs PUTs forwarded without a rewrite because confshim could not read them, by reason.",
		}, []string{"reason"}),
	}
	m.Refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "refused_requests_total",
		Help: "Requests confshim refused before the Admin API, by reason (allow_cidrs, upgrade).",
	}, []string{"reason"})
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: ns, Name: "build_info",
		Help: "A constant 1, labelled with confshim's version and the Go version that built it.",
	}, []string{"version", "goversion"})
	buildInfo.WithLabelValues(version, runtime.Version()).Set(1)
	reg.MustRegister(m.Requests, m.SectionRewrites, m.ConflictRetries, m.UpstreamErrors,
		m.ClientDisconnects, m.RequestDuration, m.RewriteDuration, m.Passthrough, m.Refused, buildInfo,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, k := range UpstreamErrorKinds {
		m.UpstreamErrors.WithLabelValues(k) // exported at 0 so that rate() works from the start
	}
	return m
}

// SectionLabel bounds the section label to APISIX's known sections plus "other".
func SectionLabel(section string) string {
	if slices.Contains(knownSections, section) {
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
