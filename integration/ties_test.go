package integration

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confshim/confshim/internal/testsupport/adcclient"
	"github.com/confshim/confshim/proxy"
)

// A change to a merged section sent at the data plane's version + 1 is read back after
// APISIX accepts it (an operator's read-modify-write of the same state picks that
// version too, and APISIX keeps what it holds at an equal version). These are the cases
// a review of the first version found: each asserts from the data plane.

// secretsSync is a client configuration whose merged secrets hold vault/ctrl with extra
// fields.
func secretsSync(extra map[string]any) adcclient.Config {
	cfg := config("v1")
	it := secretItem("vault/ctrl", "a")
	for k, v := range extra {
		it[k] = v
	}
	cfg["secrets"] = []map[string]any{it}
	return cfg
}

// TestATieLostToAWriterThatOnlyAddsIsFound: the client removes a field at vS+1; the
// operator's racing +1 only adds a field to its own item. The writer's copy still holds
// the removed field: the change did not land, the sync is decided again, and the client
// is answered once the field is gone — and its next, identical sync changes nothing.
func TestATieLostToAWriterThatOnlyAddsIsFound(t *testing.T) {
	t.Parallel()
	var hook onNthPut
	s := newStack(t, stackOptions{merge: []string{"secrets"}, trust: proxy.TrustNever, wrap: hook.wrap})
	c := s.client(true)
	clock := int64(1_000_000)
	c.Clock = func() int64 { return clock }
	mustLand(t, sync1(t, c, secretsSync(map[string]any{"namespace": "ns1"})))
	s.oobPut(t, func(doc map[string]any) { // the operator's own vault, kept by the merge
		doc["secrets_conf_version"] = doc["secrets_conf_version"].(float64) + 1
		doc["secrets"] = append(doc["secrets"].([]any), secretItem("vault/1", "op"))
	})
	clock += 2 // the client's next version is the data plane's + 1
	hook.arm(1, func() {
		s.oobPut(t, func(doc map[string]any) {
			doc["secrets_conf_version"] = doc["secrets_conf_version"].(float64) + 1
			for _, it := range doc["secrets"].([]any) {
				if m := it.(map[string]any); m["id"] == "vault/1" {
					m["namespace"] = "opns"
				}
			}
		})
	})
	mustLand(t, sync1(t, c, secretsSync(nil))) // the client drops namespace from vault/ctrl
	got := s.items(t, "secrets")
	if strings.Contains(got, `"namespace":"ns1"`) || !strings.Contains(got, `"namespace":"opns"`) {
		t.Fatalf("secrets %s: want vault/ctrl without its namespace and the operator's vault/1 as it wrote it", got)
	}
	if n := counter(s.metrics.ConflictRetries); n != 1 {
		t.Fatalf("conflict_retries_total %v, want 1", n)
	}
}

// TestNumbersStoredAt14DigitsAreNoTieLost: APISIX's cjson keeps 14 significant digits,
// so a 16-digit float reads back rounded. With no writer at all that is the client's
// change landed: one PUT, no out-of-band write counted, a 2xx — with the clock behind
// the versions too (where a false loss would answer 409).
func TestNumbersStoredAt14DigitsAreNoTieLost(t *testing.T) {
	t.Parallel()
	for _, start := range []int64{1_000_000, 9_000_000_000_000} {
		t.Run(strconv.FormatInt(start, 10), func(t *testing.T) {
			t.Parallel()
			var hook onNthPut
			s := newStack(t, stackOptions{merge: []string{"global_rules"}, trust: proxy.TrustNever, wrap: hook.wrap})
			c := s.client(true)
			clock := start
			c.Clock = func() int64 { return clock }
			with := func(ratio float64) adcclient.Config {
				cfg := config("v1")
				cfg["global_rules"] = append(cfg["global_rules"], map[string]any{"id": "trace",
					"plugins": map[string]any{"zipkin": map[string]any{"endpoint": "http://z:9411/api/v2/spans", "sample_ratio": ratio}}})
				return cfg
			}
			mustLand(t, sync1(t, c, with(0.5)))
			hook.puts.Store(0)
			clock++
			mustLand(t, sync1(t, c, with(1.0/3)))
			if n := hook.puts.Load(); n != 1 {
				t.Fatalf("%d PUTs for one sync without a writer", n)
			}
			if n := counter(s.metrics.OutOfBandWrites.WithLabelValues("global_rules")); n != 0 {
				t.Fatalf("%v out-of-band writes counted, and nobody wrote", n)
			}
			if got := s.items(t, "global_rules"); !strings.Contains(got, "0.33333333333333") {
				t.Fatalf("global_rules %s", got)
			}
		})
	}
}

// readBackHook answers the GETs of /apisix/admin/configs after confshim's nth PUT with
// status (0: passes them), or delays them by delay.
type readBackHook struct {
	after  int32
	status int
	delay  time.Duration
	puts   atomic.Int32
}

func (h *readBackHook) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		isPut := r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/configs") && !strings.HasPrefix(r.Header.Get("X-Digest"), "oob-")
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/configs") && h.after > 0 && h.puts.Load() >= h.after {
			time.Sleep(h.delay)
			if h.status != 0 {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(h.status)
				_, _ = io.WriteString(w, `{"error_msg":"failed to check token","description":"wrong apikey"}`+"\n")
				return
			}
		}
		next.ServeHTTP(w, r)
		if isPut {
			h.puts.Add(1)
		}
	})
}

