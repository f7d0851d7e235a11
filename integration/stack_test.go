package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/confshim/confshim/internal/testsupport/adcclient"
	"github.com/confshim/confshim/internal/testsupport/apisixtest"
	"github.com/confshim/confshim/internal/testsupport/emulator"
	"github.com/confshim/confshim/metrics"
	"github.com/confshim/confshim/proxy"
	"github.com/confshim/confshim/rewrite"
)

const adminKey = "test-admin-key"

// stack is an emulated APISIX with confshim in front of it.
type stack struct {
	em       *emulator.Emulator
	dpURL    string // the bare data plane
	proxyURL string // confshim
	metrics  *metrics.Metrics
	logs     *syncBuffer

	opts      stackOptions
	timeout   time.Duration
	stopProxy func()
	dp        *apisixtest.Server
	proxy     *proxy.Proxy
}

// restartDataPlane is a container restart: the port closes for down, the emulator
// forgets its configuration, the port answers again.
func (s *stack) restartDataPlane(t testing.TB, down time.Duration) {
	t.Helper()
	s.dp.Restart(t, down)
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type stackOptions struct {
	fillDefaults bool
	version      string
	// wrap lets a test put faults between confshim and the emulator.
	wrap    func(http.Handler) http.Handler
	timeout time.Duration
	// re-seeding (§8.4): the watch interval, --state-dir and --admin-key
	reseed   time.Duration
	stateDir string
	adminKey string
	// safety is the watch's safety-check interval (0: the default minute)
	safety time.Duration
	// merge is --merge; preserve, when set, replaces the default --preserve
	merge    []string
	preserve []string
	fallback bool // --fallback backfill
	// appliedLag: the emulator's workers apply a 202 this late (state-dependent checks)
	appliedLag time.Duration
	// decodeCost is the emulator's cost of one decode per MiB stored (0: APISIX's)
	decodeCost time.Duration
	// trust is --trust-connection ("": auto); fallbackAnswer is --fallback-answer
	trust          proxy.TrustMode
	fallbackAnswer proxy.FallbackAnswer
	fallbackBudget time.Duration // 0: the contract's 10 s
	skipItemLists  bool          // the benchmarks' baseline without the ids each sync touched
	dictSize       int           // the emulator's standalone-config dict (0: APISIX's 10m)
}

func newStack(t testing.TB, o stackOptions) *stack {
	t.Helper()
	dpSrv := apisixtest.Start(t, apisixtest.Options{Wrap: o.wrap, Emulator: emulator.Options{Version: o.version, AdminKey: adminKey,
		FillDefaults: o.fillDefaults, AppliedLag: o.appliedLag, DecodeCost: o.decodeCost, DictSize: o.dictSize}})
	em := dpSrv.Emulator
	s := &stack{em: em, logs: &syncBuffer{}, dp: dpSrv}
	timeout := o.timeout
	if timeout == 0 {
		timeout = 10 * time.Second
	}
	s.dpURL, s.opts, s.timeout = dpSrv.URL, o, timeout
	s.startProxy(t)
	return s
}

// startProxy starts (or, called again, restarts) confshim in front of the data plane.
func (s *stack) startProxy(t testing.TB) {
	t.Helper()
	if s.stopProxy != nil {
		s.stopProxy() // the old process is gone, its state file written, before the new one reads it
	}
	s.metrics = metrics.New(prometheus.NewRegistry(), "test")
	p, err := proxy.New(proxy.Config{
		Upstream:            s.dpURL,
		Preserve:            s.preserveList(),
		Merge:               s.opts.merge,
		Fallback:            s.opts.fallback,
		FallbackAnswer:      s.opts.fallbackAnswer,
		FallbackBudget:      s.opts.fallbackBudget,
		SkipItemLists:       s.opts.skipItemLists,
		TrustConnection:     s.opts.trust,
		MaxBodyBytes:        64 << 20,
		UpstreamTimeout:     s.timeout,
		AdminKey:            s.opts.adminKey,
		ReseedInterval:      s.opts.reseed,
		StateDir:            s.opts.stateDir,
		WatchSafetyInterval: s.opts.safety,
		Logger:              zerolog.New(s.logs).Level(zerolog.DebugLevel),
		Metrics:             s.metrics,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.StartBackground(ctx)
	pSrv := httptest.NewServer(p)
	s.proxy = p
	var once sync.Once
	s.stopProxy = func() { once.Do(func() { pSrv.Close(); cancel(); p.Wait() }) }
	t.Cleanup(s.stopProxy)
	s.proxyURL = pSrv.URL
}

// preserveList is --preserve as main would resolve it: the default minus merged sections.
func (s *stack) preserveList() []string {
	if s.opts.preserve != nil {
		return s.opts.preserve
	}
	var out []string
	for _, p := range rewrite.DefaultPreserve {
		if !slices.Contains(s.opts.merge, p) {
			out = append(out, p)
		}
	}
	return out
}

// via returns a client talking to confshim (through=true) or to the bare data plane.
func (s *stack) client(through bool) *adcclient.Client {
	if through {
		return adcclient.New(s.proxyURL, adminKey)
	}
	return adcclient.New(s.dpURL, adminKey)
}

// doc is the data plane's stored document.
func (s *stack) doc(t testing.TB) map[string]any {
	t.Helper()
	d := s.em.Document()
	if d == nil {
		t.Fatal("nothing stored on the data plane")
	}
	return d
}

// items returns a section's stored items as canonical JSON without modifiedIndex.
func (s *stack) items(t testing.TB, section string) string {
	t.Helper()
	raw, _ := json.Marshal(s.doc(t)[section])
	return canonicalItems(raw)
}

func canonicalItems(raw []byte) string {
	var items []map[string]any
	_ = json.Unmarshal(raw, &items)
	for _, it := range items {
		delete(it, "modifiedIndex")
		for k, v := range fillDefaultKeys {
			if it[k] == v {
				delete(it, k)
			}
		}
	}
	b, _ := json.Marshal(items)
	return string(b)
}

// fillDefaultKeys are what --fill-defaults adds: ignored when comparing content.
var fillDefaultKeys = map[string]any{"pass_host": "pass", "hash_on": "vars", "priority": float64(0)}

func wantItems(cfg adcclient.Config, section string) string {
	raw, _ := json.Marshal(cfg[section])
	return canonicalItems(raw)
}

// oobPut writes straight to the data plane, as an operator or another tool would:
// it reads the document, applies change, and PUTs it with every other version kept.
func (s *stack) oobPut(t testing.TB, change func(doc map[string]any)) {
	t.Helper()
	doc := s.doc(t)
	delete(doc, "X-Digest")
	delete(doc, "X-Last-Modified")
	change(doc)
	body, _ := json.Marshal(doc)
	adminPut(t, s.dpURL, string(body), fmt.Sprintf("oob-%d", time.Now().UnixNano()))
}

// writeSecret is the operator's vault manager written (or its token rotated) straight on
// the data plane, every other section kept.
func (s *stack) writeSecret(t testing.TB, token string) {
	t.Helper()
	s.oobPut(t, func(doc map[string]any) {
		doc["secrets_conf_version"] = doc["secrets_conf_version"].(float64) + 1
		doc["secrets"] = []any{secretItem("vault/1", token)}
	})
}

// configsPut sends one PUT /apisix/admin/configs with the admin key and a digest, and
// reads the answer to its end (so that the connection is reused).
func configsPut(base string, body []byte, digest string) (int, http.Header, error) {
	req, err := http.NewRequest(http.MethodPut, base+"/apisix/admin/configs", bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("X-API-KEY", adminKey)
	req.Header.Set("X-Digest", digest)
	req.Header.Set("Content-Type", "application/json")
	resp, err := benchClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header, nil
}

// rawPut is configsPut for a test: a transport error fails it.
func rawPut(t testing.TB, base, body, digest string) (int, http.Header) {
	t.Helper()
	status, hdr, err := configsPut(base, []byte(body), digest)
	if err != nil {
		t.Fatal(err)
	}
	return status, hdr
}

// adminPut writes straight to a data plane's Admin API and expects 202.
func adminPut(t testing.TB, admin, body, digest string) {
	t.Helper()
	if status, _ := rawPut(t, admin, body, digest); status != http.StatusAccepted {
		t.Fatalf("out-of-band PUT: %d", status)
	}
}

// putOnce sends one ADC-shaped PUT and checks that it landed (benchmarks, load).
func putOnce(_ testing.TB, base string, body []byte, digest string) (http.Header, error) {
	status, hdr, err := configsPut(base, body, digest)
	if err == nil && status/100 != 2 {
		err = fmt.Errorf("PUT: %d", status)
	}
	return hdr, err
}

func sync1(t testing.TB, c *adcclient.Client, cfg adcclient.Config) *adcclient.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := c.Sync(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func mustLand(t testing.TB, res *adcclient.Result) {
	t.Helper()
	if res.Status/100 != 2 {
		t.Fatalf("sync did not land: %d %s", res.Status, res.Body)
	}
}

func counter(c prometheus.Collector) float64 { return testutil.ToFloat64(c) }

// config is an ingress-controller-like configuration; variant changes the routes.
func config(variant string) adcclient.Config {
	labels := map[string]any{"k8s/kind": "HTTPRoute", "k8s/name": "httpbin", "manager-by": "apisix-ingress-controller"}
	return adcclient.Config{
		"services": {{"id": "svc1", "name": "default_httpbin", "labels": labels, "hosts": []any{"httpbin.example.com"}, "upstream_id": "svc1"}},
		"upstreams": {{"id": "svc1", "name": "default_httpbin", "type": "roundrobin", "scheme": "http",
			"nodes": []any{map[string]any{"host": "10.244.0.11", "port": 80, "weight": 100}}}},
		"routes": {{"id": "r1", "name": "default_httpbin_0", "labels": labels, "uris": []any{"/" + variant}, "service_id": "svc1",
			"plugins": map[string]any{"proxy-rewrite": map[string]any{"uri": "/get"}}, "status": 1}},
		"consumers": {
			{"username": "default_jack", "labels": labels},
			{"id": "default_jack/credentials/k1", "name": "key-auth-cred", "plugins": map[string]any{"key-auth": map[string]any{"key": "jack-" + variant}}},
		},
		"global_rules": {{"id": "prometheus", "plugins": map[string]any{"prometheus": map[string]any{"prefer_name": true}}}},
	}
}

func routesOf(variant string) string { return wantItems(config(variant), "routes") }

func mustContain(t testing.TB, s, sub string) {
	t.Helper()
	if !strings.Contains(s, sub) {
		t.Fatalf("%q does not contain %q", s, sub)
	}
}

func newServer(t testing.TB, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// tail is the last n lines of a log.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
