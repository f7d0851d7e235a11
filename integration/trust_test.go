package integration

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/confshim/confshim/internal/testsupport/fixture"
	"github.com/confshim/confshim/internal/testsupport/race"
	"github.com/confshim/confshim/proxy"
)

// Issue 30: a sync decided on confshim's belief without a read must be as safe as one
// decided on a read, in every deployment. Each test is one way the belief was wrong.

// marked puts an intermediary's marks on every answer of the data plane, as an L7 proxy
// or a mesh sidecar between confshim and APISIX would.
func marked(marks http.Header) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			next.ServeHTTP(&markingWriter{ResponseWriter: w, marks: marks}, r)
		})
	}
}

type markingWriter struct {
	http.ResponseWriter
	marks   http.Header
	written bool
}

func (m *markingWriter) WriteHeader(code int) {
	if !m.written {
		m.written = true
		for k, v := range m.marks {
			m.Header()[k] = v // replaces the emulator's Server too
		}
	}
	m.ResponseWriter.WriteHeader(code)
}

func (m *markingWriter) Write(b []byte) (int, error) {
	if !m.written {
		m.WriteHeader(http.StatusOK)
	}
	return m.ResponseWriter.Write(b)
}

func (m *markingWriter) Unwrap() http.ResponseWriter { return m.ResponseWriter }

// stateOnlyRestartRoutes is the gateway of the restart tests: routes with their
// services and upstreams and an out-of-band secrets manager. 2,000 in the suite (a
// 20,000-route sync takes about 2 s in the emulator), 500 under the race detector (at
// 2,000 the five restarts were 60 % of the race suite's CPU; TestTrustAlways… shows
// the loss at either size); make soak runs the 20,000 (restart_soak_test.go).
var stateOnlyRestartRoutes = func() int {
	if race.Enabled {
		return 500
	}
	return 2000
}

// restartBehindTheConnection seeds the data plane, lands the client's sync, restarts
// the data plane's state only (connections stay open, as behind a proxy that keeps
// them) and syncs the same configuration again. It returns the stack and the routes
// the client declared.
func restartBehindTheConnection(t *testing.T, o stackOptions) (*stack, int) {
	t.Helper()
	n := stateOnlyRestartRoutes()
	o.reseed = time.Hour // the watch stays out of it: the sync alone must be right
	s := newStack(t, o)
	pair := fixture.Clean(n)
	adminPut(t, s.dpURL, string(pair.State), "seed") // with the operator's secrets manager
	for i, digest := range []string{"c1", "c1"} {    // the change, then the identical sync
		if status, _ := rawPut(t, s.proxyURL, string(pair.Request), digest); status/100 != 2 {
			t.Fatalf("sync %d: %d", i+1, status)
		}
	}
	s.em.Restart() // APISIX forgets; the connection to it stays open
	status, hdr := rawPut(t, s.proxyURL, string(pair.Request), "c1")
	if status/100 != 2 {
		t.Fatalf("the sync after the restart: %d %v", status, hdr)
	}
	return s, n
}

func sectionLen(s *stack, section string) int {
	d := s.em.Document()
	items, _ := d[section].([]any)
	return len(items)
}

// TestStateOnlyRestartBehindAnIntermediaryLosesNothing: with an intermediary's marks on
// the answers, or with --trust-connection never, the sync after a restart the kept-open
// connection did not show is decided on a read: the data plane is re-seeded and holds
// every section whole.
func TestStateOnlyRestartBehindAnIntermediaryLosesNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		trust proxy.TrustMode
		marks http.Header
	}{
		{"Via", proxy.TrustAuto, http.Header{"Via": {"1.1 sidecar"}}},
		{"X-Envoy-Upstream-Service-Time", proxy.TrustAuto, http.Header{"X-Envoy-Upstream-Service-Time": {"3"}}},
		{"Server: envoy", proxy.TrustAuto, http.Header{"Server": {"envoy"}}},
		{"never", proxy.TrustNever, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, n := restartBehindTheConnection(t, stackOptions{trust: tc.trust, wrap: marked(tc.marks)})
			for _, section := range []string{"routes", "services", "upstreams"} {
				if got := sectionLen(s, section); got != n {
					t.Fatalf("%s: %d items after the sync, want %d", section, got, n)
				}
			}
			mustContain(t, s.items(t, "secrets"), "vault") // the operator's, re-seeded too
			if trusted, why := s.proxy.TrustConnection(); trusted {
				t.Fatalf("the connection is trusted: %s", why)
			}
		})
	}
}

// TestTrustAlwaysLosesAStateOnlyRestartBehindAProxy documents the risk of
// --trust-connection always where something does keep confshim's connection open while
// APISIX restarts behind it: the sync is decided unread, its thin PUT reaches the empty
// data plane, and the unchanged sections are stored empty. That is why auto trusts only
// a loopback upstream with no intermediary's marks.
func TestTrustAlwaysLosesAStateOnlyRestartBehindAProxy(t *testing.T) {
	t.Parallel()
	s, n := restartBehindTheConnection(t, stackOptions{trust: proxy.TrustAlways, wrap: marked(http.Header{"Via": {"1.1 sidecar"}})})
	if got := sectionLen(s, "routes"); got == n {
		t.Fatalf("routes whole (%d): --trust-connection always should have decided unread and lost them", got)
	}
}

