package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/confshim/confshim/internal/testsupport/emulator"
	"github.com/confshim/confshim/internal/testsupport/testcerts"
	"github.com/confshim/confshim/internal/testsupport/wait"
)

func TestAllowCIDRs(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		allow  string
		xff    string
		status int
	}{
		{"everyone by default", "", "", http.StatusOK},
		{"loopback allowed", "127.0.0.0/8", "", http.StatusOK},
		{"single address allowed", "127.0.0.1", "", http.StatusOK},
		{"other network refused", "10.0.0.0/8", "", http.StatusForbidden},
		{"X-Forwarded-For cannot open the door", "10.0.0.0/8", "10.1.2.3", http.StatusForbidden},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cidrs, err := ParseCIDRs(tc.allow)
			if err != nil {
				t.Fatal(err)
			}
			f := newFixture(t, nil, func(c *Config) { c.AllowCIDRs = cidrs })
			hdr := withKey(nil)
			if tc.xff != "" {
				hdr["X-Forwarded-For"] = tc.xff
				hdr["X-Real-IP"] = tc.xff
			}
			r := do(t, "GET", f.url+"/apisix/admin/configs", "", hdr)
			if r.status != tc.status {
				t.Fatalf("got %d %s", r.status, r.body)
			}
			if tc.status == http.StatusForbidden {
				if !strings.HasPrefix(r.body, `{"error_msg":"confshim: `) || len(f.rec.all()) != 0 {
					t.Fatalf("a refused client gets confshim's 403 and reaches nothing: %s, upstream saw %d", r.body, len(f.rec.all()))
				}
				if got := testutil.ToFloat64(f.m.Refused.WithLabelValues("allow_cidrs")); got != 1 {
					t.Fatalf("refused{allow_cidrs} = %v", got)
				}
			}
		})
	}
	if _, err := ParseCIDRs("10.0.0.0/8, nonsense"); err == nil {
		t.Fatal("a bad entry must be an error")
	}
	if got, _ := ParseCIDRs("::ffff:10.0.0.1"); len(got) != 1 || !got[0].Contains(netip.MustParseAddr("10.0.0.1")) {
		t.Fatalf("a v4-mapped address matches its v4 peer: %v", got)
	}
}

func TestUpgradesAreRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, nil)
	for _, hdr := range []map[string]string{
		{"Connection": "Upgrade, HTTP2-Settings", "Upgrade": "h2c", "HTTP2-Settings": "AAMAAABkAARAAAAAAAIAAAAA"},
		{"Connection": "Upgrade", "Upgrade": "websocket"},
	} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(f.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "GET /apisix/admin/configs HTTP/1.1\r\nHost: x\r\nX-API-KEY: %s\r\n", key)
		for k, v := range hdr {
			fmt.Fprintf(conn, "%s: %s\r\n", k, v)
		}
		fmt.Fprint(conn, "\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		conn.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "upgrades are not allowed") {
			t.Fatalf("%v: got %d %s", hdr, resp.StatusCode, body)
		}
	}
	if len(f.rec.all()) != 0 {
		t.Fatal("an upgrade request must not reach APISIX")
	}
}

// slowPut starts a configs PUT whose body the test writes (and closes) through pw;
// APISIX's answer arrives on done.
func slowPut(t *testing.T, f *fixture, digest string) (pw *io.PipeWriter, done <-chan resp) {
	t.Helper()
	pr, pw := io.Pipe()
	answer := make(chan resp, 1)
	go func() {
		req, _ := http.NewRequest("PUT", f.url+"/apisix/admin/configs", pr)
		req.Header.Set("X-API-KEY", key)
		req.Header.Set("X-Digest", digest)
		res, err := testHTTP.Do(req)
		if err != nil {
			answer <- resp{status: -1}
			return
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		answer <- resp{status: res.StatusCode, header: res.Header, body: string(b)}
	}()
	return pw, answer
}

// TestSlowClientDoesNotHoldThePutLock: a client that trickles its body does not stop
// another client's PUT, because the body is read before the lock is taken.
func TestSlowClientDoesNotHoldThePutLock(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, nil)
	pw, slowDone := slowPut(t, f, "slow")
	_, _ = io.WriteString(pw, `{"routes_conf_version":`)                                   // half a body, then silence
	wait.For(t, "the slow PUT to be probed", func() bool { return len(f.rec.all()) >= 1 }) // and being read
	// the fast PUT lands while the slow body is still incomplete: had the slow client
	// held the lock, this would wait until the test's deadline
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "PUT", f.url+"/apisix/admin/configs", strings.NewReader(`{"routes_conf_version":5}`))
	req.Header.Set("X-API-KEY", key)
	req.Header.Set("X-Digest", "fast")
	resp, err := testHTTP.Do(req)
	if err != nil || resp.StatusCode != http.StatusAccepted {
		t.Fatalf("the fast PUT waited for the slow one: %v %v", resp, err)
	}
	resp.Body.Close()
	_, _ = io.WriteString(pw, `6}`)
	pw.Close()
	if got := <-slowDone; got.status != http.StatusAccepted {
		t.Fatalf("slow PUT: %d", got.status)
	}
}

