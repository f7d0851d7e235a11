package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/confshim/confshim/internal/testsupport/adcclient"
	"github.com/confshim/confshim/internal/testsupport/wait"
	"github.com/confshim/confshim/proxy"
)

// Contract §8.6: --merge sections are shared item by item between the client and
// out-of-band writers.

// ids lists the ids of a section as the data plane holds it.
func (s *stack) ids(t *testing.T, section string) []string {
	t.Helper()
	raw, _ := json.Marshal(s.doc(t)[section])
	var items []map[string]any
	_ = json.Unmarshal(raw, &items)
	var out []string
	for _, it := range items {
		id, _ := it["id"].(string)
		out = append(out, id)
	}
	return out
}

func wantIDs(t *testing.T, got []string, want ...string) {
	t.Helper()
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("ids %v, want %v", got, want)
	}
}

// withRules is config("v1") with the given client global rules.
func withRules(rules ...map[string]any) adcclient.Config {
	cfg := config("v1")
	cfg["global_rules"] = rules
	return cfg
}

func rule(id, plugin string, setting any) map[string]any {
	return map[string]any{"id": id, "plugins": map[string]any{plugin: map[string]any{"v": setting}}}
}

// addPlatformRule is the platform team's tracing rule, written straight to APISIX.
func addPlatformRule(t *testing.T, s *stack) {
	s.oobPut(t, func(doc map[string]any) {
		rules, _ := doc["global_rules"].([]any)
		doc["global_rules"] = append(rules, map[string]any{"id": "platform-tracing", "plugins": map[string]any{"zipkin": map[string]any{"endpoint": "http://zipkin:9411"}}})
		doc["global_rules_conf_version"] = doc["global_rules_conf_version"].(float64) + 1
	})
}

// adoptedClient is the same ADC (its cache) aimed at the restarted confshim.
func adoptedClient(s *stack, c *adcclient.Client) *adcclient.Client {
	next := s.client(true)
	next.Adopt(c)
	return next
}

func TestMergeKeepsTheOutOfBandRuleThroughAddChangeDelete(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{merge: []string{"global_rules"}})
	c := s.client(true)
	mustLand(t, sync1(t, c, withRules(rule("prometheus", "prometheus", 1))))
	addPlatformRule(t, s)
	wantIDs(t, s.ids(t, "global_rules"), "prometheus", "platform-tracing")

	res := sync1(t, c, withRules(rule("prometheus", "prometheus", 1), rule("cors", "cors", 1))) // add
	mustLand(t, res)
	mustContain(t, res.Header.Get("X-Confshim-Actions"), "global_rules=merged")
	wantIDs(t, s.ids(t, "global_rules"), "prometheus", "cors", "platform-tracing")
	if m := s.proxy.DebugConfig().Merge; len(m) != 1 || m[0].Section != "global_rules" || m[0].ClientOwned != 2 || m[0].Kept != 1 {
		t.Fatalf("/debug/config merge: %+v, want global_rules owned 2, kept 1", m)
	}

	mustLand(t, sync1(t, c, withRules(rule("prometheus", "prometheus", 2), rule("cors", "cors", 1)))) // change
	wantIDs(t, s.ids(t, "global_rules"), "prometheus", "cors", "platform-tracing")
	mustContain(t, jsonOf(s.doc(t)["global_rules"]), `"v":2`)

	mustLand(t, sync1(t, c, withRules(rule("prometheus", "prometheus", 2)))) // delete its own
	wantIDs(t, s.ids(t, "global_rules"), "prometheus", "platform-tracing")

	// nothing changed: settled against the union, thinned, answered 204, nothing reloads
	before := s.em.Reloads()["global_rules"]
	res = sync1(t, c, withRules(rule("prometheus", "prometheus", 2)))
	mustLand(t, res)
	if got := s.em.Reloads()["global_rules"]; got != before {
		t.Fatalf("an unchanged merged section reloaded (%d → %d)", before, got)
	}
	wantIDs(t, s.ids(t, "global_rules"), "prometheus", "platform-tracing")

	// an id the out-of-band writer created becomes the client's when the client sends it
	mustLand(t, sync1(t, c, withRules(rule("prometheus", "prometheus", 2), rule("platform-tracing", "zipkin", "mine"))))
	mustContain(t, jsonOf(s.doc(t)["global_rules"]), `"v":"mine"`)
	mustLand(t, sync1(t, c, withRules(rule("prometheus", "prometheus", 2))))
	wantIDs(t, s.ids(t, "global_rules"), "prometheus")
}

