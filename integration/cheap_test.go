package integration

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/confshim/confshim/internal/testsupport/adcclient"
	"github.com/confshim/confshim/internal/testsupport/emulator"
)

// The §8 stories: every sync cheap for APISIX. They read the emulator's cost counters
// (reloads, items validated, 204s), which model what a real APISIX does per PUT.

// withMetadata is config plus plugin metadata, which ADC 0.28 re-stamps on every sync.
func withMetadata(variant, logHost string) adcclient.Config {
	cfg := config(variant)
	cfg["plugin_metadata"] = []map[string]any{{"id": "http-logger", "log_format": map[string]any{"host": logHost}}}
	return cfg
}

func restamping(c *adcclient.Client) *adcclient.Client {
	c.Restamp = []string{"plugin_metadata"}
	return c
}

func TestCheapIdenticalSyncsAreNoOps(t *testing.T) {
	t.Parallel()
	for _, o := range profiles {
		t.Run(profileName(o), func(t *testing.T) {
			t.Parallel()
			for _, through := range []bool{false, true} {
				s := newStack(t, o)
				c := restamping(s.client(through))
				mustLand(t, sync1(t, c, withMetadata("v1", "$host")))
				if through {
					registerSecrets(t, s) // an out-of-band writer too: the first sync repairs
					mustLand(t, sync1(t, c, withMetadata("v1", "$host")))
				}
				reloads, costs, noops := s.em.TotalReloads(), s.em.Costs(), counter(s.metrics.NoopPuts)
				var noContent int
				for i := 0; i < 10; i++ {
					res := sync1(t, c, withMetadata("v1", "$host"))
					mustLand(t, res)
					if res.Status == http.StatusNoContent {
						noContent++
					}
				}
				after := s.em.Costs()
				gotReloads := s.em.TotalReloads() - reloads
				t.Logf("through=%v: 10 identical syncs: %d reloads, %d answered 204, %d items validated", through, gotReloads, noContent, after.ItemsValidated-costs.ItemsValidated)
				switch {
				case !through:
					if gotReloads != 10 || noContent != 0 {
						t.Fatalf("bare: want plugin_metadata reloaded 10 times and no 204, got %d and %d", gotReloads, noContent)
					}
				case o.version == "3.13.0": // no digest: no 204, but nothing reloads
					if gotReloads != 0 {
						t.Fatalf("want no reload, got %d", gotReloads)
					}
				default:
					if gotReloads != 0 || noContent != 10 || after.ItemsValidated != costs.ItemsValidated {
						t.Fatalf("want 0 reloads, ten 204s, nothing validated; got %d, %d, %d", gotReloads, noContent, after.ItemsValidated-costs.ItemsValidated)
					}
					if got := counter(s.metrics.NoopPuts) - noops; got != 10 {
						t.Fatalf("confshim_noop_puts_total = %v", got)
					}
				}
			}
		})
	}
}

func TestCheapRestampReloadsNothingButAChangeLands(t *testing.T) {
	t.Parallel()
	for _, o := range profiles {
		t.Run(profileName(o), func(t *testing.T) {
			s := newStack(t, o)
			c := restamping(s.client(true))
			mustLand(t, sync1(t, c, withMetadata("v1", "$host")))
			before := s.em.Reloads()
			res := sync1(t, c, withMetadata("v2", "$host")) // a route change; metadata re-stamped
			mustLand(t, res)
			if h := res.Header.Get("X-Confshim-Actions"); h != "plugin_metadata=settled" {
				t.Fatalf("actions %q", h)
			}
			after := s.em.Reloads()
			if after["plugin_metadata"] != before["plugin_metadata"] || after["routes"] != before["routes"]+1 {
				t.Fatalf("want only routes reloaded: before %v after %v", before, after)
			}
			res = sync1(t, c, withMetadata("v2", "$remote_addr")) // a real metadata change
			mustLand(t, res)
			if got := s.em.Reloads()["plugin_metadata"]; got != after["plugin_metadata"]+1 {
				t.Fatalf("the metadata change did not reload its section")
			}
			mustContain(t, s.items(t, "plugin_metadata"), "$remote_addr")
			mustContain(t, s.items(t, "routes"), "/v2")
		})
	}
}

// largeConfig is n routes, services and upstreams, as the ingress controller has them.
func largeConfig(n int, variant string) adcclient.Config {
	cfg := adcclient.Config{}
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("s%d", i)
		cfg["upstreams"] = append(cfg["upstreams"], map[string]any{"id": id, "type": "roundrobin", "nodes": []any{map[string]any{"host": "10.0.0.1", "port": 80, "weight": 1}}})
		cfg["services"] = append(cfg["services"], map[string]any{"id": id, "upstream_id": id})
		cfg["routes"] = append(cfg["routes"], map[string]any{"id": fmt.Sprintf("r%d", i), "uris": []any{fmt.Sprintf("/r%d", i)}, "service_id": id})
	}
	cfg["routes"][0]["uris"] = []any{"/" + variant}
	return cfg
}