func TestUpstreamTLS(t *testing.T) {
	t.Parallel()
	ca := testcerts.NewCA(t, "apisix-ca")
	serverPair := ca.Issue(t, "apisix")
	clientCA := testcerts.NewCA(t, "client-ca")
	clientPair := clientCA.Issue(t, "confshim")
	dir := t.TempDir()
	caFile := testcerts.Write(t, dir, "ca.pem", ca.PEM)
	certFile := testcerts.Write(t, dir, "client.pem", clientPair.CertPEM)
	keyFile := testcerts.Write(t, dir, "client-key.pem", clientPair.KeyPEM)

	em, _ := emulator.New(emulator.Options{AdminKey: key})
	start := func(mtls bool) string {
		srv := httptest.NewUnstartedServer(em)
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{serverPair.TLS(t)}}
		if mtls {
			srv.TLS.ClientAuth = tls.RequireAndVerifyClientCert
			srv.TLS.ClientCAs = clientCA.Pool()
		}
		srv.StartTLS()
		t.Cleanup(srv.Close)
		return srv.URL
	}
	plain, mutual := start(false), start(true)
	cases := []struct {
		name     string
		upstream string
		cfg      func(*Config)
		status   int
		kind     string
	}{
		{"verified with --upstream-ca-file", plain, func(c *Config) { c.UpstreamCAFile = caFile }, http.StatusOK, ""},
		{"unknown CA is a tls error", plain, nil, http.StatusBadGateway, "tls"},
		{"insecure skip verify", plain, func(c *Config) { c.UpstreamInsecureSkipVerify = true }, http.StatusOK, ""},
		{"mTLS with a client certificate", mutual, func(c *Config) {
			c.UpstreamCAFile, c.UpstreamClientCertFile, c.UpstreamClientKeyFile = caFile, certFile, keyFile
		}, http.StatusOK, ""},
		{"mTLS without a client certificate", mutual, func(c *Config) { c.UpstreamCAFile = caFile }, http.StatusBadGateway, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, http.NotFoundHandler(), func(c *Config) {
				c.Upstream = tc.upstream
				if tc.cfg != nil {
					tc.cfg(c)
				}
			})
			r := do(t, "GET", f.url+"/apisix/admin/configs", "", withKey(nil))
			if r.status != tc.status {
				t.Fatalf("got %d %s", r.status, r.body)
			}
			if tc.kind != "" {
				if got := testutil.ToFloat64(f.m.UpstreamErrors.WithLabelValues(tc.kind)); got != 1 {
					t.Fatalf("upstream errors{%s} = %v", tc.kind, got)
				}
			}
			if tc.status == http.StatusOK {
				// and a repaired PUT over the same TLS connection settings
				p := do(t, "PUT", f.url+"/apisix/admin/configs", `{"routes_conf_version":1}`, withKey(map[string]string{"X-Digest": tc.name}))
				if p.status != http.StatusAccepted && p.status != http.StatusNoContent {
					t.Fatalf("PUT over TLS: %d %s", p.status, p.body)
				}
			}
		})
	}
}

// heldPuts is a fixture whose data plane holds every PUT until release is closed;
// entered receives once per PUT that arrived, and maxInFlight counts how many APISIX
// saw at once.
type heldPuts struct {
	*fixture
	release     chan struct{}
	entered     chan struct{}
	maxInFlight atomic.Int32
}