// TestAutoTrustsLoopbackWithoutMarks: the sidecar deployment: the same sync on a
// loopback upstream with APISIX's own answers is decided unread (no HEAD or GET of the
// configuration before the PUT).
func TestAutoTrustsLoopbackWithoutMarks(t *testing.T) {
	t.Parallel()
	var log exchangeLog
	s := newStack(t, stackOptions{reseed: time.Hour, wrap: log.wrap})
	c := s.client(true)
	mustLand(t, sync1(t, c, config("v1")))
	mustLand(t, sync1(t, c, config("v1")))
	n := log.len()
	mustLand(t, sync1(t, c, config("v2")))
	if reads := log.stateReads(n); reads != 0 {
		t.Fatalf("%d reads before the PUT on a trusted connection: %q", reads, log.since(n))
	}
	if trusted, why := s.proxy.TrustConnection(); !trusted {
		t.Fatalf("a loopback upstream without marks is not trusted: %s", why)
	}
}

// TestClientVersionEqualToAWritersIsApplied: an out-of-band writer set routes to
// vS+1; the client, whose clock is behind, sends its change at vS+1 too. Decided
// unread, the section goes at the clock's version, so APISIX applies the client's copy
// instead of keeping the writer's.
func TestClientVersionEqualToAWritersIsApplied(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{reseed: time.Hour})
	first := `{"routes_conf_version":5,"routes":[{"id":"r1","uri":"/one"}]}`
	if status, _ := rawPut(t, s.proxyURL, first, "c1"); status != 202 {
		t.Fatalf("first sync: %d", status)
	}
	vS := s.em.SectionVersion("routes")
	s.oobPut(t, func(doc map[string]any) {
		doc["routes_conf_version"] = vS + 1
		doc["routes"] = []any{map[string]any{"id": "w1", "uri": "/by-hand"}}
	})
	change := fmt.Sprintf(`{"routes_conf_version":%.0f,"routes":[{"id":"r1","uri":"/one"},{"id":"r2","uri":"/two"},{"id":"r3","uri":"/three"}]}`, vS+1)
	if status, _ := rawPut(t, s.proxyURL, change, "c2"); status != 202 {
		t.Fatalf("the client's change: %d", status)
	}
	routes := s.items(t, "routes")
	mustContain(t, routes, `"/three"`)
	if strings.Contains(routes, "/by-hand") {
		t.Fatalf("the writer's routes stayed: %s", routes)
	}
	if got := sectionLen(s, "routes"); got != 3 {
		t.Fatalf("%d routes, want the client's 3", got)
	}
}

// closing answers the matching requests with Connection: close (every one when match
// is nil), as nginx does at keepalive_timeout 0 or at its keep-alive request limit.
func closing(match func(*http.Request) bool) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if match == nil || match(r) {
				// set as the answer starts: the emulator says keep-alive, as APISIX does
				w = &markingWriter{ResponseWriter: w, marks: http.Header{"Connection": {"close"}}}
			}
			next.ServeHTTP(w, r)
		})
	}
}

// TestEveryAnswerClosingItsConnection: where APISIX keeps no connection, confshim
// works like a read-then-PUT proxy: ten syncs in a row land, none answered 502.
func TestEveryAnswerClosingItsConnection(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{wrap: closing(nil)})
	c := s.client(true)
	for i := range 10 {
		res := sync1(t, c, config(fmt.Sprintf("v%d", i%3)))
		if res.Status/100 != 2 {
			t.Fatalf("sync %d: %d %s", i+1, res.Status, res.Body)
		}
	}
	mustContain(t, s.items(t, "routes"), routesOf("v0")[1:20])
}

// TestConnectionCloseOnTheCorrectedPutStillLandsTheSecondStep: APISIX answers the
// corrected PUT's 202 with Connection: close; the second step's PUT goes on a new
// connection, in the same sync, and the renamed metrics rule lands.
func TestConnectionCloseOnTheCorrectedPutStillLandsTheSecondStep(t *testing.T) {
	t.Parallel()
	corrected := func(r *http.Request) bool {
		return r.Method == http.MethodPut && strings.Contains(r.Header.Get("X-Digest"), "+backfill:") && !strings.HasSuffix(r.Header.Get("X-Digest"), "+2")
	}
	s, _, _, res, _ := renamed(t, stackOptions{fallback: true, fallbackAnswer: proxy.AnswerAccepted, appliedLag: 300 * time.Millisecond, wrap: closing(corrected)}, true)
	mustLand(t, res)
	rules := jsonOf(s.doc(t)["global_rules"])
	if !strings.Contains(rules, `"prometheus"`) || strings.Contains(rules, `"id":"1"`) {
		t.Fatalf("global rules after one sync: %s, want only the renamed rule", rules)
	}
	mustContain(t, s.items(t, "routes"), `"r-new"`)
}

// TestDebugConfigIsNeverTorn: /debug/config read 10,000 times while two clients sync
// alternately never shows the kept configuration of one PUT beside the data plane's
// digest of another: the belief publishes one snapshot per transition.
func TestDebugConfigIsNeverTorn(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{reseed: time.Hour})
	a, b := s.client(true), s.client(true)
	mustLand(t, sync1(t, a, config("a")))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 10000; i++ {
			doc := s.proxy.DebugConfig()
			if k := doc.Kept; k != nil && k.Digest != "" && doc.DataPlane.Digest != "" && k.Digest != doc.DataPlane.Digest {
				t.Errorf("read %d: kept.digest %q beside data_plane.digest %q", i, k.Digest, doc.DataPlane.Digest)
				return
			}
		}
	}()
	for i := 0; ; i++ {
		select {
		case <-done:
			return
		default:
		}
		c, variant := a, "a"
		if i%2 == 1 {
			c, variant = b, "b"
		}
		if res := sync1(t, c, config(fmt.Sprintf("%s%d", variant, i))); res.Status/100 != 2 {
			t.Fatalf("sync %d: %d %s", i, res.Status, res.Body)
		}
	}
}
