package integration

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confshim/confshim/internal/testsupport/adcclient"
	"github.com/confshim/confshim/internal/testsupport/race"
	"github.com/confshim/confshim/proxy"
)

// Contract §8.5, --fallback backfill: one item APISIX rejects never blocks the rest.

func route(id, uri string, plugins map[string]any) map[string]any {
	r := map[string]any{"id": id, "uris": []any{uri}, "service_id": "svc1"}
	if plugins != nil {
		r["plugins"] = plugins
	}
	return r
}

var unknownPlugin = map[string]any{"nope": map[string]any{}}

func withRoutes(routes ...map[string]any) adcclient.Config {
	cfg := config("v1")
	cfg["routes"] = routes
	return cfg
}

func TestFallbackBackfillsAChangedRouteAndAppliesTheRest(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{fallback: true, fallbackAnswer: proxy.AnswerAccepted})
	c := s.client(true)
	mustLand(t, sync1(t, c, withRoutes(route("r1", "/old", nil))))
	cfg := withRoutes(route("r1", "/changed", unknownPlugin), route("r2", "/new", nil))
	cfg["upstreams"][0]["nodes"] = []any{map[string]any{"host": "10.244.0.99", "port": 80, "weight": 100}}
	res := sync1(t, c, cfg)
	mustLand(t, res)
	mustContain(t, res.Header.Get("X-Confshim-Actions"), "routes=backfilled")
	routes := s.items(t, "routes")
	mustContain(t, routes, `"/old"`) // r1 keeps its accepted copy
	mustContain(t, routes, `"/new"`) // r2 lands
	if strings.Contains(routes, "nope") {
		t.Fatalf("the rejected copy reached the data plane: %s", routes)
	}
	mustContain(t, s.items(t, "upstreams"), "10.244.0.99") // the changed upstream lands too
	if got := counter(s.metrics.HeldBackItems.WithLabelValues("routes")); got != 1 {
		t.Fatalf("held_back_items{routes} = %v", got)
	}
	if got := counter(s.metrics.FallbackPuts.WithLabelValues("applied")); got != 1 {
		t.Fatalf("fallback_puts_total{applied} = %v", got)
	}
	held := s.proxy.DebugConfig().HeldBack
	if len(held) != 1 || held[0].ID != "r1" || held[0].Outcome != "backfilled" || !strings.Contains(held[0].Error, "unknown plugin [nope]") {
		t.Fatalf("/debug/config held_back: %+v", held)
	}
	mustContain(t, s.logs.String(), `"event":"held_back"`)
}

func TestFallbackLeavesOutANewBadServiceAndTheRouteUsingIt(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{fallback: true, fallbackAnswer: proxy.AnswerAccepted})
	c := s.client(true)
	mustLand(t, sync1(t, c, config("v1")))
	cfg := config("v1")
	cfg["services"] = append(cfg["services"], map[string]any{"id": "bad-svc", "plugins": unknownPlugin})
	bad := route("r-bad", "/bad", nil)
	bad["service_id"] = "bad-svc"
	cfg["routes"] = append(cfg["routes"], bad, route("r-good", "/good", nil))
	mustLand(t, sync1(t, c, cfg))
	if svc := s.items(t, "services"); strings.Contains(svc, "bad-svc") {
		t.Fatalf("the bad service landed: %s", svc)
	}
	routes := s.items(t, "routes")
	if strings.Contains(routes, "r-bad") || !strings.Contains(routes, "r-good") {
		t.Fatalf("routes %s: want r-good without r-bad (it refers to the left-out service)", routes)
	}
}

// validateCounter counts validate calls that carry items (not the probe's empty {}).
func validateCounter(n *atomic.Int32) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/validate") && r.ContentLength > 2 {
				n.Add(1)
			}
			next.ServeHTTP(w, r)
		})
	}
}

func TestFallbackOffLeavesAPISIXsAnswer(t *testing.T) {
	t.Parallel()
	var validates atomic.Int32
	s := newStack(t, stackOptions{wrap: validateCounter(&validates)})
	c := s.client(true)
	mustLand(t, sync1(t, c, withRoutes(route("r1", "/old", nil))))
	res := sync1(t, c, withRoutes(route("r1", "/changed", unknownPlugin)))
	if res.Status != http.StatusBadRequest || !strings.Contains(string(res.Body), "unknown plugin [nope]") {
		t.Fatalf("with --fallback off: %d %s, want APISIX's 400", res.Status, res.Body)
	}
	if validates.Load() != 0 {
		t.Fatal("validate was called with --fallback off")
	}
}

