package integration

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/confshim/confshim/internal/testsupport/adcclient"
)

// Issue 32: the stories with both client generations — ADC 0.28 and ADC 0.30 (the Rust
// rewrite the controller's master ships, §13) — against APISIX 3.17, 3.18 and the 3.19
// profile (?wait, body-shape checks). Each row logs client × profile × story → answer.

var generations = []adcclient.Generation{adcclient.Gen028, adcclient.Gen030}

var genProfiles = []string{"3.17.0", "3.18.0", "3.19.0"}

// clientOf is a client of generation g, through confshim or straight to the data plane.
func (s *stack) clientOf(g adcclient.Generation, through bool) *adcclient.Client {
	c := s.client(through)
	c.Gen = g
	return c
}

// landed is the 2xx a generation gets for an applied sync on a profile: 200 where ADC
// 0.30 waits on a data plane that answers ?wait, 202 otherwise.
func landed(g adcclient.Generation, version string) int {
	if g == adcclient.Gen030 && version == "3.19.0" {
		return http.StatusOK
	}
	return http.StatusAccepted
}

func TestGenerationsAcrossProfiles(t *testing.T) {
	t.Parallel()
	for _, g := range generations {
		for _, version := range genProfiles {
			t.Run(g.String()+"/apisix-"+version, func(t *testing.T) {
				t.Parallel()
				t.Run("out-of-band secrets", func(t *testing.T) { storyOutOfBand(t, g, version) })
				t.Run("held route", func(t *testing.T) { storyHeldRoute(t, g, version) })
				t.Run("omitted sections survive", func(t *testing.T) { storyOmittedSections(t, g, version) })
			})
		}
	}
}

// storyOutOfBand: the operator's secrets manager straight on the data plane, then the
// client's change. Straight to APISIX ADC 0.28 is refused for its stale secrets version
// (the deadlock) and ADC 0.30 empties secrets with a 2xx; through confshim the change
// lands and the secrets stay.
func storyOutOfBand(t *testing.T, g adcclient.Generation, version string) {
	for _, through := range []bool{false, true} {
		s := newStack(t, stackOptions{version: version, reseed: time.Hour})
		c := s.clientOf(g, through)
		mustLand(t, sync1(t, c, config("v1")))
		registerSecrets(t, s)
		res := sync1(t, c, config("v2"))
		secrets := s.items(t, "secrets")
		if !through {
			lost := !strings.Contains(secrets, "vault/1")
			if res.Status/100 == 2 && !lost {
				t.Fatalf("straight to APISIX the story should fail: %d, secrets %s", res.Status, secrets)
			}
			continue
		}
		if res.Status != landed(g, version) {
			t.Fatalf("through confshim: %d %s, want %d", res.Status, res.Body, landed(g, version))
		}
		mustContain(t, secrets, "vault/1")
		mustContain(t, s.items(t, "routes"), "/v2")
		t.Logf("%s × apisix-%s × out-of-band secrets → %d, secrets kept", g, version, res.Status)
	}
}

// storyHeldRoute: with --fallback backfill, one refused route among 20 changes: the rest
// lands, the answer is the 400 naming it, and an ADC 0.30 re-validation through
// confshim reports exactly that route; the identical resync gets the same answer and
// APISIX applies nothing.
func storyHeldRoute(t *testing.T, g adcclient.Generation, version string) {
	s := newStack(t, stackOptions{version: version, fallback: true, reseed: time.Hour})
	c := s.clientOf(g, true)
	mustLand(t, sync1(t, c, config("v1")))
	var routes []map[string]any
	for i := range 19 {
		routes = append(routes, route(fmt.Sprintf("r%02d", i), fmt.Sprintf("/r%02d", i), nil))
	}
	routes = append(routes, route("r-bad", "/bad", unknownPlugin))
	res := sync1(t, c, withRoutes(routes...))
	mustNameHeld(t, res.Status, res.Body, "r-bad")
	if g == adcclient.Gen030 && fmt.Sprint(res.Failed) != "[r-bad]" {
		t.Fatalf("ADC 0.30's re-validation reports %v, want [r-bad]", res.Failed)
	}
	if got := sectionLen(s, "routes"); got != 19 {
		t.Fatalf("%d routes landed, want 19", got)
	}
	accepted := s.em.Costs().Accepted
	again := sync1(t, c, withRoutes(routes...))
	mustNameHeld(t, again.Status, again.Body, "r-bad")
	if s.em.Costs().Accepted != accepted {
		t.Fatal("the identical resync made APISIX apply a PUT")
	}
	t.Logf("%s × apisix-%s × held route → %d naming r-bad, resync → %d, failed %v", g, version, res.Status, again.Status, res.Failed)
}

// storyOmittedSections: ADC 0.30 never sends secrets, plugin_configs, consumer_groups,
// protos or plugins; the default --preserve keeps what the data plane holds for them
// over 10 syncs, and every PUT confshim sends carries the client's ?wait.
func storyOmittedSections(t *testing.T, g adcclient.Generation, version string) {
	s := newStack(t, stackOptions{version: version, reseed: time.Hour})
	c := s.clientOf(g, true)
	mustLand(t, sync1(t, c, config("v1")))
	s.oobPut(t, func(doc map[string]any) {
		for _, section := range []string{"secrets", "plugin_configs", "consumer_groups", "protos", "plugins"} {
			v, _ := doc[section+"_conf_version"].(float64)
			doc[section+"_conf_version"] = v + 1
		}
		doc["secrets"] = []any{map[string]any{"id": "vault/1", "uri": "http://vault:8200", "prefix": "kv", "token": "t"}}
		doc["plugin_configs"] = []any{map[string]any{"id": "pc1", "plugins": map[string]any{}}}
		doc["consumer_groups"] = []any{map[string]any{"id": "cg1", "plugins": map[string]any{}}}
	})
	puts := s.em.Puts()
	var last int
	for i := range 10 {
		res := sync1(t, c, config(fmt.Sprintf("v%d", i%3)))
		if res.Status/100 != 2 {
			t.Fatalf("sync %d: %d %s", i+1, res.Status, res.Body)
		}
		last = res.Status
	}
	for _, want := range []string{"vault/1", "pc1", "cg1"} {
		doc := jsonOf(s.doc(t))
		mustContain(t, doc, want)
	}
	if g == adcclient.Gen030 {
		if sent, waited := s.em.Puts()-puts, s.em.WaitPuts(); waited < sent {
			t.Fatalf("%d PUTs reached the data plane, %d carried ?wait", sent, waited)
		}
	}
	t.Logf("%s × apisix-%s × omitted sections over 10 syncs → last %d, kept", g, version, last)
}
