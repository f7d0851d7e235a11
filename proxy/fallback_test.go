package proxy

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/confshim/confshim/internal/testsupport/emulator"
	"github.com/confshim/confshim/internal/testsupport/wait"
)

// The fallback (contract §8.5) through the proxy: each path of internal/syncmachine's
// fallback.go driven against the emulator, with what the data plane then holds and what
// the client is told.

// fallbackFixture is confshim with --fallback backfill in front of an emulator of
// version, whose workers apply a PUT lag late; wrap may stand between them.
func fallbackFixture(t *testing.T, version string, lag time.Duration, wrap func(*emulator.Emulator, http.Handler) http.Handler, mutate func(*Config)) (*fixture, *emulator.Emulator) {
	t.Helper()
	em, err := emulator.New(emulator.Options{Version: version, AdminKey: key, AppliedLag: lag})
	if err != nil {
		t.Fatal(err)
	}
	var h http.Handler = em
	if wrap != nil {
		h = wrap(em, em)
	}
	f := newFixture(t, h, func(c *Config) {
		c.Fallback, c.ReseedInterval = true, time.Hour
		if mutate != nil {
			mutate(c)
		}
	})
	f.em = em
	return f, em
}

func putConfig(t *testing.T, f *fixture, body, digest string) resp {
	t.Helper()
	return do(t, "PUT", f.url+"/apisix/admin/configs", body, withKey(map[string]string{"X-Digest": digest}))
}

// heldIDs are the ids the 400 of --fallback-answer rejection names.
func heldIDs(t *testing.T, r resp) []string {
	t.Helper()
	var a struct {
		Errors []struct {
			ID string `json:"resource_id"`
		} `json:"errors"`
	}
	if r.status != http.StatusBadRequest || json.Unmarshal([]byte(r.body), &a) != nil {
		t.Fatalf("answer %d %s: want the 400 naming the held items", r.status, r.body)
	}
	var ids []string
	for _, e := range a.Errors {
		ids = append(ids, e.ID)
	}
	return ids
}

func stored(t *testing.T, em *emulator.Emulator, section string) string {
	t.Helper()
	b, _ := json.Marshal(em.Document()[section])
	return string(b)
}

func TestFallbackBackfillsHoldsAndReports(t *testing.T) {
	t.Parallel()
	var validates atomic.Int32
	f, em := fallbackFixture(t, "3.17.0", 0, func(_ *emulator.Emulator, next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/validate") && r.ContentLength > 2 {
				validates.Add(1)
			}
			next.ServeHTTP(w, r)
		})
	}, nil)
	if r := putConfig(t, f, `{"routes_conf_version":1,"routes":[{"id":"r1","uri":"/a"}]}`, "d1"); r.status != http.StatusAccepted {
		t.Fatalf("first sync: %d %s", r.status, r.body)
	}
	bad := `{"routes_conf_version":2,"routes":[{"id":"r1","uri":"/b","plugins":{"nope":{}}},{"id":"r2","uri":"/c"}]}`
	r := putConfig(t, f, bad, "d2")
	if ids := heldIDs(t, r); len(ids) != 1 || ids[0] != "r1" || !strings.Contains(r.header.Get("X-Confshim-Actions"), "routes=backfilled") {
		t.Fatalf("held %v, actions %q", ids, r.header.Get("X-Confshim-Actions"))
	}
	routes := stored(t, em, "routes")
	if !strings.Contains(routes, `"/a"`) || !strings.Contains(routes, `"/c"`) || strings.Contains(routes, "nope") {
		t.Fatalf("routes %s: want r1's accepted copy and r2", routes)
	}
	// the same bytes again: held back before the PUT, no validate call, routes as they
	// were (this body leaves other sections out, which APISIX moves on every PUT)
	before := validates.Load()
	if ids := heldIDs(t, putConfig(t, f, bad, "d2")); len(ids) != 1 {
		t.Fatalf("steady state held %v", ids)
	}
	if validates.Load() != before {
		t.Fatalf("the steady state validated %d times", validates.Load()-before)
	}
	if got := stored(t, em, "routes"); got != routes {
		t.Fatalf("routes after the steady state %s, want %s", got, routes)
	}
	// the client drops it: APISIX's own answer again
	if r := putConfig(t, f, `{"routes_conf_version":3,"routes":[{"id":"r2","uri":"/c"}]}`, "d3"); r.status != http.StatusAccepted {
		t.Fatalf("after the client dropped it: %d %s", r.status, r.body)
	}
	if got := testutil.ToFloat64(f.m.FallbackPuts.WithLabelValues("applied")); got != 1 {
		t.Fatalf("fallback_puts_total{applied} = %v", got)
	}
}