func TestFallbackFailsSafeWhenValidateFails(t *testing.T) {
	t.Parallel()
	var puts atomic.Int32
	s := newStack(t, stackOptions{fallback: true, fallbackAnswer: proxy.AnswerAccepted, wrap: func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/validate") && r.ContentLength > 2 {
				http.Error(w, "boom", http.StatusInternalServerError)
				return
			}
			if r.Method == http.MethodPut {
				puts.Add(1)
			}
			next.ServeHTTP(w, r)
		})
	}})
	c := s.client(true)
	mustLand(t, sync1(t, c, withRoutes(route("r1", "/old", nil))))
	before := puts.Load()
	res := sync1(t, c, withRoutes(route("r1", "/changed", unknownPlugin)))
	if res.Status != http.StatusBadRequest || !strings.Contains(string(res.Body), "unknown plugin [nope]") {
		t.Fatalf("%d %s, want APISIX's first answer", res.Status, res.Body)
	}
	if n := puts.Load() - before; n != 1 {
		t.Fatalf("%d PUTs reached the data plane, want the one (no corrected PUT without validate)", n)
	}
	if got := counter(s.metrics.FallbackPuts.WithLabelValues("unavailable")); got != 1 {
		t.Fatalf("fallback_puts_total{unavailable} = %v", got)
	}
}

func TestFallbackOnAPISIX314UsesThePutsMessage(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{fallback: true, fallbackAnswer: proxy.AnswerAccepted, version: "3.14.1"})
	c := s.client(true)
	mustLand(t, sync1(t, c, withRoutes(route("r1", "/old", nil), route("r2", "/two", nil))))
	res := sync1(t, c, withRoutes(route("r1", "/changed", unknownPlugin), route("r2", "/two", unknownPlugin), route("r3", "/three", nil)))
	mustLand(t, res)
	routes := s.items(t, "routes")
	if !strings.Contains(routes, `"/old"`) || !strings.Contains(routes, `"/two"`) || !strings.Contains(routes, `"/three"`) || strings.Contains(routes, "nope") {
		t.Fatalf("routes %s", routes)
	}
}

func TestFallbackOverTheValidateCap(t *testing.T) {
	if race.Enabled {
		// sizes, not concurrency: its 2 MiB section costs 6 s of CPU under the race
		// detector; make test runs it in its pass without (test-suites)
		t.Skip("a 2 MiB section: run without -race (make test does)")
	}
	t.Parallel()
	// about correctness, not speed: no modelled decode cost, and a client and upstream
	// patience a race-enabled build on a busy 2-core machine cannot run out of
	s := newStack(t, stackOptions{fallback: true, fallbackAnswer: proxy.AnswerAccepted, decodeCost: -1, timeout: time.Minute})
	c := s.client(true)
	c.HTTP.Timeout = time.Minute
	var routes []map[string]any
	for i := 0; i < 3000; i++ {
		r := route(fmt.Sprintf("r%d", i), fmt.Sprintf("/r%d", i), nil)
		r["desc"] = strings.Repeat("x", 600) // 3,000 routes: about 2 MiB, over the 1.5 MiB cap
		routes = append(routes, r)
	}
	mustLand(t, sync1(t, c, withRoutes(routes...)))
	routes[2500] = route("r2500", "/changed", unknownPlugin)
	routes = append(routes, route("r-new", "/new", nil))
	mustLand(t, sync1(t, c, withRoutes(routes...)))
	got := s.items(t, "routes")
	if !strings.Contains(got, `"/r2500"`) || strings.Contains(got, "nope") || !strings.Contains(got, `"/new"`) {
		t.Fatal("the bad route was not backfilled in a section over the validate cap")
	}
	if s.em.Costs().Validates < 2 {
		t.Fatalf("%d validate calls: the section must be split under the cap", s.em.Costs().Validates)
	}
}

// putCounter counts configs PUTs that reach the data plane, and those it rejects.
type putCounter struct{ all, rejected, validates atomic.Int32 }

func (c *putCounter) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/validate") && r.ContentLength > 2 {
			c.validates.Add(1)
		}
		if r.Method != http.MethodPut {
			next.ServeHTTP(w, r)
			return
		}
		c.all.Add(1)
		sw := &statusCapture{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		if sw.status >= 400 {
			c.rejected.Add(1)
		}
	})
}

type statusCapture struct {
	http.ResponseWriter
	status int
}

func (s *statusCapture) WriteHeader(code int) { s.status = code; s.ResponseWriter.WriteHeader(code) }

