package integration

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confshim/confshim/internal/testsupport/adcclient"
	"github.com/confshim/confshim/proxy"
)

// reqLog records every request confshim sends to the data plane (not the operator's).
type reqLog struct {
	mu   sync.Mutex
	on   atomic.Bool
	seen []string
}

func (l *reqLog) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if l.on.Load() && !strings.HasPrefix(r.Header.Get("X-Digest"), "oob-") && strings.HasSuffix(r.URL.Path, "/configs") {
			l.mu.Lock()
			l.seen = append(l.seen, r.Method)
			l.mu.Unlock()
		}
		next.ServeHTTP(w, r)
	})
}

func withSecretR(route, token string) adcclient.Config {
	cfg := config(route)
	cfg["secrets"] = []map[string]any{secretItem("vault/ctrl", token)}
	return cfg
}

func opPlusOne(t *testing.T, s *stack, id string) func() {
	return func() {
		s.oobPut(t, func(doc map[string]any) {
			doc["secrets_conf_version"] = doc["secrets_conf_version"].(float64) + 1
			doc["secrets"] = append(doc["secrets"].([]any), secretItem(id, "op"))
		})
	}
}

// More cases from reviews of the read-back of a merged section sent at vS+1, each
// asserting what the data plane holds and what the client is told.

// After a lost tie the sync is decided again: the header and metrics report what both
// decisions did, so a section the first (applied) PUT bumped is reported bumped.
func TestATieLostSyncReportsBothDecisions(t *testing.T) {
	t.Parallel()
	var hook onNthPut
	s := newStack(t, stackOptions{merge: []string{"secrets"}, trust: proxy.TrustNever, wrap: hook.wrap})
	c := s.client(true)
	clock := int64(1_000_000)
	c.Clock = func() int64 { return clock }
	mustLand(t, sync1(t, c, withSecretR("v1", "a")))
	s.oobPut(t, func(doc map[string]any) { doc["routes_conf_version"] = doc["routes_conf_version"].(float64) + 100 })
	clock++
	hook.arm(1, opPlusOne(t, s, "vault/1"))
	res := sync1(t, c, withSecretR("v2", "b"))
	t.Logf("answer %d, X-Confshim-Actions: %q", res.Status, res.Header.Get("X-Confshim-Actions"))
	t.Logf("routes on the data plane: %s (version %v)", s.items(t, "routes"), s.em.SectionVersion("routes"))
	t.Logf("section_rewrites_total routes/bumped=%v routes/raised=%v; conflict_retries=%v",
		counter(s.metrics.SectionRewrites.WithLabelValues("routes", "bumped")),
		counter(s.metrics.SectionRewrites.WithLabelValues("routes", "raised")), counter(s.metrics.ConflictRetries))
	if strings.Contains(s.items(t, "routes"), "/v2") && !strings.Contains(res.Header.Get("X-Confshim-Actions"), "routes=bumped") {
		t.Errorf("this sync applied the client's routes change (bumped over a stale version) but the answer reports %q", res.Header.Get("X-Confshim-Actions"))
	}
}

// One repaired PUT makes at most four state reads and PUTs (contract §3), a lost tie's
// read-back included: the sync decided again never goes at a tie (no second read-back).
func TestATieLostSyncMakesNoMoreRequestsThanAConflict(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		clock int64
		setup func(t *testing.T, s *stack, hook *onNthPut)
	}{
		{"conflict-then-tie", 1_000_000, func(t *testing.T, s *stack, hook *onNthPut) {
			hook.arm(1, func() { // an operator raises routes: the first PUT is a version conflict
				s.oobPut(t, func(doc map[string]any) { doc["routes_conf_version"] = doc["routes_conf_version"].(float64) + 100 })
			})
		}},
		{"tie-lost-clock-behind", 9_000_000_000_000, func(t *testing.T, s *stack, hook *onNthPut) {
			hook.arm(1, func() { opPlusOne(t, s, "vault/op1")(); hook.arm(1, opPlusOne(t, s, "vault/op2")) })
		}},
	} {
		for _, trust := range []proxy.TrustMode{proxy.TrustNever, ""} {
			t.Run(tc.name+"/"+string(trust), func(t *testing.T) {
				t.Parallel()
				var hook onNthPut
				var log reqLog
				s := newStack(t, stackOptions{merge: []string{"secrets"}, trust: trust, wrap: func(h http.Handler) http.Handler { return log.wrap(hook.wrap(h)) }})
				c := s.client(true)
				clock := tc.clock
				c.Clock = func() int64 { return clock }
				mustLand(t, sync1(t, c, withSecretR("v1", "a")))
				clock++
				tc.setup(t, s, &hook)
				log.on.Store(true)
				res := sync1(t, c, withSecretR("v2", "b"))
				log.on.Store(false)
				t.Logf("answer %d; confshim's requests to /configs in this sync: %v (%d)", res.Status, log.seen, len(log.seen))
				reads := 0 // a HEAD is a look, not a state read (as before this change, a conflict with trust never: HEAD GET PUT GET PUT)
				for _, m := range log.seen {
					if m != http.MethodHead {
						reads++
					}
				}
				if reads > 4 {
					t.Errorf("%d state reads and PUTs for one repaired PUT, contract §3 says at most four", reads)
				}
			})
		}
	}
}

