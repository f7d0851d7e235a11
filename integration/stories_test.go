package integration

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/confshim/confshim/internal/testsupport/adcclient"
)

// Each story runs against the emulator as APISIX behaves and with --fill-defaults, and
// is first shown to fail against the bare data plane, then to pass through confshim.
var profiles = []stackOptions{{}, {fillDefaults: true}, {version: "3.14.1"}, {version: "3.13.0"}}

func profileName(o stackOptions) string {
	name := "apisix-3.17"
	if o.version != "" {
		name = "apisix-" + o.version
	}
	if o.fillDefaults {
		name += "-fill-defaults"
	}
	return name
}

// registerSecrets is the operator's out-of-band write: a vault manager in secrets.
func registerSecrets(t *testing.T, s *stack) {
	s.oobPut(t, func(doc map[string]any) {
		doc["secrets_conf_version"] = doc["secrets_conf_version"].(float64) + 1
		doc["secrets"] = []any{map[string]any{"id": "vault/1", "uri": "http://vault:8200", "prefix": "kv/apisix", "token": "example-vault-token"}}
	})
}

func TestStoryOutOfBandSecrets(t *testing.T) {
	t.Parallel()
	for _, o := range profiles {
		t.Run(profileName(o), func(t *testing.T) {
			for _, through := range []bool{false, true} {
				s := newStack(t, o)
				c := s.client(through)
				mustLand(t, sync1(t, c, config("v1")))
				registerSecrets(t, s)
				res := sync1(t, c, config("v2"))
				if !through {
					if res.Status != http.StatusBadRequest || !strings.Contains(string(res.Body), "secrets_conf_version must be greater than or equal to (1)") {
						t.Fatalf("bare data plane: want the stale-secrets 400, got %d %s", res.Status, res.Body)
					}
					continue
				}
				mustLand(t, res)
				mustContain(t, res.Header.Get("X-Confshim-Actions"), "secrets=preserved")
				if got := s.items(t, "routes"); got != routesOf("v2") {
					t.Fatalf("routes change not applied: %s", got)
				}
				mustContain(t, s.items(t, "secrets"), "vault/1")
				// and again: ADC's cache still holds the stale secrets version
				mustLand(t, sync1(t, c, config("v3")))
				if got := s.items(t, "routes"); got != routesOf("v3") {
					t.Fatalf("second change not applied: %s", got)
				}
				mustContain(t, s.items(t, "secrets"), "vault/1")
			}
		})
	}
}

func TestStoryLeaderChange(t *testing.T) {
	t.Parallel()
	for _, o := range profiles {
		t.Run(profileName(o), func(t *testing.T) {
			for _, through := range []bool{false, true} {
				s := newStack(t, o)
				a, b := s.client(through), s.client(through)
				mustLand(t, sync1(t, a, config("a1")))
				// b leads for a while with another view of the world
				cfgB := config("b1")
				cfgB["upstreams"][0]["nodes"] = []any{map[string]any{"host": "10.0.0.99", "port": 8080, "weight": 1}}
				mustLand(t, sync1(t, b, cfgB))
				// a is re-elected; its cache is stale
				cfgA := config("a2")
				res := sync1(t, a, cfgA)
				if !through {
					if res.Status != http.StatusBadRequest || !strings.Contains(string(res.Body), "must be greater than or equal to") {
						t.Fatalf("bare data plane: want a stale-version 400, got %d %s", res.Status, res.Body)
					}
					continue
				}
				mustLand(t, res)
				for _, section := range []string{"routes", "upstreams", "services", "consumers", "global_rules"} {
					if got, want := s.items(t, section), wantItems(cfgA, section); got != want {
						t.Fatalf("%s: data plane holds %s, the leader declared %s", section, got, want)
					}
				}
			}
		})
	}
}

func TestStoryNoChurn(t *testing.T) {
	t.Parallel()
	for _, o := range profiles {
		t.Run(profileName(o), func(t *testing.T) {
			s := newStack(t, o)
			c := s.client(true)
			mustLand(t, sync1(t, c, config("v1")))
			registerSecrets(t, s)
			mustLand(t, sync1(t, c, config("v2"))) // the repair
			before := s.em.Reloads()
			for i := 0; i < 3; i++ {
				res := sync1(t, c, config("v2"))
				mustLand(t, res)
			}
			if after := s.em.Reloads(); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Fatalf("identical syncs reloaded sections: before %v after %v", before, after)
			}
			mustLand(t, sync1(t, c, config("v3")))
			after := s.em.Reloads()
			for section, n := range after {
				want := before[section]
				if section == "routes" || section == "consumers" { // v3 changes route uris and the consumer key
					want++
				}
				if n != want {
					t.Fatalf("%s reloaded %d times, want %d (before %v after %v)", section, n, want, before, after)
				}
			}
		})
	}
}

