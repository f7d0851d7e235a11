package proxy

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/internal/testsupport/apisixtest"
	"github.com/confshim/confshim/internal/testsupport/emulator"
	"github.com/confshim/confshim/internal/testsupport/wait"
	"github.com/confshim/confshim/metrics"
	"github.com/confshim/confshim/rewrite"
)

const key = "test-admin-key"

// seen is one request as the upstream received it.
type seen struct {
	method, path, rawPath, query string
	header                       http.Header
	body                         []byte
	contentLength                int64
}

// recorder is a fake upstream that records requests and serves an emulator (or a
// canned answer) behind them.
type recorder struct {
	mu   sync.Mutex
	reqs []seen
	next http.Handler
}

// testHTTP sends the tests' own requests on a transport of their own: every
// httptest.Server's Close closes http.DefaultTransport's idle connections, and a
// request that had just taken one fails when another test ends beside it.
var testHTTP = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	r.reqs = append(r.reqs, seen{req.Method, req.URL.Path, req.URL.RawPath, req.URL.RawQuery, req.Header.Clone(), body, req.ContentLength})
	r.mu.Unlock()
	req.Body = io.NopCloser(bytes.NewReader(body))
	r.next.ServeHTTP(w, req)
}

func (r *recorder) all() []seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]seen(nil), r.reqs...)
}

func (r *recorder) puts() []seen {
	var out []seen
	for _, s := range r.all() {
		if s.method == http.MethodPut {
			out = append(out, s)
		}
	}
	return out
}

type fixture struct {
	p     *Proxy
	rec   *recorder
	em    *emulator.Emulator
	url   string
	m     *metrics.Metrics
	reg   *prometheus.Registry
	logs  *bytes.Buffer
	logMu *sync.Mutex
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func newFixture(t *testing.T, upstream http.Handler, mutate func(*Config)) *fixture {
	t.Helper()
	f := &fixture{reg: prometheus.NewRegistry(), logs: &bytes.Buffer{}, logMu: &sync.Mutex{}}
	record := func(next http.Handler) http.Handler {
		f.rec = &recorder{next: next}
		return f.rec
	}
	var up *apisixtest.Server
	if upstream == nil {
		up = apisixtest.Start(t, apisixtest.Options{Emulator: emulator.Options{AdminKey: key}, Wrap: record})
		f.em = up.Emulator
	} else {
		up = apisixtest.Serve(t, record(upstream))
	}
	f.m = metrics.New(f.reg, "test")
	cfg := Config{Upstream: up.URL, Preserve: rewrite.DefaultPreserve, MaxBodyBytes: 1 << 20,
		UpstreamTimeout: 5 * time.Second, Metrics: f.m,
		Logger: zerolog.New(lockedWriter{f.logMu, f.logs}).Level(zerolog.DebugLevel)}
	if mutate != nil {
		mutate(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	f.url, f.p = srv.URL, p
	return f
}

func (f *fixture) log() string {
	f.logMu.Lock()
	defer f.logMu.Unlock()
	return f.logs.String()
}

type resp struct {
	status int
	header http.Header
	body   string
}

func do(t *testing.T, method, url, body string, hdr map[string]string) resp {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	r, err := testHTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return resp{r.StatusCode, r.Header, string(b)}
}

func withKey(extra map[string]string) map[string]string {
	h := map[string]string{"X-API-KEY": key}
	for k, v := range extra {
		h[k] = v
	}
	return h
}

func TestPassthroughIsTransparent(t *testing.T) {
	t.Parallel()
	canned := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Server", "APISIX/3.17.0")
		w.Header().Set("X-Last-Modified", "1764441600")
		w.Header().Set("X-Digest", "abc")
		w.Header().Set("X-Custom", "kept")
		w.WriteHeader(218)
		_, _ = io.WriteString(w, `{"answer":"`+r.Method+`"}`)
	})
	f := newFixture(t, canned, nil)
	cases := []struct{ method, path, body string }{
		{"GET", "/apisix/admin/configs?api_key=q&x=1", ""},
		{"HEAD", "/apisix/admin", ""},
		{"POST", "/apisix/admin/configs/validate", `{"routes":[{"id":"r1"}]}`},
		{"DELETE", "/apisix/admin/configs", ""},
		{"PURGE", "/anything/else", ""},
		{"PUT", "/apisix/admin/configs/", `{"routes_conf_version":1}`}, // trailing slash: not the configs route
		{"PUT", "/apisix/admin/routes/1", `not json`},
		{"PATCH", "/apisix/admin/configs", `x`},
	}
	for _, tc := range cases {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			before := len(f.rec.all())
			r := do(t, tc.method, f.url+tc.path, tc.body, withKey(map[string]string{"Cookie": "x_api_key=c", "X-Other": "o"}))
			if r.status != 218 || r.header.Get("X-Custom") != "kept" || r.header.Get("Server") != "APISIX/3.17.0" ||
				r.header.Get("X-Last-Modified") != "1764441600" || r.header.Get("X-Digest") != "abc" {
				t.Fatalf("response changed: %d %v", r.status, r.header)
			}
			if tc.method != "HEAD" && r.body != `{"answer":"`+tc.method+`"}` {
				t.Fatalf("body changed: %q", r.body)
			}
			got := f.rec.all()
			if len(got) != before+1 {
				t.Fatalf("upstream saw %d requests, want exactly the forwarded one", len(got)-before)
			}
			s := got[len(got)-1]
			wantPath, wantQuery, _ := strings.Cut(tc.path, "?")
			if s.method != tc.method || s.path != wantPath || s.query != wantQuery || string(s.body) != tc.body ||
				s.header.Get("X-API-KEY") != key || s.header.Get("Cookie") != "x_api_key=c" || s.header.Get("X-Other") != "o" {
				t.Fatalf("forwarded request changed: %+v", s)
			}
		})
	}
}

