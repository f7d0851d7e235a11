// Package containers holds the tests against a real apache/apisix image, in a module of
// its own (testcontainers-go and its dependencies stay out of confshim's module graph).
package containers

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/confshim/confshim/internal/testsupport/adcclient"
	"github.com/confshim/confshim/metrics"
	"github.com/confshim/confshim/proxy"
	"github.com/confshim/confshim/rewrite"
)

// These tests start the real apache/apisix image in API-driven standalone mode and put
// confshim (in-process) in front of its Admin API. They run with `make integration` on
// a machine with Docker (a module of its own, so the main module's `go test ./...` never
// builds them) and skip, with one line saying why, where there is none.
// CONFSHIM_APISIX_IMAGE picks the image (default a 3.17 Debian tag). Where no APISIX
// image can be had, make integration runs them against the emulator's image
// (tools/image-test/standins/apisix) with CONFSHIM_APISIX_EMULATED=1: the emulator has
// no gateway, so the checks of gateway traffic are skipped (logged). Ports are published
// on 127.0.0.1 only.

const apisixConfig = `apisix:
  node_listen: 9080
  enable_admin: true
deployment:
  role: traditional
  role_traditional:
    config_provider: yaml
  admin:
    admin_listen:
      ip: 0.0.0.0
      port: 9180
    allow_admin:
      - 0.0.0.0/0
    admin_key:
      - name: admin
        key: test-admin-key
        role: admin
nginx_config:
  worker_processes: 1
`

type realAPISIX struct {
	admin, gateway string
}

func startAPISIX(t *testing.T) realAPISIX {
	t.Helper()
	testcontainers.SkipIfProviderIsNotHealthy(t)
	image := os.Getenv("CONFSHIM_APISIX_IMAGE")
	if image == "" {
		image = "apache/apisix:3.17.0-debian"
	}
	ctx := context.Background()
	ctr, err := testcontainers.Run(ctx, image,
		testcontainers.WithExposedPorts("9180/tcp", "9080/tcp"),
		testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
			loopback := []network.PortBinding{{HostIP: netip.MustParseAddr("127.0.0.1")}}
			hc.PortBindings = network.PortMap{network.MustParsePort("9180/tcp"): loopback, network.MustParsePort("9080/tcp"): loopback}
		}),
		testcontainers.WithFiles(testcontainers.ContainerFile{
			Reader:            strings.NewReader(apisixConfig),
			ContainerFilePath: "/usr/local/apisix/conf/config.yaml",
			FileMode:          0o644,
		}),
		testcontainers.WithWaitStrategy(wait.ForHTTP("/apisix/admin/configs").
			WithPort("9180/tcp").
			WithHeaders(map[string]string{"X-API-KEY": adminKey}).
			WithStartupTimeout(2*time.Minute)),
	)
	testcontainers.CleanupContainer(t, ctr)
	if err != nil {
		t.Fatalf("starting %s: %v", image, err)
	}
	endpoint := func(port string) string {
		u, err := ctr.PortEndpoint(ctx, port, "http")
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	return realAPISIX{admin: endpoint("9180/tcp"), gateway: endpoint("9080/tcp")}
}

func confshimFor(t *testing.T, upstream string) (string, *metrics.Metrics) {
	t.Helper()
	m := metrics.New(prometheus.NewRegistry(), "container-test")
	p, err := proxy.New(proxy.Config{Upstream: upstream, Preserve: rewrite.DefaultPreserve, MaxBodyBytes: 64 << 20,
		UpstreamTimeout: 30 * time.Second, Logger: zerolog.New(io.Discard), Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return srv.URL, m
}

// gatewayConfig routes /<variant> to a mocking plugin, so that gateway traffic proves
// which configuration APISIX applied without any backend.
func gatewayConfig(variant string) adcclient.Config {
	return adcclient.Config{
		"routes": {{"id": "r1", "uris": []any{"/" + variant}, "status": 1,
			"plugins": map[string]any{"mocking": map[string]any{"response_example": "hello " + variant, "content_type": "text/plain"}}}},
		"upstreams": {{"id": "u1", "type": "roundrobin", "nodes": []any{map[string]any{"host": "127.0.0.1", "port": 1980, "weight": 1}}}},
	}
}

// waitForGateway polls the gateway until path answers 200 with want (APISIX applies a
// configuration within about a second of the 202).
func waitForGateway(t *testing.T, gateway, path, want string) {
	t.Helper()
	if os.Getenv("CONFSHIM_APISIX_EMULATED") != "" {
		t.Logf("emulated APISIX: no gateway to answer %s", path)
		return
	}
	deadline := time.Now().Add(10 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		resp, err := http.Get(gateway + path)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			last = fmt.Sprintf("%d %s", resp.StatusCode, b)
			if resp.StatusCode == http.StatusOK && strings.Contains(string(b), want) {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("gateway %s never answered %q; last %s", path, want, last)
}

func TestContainerOutOfBandSecrets(t *testing.T) {
	a := startAPISIX(t)
	shim, _ := confshimFor(t, a.admin)
	c := adcclient.New(shim, adminKey)
	mustLand(t, sync1(t, c, gatewayConfig("v1")))
	waitForGateway(t, a.gateway, "/v1", "hello v1")

	// the operator registers a secrets manager straight on APISIX, keeping the rest
	doc := fmt.Sprintf(`{"routes_conf_version":%d,"upstreams_conf_version":%d,"secrets_conf_version":%d,
		"secrets":[{"id":"vault/1","uri":"http://vault:8200","prefix":"kv/apisix","token":"example-vault-token"}]}`,
		c.CachedVersion("routes"), c.CachedVersion("upstreams"), c.CachedVersion("secrets")+1)
	adminPut(t, a.admin, doc, "operator-1")

	bare := adcclient.New(a.admin, adminKey)
	bare.Adopt(c)
	if res := sync1(t, bare, gatewayConfig("v2")); res.Status != http.StatusBadRequest {
		t.Fatalf("real APISIX should reject the stale secrets version, got %d %s", res.Status, res.Body)
	}
	res := sync1(t, c, gatewayConfig("v2"))
	mustLand(t, res)
	mustContain(t, res.Header.Get("X-Confshim-Actions"), "secrets=preserved")
	waitForGateway(t, a.gateway, "/v2", "hello v2")
}

func TestContainerLeaderChange(t *testing.T) {
	a := startAPISIX(t)
	shim, _ := confshimFor(t, a.admin)
	leader, other := adcclient.New(shim, adminKey), adcclient.New(shim, adminKey)
	mustLand(t, sync1(t, leader, gatewayConfig("a1")))
	mustLand(t, sync1(t, other, gatewayConfig("b1")))
	waitForGateway(t, a.gateway, "/b1", "hello b1")
	mustLand(t, sync1(t, leader, gatewayConfig("a2")))
	waitForGateway(t, a.gateway, "/a2", "hello a2")
}

const adminKey = "test-admin-key"

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

// adminPut writes straight to a data plane's Admin API and expects 202.
func adminPut(t testing.TB, admin, body, digest string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, admin+"/apisix/admin/configs", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-KEY", adminKey)
	req.Header.Set("X-Digest", digest)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("out-of-band PUT: %d", resp.StatusCode)
	}
}

func mustContain(t testing.TB, s, sub string) {
	t.Helper()
	if !strings.Contains(s, sub) {
		t.Fatalf("%q does not contain %q", s, sub)
	}
}