func TestFallbackLeavesOutWhatRefersToALeftOutItem(t *testing.T) {
	t.Parallel()
	f, em := fallbackFixture(t, "3.17.0", 0, nil, nil)
	putConfig(t, f, `{"routes_conf_version":1,"routes":[{"id":"r0","uri":"/z"}]}`, "d1")
	r := putConfig(t, f, `{"services_conf_version":2,"services":[{"id":"bad","plugins":{"nope":{}}}],"routes_conf_version":2,"routes":[{"id":"r0","uri":"/z"},{"id":"r-bad","uri":"/x","service_id":"bad"},{"id":"r-good","uri":"/y"}]}`, "d2")
	if ids := heldIDs(t, r); strings.Join(ids, ",") != "bad,r-bad" {
		t.Fatalf("held %v, want the service and the route that refers to it", ids)
	}
	if routes := stored(t, em, "routes"); strings.Contains(routes, "r-bad") || !strings.Contains(routes, "r-good") {
		t.Fatalf("routes %s", routes)
	}
}

func TestFallbackRoundsOn314(t *testing.T) {
	t.Parallel()
	f, em := fallbackFixture(t, "3.14.1", 0, nil, func(c *Config) { c.FallbackAnswer = AnswerAccepted })
	putConfig(t, f, `{"routes_conf_version":1,"routes":[{"id":"r1","uri":"/a"},{"id":"r2","uri":"/b"}]}`, "d1")
	r := putConfig(t, f, `{"routes_conf_version":2,"routes":[{"id":"r1","uri":"/A","plugins":{"nope":{}}},{"id":"r2","uri":"/B","plugins":{"nope":{}}},{"id":"r3","uri":"/c"}]}`, "d2")
	if r.status != http.StatusAccepted {
		t.Fatalf("--fallback-answer accepted on 3.14: %d %s", r.status, r.body)
	}
	if routes := stored(t, em, "routes"); !strings.Contains(routes, `"/a"`) || !strings.Contains(routes, `"/b"`) || !strings.Contains(routes, `"/c"`) {
		t.Fatalf("routes %s: want both accepted copies and r3", routes)
	}
}

func TestFallbackFailsSafe(t *testing.T) {
	t.Parallel()
	f, em := fallbackFixture(t, "3.17.0", 0, func(_ *emulator.Emulator, next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/validate") && r.ContentLength > 2 {
				w.WriteHeader(http.StatusInternalServerError)
				return
			}
			next.ServeHTTP(w, r)
		})
	}, nil)
	putConfig(t, f, `{"routes_conf_version":1,"routes":[{"id":"r1","uri":"/a"}]}`, "d1")
	r := putConfig(t, f, `{"routes_conf_version":2,"routes":[{"id":"r1","uri":"/b","plugins":{"nope":{}}},{"id":"r2","uri":"/c"}]}`, "d2")
	if r.status != http.StatusBadRequest || !strings.Contains(r.body, "unknown plugin [nope]") || strings.Contains(r.body, "errors") {
		t.Fatalf("validate failing: %d %s, want APISIX's first answer", r.status, r.body)
	}
	if routes := stored(t, em, "routes"); strings.Contains(routes, "/c") {
		t.Fatalf("something was applied: %s", routes)
	}
	if got := testutil.ToFloat64(f.m.FallbackPuts.WithLabelValues("unavailable")); got != 1 {
		t.Fatalf("fallback_puts_total{unavailable} = %v", got)
	}
}