func TestConfigsPutIsRepaired(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, nil)
	// an operator's secrets manager, straight on the data plane
	seed := `{"routes_conf_version":5,"routes":[{"id":"r1","uri":"/a"}],"secrets_conf_version":2,"secrets":[{"id":"vault/1","uri":"http://v"}]}`
	seedReq := httptest.NewRequest("PUT", "/apisix/admin/configs", strings.NewReader(seed))
	seedReq.Header.Set("X-API-KEY", key)
	seedReq.Header.Set("X-Digest", "seed")
	rec := httptest.NewRecorder()
	f.em.ServeHTTP(rec, seedReq)
	if rec.Code != 202 {
		t.Fatalf("seed: %d %s", rec.Code, rec.Body)
	}
	body := `{"routes_conf_version":3,"routes":[{"id":"r1","uri":"/a"}],"upstreams_conf_version":2,"upstreams":[{"id":"u1","type":"roundrobin","nodes":{"127.0.0.1:80":1}}],"secrets_conf_version":0}`
	r := do(t, "PUT", f.url+"/apisix/admin/configs", body, withKey(map[string]string{"X-Digest": "client", "Expect": ""}))
	if r.status != http.StatusAccepted {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if got := r.header.Get("X-Confshim-Actions"); got != "consumer_groups=preserved, plugin_configs=preserved, plugins=preserved, protos=preserved, routes=raised, secrets=preserved" {
		t.Fatalf("actions %q", got)
	}
	put := f.rec.puts()[0]
	// routes is raised and, kept by APISIX, sent without its items (§8.3)
	want := `{"routes_conf_version":5,"upstreams_conf_version":2,"upstreams":[{"id":"u1","type":"roundrobin","nodes":{"127.0.0.1:80":1}}],"secrets_conf_version":2,"consumer_groups_conf_version":1,"plugin_configs_conf_version":1,"plugins_conf_version":1,"protos_conf_version":1}`
	if string(put.body) != want {
		t.Fatalf("forwarded\n%s\nwant\n%s", put.body, want)
	}
	if put.contentLength != int64(len(want)) || put.header.Get("Expect") != "" {
		t.Fatalf("Content-Length %d for %d bytes; Expect %q", put.contentLength, len(want), put.header.Get("Expect"))
	}
	if d := put.header.Get("X-Digest"); !strings.HasPrefix(d, "client+confshim:") || len(d) != len("client+confshim:")+16 {
		t.Fatalf("digest %q", d)
	}
	if f.em.Document()["secrets"] == nil {
		t.Fatal("the preserved secrets manager was lost")
	}
	// Again: upstreams is now unchanged too and sent without items, a new rewrite (202;
	// the sections the client leaves out still change). The same body once more is the
	// same rewrite: same digest, APISIX answers 204.
	for _, want := range []int{http.StatusAccepted, http.StatusNoContent} {
		r = do(t, "PUT", f.url+"/apisix/admin/configs", body, withKey(map[string]string{"X-Digest": "client"}))
		if r.status != want {
			t.Fatalf("repeat: want %d, got %d", want, r.status)
		}
	}
	if got := testutil.ToFloat64(f.m.SectionRewrites.WithLabelValues("routes", "raised")); got != 3 {
		t.Fatalf("routes raised counted %v times", got)
	}
}