func (s *statusCapture) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// TestFallbackSteadyStateCostsNothingExtra: the same body re-sent is held back before
// the PUT: no rejected PUT, no validate call, and nothing reloads.
func TestFallbackSteadyStateCostsNothingExtra(t *testing.T) {
	t.Parallel()
	var pc putCounter
	s := newStack(t, stackOptions{fallback: true, fallbackAnswer: proxy.AnswerAccepted, wrap: pc.wrap})
	c := s.client(true)
	mustLand(t, sync1(t, c, withRoutes(route("r1", "/old", nil))))
	bad := withRoutes(route("r1", "/changed", unknownPlugin), route("r2", "/new", nil))
	mustLand(t, sync1(t, c, bad))
	rejected, validates, reloads := pc.rejected.Load(), pc.validates.Load(), s.em.TotalReloads()
	for i := 0; i < 3; i++ {
		c.Invalidate() // a cold cache: the same desired configuration, body built afresh
		res := sync1(t, c, bad)
		mustLand(t, res)
		mustContain(t, res.Header.Get("X-Confshim-Actions"), "routes=backfilled")
		if d := s.proxy.DebugConfig().LastAccepted.ClientDigest; d == "" || strings.Contains(d, "+held") {
			t.Fatalf("/debug/config client_digest %q: want the digest the client sent", d)
		}
	}
	if pc.rejected.Load() != rejected || pc.validates.Load() != validates {
		t.Fatalf("steady state: %d rejected PUTs and %d validate calls more, want none",
			pc.rejected.Load()-rejected, pc.validates.Load()-validates)
	}
	if got := s.em.TotalReloads(); got != reloads {
		t.Fatalf("steady state reloaded %d sections", got-reloads)
	}
	routes := s.items(t, "routes")
	if !strings.Contains(routes, `"/old"`) || !strings.Contains(routes, `"/new"`) {
		t.Fatalf("routes %s", routes)
	}
	// fixed at the source: the item lands
	mustLand(t, sync1(t, c, withRoutes(route("r1", "/changed", nil), route("r2", "/new", nil))))
	mustContain(t, s.items(t, "routes"), `"/changed"`)
	if got := counter(s.metrics.HeldBackItems.WithLabelValues("routes")); got != 0 {
		t.Fatalf("held_back_items{routes} = %v after the fix", got)
	}
}

// TestFallbackGlobalRuleMoveLandsInOneSync: a plugin moved from global rule g1 to g2 is
// refused by APISIX 3.17 in one PUT (g1 still holds it, as applied); the corrected PUT
// lands g1 without it, and once that is applied g2 goes in a second PUT — within the
// client's one sync, although the workers apply a second late.
func TestFallbackGlobalRuleMoveLandsInOneSync(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{fallback: true, fallbackAnswer: proxy.AnswerAccepted, appliedLag: 500 * time.Millisecond})
	c := s.client(true)
	rules := func(g1, g2 map[string]any) adcclient.Config {
		cfg := config("v1")
		cfg["global_rules"] = []map[string]any{{"id": "g1", "plugins": g1}}
		if g2 != nil {
			cfg["global_rules"] = append(cfg["global_rules"], map[string]any{"id": "g2", "plugins": g2})
		}
		return cfg
	}
	mustLand(t, sync1(t, c, rules(map[string]any{"prometheus": map[string]any{}}, nil)))
	s.em.ApplyNow() // the workers have applied the first rules (their lag is not this test's subject)
	res := sync1(t, c, rules(map[string]any{"cors": map[string]any{}}, map[string]any{"prometheus": map[string]any{}}))
	mustLand(t, res)
	got := jsonOf(s.doc(t)["global_rules"])
	if !strings.Contains(got, `"g2"`) || !strings.Contains(got, "prometheus") || !strings.Contains(got, "cors") {
		t.Fatalf("global rules after one sync: %s, want g1 with cors and g2 with prometheus", got)
	}
}

// TestFallbackNeverTouchesYAML: a YAML body with a rejected item gets APISIX's answer.
func TestFallbackNeverTouchesYAML(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{fallback: true, fallbackAnswer: proxy.AnswerAccepted})
	adminPut(t, s.dpURL, `{"routes_conf_version":1,"routes":[{"id":"r1","uri":"/old"}]}`, "seed")
	body := "routes_conf_version: 2\nroutes:\n  - id: r1\n    uri: /new\n    plugins:\n      nope: {}\n"
	req, _ := http.NewRequest(http.MethodPut, s.proxyURL+"/apisix/admin/configs", strings.NewReader(body))
	req.Header.Set("X-API-KEY", adminKey)
	req.Header.Set("X-Digest", "y")
	req.Header.Set("Content-Type", "application/yaml")
	resp, err := testHTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || s.em.Costs().Rejected != 1 {
		t.Fatalf("%d, %d rejected PUTs: want APISIX's 400 and no second PUT", resp.StatusCode, s.em.Costs().Rejected)
	}
	mustContain(t, s.items(t, "routes"), `"/old"`)
}

