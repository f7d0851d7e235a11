package integration

import (
	"bytes"
	"crypto/sha1"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/valyala/fastjson"

	"github.com/confshim/confshim/internal/testsupport/fixture"
	"github.com/confshim/confshim/metrics"
	"github.com/confshim/confshim/proxy"
	"github.com/confshim/confshim/rewrite"
)

// steadyDataPlane answers like APISIX in the steady state of a sync loop: GET and HEAD
// give a fixed state, and a PUT is read completely and answered 204 (APISIX's
// same-digest short-circuit, which every identical sync hits). It keeps APISIX's own
// cost out of the figures, so that they show what a proxy adds.
type steadyDataPlane struct {
	state []byte
}

func (d *steadyDataPlane) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Server", "APISIX/3.17.0")
	switch {
	case r.Method == http.MethodPut:
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	case r.URL.Path == "/apisix/admin/configs":
		w.Header().Set("X-Digest", "seed")
		w.Header().Set("X-Last-Modified", "1795978900")
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodGet {
			_, _ = w.Write(d.state)
		}
	default:
		w.WriteHeader(http.StatusOK)
	}
}

type endpoint struct {
	name string
	url  string
}

// endpoints starts the data plane, a plain httputil.ReverseProxy and confshim.
func endpoints(tb testing.TB, state []byte) (direct, bare, confshim endpoint) {
	tb.Helper()
	return endpointsFor(tb, &steadyDataPlane{state: state})
}

// endpointsFor is endpoints in front of the data plane dataPlane.
func endpointsFor(tb testing.TB, dataPlane http.Handler) (direct, bare, confshim endpoint) {
	tb.Helper()
	dp := httptest.NewServer(dataPlane)
	tb.Cleanup(dp.Close)
	u, _ := url.Parse(dp.URL)
	rp := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u) }}
	bareSrv := httptest.NewServer(rp)
	tb.Cleanup(bareSrv.Close)
	p, err := proxy.New(proxy.Config{Upstream: dp.URL, Preserve: rewrite.DefaultPreserve, MaxBodyBytes: 128 << 20,
		UpstreamTimeout: time.Minute, ReseedInterval: time.Second, Logger: zerolog.Nop(), Metrics: metrics.New(prometheus.NewRegistry(), "bench")})
	if err != nil {
		tb.Fatal(err)
	}
	cs := httptest.NewServer(p)
	tb.Cleanup(cs.Close)
	return endpoint{"direct", dp.URL}, endpoint{"bareproxy", bareSrv.URL}, endpoint{"confshim", cs.URL}
}

var benchClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, DisableCompression: true}}

func sha1Hex(b []byte) string {
	s := sha1.Sum(b)
	return hex.EncodeToString(s[:])
}

// BenchmarkEndToEnd measures one configs PUT over loopback: straight to the data plane,
// through a plain reverse proxy (the floor for any proxy), through confshim with three
// stale sections and a preserved secrets section to repair, and with nothing to repair.
func BenchmarkEndToEnd(b *testing.B) {
	for _, size := range fixture.Sizes {
		runtime.GC() // the previous size's garbage must not be collected on this one's clock
		stale, clean := fixture.Stale(size.Routes), fixture.Clean(size.Routes)
		direct, bare, cs := endpoints(b, stale.State)
		_, _, csClean := endpoints(b, clean.State)
		// the same sync with a space after its first brace: another length, so confshim
		// cannot reuse the last body's layout and scans it whole (a sync that changed)
		shifted := append([]byte("{ "), stale.Request[1:]...)
		cases := []struct {
			name  string
			ep    endpoint
			body  []byte
			other []byte // when set, alternate with body
			want  string // an X-Confshim-Actions the response must carry
		}{
			{"direct", direct, stale.Request, nil, ""},
			{"bareproxy", bare, stale.Request, nil, ""},
			{"confshim", cs, stale.Request, nil, "services=raised"},
			{"confshim-clean", csClean, clean.Request, nil, ""},
			{"confshim-rescan", cs, stale.Request, shifted, ""},
		}
		for _, tc := range cases {
			runtime.GC()
			b.Run(size.Name+"/"+tc.name, func(b *testing.B) {
				digest := sha1Hex(tc.body)
				hdr, err := putOnce(b, tc.ep.url, tc.body, digest) // warm: state cached, record kept
				if err != nil {
					b.Fatal(err)
				}
				if got := hdr.Get("X-Confshim-Actions"); tc.want != "" && !bytes.Contains([]byte(got), []byte(tc.want)) {
					b.Fatalf("actions %q, want %q", got, tc.want)
				}
				b.SetBytes(int64(len(tc.body)))
				b.ReportAllocs()
				bodies, digests := [][]byte{tc.body}, []string{digest}
				if tc.other != nil {
					bodies, digests = append(bodies, tc.other), append(digests, sha1Hex(tc.other))
				}
				n := 0
				for b.Loop() {
					if _, err := putOnce(b, tc.ep.url, bodies[n%len(bodies)], digests[n%len(bodies)]); err != nil {
						b.Fatal(err)
					}
					n++
				}
			})
		}
	}
}

// BenchmarkValidate is fastjson.ValidateBytes of the same bodies: the floor for any
// proxy that must look at the body, measured in the same run.
func BenchmarkValidate(b *testing.B) {
	for _, size := range fixture.Sizes {
		body := fixture.Stale(size.Routes).Request
		b.Run(size.Name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if err := fastjson.ValidateBytes(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