func TestConfigsPutPathNormalisation(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, nil)
	r := do(t, "PUT", f.url+"//apisix/admin/./configs", `{"routes_conf_version":1}`, withKey(map[string]string{"X-Digest": "d"}))
	if r.status != http.StatusAccepted || r.header.Get("X-Confshim-Actions") == "" {
		t.Fatalf("a path nginx reads as /apisix/admin/configs must be repaired too: %d %v", r.status, r.header)
	}
	reqs := f.rec.all()
	if reqs[0].method != http.MethodHead || reqs[0].path != apisix.ConfigsPath || reqs[len(reqs)-1].path != "//apisix/admin/./configs" {
		t.Fatalf("want a probe, a state read and the PUT on the client's path, got %+v", reqs)
	}
}

func TestConfigsPutErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		body     string
		hdr      map[string]string
		chunked  bool
		status   int
		msg      string
		forwards bool // the body reaches APISIX untouched
	}{
		{name: "array body", body: `[{"routes_conf_version":1}]`, status: 400, msg: "must be an object"},
		{name: "string body", body: ` "x"`, status: 400, msg: "must be an object"},
		{name: "number body", body: `5`, status: 400, msg: "must be an object"},
		{name: "null body", body: `null`, status: 400, msg: "must be an object"},
		{name: "too large", body: `{"x":"` + strings.Repeat("a", 1<<20) + `"}`, status: 413, msg: "--max-body-bytes"},
		{name: "too large without Content-Length", body: `{"x":"` + strings.Repeat("a", 1<<20) + `"}`, chunked: true, status: 413, msg: "--max-body-bytes"},
		{name: "invalid JSON goes to APISIX", body: `{abcd`, status: 400, msg: "invalid request body: Expected object key string but found invalid token at character 2", forwards: true},
		{name: "string version goes to APISIX", body: `{"routes_conf_version":"15"}`, status: 400, msg: "routes_conf_version must be a number", forwards: true},
		{name: "duplicate keys refused", body: `{"routes_conf_version":1,"routes_conf_version":2}`, status: 400, msg: "appears twice"},
		{name: "escaped duplicate keys refused", body: `{"secrets":[],"s\u0065crets":[{"id":"v/1"}]}`, status: 400, msg: "appears twice"},
		{name: "YAML array refused", body: "- routes_conf_version: 3\n", hdr: map[string]string{"Content-Type": "application/yaml"}, status: 400, msg: "must be an object"},
		{name: "YAML that cannot be placed refused", body: "routes: [\n", hdr: map[string]string{"Content-Type": "application/yaml"}, status: 400, msg: "YAML body"},
		{name: "YAML with a top-level merge key refused", body: "<<: {secrets_conf_version: 9}\nroutes_conf_version: 1\n", hdr: map[string]string{"Content-Type": "application/yaml"}, status: 400, msg: "merge key"},
		{name: "an empty YAML document refused", body: "# nothing\n", hdr: map[string]string{"Content-Type": "application/yaml"}, status: 400, msg: "must be an object"},
		{name: "gzip goes to APISIX", body: "\x1f\x8b\x08\x00gzipped", hdr: map[string]string{"Content-Encoding": "gzip"}, status: 400, msg: "invalid request body", forwards: true},
		{name: "wrong key: APISIX refuses", body: `{"routes_conf_version":1}`, hdr: map[string]string{"X-API-KEY": "wrong"}, status: 401, msg: "failed to check token", forwards: true},
		{name: "empty body goes to APISIX", body: ``, status: 400, msg: "invalid request body: empty request body", forwards: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, nil, nil)
			hdr := withKey(map[string]string{"X-Digest": "d"})
			for k, v := range tc.hdr {
				hdr[k] = v
			}
			var rd io.Reader = strings.NewReader(tc.body)
			if tc.chunked {
				rd = io.MultiReader(rd) // hides the length: chunked
			}
			req, _ := http.NewRequest("PUT", f.url+"/apisix/admin/configs", rd)
			for k, v := range hdr {
				req.Header.Set(k, v)
			}
			res, err := testHTTP.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != tc.status || !strings.Contains(string(b), tc.msg) {
				t.Fatalf("got %d %s, want %d with %q", res.StatusCode, b, tc.status, tc.msg)
			}
			puts := f.rec.puts()
			if !tc.forwards {
				if len(puts) != 0 {
					t.Fatalf("nothing may be forwarded, upstream got %d PUTs", len(puts))
				}
				if !strings.HasPrefix(string(b), `{"error_msg":"confshim: `) {
					t.Fatalf("confshim's errors are APISIX-shaped: %s", b)
				}
				return
			}
			if len(puts) != 1 || string(puts[0].body) != tc.body || puts[0].header.Get("X-Digest") != "d" {
				t.Fatalf("want the body forwarded untouched once, got %+v", puts)
			}
			if res.Header.Get("X-Confshim-Actions") != "" {
				t.Fatal("an untouched body gets no actions header")
			}
		})
	}
}