// TestAReadBackThatFailsForwardsNothingMore: the read-back is refused (the admin key
// rotated between the PUT and the GET: 401) or fails (500). The PUT was applied; the
// client is told so, with a 502 naming the section not read back, and nothing more is
// forwarded (a refused read before a PUT forwards the body untouched: not after one).
// The record no longer vouches: the client's next sync compares the section again.
func TestAReadBackThatFailsForwardsNothingMore(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusUnauthorized, http.StatusInternalServerError} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			t.Parallel()
			hook := &readBackHook{status: status}
			s := newStack(t, stackOptions{merge: []string{"secrets"}, trust: proxy.TrustNever, wrap: hook.wrap})
			c := s.client(true)
			clock := int64(1_000_000)
			c.Clock = func() int64 { return clock }
			mustLand(t, sync1(t, c, secretsSync(nil)))
			hook.after = hook.puts.Load() + 1
			clock++
			res := sync1(t, c, secretsSync(map[string]any{"token": "b"}))
			if res.Status != http.StatusBadGateway || !strings.Contains(string(res.Body), "APISIX accepted this sync's PUT, but reading back secrets failed") {
				t.Fatalf("answered %d %s, want 502 saying the PUT was applied and not read back", res.Status, res.Body)
			}
			if n := hook.puts.Load() - hook.after + 1; n != 1 {
				t.Fatalf("%d PUTs in the sync, want 1", n)
			}
			if got := s.items(t, "secrets"); !strings.Contains(got, `"token":"b"`) {
				t.Fatalf("secrets %s: the accepted PUT's change is not there", got)
			}
		})
	}
}

// TestTheReadBackKeepsTheBudget: a sync with fallback work whose validate took most of
// its budget; the read-back of its merged section is bounded by what is left, and the
// client is answered within the budget (§8.5), told the PUT could not be read back.
func TestTheReadBackKeepsTheBudget(t *testing.T) {
	t.Parallel()
	const budget = 1500 * time.Millisecond
	var slowValidate atomic.Bool
	hook := &readBackHook{delay: time.Second}
	wrap := func(next http.Handler) http.Handler {
		inner := hook.wrap(next)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/validate") && r.ContentLength > 2 && slowValidate.Swap(false) {
				time.Sleep(budget * 6 / 10)
			}
			inner.ServeHTTP(w, r)
		})
	}
	s := newStack(t, stackOptions{merge: []string{"secrets"}, trust: proxy.TrustNever, fallback: true, fallbackBudget: budget, wrap: wrap})
	c := s.client(true)
	clock := int64(1_000_000)
	c.Clock = func() int64 { return clock }
	mustLand(t, sync1(t, c, secretsSync(nil)))
	cfg := secretsSync(map[string]any{"token": "b"})
	cfg["routes"] = append(cfg["routes"], route("r9", "/x", unknownPlugin))
	slowValidate.Store(true)
	hook.after = hook.puts.Load() + 1 // the GETs after the sync's first PUT (rejected: r9) are slow
	clock++
	start := time.Now()
	res := sync1(t, c, cfg)
	if took := time.Since(start); took > budget+500*time.Millisecond {
		t.Fatalf("a sync with fallback work answered after %v, past its %v budget (%d %s)", took, budget, res.Status, res.Body)
	}
	if res.Status/100 == 2 {
		t.Fatalf("answered %d: a change not read back is not known to be on the data plane", res.Status)
	}
	// cut where the budget ends: the budget is blamed, not --upstream-timeout, and no
	// upstream error is counted
	if !strings.Contains(string(res.Body), "the budget of a sync with fallback work ended before the read-back") {
		t.Fatalf("answered %d %s, want the budget named", res.Status, res.Body)
	}
	if n := counter(s.metrics.UpstreamErrors.WithLabelValues("timeout")) + counter(s.metrics.UpstreamErrors.WithLabelValues("other")); n != 0 {
		t.Fatalf("%v upstream errors counted for a read-back the budget cut", n)
	}
}

// TestAYAMLMergedChangeAtVSPlusOneLands: a YAML body's merged section is not read (§5.6),
// so it cannot be read back: its change at vS+1 goes at the clock's version, above the
// operator's racing +1, and lands.
func TestAYAMLMergedChangeAtVSPlusOneLands(t *testing.T) {
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
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	first, _ := json.Marshal(map[string]any{"routes_conf_version": 1000000, "routes": []any{map[string]any{"id": "r1", "uri": "/a"}},
		"secrets_conf_version": 1000000, "secrets": []any{secretItem("vault/ctrl", "a")}})
	if st := put(string(first), "d1", "application/json"); st/100 != 2 {
		t.Fatalf("first PUT %d", st)
	}
	hook.arm(1, func() {
		s.oobPut(t, func(doc map[string]any) {
			doc["secrets_conf_version"] = doc["secrets_conf_version"].(float64) + 1
			doc["secrets"] = append(doc["secrets"].([]any), secretItem("vault/1", "op"))
		})
	})
	yaml := "routes_conf_version: 1000000\nroutes:\n  - id: r1\n    uri: /a\n" +
		"secrets_conf_version: 1000001\nsecrets:\n  - id: vault/ctrl\n    uri: http://vault:8200\n    prefix: kv\n    token: b\n"
	if st := put(yaml, "d2", "application/yaml"); st/100 != 2 {
		t.Fatalf("YAML PUT %d", st)
	}
	if got := s.items(t, "secrets"); !strings.Contains(got, `"token":"b"`) {
		t.Fatalf("answered 2xx, but the client's token b is not on the data plane: %s", got)
	}
}