func TestCheapOneRouteChangeValidatesOnlyRoutes(t *testing.T) {
	t.Parallel()
	for _, through := range []bool{false, true} {
		s := newStack(t, stackOptions{})
		c := s.client(through)
		mustLand(t, sync1(t, c, largeConfig(1000, "a")))
		before := s.em.Costs()
		mustLand(t, sync1(t, c, largeConfig(1000, "b")))
		validated := s.em.Costs().ItemsValidated - before.ItemsValidated
		t.Logf("through=%v: a one-route change validated %d items", through, validated)
		want := 3000
		if through {
			want = 1000 // only the routes section is sent with items
		}
		if validated != want {
			t.Fatalf("validated %d items, want %d", validated, want)
		}
	}
}

func TestCheapLeaderChangeReloadsOnlyWhatChanged(t *testing.T) {
	t.Parallel()
	for _, o := range profiles {
		t.Run(profileName(o), func(t *testing.T) {
			s := newStack(t, o)
			a, b := s.client(true), s.client(true)
			mustLand(t, sync1(t, a, config("a1")))
			cfgB := config("b1") // b leads for a while: other routes and consumer key
			mustLand(t, sync1(t, b, cfgB))
			before := s.em.Reloads()
			cfgA := config("a2") // a is re-elected with a stale cache
			mustLand(t, sync1(t, a, cfgA))
			after := s.em.Reloads()
			for _, section := range emulator.Sections {
				want := before[section]
				if section == "routes" || section == "consumers" {
					want++
				}
				if after[section] != want {
					t.Fatalf("%s reloaded %d times, want %d (before %v after %v)", section, after[section], want, before, after)
				}
			}
			for _, section := range []string{"routes", "upstreams", "services", "consumers", "global_rules"} {
				if got, want := s.items(t, section), wantItems(cfgA, section); got != want {
					t.Fatalf("%s: data plane holds %s, the leader declared %s", section, got, want)
				}
			}
		})
	}
}

// TestCheapReorderedUpstreamsSettleReorderedRoutesApply: a replica that led for a
// while, or a bypassCache sync, sends the same items in another order at new versions.
// In upstreams (order-free, §8.1) that is settled and nothing reloads; in routes order
// can decide which route matches, so the reorder is applied.
func TestCheapReorderedUpstreamsSettleReorderedRoutesApply(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{})
	ups := `{"id":"u1","type":"roundrobin","nodes":{"10.0.0.1:80":1}},{"id":"u2","type":"roundrobin","nodes":{"10.0.0.2:80":1}}`
	upsReordered := `{"id":"u2","type":"roundrobin","nodes":{"10.0.0.2:80":1}},{"id":"u1","type":"roundrobin","nodes":{"10.0.0.1:80":1}}`
	routes := `{"id":"r1","uri":"/a","upstream_id":"u1"},{"id":"r2","uri":"/b","upstream_id":"u2"}`
	routesReordered := `{"id":"r2","uri":"/b","upstream_id":"u2"},{"id":"r1","uri":"/a","upstream_id":"u1"}`
	body := func(v int, ups, routes string) string {
		return fmt.Sprintf(`{"upstreams_conf_version":%d,"upstreams":[%s],"routes_conf_version":%d,"routes":[%s]}`, v, ups, v, routes)
	}
	if status, _ := rawPut(t, s.proxyURL, body(1, ups, routes), "d1"); status != http.StatusAccepted {
		t.Fatalf("first sync: %d", status)
	}
	reloads := s.em.Reloads()
	status, hdr := rawPut(t, s.proxyURL, body(2, upsReordered, routes), "d2")
	if status/100 != 2 || !strings.Contains(hdr.Get("X-Confshim-Actions"), "upstreams=settled") {
		t.Fatalf("reordered upstreams: %d %q, want upstreams=settled", status, hdr.Get("X-Confshim-Actions"))
	}
	if got := s.em.Reloads(); got["upstreams"] != reloads["upstreams"] || got["routes"] != reloads["routes"] {
		t.Fatalf("a reorder of upstreams reloaded: before %v after %v", reloads, got)
	}
	status, _ = rawPut(t, s.proxyURL, body(3, ups, routesReordered), "d3")
	if status != http.StatusAccepted {
		t.Fatalf("reordered routes: %d", status)
	}
	if got := s.em.Reloads(); got["routes"] != reloads["routes"]+1 {
		t.Fatalf("a reorder of routes must be applied: routes reloaded %d times, want %d", got["routes"], reloads["routes"]+1)
	}
	mustContain(t, jsonOf(s.doc(t)["routes"]), `[{"id":"r2"`)
}