func TestStateReadUsesTheCallersCredentials(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, query string
		hdr         map[string]string
		check       func(s seen) bool
	}{
		{"query", "?api_key=" + key, nil, func(s seen) bool { return s.query == "api_key="+key && s.header.Get("X-API-KEY") == "" }},
		{"cookie", "", map[string]string{"Cookie": "x_api_key=" + key}, func(s seen) bool {
			return strings.Contains(s.header.Get("Cookie"), "x_api_key="+key) && s.header.Get("X-API-KEY") == ""
		}},
		{"last of two cookies", "", map[string]string{"Cookie": "x_api_key=wrong; x_api_key=" + key}, func(s seen) bool {
			return s.header.Get("Cookie") == "x_api_key=wrong; x_api_key="+key
		}},
		{"header", "", map[string]string{"X-API-KEY": key}, func(s seen) bool { return s.header.Get("X-API-KEY") == key }},
		{"header with underscores", "", map[string]string{"X_API_KEY": key}, func(s seen) bool { return s.header.Get("X_API_KEY") == key }},
		{"header mixed", "", map[string]string{"X-Api_Key": key}, func(s seen) bool { return s.header.Get("X-Api_Key") == key }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, nil, func(c *Config) { c.AdminKey = "never-used" })
			hdr := map[string]string{"X-Digest": "d"}
			for k, v := range tc.hdr {
				hdr[k] = v
			}
			r := do(t, "PUT", f.url+"/apisix/admin/configs"+tc.query, `{"routes_conf_version":1}`, hdr)
			if r.status != http.StatusAccepted || r.header.Get("X-Confshim-Actions") == "" {
				t.Fatalf("the repair must see the key APISIX sees: %d %s %v", r.status, r.body, r.header)
			}
			for _, read := range f.rec.all() {
				if read.method != http.MethodPut && !tc.check(read) {
					t.Fatalf("state read did not carry the caller's credentials as sent: %+v", read)
				}
			}
		})
	}
	t.Run("not keys to APISIX", func(t *testing.T) {
		for _, tc := range []struct{ query, cookie string }{{"?API_KEY=" + key, ""}, {"", "X_API_KEY=" + key}} {
			f := newFixture(t, nil, nil)
			hdr := map[string]string{"X-Digest": "d"}
			if tc.cookie != "" {
				hdr["Cookie"] = tc.cookie
			}
			r := do(t, "PUT", f.url+"/apisix/admin/configs"+tc.query, `{"routes_conf_version":1}`, hdr)
			if r.status != http.StatusUnauthorized || r.header.Get("X-Confshim-Actions") != "" {
				t.Fatalf("%q %q: want APISIX's 401 and no decision, got %d %v", tc.query, tc.cookie, r.status, r.header)
			}
		}
	})
	t.Run("admin key never used for a caller", func(t *testing.T) {
		f := newFixture(t, nil, func(c *Config) { c.AdminKey = key })
		r := do(t, "PUT", f.url+"/apisix/admin/configs", `{"routes_conf_version":1}`, map[string]string{"X-Digest": "d"})
		if r.status != http.StatusUnauthorized || r.header.Get("X-Confshim-Actions") != "" {
			t.Fatalf("a key-less caller gets APISIX's refusal and learns no decision: %d %v", r.status, r.header)
		}
		for _, s := range f.rec.all() {
			if s.header.Get("X-API-KEY") != "" {
				t.Fatalf("%s carried --admin-key for a caller", s.method)
			}
			if s.method == http.MethodGet {
				t.Fatal("a refused caller's PUT must not cost a state read")
			}
		}
		if got := testutil.ToFloat64(f.m.Untouched.WithLabelValues("refused")); got != 1 {
			t.Fatalf("untouched{refused} = %v", got)
		}
	})
}