// The client deletes its own item at vS+1; an operator's read-modify-write lands at
// vS+1 just before confshim's PUT (kept: equal version) and the operator writes again
// (vS+2) before the read-back. At a higher version the read-back looks for the client's
// deletion too: not there, the sync is decided again and the deletion lands.
func TestADeletionKeptOutAtAHigherVersionIsFound(t *testing.T) {
	t.Parallel()
	var armed atomic.Bool
	var s *stack
	wrap := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPut && !strings.HasPrefix(r.Header.Get("X-Digest"), "oob-") && armed.Swap(false) {
				opPlusOne(t, s, "vault/1")() // the operator's +1, before the PUT
				next.ServeHTTP(w, r)
				s.oobPut(t, func(doc map[string]any) { // and its next write, before the read-back
					doc["secrets_conf_version"] = doc["secrets_conf_version"].(float64) + 1
				})
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	s = newStack(t, stackOptions{merge: []string{"secrets"}, trust: proxy.TrustNever, wrap: wrap})
	c := s.client(true)
	clock := int64(1_000_000)
	c.Clock = func() int64 { return clock }
	two := config("v1")
	two["secrets"] = []map[string]any{secretItem("vault/ctrl", "a"), secretItem("vault/x", "x")}
	mustLand(t, sync1(t, c, two))
	clock++
	armed.Store(true)
	res := sync1(t, c, withSecretR("v1", "a")) // vault/x deleted by the client
	got := s.items(t, "secrets")
	t.Logf("answer %d %s; secrets on the data plane: %s", res.Status, res.Body, got)
	if res.Status/100 == 2 && strings.Contains(got, "vault/x") {
		t.Errorf("answered %d, but the client's deletion of vault/x is not on the data plane", res.Status)
	}
}

// With fallback work, a tie lost on the corrected PUT is decided again; when the budget
// then has no room for the PUT decided again, the client is told the merged change did
// not land (409, the rest applied) — not APISIX's first 400, which names only the
// refused route.
func TestATieLostWithoutBudgetAnswers409(t *testing.T) {
	t.Parallel()
	const budget = 3 * time.Second
	var phase atomic.Int32 // 1: armed
	var puts atomic.Int32
	var s *stack
	wrap := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mine := !strings.HasPrefix(r.Header.Get("X-Digest"), "oob-")
			switch {
			case phase.Load() == 0 || !mine:
			case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/validate") && r.ContentLength > 2 && phase.CompareAndSwap(1, 2):
				time.Sleep(budget * 4 / 10)
			case r.Method == http.MethodPut && puts.Load() == 1: // the corrected PUT
				opPlusOne(t, s, "vault/1")()
				time.Sleep(budget / 5)
			case r.Method == http.MethodGet && puts.Load() == 2: // the read-back
				time.Sleep(budget * 3 / 10)
			}
			next.ServeHTTP(w, r)
			if mine && phase.Load() > 0 && r.Method == http.MethodPut {
				puts.Add(1)
			}
		})
	}
	s = newStack(t, stackOptions{merge: []string{"secrets"}, trust: proxy.TrustNever, fallback: true, fallbackBudget: budget, wrap: wrap})
	c := s.client(true)
	clock := int64(1_000_000)
	c.Clock = func() int64 { return clock }
	mustLand(t, sync1(t, c, withSecretR("v1", "a")))
	cfg := withSecretR("v2", "b")
	cfg["routes"] = append(cfg["routes"], route("r9", "/x", unknownPlugin))
	clock++
	phase.Store(1)
	start := time.Now()
	res := sync1(t, c, cfg)
	t.Logf("answered %d after %v: %s actions=%q; confshim PUTs %d", res.Status, time.Since(start).Round(time.Millisecond), strings.TrimSpace(string(res.Body)), res.Header.Get("X-Confshim-Actions"), puts.Load())
	t.Logf("routes: %s", s.items(t, "routes"))
	t.Logf("secrets: %s", s.items(t, "secrets"))
	if res.Status == http.StatusBadRequest && !strings.Contains(string(res.Body), "secrets") && !strings.Contains(s.items(t, "secrets"), `"token":"b"`) {
		t.Errorf("the client is told only r9 was refused; its secrets change did not land and the answer does not say so")
	}
}