func TestStoryOtherWritersClockAhead(t *testing.T) {
	t.Parallel()
	for _, o := range profiles {
		t.Run(profileName(o), func(t *testing.T) {
			for _, through := range []bool{false, true} {
				s := newStack(t, o)
				c := s.client(through)
				mustLand(t, sync1(t, c, config("v1")))
				// another writer's clock is far ahead of ADC's on routes
				s.oobPut(t, func(doc map[string]any) {
					doc["routes_conf_version"] = float64(time.Now().UnixMilli() + 1e9)
					doc["routes"] = []any{map[string]any{"id": "other", "uris": []any{"/other"}}}
				})
				res := sync1(t, c, config("v2"))
				if !through {
					if res.Status != http.StatusBadRequest {
						t.Fatalf("bare data plane: want 400, got %d", res.Status)
					}
					continue
				}
				mustLand(t, res)
				mustContain(t, res.Header.Get("X-Confshim-Actions"), "routes=bumped")
				if got := s.items(t, "routes"); got != routesOf("v2") {
					t.Fatalf("the client's change was dropped: %s", got)
				}
			}
		})
	}
	t.Run("equal version with a changed copy", func(t *testing.T) {
		for _, through := range []bool{false, true} {
			s := newStack(t, stackOptions{})
			c := s.client(through)
			mustLand(t, sync1(t, c, config("v1")))
			v := int64(s.em.SectionVersion("routes"))
			body := fmt.Sprintf(`{"routes_conf_version":%d,"routes":[{"id":"r1","uris":["/changed"],"service_id":"svc1"}]}`, v)
			status, hdr := rawPut(t, pick(s, through), body, "eq-1")
			if status != http.StatusAccepted {
				t.Fatalf("PUT: %d", status)
			}
			applied := strings.Contains(s.items(t, "routes"), "/changed")
			if !through {
				if applied {
					t.Fatal("bare APISIX keeps its copy on an equal version; the emulator applied it")
				}
				continue
			}
			if !applied || !strings.Contains(hdr.Get("X-Confshim-Actions"), "routes=bumped") {
				t.Fatalf("equal-version change not applied (actions %q): %s", hdr.Get("X-Confshim-Actions"), s.items(t, "routes"))
			}
		}
	})
}

func pick(s *stack, through bool) string {
	if through {
		return s.proxyURL
	}
	return s.dpURL
}

func TestStoryConcurrentClients(t *testing.T) {
	t.Parallel()
	for _, o := range profiles {
		t.Run(profileName(o), func(t *testing.T) {
			s := newStack(t, o)
			const clients, rounds = 4, 3
			var wg sync.WaitGroup
			errs := make(chan error, clients*rounds)
			for i := 0; i < clients; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					c := s.client(true)
					for r := 0; r < rounds; r++ {
						res, err := c.Sync(context.Background(), config(fmt.Sprintf("c%d-r%d", i, r)))
						switch {
						case err != nil:
							errs <- err
						case res.Status/100 != 2:
							errs <- fmt.Errorf("client %d round %d: %d %s", i, r, res.Status, res.Body)
						}
					}
				}(i)
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			// the final state is one client's complete configuration
			routes := s.items(t, "routes")
			var owner adcclient.Config
			for i := 0; i < clients; i++ {
				for r := 0; r < rounds; r++ {
					if cfg := config(fmt.Sprintf("c%d-r%d", i, r)); wantItems(cfg, "routes") == routes {
						owner = cfg
					}
				}
			}
			if owner == nil {
				t.Fatalf("final routes are no client's: %s", routes)
			}
			for _, section := range []string{"consumers", "services", "upstreams"} {
				if got := s.items(t, section); got != wantItems(owner, section) {
					t.Fatalf("%s is from another client than routes: %s", section, got)
				}
			}
		})
	}
}