func TestMergeOwnershipSurvivesARestartWithStateDir(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{merge: []string{"global_rules"}, reseed: watch, stateDir: t.TempDir(), adminKey: adminKey})
	c := s.client(true)
	mustLand(t, sync1(t, c, withRules(rule("prometheus", "prometheus", 1), rule("cors", "cors", 1))))
	addPlatformRule(t, s)
	mustLand(t, sync1(t, c, withRules(rule("prometheus", "prometheus", 1), rule("cors", "cors", 1))))
	s.startProxy(t) // the old one writes its state file before it is gone
	data, _ := os.ReadFile(filepath.Join(s.opts.stateDir, "confshim-state.json"))
	mustContain(t, string(data), `"owned":{"global_rules":["cors","prometheus"]}`)
	c = adoptedClient(s, c)
	mustLand(t, sync1(t, c, withRules(rule("prometheus", "prometheus", 1)))) // the client deletes cors
	wantIDs(t, s.ids(t, "global_rules"), "prometheus", "platform-tracing")
	if strings.Contains(s.logs.String(), "merge_unowned") {
		t.Fatal("ownership was remembered, yet the log says it was not")
	}
}

func TestMergeWithoutMemoryKeepsAndSaysSo(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{merge: []string{"global_rules"}})
	c := s.client(true)
	mustLand(t, sync1(t, c, withRules(rule("prometheus", "prometheus", 1), rule("cors", "cors", 1))))
	addPlatformRule(t, s)
	s.startProxy(t) // memory only: who owns what is forgotten
	c = adoptedClient(s, c)
	mustLand(t, sync1(t, c, withRules(rule("prometheus", "prometheus", 1))))
	wantIDs(t, s.ids(t, "global_rules"), "prometheus", "cors", "platform-tracing") // kept, never deleted
	mustLand(t, sync1(t, c, withRules(rule("prometheus", "prometheus", 2))))
	if n := strings.Count(s.logs.String(), `"event":"merge_unowned"`); n != 1 {
		t.Fatalf("want the missing memory said once for the section, said %d times", n)
	}
	// the line names what was kept, so an operator can tell a stale deletion (cors)
	// from an out-of-band item (platform-tracing)
	mustContain(t, s.logs.String(), `"kept_ids":["cors","platform-tracing"],"kept_ids_not_named":0`)
	// from now on confshim knows: the client's next deletion lands
	mustLand(t, sync1(t, c, withRules(rule("cors2", "ip-restriction", 1))))
	wantIDs(t, s.ids(t, "global_rules"), "cors2", "cors", "platform-tracing")
}

func TestMergeSecretsBesideTheOperatorsManager(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{merge: []string{"secrets"}})
	c := s.client(true)
	mustLand(t, sync1(t, c, config("v1")))
	registerSecrets(t, s) // the operator's vault/1, straight to APISIX
	cfg := config("v1")
	cfg["secrets"] = []map[string]any{{"id": "vault/controller", "uri": "http://vault:8200", "prefix": "kv/ctrl", "token": "ctrl-token"}}
	res := sync1(t, c, cfg)
	mustLand(t, res)
	wantIDs(t, s.ids(t, "secrets"), "vault/controller", "vault/1")
	actions := res.Header.Get("X-Confshim-Actions")
	mustContain(t, actions, "secrets=merged")
	mustContain(t, s.items(t, "secrets"), "example-vault-token")
	// the rest of the default --preserve list still holds: protos written out of band
	s.oobPut(t, func(doc map[string]any) { doc["protos_conf_version"] = doc["protos_conf_version"].(float64) + 1 })
	cfg["routes"][0]["uris"] = []any{"/v2"}
	res = sync1(t, c, cfg)
	mustLand(t, res)
	mustContain(t, res.Header.Get("X-Confshim-Actions"), "protos=preserved")
	wantIDs(t, s.ids(t, "secrets"), "vault/controller", "vault/1")
}

func secretItem(id, token string) map[string]any {
	return map[string]any{"id": id, "uri": "http://vault:8200", "prefix": "kv", "token": token}
}