func newHeldPuts(t *testing.T) *heldPuts {
	em, _ := emulator.New(emulator.Options{AdminKey: key})
	h := &heldPuts{release: make(chan struct{}), entered: make(chan struct{}, 4)}
	var inFlight atomic.Int32
	h.fixture = newFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			n := inFlight.Add(1)
			defer inFlight.Add(-1)
			if n > h.maxInFlight.Load() {
				h.maxInFlight.Store(n)
			}
			h.entered <- struct{}{}
			<-h.release
		}
		em.ServeHTTP(w, r)
	}), nil)
	return h
}

// putAsync sends a configs PUT in the background; its status arrives on the channel.
func putAsync(t *testing.T, f *fixture, body, digest string) <-chan int {
	status := make(chan int, 1)
	go func() {
		status <- do(t, "PUT", f.url+"/apisix/admin/configs", body, withKey(map[string]string{"X-Digest": digest})).status
	}()
	return status
}

// TestGetsGoOnWhileAPutIsInFlight: PUTs are serialised, other requests are not held up.
func TestGetsGoOnWhileAPutIsInFlight(t *testing.T) {
	t.Parallel()
	h := newHeldPuts(t)
	f, entered, release := h.fixture, h.entered, h.release
	putDone := putAsync(t, f, `{"routes_conf_version":1}`, "a")
	<-entered
	// a GET completes while the PUT is held at APISIX: it does not wait for the lock
	if r := do(t, "GET", f.url+"/apisix/admin/configs", "", withKey(nil)); r.status != http.StatusOK {
		t.Fatalf("GET during a PUT: %d", r.status)
	}
	heads := func() int { // probes: HEAD /configs, or the validate call once Server says 3.15+
		n := 0
		for _, s := range f.rec.all() {
			if s.method == http.MethodHead || s.method == http.MethodPost {
				n++
			}
		}
		return n
	}
	before := heads()
	second := putAsync(t, f, `{"routes_conf_version":2}`, "b")
	wait.For(t, "the second PUT to be probed", func() bool { return heads() > before }) // it is on its way
	close(release)
	if got := <-putDone; got != http.StatusAccepted {
		t.Fatalf("first PUT: %d", got)
	}
	if got := <-second; got != http.StatusAccepted {
		t.Fatalf("second PUT: %d", got)
	}
	if h.maxInFlight.Load() != 1 {
		t.Fatalf("%d PUTs reached APISIX at once: they must be serialised", h.maxInFlight.Load())
	}
}

func TestPassthroughBodyLimit(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, func(c *Config) { c.MaxBodyBytes = 1024 })
	big := strings.Repeat("a", 4096)
	for _, chunked := range []bool{false, true} {
		var body io.Reader = strings.NewReader(big)
		if chunked {
			body = io.MultiReader(body)
		}
		req, _ := http.NewRequest("POST", f.url+"/apisix/admin/configs/validate", body)
		req.Header.Set("X-API-KEY", key)
		resp, err := testHTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), "--max-body-bytes") {
			t.Fatalf("chunked=%v: got %d %s", chunked, resp.StatusCode, b)
		}
	}
}

func TestStateReadFailures(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		upstrm  http.HandlerFunc
		status  int
		message string
	}{
		{"state read answered 500", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) }, 502, "answered 500"},
		{"state is not JSON", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "<html>") }, 502, "cannot read the data plane's state"},
		{"connection reset", func(w http.ResponseWriter, r *http.Request) {
			conn, _, _ := http.NewResponseController(w).Hijack()
			conn.(*net.TCPConn).SetLinger(0)
			conn.Close()
		}, 502, "upstream reset"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.upstrm, nil)
			r := do(t, "PUT", f.url+"/apisix/admin/configs", `{"routes_conf_version":1}`, withKey(map[string]string{"X-Digest": "d"}))
			if r.status != tc.status || !strings.Contains(r.body, tc.message) {
				t.Fatalf("got %d %s", r.status, r.body)
			}
			if len(f.rec.puts()) != 0 {
				t.Fatal("nothing may be forwarded when the state cannot be read")
			}
		})
	}
}