func TestClientGoneIsNotAnUpstreamError(t *testing.T) {
	t.Parallel()
	hang := make(chan struct{})
	defer close(hang)
	f := newFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", f.url+"/apisix/admin/configs", nil)
	if _, err := testHTTP.Do(req); err == nil {
		t.Fatal("want the client's own timeout")
	}
	wait.For(t, "the client's disconnect to be counted", func() bool { return testutil.ToFloat64(f.m.ClientDisconnects) >= 1 })
	if got := testutil.ToFloat64(f.m.ClientDisconnects); got != 1 {
		t.Fatalf("client disconnects = %v", got)
	}
	for _, kind := range metrics.UpstreamErrorKinds {
		if got := testutil.ToFloat64(f.m.UpstreamErrors.WithLabelValues(string(kind))); got != 0 {
			t.Fatalf("upstream errors{%s} = %v", kind, got)
		}
	}
}

// TestLogsNeverLeakSecrets sends the admin key in every form and a body full of
// secrets, valid and broken, and reads the whole log.
func TestLogsNeverLeakSecrets(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, nil)
	secretBody := `{"routes_conf_version":1,"ssls":[{"id":"s1","cert":"c","key":"-----BEGIN PRIVATE KEY-----SSLSECRET"}],"consumers":[{"username":"u","plugins":{"key-auth":{"key":"CONSUMERSECRET"}}}],"secrets":[{"id":"vault/1","token":"VAULTTOKEN"}]}`
	forms := []struct {
		query string
		hdr   map[string]string
	}{
		{"", map[string]string{"X-API-KEY": key}},
		{"?api_key=" + key, nil},
		{"", map[string]string{"Cookie": "x_api_key=" + key}},
	}
	for _, form := range forms {
		for _, body := range []string{secretBody, secretBody[:40] + "BROKEN" + secretBody[40:], `[` + secretBody + `]`} {
			hdr := map[string]string{"X-Digest": "d"}
			for k, v := range form.hdr {
				hdr[k] = v
			}
			do(t, "PUT", f.url+"/apisix/admin/configs"+form.query, body, hdr)
			do(t, "GET", f.url+"/apisix/admin/configs"+form.query, "", hdr)
		}
	}
	log := f.log()
	if !strings.Contains(log, `"event":"access"`) || !strings.Contains(log, `"event":"rewrite"`) {
		t.Fatalf("the log should hold access and decision lines: %s", log)
	}
	for _, secret := range []string{key, "SSLSECRET", "PRIVATE KEY", "CONSUMERSECRET", "VAULTTOKEN", "api_key"} {
		if strings.Contains(log, secret) {
			t.Fatalf("the log leaks %q:\n%s", secret, log)
		}
	}
}

