package integration

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/confshim/confshim/metrics"
	"github.com/confshim/confshim/proxy"
	"github.com/confshim/confshim/rewrite"
)

func errorMsg(t *testing.T, body []byte) string {
	t.Helper()
	var e struct {
		ErrorMsg string `json:"error_msg"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body is not JSON: %q", body)
	}
	return e.ErrorMsg
}

func TestFaultDataPlaneDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	m := metrics.New(prometheus.NewRegistry(), "test")
	p, err := proxy.New(proxy.Config{Upstream: "http://" + addr, Preserve: rewrite.DefaultPreserve,
		MaxBodyBytes: 1 << 20, UpstreamTimeout: 5 * time.Second, Logger: zerolog.Nop(), Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	c := newClientFor(t, p)
	start := time.Now()
	status, body := c.put(t, `{"routes_conf_version":1}`)
	if status != http.StatusBadGateway || !strings.HasPrefix(errorMsg(t, body), "confshim: ") {
		t.Fatalf("want 502 with a confshim error, got %d %s", status, body)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatalf("502 took %s, want fast", time.Since(start))
	}
	if got := counter(m.UpstreamErrors.WithLabelValues("unreachable")); got < 1 {
		t.Fatalf("unreachable errors = %v", got)
	}
	if p.Ready(context.Background()) {
		t.Fatal("Ready with the data plane down")
	}
	// passthrough requests too
	status, body = c.do(t, http.MethodGet, "/apisix/admin/configs", "")
	if status != http.StatusBadGateway {
		t.Fatalf("GET: want 502, got %d %s", status, body)
	}
}

func TestFaultDataPlaneHangs(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	s := newStack(t, stackOptions{timeout: 300 * time.Millisecond, wrap: func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		})
	}})
	for _, tc := range []struct{ method, body string }{{http.MethodPut, `{"routes_conf_version":1}`}, {http.MethodGet, ""}} {
		start := time.Now()
		status, body := httpDo(t, tc.method, s.proxyURL+"/apisix/admin/configs", tc.body)
		elapsed := time.Since(start)
		if status != http.StatusGatewayTimeout || !strings.Contains(errorMsg(t, body), "--upstream-timeout") {
			t.Fatalf("%s: want 504, got %d %s", tc.method, status, body)
		}
		if elapsed < 250*time.Millisecond || elapsed > 3*time.Second {
			t.Fatalf("%s: 504 after %s, want about the 300ms timeout", tc.method, elapsed)
		}
	}
	if got := counter(s.metrics.UpstreamErrors.WithLabelValues("timeout")); got != 2 {
		t.Fatalf("timeout errors = %v, want 2", got)
	}
	if s.em.Puts() != 0 {
		t.Fatal("nothing may be forwarded when the state cannot be read")
	}
}

func TestFaultWriteSneaksInBetween(t *testing.T) {
	t.Parallel()
	var armed atomic.Bool
	var s *stack
	s = newStack(t, stackOptions{wrap: func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPut && armed.CompareAndSwap(true, false) {
				// another writer lands between confshim's state read and its PUT
				s.oobPut(t, func(doc map[string]any) {
					doc["routes_conf_version"] = doc["routes_conf_version"].(float64) + 1000
				})
			}
			h.ServeHTTP(w, r)
		})
	}})
	c := s.client(true)
	mustLand(t, sync1(t, c, config("v1")))
	registerSecrets(t, s)
	armed.Store(true)
	res := sync1(t, c, config("v2"))
	mustLand(t, res)
	if got := counter(s.metrics.ConflictRetries); got != 1 {
		t.Fatalf("conflict retries = %v, want 1", got)
	}
	if got := s.items(t, "routes"); got != routesOf("v2") {
		t.Fatalf("the retried change did not land: %s", got)
	}
}

func TestFaultDataPlaneRestart(t *testing.T) {
	t.Parallel()
	for _, o := range profiles {
		t.Run(profileName(o), func(t *testing.T) {
			s := newStack(t, o)
			c := s.client(true)
			mustLand(t, sync1(t, c, config("v1")))
			mustLand(t, sync1(t, c, config("v2")))
			s.restartDataPlane(t, restartDowntime) // state lost; confshim's cache and record describe the old one
			mustLand(t, sync1(t, c, config("v3")))
			for _, section := range []string{"routes", "services", "upstreams", "consumers"} {
				if got := s.items(t, section); got != wantItems(config("v3"), section) {
					t.Fatalf("%s after restart: %s", section, got)
				}
			}
		})
	}
}

func TestFaultSecondConflictGoesBack(t *testing.T) {
	t.Parallel()
	var s *stack
	s = newStack(t, stackOptions{wrap: func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPut && strings.Contains(r.Header.Get("X-Digest"), "confshim") || r.Method == http.MethodPut && r.Header.Get("X-Digest") == "plain" {
				s.oobPut(t, func(doc map[string]any) { doc["routes_conf_version"] = doc["routes_conf_version"].(float64) + 1000 })
			}
			h.ServeHTTP(w, r)
		})
	}})
	status, _ := rawPut(t, s.dpURL, `{"routes_conf_version":5}`, "seed")
	if status != http.StatusAccepted {
		t.Fatal(status)
	}
	status, _ = rawPut(t, s.proxyURL, `{"routes_conf_version":6}`, "plain")
	if status != http.StatusBadRequest {
		t.Fatalf("a second rejection goes back to the client: want 400, got %d", status)
	}
	if got := counter(s.metrics.ConflictRetries); got != 1 {
		t.Fatalf("retries = %v, want exactly 1", got)
	}
}

type testClient struct {
	base string
}

func newClientFor(t *testing.T, h http.Handler) testClient {
	srv := newServer(t, h)
	return testClient{base: srv}
}

func (c testClient) put(t *testing.T, body string) (int, []byte) {
	return httpDo(t, http.MethodPut, c.base+"/apisix/admin/configs", body)
}

func (c testClient) do(t *testing.T, method, path, body string) (int, []byte) {
	return httpDo(t, method, c.base+path, body)
}

func httpDo(t *testing.T, method, url, body string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("X-API-KEY", adminKey)
	req.Header.Set("X-Digest", "d")
	resp, err := testHTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}