func TestOddHeadStatusFallsBackToGet(t *testing.T) {
	t.Parallel()
	em, _ := emulator.New(emulator.Options{AdminKey: key})
	f := newFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodHead && r.URL.Path == "/apisix/admin/configs" {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		em.ServeHTTP(w, r)
	}), nil)
	for i, body := range []string{`{"routes_conf_version":1}`, `{"routes_conf_version":0,"routes":[{"id":"r1","uri":"/x","upstream":{"nodes":{"127.0.0.1:1980":1},"type":"roundrobin"}}]}`} {
		r := do(t, "PUT", f.url+"/apisix/admin/configs", body, withKey(map[string]string{"X-Digest": fmt.Sprint(i)}))
		if r.status != http.StatusAccepted {
			t.Fatalf("PUT %d: %d %s", i, r.status, r.body)
		}
	}
	var heads, gets int
	for _, s := range f.rec.all() {
		switch s.method {
		case http.MethodHead:
			heads++
		case http.MethodGet:
			gets++
		}
	}
	// The first PUT: the HEAD probe answers 405, so the probe is a GET, and the state is
	// read again by GET on the decide connection. The second (Server now says 3.17) is
	// a bump, which is never decided unread: the validate probe, the HEAD revalidation
	// (405) and the GET it falls back to.
	if heads != 2 || gets != 3 {
		t.Fatalf("want a GET wherever the HEAD answered 405 (2 HEAD, 3 GET), got %d HEAD %d GET", heads, gets)
	}
}

func TestClientGoneWhileSendingOrWaiting(t *testing.T) {
	t.Parallel()
	t.Run("body cut short", func(t *testing.T) {
		f := newFixture(t, nil, nil)
		conn, err := net.Dial("tcp", strings.TrimPrefix(f.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "PUT /apisix/admin/configs HTTP/1.1\r\nHost: x\r\nX-API-KEY: %s\r\nX-Digest: d\r\nContent-Length: 1000\r\n\r\n{\"routes_conf_version\":", key)
		conn.Close()
		wait.For(t, "the cut body counted as a client gone", func() bool { return testutil.ToFloat64(f.m.ClientDisconnects) >= 1 })
		if got := testutil.ToFloat64(f.m.ClientDisconnects); got != 1 || len(f.rec.puts()) != 0 {
			t.Fatalf("disconnects %v, upstream saw %d PUTs", got, len(f.rec.puts()))
		}
	})
	t.Run("gone while waiting for the PUT lock", func(t *testing.T) {
		h := newHeldPuts(t)
		f, release := h.fixture, h.release
		first := putAsync(t, f, `{"routes_conf_version":1}`, "a")
		<-h.entered
		probes := func() int {
			n := 0
			for _, s := range f.rec.all() {
				if s.method == http.MethodPost && strings.HasSuffix(s.path, "/validate") {
					n++
				}
			}
			return n
		}
		before := probes()
		// the second client gives up once confshim has let it in (its probe answered):
		// wherever that finds it, reading its body or waiting for the lock, it is a client
		// gone, never a PUT. Not a timeout, which a busy machine could run out before the
		// request even arrives.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "PUT", f.url+"/apisix/admin/configs", strings.NewReader(`{"routes_conf_version":2}`))
		req.Header.Set("X-API-KEY", key)
		req.Header.Set("X-Digest", "b")
		errc := make(chan error, 1)
		go func() {
			resp, err := testHTTP.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			errc <- err
		}()
		wait.For(t, "the second PUT's probe", func() bool { return probes() > before })
		cancel()
		if err := <-errc; err == nil {
			t.Fatal("want the waiting client's own cancellation")
		}
		wait.For(t, "the abandoned PUT counted as a client gone", func() bool { return testutil.ToFloat64(f.m.ClientDisconnects) >= 1 })
		close(release)
		if got := <-first; got != http.StatusAccepted {
			t.Fatalf("first PUT: %d", got)
		}
		if got := len(f.rec.puts()); got != 1 {
			t.Fatalf("the abandoned PUT reached APISIX: %d PUTs", got)
		}
		// counted as a client gone (499), never as answered
		wait.For(t, "the abandoned PUT counted as 499", func() bool { return testutil.ToFloat64(f.m.Requests.WithLabelValues("PUT", "configs_put", "499")) == 1 })
		if got := testutil.ToFloat64(f.m.Requests.WithLabelValues("PUT", "configs_put", "200")); got != 0 {
			t.Fatalf("a client gone while waiting counted as 200 (%v)", got)
		}
	})
}

func TestPutForwardFailsAfterTheStateRead(t *testing.T) {
	t.Parallel()
	em, _ := emulator.New(emulator.Options{AdminKey: key})
	f := newFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			conn, _, _ := http.NewResponseController(w).Hijack()
			conn.(*net.TCPConn).SetLinger(0)
			conn.Close()
			return
		}
		em.ServeHTTP(w, r)
	}), nil)
	r := do(t, "PUT", f.url+"/apisix/admin/configs", `{"routes_conf_version":1}`, withKey(map[string]string{"X-Digest": "d"}))
	if r.status != http.StatusBadGateway || !strings.Contains(r.body, "PUT /apisix/admin/configs") {
		t.Fatalf("got %d %s", r.status, r.body)
	}
	if got := testutil.ToFloat64(f.m.UpstreamErrors.WithLabelValues("reset")); got != 1 {
		t.Fatalf("upstream errors{reset} = %v", got)
	}
}