func TestMetricsExposition(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, func(c *Config) { c.Preserve = []string{"secrets"} })
	do(t, "PUT", f.url+"/apisix/admin/configs", `{"routes_conf_version":2,"routes":[{"id":"r1","uri":"/a"}],"secrets_conf_version":0,"upstreams_conf_version":1}`, withKey(map[string]string{"X-Digest": "a"}))
	do(t, "PUT", f.url+"/apisix/admin/configs", `{"routes_conf_version":1,"routes":[{"id":"r1","uri":"/a"}],"secrets":[{"id":"v/1"}],"secrets_conf_version":1}`, withKey(map[string]string{"X-Digest": "b"}))
	for _, c := range []struct {
		section, action string
		want            float64
	}{{"secrets", "preserved", 1}, {"routes", "raised", 1}, {"upstreams", "settled", 1}, {"routes", "bumped", 0}, {"other", "settled", 0}} {
		if got := testutil.ToFloat64(f.m.SectionRewrites.WithLabelValues(c.section, c.action)); got != c.want {
			t.Fatalf("%s=%s counted %v, want %v", c.section, c.action, got, c.want)
		}
	}
	if got := testutil.ToFloat64(f.m.Requests.WithLabelValues("PUT", "configs_put", "202")); got != 2 {
		t.Fatalf("configs PUTs answered 202: %v", got)
	}
	// every series alerts and dashboards use exists from the start (at 0)
	n, err := testutil.GatherAndCount(f.reg, "confshim_section_rewrites_total")
	if err != nil || n != (len(rewrite.KnownSections)+1)*len(rewrite.AllActions) {
		t.Fatalf("section × action series: %d %v", n, err)
	}
	n, err = testutil.GatherAndCount(f.reg, "confshim_build_info", "go_goroutines", "process_cpu_seconds_total", "confshim_noop_puts_total", "confshim_thinned_bytes_total", "confshim_reseeds_total")
	if err != nil || n < 6 {
		t.Fatalf("build info, Go and process collectors, §8 counters: %d %v", n, err)
	}
}

func TestReady(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, nil)
	p, _ := New(Config{Upstream: f.url, MaxBodyBytes: 1, UpstreamTimeout: time.Second, Metrics: metrics.New(prometheus.NewRegistry(), "t")})
	if !p.Ready(context.Background()) {
		t.Fatal("not ready with a data plane that answers")
	}
}

func TestNewReportsEverySettingAtFault(t *testing.T) {
	t.Parallel()
	_, err := New(Config{Upstream: "ftp://x", MaxBodyBytes: 0, UpstreamTimeout: 0, UpstreamCAFile: "/nonexistent", Metrics: metrics.New(prometheus.NewRegistry(), "t")})
	if err == nil {
		t.Fatal("want errors")
	}
	for _, name := range []string{"--upstream", "--max-body-bytes", "--upstream-timeout", "--upstream-ca-file"} {
		if !strings.Contains(err.Error(), name) {
			t.Fatalf("error %q does not name %s", err, name)
		}
	}
	_, err = New(Config{Upstream: "https://x", MaxBodyBytes: 1, UpstreamTimeout: time.Second, UpstreamClientCertFile: "/nonexistent.pem", UpstreamClientKeyFile: "/nonexistent.key", Metrics: metrics.New(prometheus.NewRegistry(), "t")})
	if err == nil || !strings.Contains(err.Error(), "--upstream-client-cert-file") {
		t.Fatalf("an unreadable client certificate names its flag: %v", err)
	}
}