// Issue 36: the operator's item in a merged section survives, with each
// --trust-connection, whether it was written the instant before the client's sync
// (the union must be made on a state shown current, not on the belief) or learnt by
// the watch first, and whatever the client later drops of its own (the kept
// configuration holds the union, not the client's copy).
func TestMergeKeepsTheOperatorsItemInEveryTrust(t *testing.T) {
	t.Parallel()
	for _, section := range []string{"secrets", "global_rules"} {
		for _, trust := range []proxy.TrustMode{proxy.TrustAuto, proxy.TrustAlways, proxy.TrustNever} {
			for _, learnt := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/watch-learnt=%v", section, trust, learnt), func(t *testing.T) {
					t.Parallel()
					s := newStack(t, stackOptions{merge: []string{section}, trust: trust, reseed: 20 * time.Millisecond, safety: watchSafety, adminKey: adminKey})
					c := s.client(true)
					cfg := config("v1")
					delete(cfg, section)
					mustLand(t, sync1(t, c, cfg))
					mine, theirs := secretItem("vault/ctrl", "ctrl"), secretItem("vault/1", "op")
					if section == "global_rules" {
						mine, theirs = rule("ctrl", "cors", 1), rule("platform-tracing", "zipkin", 1)
					}
					s.oobPut(t, func(doc map[string]any) {
						doc[section+"_conf_version"] = doc[section+"_conf_version"].(float64) + 1
						doc[section] = []any{theirs}
					})
					if learnt {
						wait.For(t, "the watch learns the out-of-band write", func() bool {
							return len(s.proxy.DebugConfig().OutOfBand) > 0
						})
					}
					cfg[section] = []map[string]any{mine}
					mustLand(t, sync1(t, c, cfg))
					wantIDs(t, s.ids(t, section), mine["id"].(string), theirs["id"].(string))
					cfg[section] = []map[string]any{} // the client drops its own item
					mustLand(t, sync1(t, c, cfg))
					wantIDs(t, s.ids(t, section), theirs["id"].(string))
					mustLand(t, sync1(t, c, cfg)) // and again, decided on what the last sync left
					wantIDs(t, s.ids(t, section), theirs["id"].(string))
				})
			}
		}
	}
}

// Issue 45 (§8.6 as amended): with --merge secrets, a body that leaves secrets out says
// nothing about them at the version the client last sent — the client's vault/ctrl and
// the operator's vault/op both stay — and at a version it moved, vault/ctrl goes and
// vault/op stays, through confshim against the emulator, with each --trust-connection.
// After a confshim restart with --state-dir (ownership remembered, the record of what
// the client sent not), a version below the data plane's may be an echo and deletes
// nothing, one above it is moved.
func TestMergedSectionLeftOutThroughTheProxy(t *testing.T) {
	t.Parallel()
	const routes = `"routes_conf_version":5,"routes":[{"id":"r1","uris":["/get"]}]`
	body := func(secrets string) string { return "{" + routes + "," + secrets + "}" }
	ctrl, _ := json.Marshal(secretItem("vault/ctrl", "ctrl-token"))
	for _, tc := range []struct {
		name    string
		trust   proxy.TrustMode
		restart bool
	}{
		{"auto", proxy.TrustAuto, false},
		{"always", proxy.TrustAlways, false},
		{"never", proxy.TrustNever, false},
		{"restarted with a state dir", proxy.TrustAuto, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := stackOptions{merge: []string{"secrets"}, trust: tc.trust, reseed: time.Hour}
			if tc.restart {
				o.stateDir, o.adminKey = t.TempDir(), adminKey
			}
			s := newStack(t, o)
			put := func(digest, b string) http.Header {
				t.Helper()
				status, hdr := rawPut(t, s.proxyURL, b, digest)
				if status/100 != 2 {
					t.Fatalf("%s: %d %v", digest, status, hdr)
				}
				return hdr
			}
			put("c1", body(`"secrets_conf_version":10,"secrets":[`+string(ctrl)+`]`))
			s.oobPut(t, func(doc map[string]any) { // the operator's, straight on APISIX
				doc["secrets_conf_version"] = doc["secrets_conf_version"].(float64) + 1
				doc["secrets"] = append(doc["secrets"].([]any), secretItem("vault/op", "op-token"))
			})
			wantIDs(t, s.ids(t, "secrets"), "vault/ctrl", "vault/op")
			moved := "11" // onto the operator's version: moved all the same
			if tc.restart {
				s.startProxy(t) // the record is memory only; ownership is in the state file
				moved = fmt.Sprintf("%.0f", s.em.SectionVersion("secrets")+1)
			}
			// the client echoes its cache: secrets left out at the version it last sent
			put("c2", body(`"secrets_conf_version":10`))
			wantIDs(t, s.ids(t, "secrets"), "vault/ctrl", "vault/op")
			put("c3", body(`"secrets_conf_version":10`)) // and again, decided on what c2 left
			wantIDs(t, s.ids(t, "secrets"), "vault/ctrl", "vault/op")
			// the client moved the version and sends no secrets: it has none of its own
			hdr := put("c4", body(`"secrets_conf_version":`+moved))
			wantIDs(t, s.ids(t, "secrets"), "vault/op")
			mustContain(t, hdr.Get("X-Confshim-Actions"), "secrets=merged")
			mustContain(t, s.items(t, "secrets"), "op-token")
		})
	}
}