// Regression tests for what a hostile or careless client found (contract §5.5–§5.7).

func TestRefusedCallerCostsNoStateRead(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, nil)
	big := `{"routes_conf_version":1,"routes":[` + strings.Repeat(`{"id":"x","uri":"/x"},`, 1000) + `{"id":"y","uri":"/y"}]}`
	r := do(t, "PUT", f.url+"/apisix/admin/configs", big, map[string]string{"X-Digest": "d", "X-API-KEY": "guess"})
	if r.status != http.StatusUnauthorized || r.header.Get("X-Confshim-Actions") != "" {
		t.Fatalf("want APISIX's 401 and no decision, got %d %v", r.status, r.header)
	}
	var methods []string
	for _, s := range f.rec.all() {
		methods = append(methods, s.method)
	}
	if strings.Join(methods, ",") != "HEAD,PUT" {
		t.Fatalf("a refused caller gets one probe and its PUT streamed to APISIX, got %v", methods)
	}
	if put := f.rec.puts()[0]; string(put.body) != big {
		t.Fatal("the refused caller's PUT must reach APISIX as it came")
	}
}

func TestBodyBudgetAnswers503WithRetryAfter(t *testing.T) {
	t.Parallel()
	// a budget of one body: a second body waits, then is answered 503
	hold := make(chan struct{})
	em, _ := emulator.New(emulator.Options{AdminKey: key})
	f := newFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			<-hold
		}
		em.ServeHTTP(w, r)
	}), func(c *Config) {
		c.MaxBodyBytes = 1 << 10
		c.BodyBudgetBytes = 1 << 10
		c.BodyBudgetWait = 50 * time.Millisecond
	})
	body := `{"routes_conf_version":1,"pad":"` + strings.Repeat("a", 900) + `"}`
	first := make(chan int, 1)
	go func() {
		first <- do(t, "PUT", f.url+"/apisix/admin/configs", body, withKey(map[string]string{"X-Digest": "a"})).status
	}()
	wait.For(t, "the first PUT to reach the data plane", func() bool { return len(f.rec.puts()) == 1 })
	r := do(t, "PUT", f.url+"/apisix/admin/configs", body, withKey(map[string]string{"X-Digest": "b"}))
	close(hold)
	if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" || !strings.Contains(r.body, "budget") {
		t.Fatalf("want 503 with Retry-After, got %d %v %s", r.status, r.header, r.body)
	}
	if got := <-first; got != http.StatusAccepted {
		t.Fatalf("the first body: %d", got)
	}
	if got := testutil.ToFloat64(f.m.Refused.WithLabelValues("body_budget")); got != 1 {
		t.Fatalf("refused{body_budget} = %v", got)
	}
	// the budget came back: the same body now lands
	if r := do(t, "PUT", f.url+"/apisix/admin/configs", body, withKey(map[string]string{"X-Digest": "c"})); r.status != http.StatusAccepted {
		t.Fatalf("after the first body: %d", r.status)
	}
}