// TestFallbackConflictOnTheCorrectedPut: an out-of-band write lands between the first
// PUT and the corrected one (the validate call lets it in): the corrected PUT meets a
// version conflict, and the whole sync is decided again on a fresh read.
func TestFallbackConflictOnTheCorrectedPut(t *testing.T) {
	t.Parallel()
	var once atomic.Bool
	f, em := fallbackFixture(t, "3.17.0", 0, func(em *emulator.Emulator, next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/validate") && r.ContentLength > 2 && once.CompareAndSwap(false, true) {
				oob := httptest.NewRequest(http.MethodPut, "/apisix/admin/configs", strings.NewReader(`{"routes_conf_version":`+
					jsonNumber(em.SectionVersion("routes"))+`,"secrets_conf_version":7,"secrets":[{"id":"vault/1","uri":"http://v","prefix":"kv","token":"t"}]}`))
				oob.Header.Set("X-API-KEY", key)
				oob.Header.Set("X-Digest", "oob")
				em.ServeHTTP(httptest.NewRecorder(), oob)
			}
			next.ServeHTTP(w, r)
		})
	}, nil)
	putConfig(t, f, `{"routes_conf_version":1,"routes":[{"id":"r1","uri":"/a"}]}`, "d1")
	r := putConfig(t, f, `{"routes_conf_version":2,"routes":[{"id":"r1","uri":"/b","plugins":{"nope":{}}},{"id":"r2","uri":"/c"}],"secrets_conf_version":0}`, "d2")
	if ids := heldIDs(t, r); len(ids) != 1 || ids[0] != "r1" {
		t.Fatalf("held %v", ids)
	}
	if !strings.Contains(stored(t, em, "routes"), `"/c"`) || !strings.Contains(stored(t, em, "secrets"), "vault/1") {
		t.Fatalf("routes %s secrets %s", stored(t, em, "routes"), stored(t, em, "secrets"))
	}
	if got := testutil.ToFloat64(f.m.ConflictRetries); got != 1 {
		t.Fatalf("conflict_retries_total = %v", got)
	}
	// decided again, the sync holds r1 before the PUT: no second failed PUT, no second
	// validate of the whole section (at 40k routes that pass alone costs seconds)
	var failedPuts, validates int
	for _, r := range f.rec.all() {
		switch {
		case r.method == http.MethodPut && strings.Contains(string(r.body), "nope"):
			failedPuts++
		case r.method == http.MethodPost && strings.HasSuffix(r.path, "/validate") && len(r.body) > 2:
			validates++
		}
	}
	if failedPuts != 1 || validates > 2 {
		t.Fatalf("%d PUTs carried the rejected route, %d validate calls carried items: want 1 and the first round's", failedPuts, validates)
	}
}

func jsonNumber(v float64) string { b, _ := json.Marshal(v); return string(b) }

// TestFallbackSecondStepAndItsBudget: a plugin moved to a new global rule id passes once
// the rest is applied (the workers apply 300 ms late): a second PUT lands it in the same
// sync; with a budget shorter than the workers' lag the client is answered at the
// budget's end, the rule held and named.
func TestFallbackSecondStepAndItsBudget(t *testing.T) {
	rule := func(id string) string {
		return `{"global_rules_conf_version":` + id[1:] + `,"global_rules":[{"id":"` + id + `","plugins":{"prometheus":{}}}]}`
	}
	t.Run("lands in one sync", func(t *testing.T) {
		f, em := fallbackFixture(t, "3.17.0", 300*time.Millisecond, nil, nil)
		putConfig(t, f, rule("g1"), "d1")
		wait.For(t, "the workers to apply", em.Applied)
		if r := putConfig(t, f, rule("g2"), "d2"); r.status != http.StatusAccepted {
			t.Fatalf("the move: %d %s, want it landed by the second step", r.status, r.body)
		}
		if rules := stored(t, em, "global_rules"); !strings.Contains(rules, `"g2"`) || strings.Contains(rules, `"g1"`) {
			t.Fatalf("global rules %s", rules)
		}
	})
	t.Run("stops where the budget ends", func(t *testing.T) {
		f, em := fallbackFixture(t, "3.17.0", 2*time.Second, nil, func(c *Config) { c.FallbackBudget = 400 * time.Millisecond })
		putConfig(t, f, rule("g1"), "d1")
		wait.For(t, "the workers to apply", em.Applied)
		start := time.Now()
		r := putConfig(t, f, rule("g2"), "d2")
		if took := time.Since(start); took > time.Second {
			t.Fatalf("answered after %v with a 400 ms budget", took)
		}
		if ids := heldIDs(t, r); len(ids) != 1 || ids[0] != "g2" {
			t.Fatalf("held %v", ids)
		}
	})
}

// TestFallbackKeyPairOn318: a copy APISIX refuses too is left out.
func TestFallbackKeyPairOn318(t *testing.T) {
	t.Parallel()
	f, em := fallbackFixture(t, "3.18.0", 0, nil, nil)
	pair := func(v, extra string) string {
		return `{"consumers_conf_version":` + v + `,"consumers":[{"username":"a","plugins":{"key-auth":{"key":"k"}}},{"username":"b","plugins":{"key-auth":{"key":"k"}}}` + extra + `]}`
	}
	if r := putConfig(t, f, pair("1", ""), "d1"); r.status != http.StatusAccepted {
		t.Fatalf("the pair, once: %d %s", r.status, r.body)
	}
	r := putConfig(t, f, pair("2", `,{"username":"c","plugins":{"key-auth":{"key":"kc"}}}`), "d2")
	if ids := heldIDs(t, r); len(ids) != 1 || ids[0] != "a" {
		t.Fatalf("held %v, want consumer a", ids)
	}
	if consumers := stored(t, em, "consumers"); strings.Contains(consumers, `"a"`) || !strings.Contains(consumers, `"c"`) {
		t.Fatalf("consumers %s", consumers)
	}
}
