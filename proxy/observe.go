package proxy

import (
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/rs/zerolog"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/metrics"
)

// statusWriter records the status and size of a response; Unwrap keeps Flush and
// friends reachable through http.ResponseController for the streaming proxy.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	if code == statusClientGone { // client gone: nothing to send
		return
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	n, err := s.ResponseWriter.Write(b)
	s.bytes += int64(n)
	return n, err
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// observe logs one access line per request and feeds the request metrics. It logs
// the path only: the query may carry api_key, headers and cookies the admin key,
// bodies SSL keys and consumer credentials.
func observe(log zerolog.Logger, m *metrics.Metrics) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			sw := &statusWriter{ResponseWriter: w}
			next.ServeHTTP(sw, r)
			route := metrics.RoutePassthrough
			if rctx := chi.RouteContext(r.Context()); rctx != nil && rctx.RoutePattern() == apisix.ConfigsPath {
				route = metrics.RouteConfigsPut
			}
			if sw.status == 0 {
				sw.status = http.StatusOK
			}
			elapsed := time.Since(start)
			m.Requests.WithLabelValues(metrics.MethodLabel(r.Method), string(route), strconv.Itoa(sw.status)).Inc()
			m.RequestDuration.WithLabelValues(string(route)).Observe(elapsed.Seconds())
			log.Info().
				Str("event", "access").
				Str("method", r.Method).
				Str("path", r.URL.Path).
				Str("route", string(route)).
				Int("status", sw.status).
				Int64("bytes_in", r.ContentLength).
				Int64("bytes_out", sw.bytes).
				Float64("duration_ms", float64(elapsed.Microseconds())/1000).
				Str("remote", r.RemoteAddr).
				Msg("request")
		})
	}
}