func TestLogsAndHeadersStayBounded(t *testing.T) {
	t.Parallel()
	t.Run("a huge repeated key name", func(t *testing.T) {
		f := newFixture(t, nil, nil)
		name := strings.Repeat("k", 256<<10)
		r := do(t, "PUT", f.url+"/apisix/admin/configs", fmt.Sprintf(`{%q:1,%q:2}`, name, name), withKey(map[string]string{"X-Digest": "d"}))
		if r.status != http.StatusBadRequest || len(r.body) > 1024 {
			t.Fatalf("want a short 400, got %d with %d bytes", r.status, len(r.body))
		}
		for _, line := range strings.Split(f.log(), "\n") {
			if len(line) > 2048 {
				t.Fatalf("a log line of %d bytes", len(line))
			}
		}
	})
	t.Run("thousands of stale unknown sections", func(t *testing.T) {
		// the data plane holds 2,000 unknown sections at version 5; the client sends them at 1
		var state, req strings.Builder
		state.WriteString(`{"routes_conf_version":0`)
		req.WriteString(`{"routes_conf_version":0`)
		for i := 0; i < 2000; i++ {
			fmt.Fprintf(&state, `,"section_with_a_long_name_%04d_conf_version":5`, i)
			fmt.Fprintf(&req, `,"section_with_a_long_name_%04d_conf_version":1`, i)
		}
		state.WriteString("}")
		req.WriteString("}")
		f := newFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.Method {
			case http.MethodGet:
				_, _ = io.WriteString(w, state.String())
			case http.MethodPut:
				_, _ = io.Copy(io.Discard, r.Body)
				w.WriteHeader(http.StatusAccepted)
			}
		}), nil)
		r := do(t, "PUT", f.url+"/apisix/admin/configs", req.String(), map[string]string{"X-Digest": "d"})
		h := r.header.Get("X-Confshim-Actions")
		if r.status != http.StatusAccepted || len(h) > 8<<10 || !strings.HasSuffix(h, ", …") {
			t.Fatalf("want the actions cut at 8 KiB with ', …', got %d, %d bytes", r.status, len(h))
		}
		for _, line := range strings.Split(f.log(), "\n") {
			if len(line) > 8<<10 {
				t.Fatalf("a log line of %d bytes", len(line))
			}
		}
	})
}

func TestBufferNotReusedWhileTheTransportSends(t *testing.T) {
	t.Parallel()
	// APISIX answers before reading the body; under -race a reused buffer shows up as a
	// race between the transport's write and the next PUT's read.
	em, _ := emulator.New(emulator.Options{AdminKey: key})
	f := newFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			w.Header().Set("Connection", "close")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error_msg":"early"}`)
			return
		}
		em.ServeHTTP(w, r)
	}), nil)
	body := `{"routes_conf_version":1,"pad":"` + strings.Repeat("b", 200<<10) + `"}`
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 5; j++ {
				do(t, "PUT", f.url+"/apisix/admin/configs", body, withKey(map[string]string{"X-Digest": fmt.Sprint(j)}))
			}
		}()
	}
	wg.Wait()
	for _, p := range f.rec.puts() {
		if len(p.body) > 0 && !strings.HasPrefix(string(p.body), `{"routes_conf_version":`) {
			t.Fatalf("a forwarded body was overwritten: %.40q", p.body)
		}
	}
}

// TestAWriteWhileTheBodyArrives: an out-of-band write lands after the probe and before
// the body is complete; whichever way confshim learns of it (a fresh revalidation, or
// APISIX's conflict and one retry), the preserved secrets survive and the sync lands.
func TestAWriteWhileTheBodyArrives(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, nil)
	pw, done := slowPut(t, f, "slow")
	_, _ = io.WriteString(pw, `{"routes_conf_version":1,"routes":[{"id":"r1","uri":"/a"}],`)
	wait.For(t, "the PUT to be probed", func() bool { return len(f.rec.all()) >= 1 })
	oob := httptest.NewRequest("PUT", "/apisix/admin/configs", strings.NewReader(`{"secrets_conf_version":5,"secrets":[{"id":"vault/1","uri":"http://v"}]}`))
	oob.Header.Set("X-API-KEY", key)
	oob.Header.Set("X-Digest", "oob")
	rec := httptest.NewRecorder()
	f.em.ServeHTTP(rec, oob)
	if rec.Code != http.StatusAccepted {
		t.Fatalf("out-of-band write: %d", rec.Code)
	}
	_, _ = io.WriteString(pw, `"secrets_conf_version":0}`)
	pw.Close()
	r := <-done
	if r.status != http.StatusAccepted || !strings.Contains(r.header.Get("X-Confshim-Actions"), "secrets=preserved") {
		t.Fatalf("%d %v %s", r.status, r.header, r.body)
	}
	if f.em.Document()["secrets"] == nil {
		t.Fatal("the out-of-band secrets were wiped")
	}
}