var _ = fmt.Sprintf

// An operator's +1 wins the tie, and the read-back fails (502 "could not be read
// back"). The kept configuration (the PUT's union, without the operator's item) is
// forgotten and read back by the watch, so a re-seed after APISIX restarts before the
// client's next sync keeps the operator's item.
func TestAReseedAfterAnUnverifiedReadBackKeepsTheWritersItems(t *testing.T) {
	t.Parallel()
	var armed atomic.Bool
	var failGet atomic.Bool
	var s *stack
	wrap := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mine := !strings.HasPrefix(r.Header.Get("X-Digest"), "oob-")
			if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/configs") && failGet.Swap(false) {
				w.WriteHeader(http.StatusInternalServerError)
				return
			}
			if r.Method == http.MethodPut && mine && armed.Swap(false) {
				opPlusOne(t, s, "vault/1")()
				next.ServeHTTP(w, r)
				failGet.Store(true)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	s = newStack(t, stackOptions{merge: []string{"secrets"}, trust: proxy.TrustNever, reseed: watch, safety: watchSafety, wrap: wrap})
	c := s.client(true)
	clock := int64(1_000_000)
	c.Clock = func() int64 { return clock }
	mustLand(t, sync1(t, c, withSecretR("v1", "a")))
	clock++
	armed.Store(true)
	res := sync1(t, c, withSecretR("v1", "b"))
	t.Logf("answer %d %s", res.Status, strings.TrimSpace(string(res.Body)))
	t.Logf("before the restart: secrets %s", s.items(t, "secrets"))
	watchTicks(t, s, 3)
	s.restartDataPlane(t, restartDowntime)
	waitRestored(t, s)
	got := s.items(t, "secrets")
	t.Logf("after the re-seed:  secrets %s", got)
	if !strings.Contains(got, "vault/1") {
		t.Errorf("the operator's vault/1, on the data plane when it restarted, is gone after the re-seed")
	}
}

// No writer at all. A merged item repeating a member (APISIX's cjson keeps the last)
// never fingerprints as what the data plane stores, so the read-back takes it for a
// writer's copy once; the sync decided again goes above vS+1 and is not read back: a
// 2xx, not a 409 (the extra PUT and the out-of-band write counted are the cost left).
func TestADuplicateMemberIsNoFalse409(t *testing.T) {
	t.Parallel()
	var log reqLog
	s := newStack(t, stackOptions{merge: []string{"secrets"}, trust: proxy.TrustNever, wrap: log.wrap})
	body := func(v int64, token string) string {
		return fmt.Sprintf(`{"routes_conf_version":9000000000000,"routes":[{"id":"r1","uri":"/a"}],`+
			`"secrets_conf_version":%d,"secrets":[{"id":"vault/ctrl","uri":"http://vault:8200","prefix":"kv","token":"x","token":%q}]}`, v, token)
	}
	if st, _ := rawPut(t, s.proxyURL, body(9000000000000, "a"), "d1"); st/100 != 2 {
		t.Fatalf("first PUT %d", st)
	}
	log.on.Store(true)
	st, hdr := rawPut(t, s.proxyURL, body(9000000000001, "b"), "d2")
	t.Logf("answer %d (actions %q); requests %v; secrets %s at %v; out-of-band writes counted %v",
		st, hdr.Get("X-Confshim-Actions"), log.seen, s.items(t, "secrets"), s.em.SectionVersion("secrets"),
		counter(s.metrics.OutOfBandWrites.WithLabelValues("secrets")))
	if st == http.StatusConflict && strings.Contains(s.items(t, "secrets"), `"token":"b"`) {
		t.Errorf("409 'another writer set secrets to the very version this sync sent' with no writer, and the change is on the data plane")
	}
}