func TestYAMLPuts(t *testing.T) {
	t.Parallel()
	t.Run("repaired by splicing the client's YAML", func(t *testing.T) {
		f := newFixture(t, nil, func(c *Config) { c.Preserve = nil })
		seed := httptest.NewRequest("PUT", "/apisix/admin/configs", strings.NewReader(`{"routes_conf_version":9}`))
		seed.Header.Set("X-API-KEY", key)
		seed.Header.Set("X-Digest", "seed")
		f.em.ServeHTTP(httptest.NewRecorder(), seed)
		body := "# ADC never sends YAML, but APISIX accepts it\nroutes_conf_version: 3\nroutes:\n  - id: r1\n    uri: /a\n    enable_websocket: yes\n"
		start := time.Now()
		r := do(t, "PUT", f.url+"/apisix/admin/configs", body, withKey(map[string]string{"X-Digest": "y1", "Content-Type": "application/yaml"}))
		if r.status != http.StatusAccepted || r.header.Get("X-Confshim-Actions") != "routes=bumped" {
			t.Fatalf("%d %v %s", r.status, r.header, r.body)
		}
		put := f.rec.puts()[0]
		// bumped above the data plane's 9 to the clock's milliseconds (§5.1)
		m := regexp.MustCompile(`routes_conf_version: (\d+)\n`).FindSubmatch(put.body)
		if m == nil {
			t.Fatalf("forwarded %q", put.body)
		}
		if v, _ := strconv.ParseInt(string(m[1]), 10, 64); v < start.UnixMilli() || v > time.Now().UnixMilli() {
			t.Fatalf("bumped to %d, want the clock's milliseconds", v)
		}
		want := strings.Replace(body, "routes_conf_version: 3", "routes_conf_version: "+string(m[1]), 1)
		if string(put.body) != want || put.header.Get("Content-Type") != "application/yaml" || !strings.HasPrefix(put.header.Get("X-Digest"), "y1+confshim:") {
			t.Fatalf("forwarded %q (%s, digest %s), want %q", put.body, put.header.Get("Content-Type"), put.header.Get("X-Digest"), want)
		}
	})
	t.Run("nothing to repair: the YAML bytes go through", func(t *testing.T) {
		f := newFixture(t, nil, func(c *Config) { c.Preserve = nil })
		body := "routes_conf_version: 3\n"
		r := do(t, "PUT", f.url+"/apisix/admin/configs", body, withKey(map[string]string{"X-Digest": "y1", "Content-Type": "application/yaml; charset=utf-8"}))
		if r.status != http.StatusAccepted || r.header.Get("X-Confshim-Actions") != "" {
			t.Fatalf("%d %v", r.status, r.header)
		}
		put := f.rec.puts()[0]
		if string(put.body) != body || put.header.Get("Content-Type") != "application/yaml; charset=utf-8" || put.header.Get("X-Digest") != "y1" {
			t.Fatalf("want the YAML untouched, got %q %v", put.body, put.header)
		}
	})
	t.Run("encoded bodies are counted", func(t *testing.T) {
		f := newFixture(t, nil, nil)
		do(t, "PUT", f.url+"/apisix/admin/configs", "x", withKey(map[string]string{"X-Digest": "d", "Content-Encoding": "br"}))
		if got := testutil.ToFloat64(f.m.Untouched.WithLabelValues("encoded")); got != 1 {
			t.Fatalf("untouched{encoded} = %v", got)
		}
	})
}