// TestFallbackConsumerKeyMoveOn318: APISIX 3.18 refuses a key-auth key moved to another
// consumer while the old one still holds it; the new consumer lands in the same sync.
func TestFallbackConsumerKeyMoveOn318(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{fallback: true, fallbackAnswer: proxy.AnswerAccepted, version: "3.18.0"})
	c := s.client(true)
	withConsumer := func(name string) adcclient.Config {
		cfg := config("v1")
		cfg["consumers"] = []map[string]any{{"username": name, "plugins": map[string]any{"key-auth": map[string]any{"key": "shared-key"}}}}
		return cfg
	}
	mustLand(t, sync1(t, c, withConsumer("alice")))
	res := sync1(t, c, withConsumer("bob"))
	mustLand(t, res)
	consumers := jsonOf(s.doc(t)["consumers"])
	if !strings.Contains(consumers, `"bob"`) || strings.Contains(consumers, `"alice"`) {
		t.Fatalf("consumers after one sync: %s, want bob holding the key", consumers)
	}
}

// TestFallbackKeepsHoldingWhatItHeldBeforeAnotherRejection: a route held back before
// the PUT stays held back (and reported) when APISIX then rejects another new item.
func TestFallbackKeepsHoldingWhatItHeldBeforeAnotherRejection(t *testing.T) {
	t.Parallel()
	var pc putCounter
	s := newStack(t, stackOptions{fallback: true, fallbackAnswer: proxy.AnswerAccepted, wrap: pc.wrap})
	c := s.client(true)
	mustLand(t, sync1(t, c, withRoutes(route("r1", "/old", nil))))
	mustLand(t, sync1(t, c, withRoutes(route("r1", "/changed", unknownPlugin)))) // r1 held back
	res := sync1(t, c, withRoutes(route("r1", "/changed", unknownPlugin), route("r2", "/new", unknownPlugin)))
	mustLand(t, res)
	if got := counter(s.metrics.HeldBackItems.WithLabelValues("routes")); got != 2 {
		t.Fatalf("held_back_items{routes} = %v, want 2 (r1 before the PUT, r2 after)", got)
	}
	rejected := pc.rejected.Load()
	mustLand(t, sync1(t, c, withRoutes(route("r1", "/changed", unknownPlugin), route("r2", "/new", unknownPlugin))))
	if pc.rejected.Load() != rejected {
		t.Fatal("the next sync of the same items was rejected again: one of them was forgotten")
	}
	mustContain(t, s.items(t, "routes"), `"/old"`)
}

// Issue 36: an operator write during a fallback's validate calls is not overwritten by
// the corrected PUT, whose merged union goes at a version that beats APISIX's check:
// before it, a HEAD shows whether the data plane still holds the state the sync was
// decided on, and when it does not the sync is decided again on a fresh read.
func TestOperatorWriteDuringTheFallbackSurvivesTheCorrectedPut(t *testing.T) {
	t.Parallel()
	var during atomic.Bool
	var s *stack
	s = newStack(t, stackOptions{fallback: true, merge: []string{"global_rules"}, wrap: func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// the fallback's validate, not the probe's empty one
			if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/validate") && r.ContentLength > 2 && during.CompareAndSwap(true, false) {
				addPlatformRule(t, s) // straight to APISIX, while confshim asks which item it rejects
			}
			next.ServeHTTP(w, r)
		})
	}})
	c := s.client(true)
	mustLand(t, sync1(t, c, withRules(rule("prometheus", "prometheus", 1))))
	during.Store(true)
	cfg := withRules(rule("prometheus", "prometheus", 1), rule("cors", "cors", 1)) // the union changes
	cfg["routes"] = []map[string]any{route("r1", "/v1", nil), route("r-bad", "/bad", unknownPlugin)}
	res := sync1(t, c, cfg)
	if res.Status != http.StatusBadRequest || !strings.Contains(string(res.Body), "r-bad") {
		t.Fatalf("answer %d %s, want the rejection naming r-bad", res.Status, res.Body)
	}
	if during.Load() {
		t.Fatal("the fallback made no validate call")
	}
	wantIDs(t, s.ids(t, "global_rules"), "prometheus", "cors", "platform-tracing")
	wantIDs(t, s.ids(t, "routes"), "r1")
}