// A YAML merged change at vS+1 goes at the clock's version; with the versions above
// the clock (another writer's clock ran ahead), at vS+2: above the operator's +1 either
// way, so it lands.
func TestAYAMLMergedChangeLandsWithTheClockBehind(t *testing.T) {
	t.Parallel()
	var hook onNthPut
	s := newStack(t, stackOptions{merge: []string{"secrets"}, trust: proxy.TrustNever, wrap: hook.wrap})
	put := func(body, digest, contentType string) int {
		req, _ := http.NewRequest(http.MethodPut, s.proxyURL+"/apisix/admin/configs", strings.NewReader(body))
		req.Header.Set("X-API-KEY", adminKey)
		req.Header.Set("X-Digest", digest)
		req.Header.Set("Content-Type", contentType)
		resp, err := testHTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	first := `{"routes_conf_version":9000000000000,"routes":[{"id":"r1","uri":"/a"}],"secrets_conf_version":9000000000000,"secrets":[{"id":"vault/ctrl","uri":"http://vault:8200","prefix":"kv","token":"a"}]}`
	if st := put(first, "d1", "application/json"); st/100 != 2 {
		t.Fatalf("first PUT %d", st)
	}
	hook.arm(1, opPlusOne(t, s, "vault/1"))
	yaml := "routes_conf_version: 9000000000000\nroutes:\n  - id: r1\n    uri: /a\n" +
		"secrets_conf_version: 9000000000001\nsecrets:\n  - id: vault/ctrl\n    uri: http://vault:8200\n    prefix: kv\n    token: b\n"
	st := put(yaml, "d2", "application/yaml")
	got := s.items(t, "secrets")
	t.Logf("YAML PUT answered %d; secrets at %v: %s", st, s.em.SectionVersion("secrets"), got)
	if st/100 == 2 && !strings.Contains(got, `"token":"b"`) {
		t.Errorf("answered %d, but the client's token b is not on the data plane", st)
	}
}

// A sync decided again after a plain version conflict (a writer is active right now)
// does not send a merged section at vS+1 either, where its change would have to be read
// back past the four requests (§3): it goes at the clock's version, and the header says
// so (secrets=bumped: a version the client did not send, §5.5).
func TestAConflictRetryReportsAMergedSectionItMovesOffATie(t *testing.T) {
	t.Parallel()
	var hook onNthPut
	s := newStack(t, stackOptions{merge: []string{"secrets"}, trust: proxy.TrustNever, wrap: hook.wrap})
	c := s.client(true)
	clock := int64(1_000_000)
	c.Clock = func() int64 { return clock }
	mustLand(t, sync1(t, c, withSecretR("v1", "a")))
	clock++              // the client's secrets version is the data plane's + 1
	hook.arm(1, func() { // an operator raises routes before the sync's PUT: a version conflict
		s.oobPut(t, func(doc map[string]any) { doc["routes_conf_version"] = doc["routes_conf_version"].(float64) + 100 })
	})
	res := sync1(t, c, withSecretR("v2", "b"))
	mustLand(t, res)
	if got := s.items(t, "secrets"); !strings.Contains(got, `"token":"b"`) {
		t.Fatalf("secrets %s", got)
	}
	if v := s.em.SectionVersion("secrets"); v <= float64(clock) {
		t.Fatalf("secrets at %v: the retry went at the client's vS+1", v)
	}
	if actions := res.Header.Get("X-Confshim-Actions"); !strings.Contains(actions, "secrets=bumped") {
		t.Fatalf("X-Confshim-Actions %q: the secrets version confshim chose is not reported", actions)
	}
}
