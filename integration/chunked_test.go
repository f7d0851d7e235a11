package integration

import (
	"fmt"
	"github.com/confshim/confshim/proxy"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/confshim/confshim/internal/testsupport/adcclient"
)

// Issue 25: APISIX answers chunked (spec §12), and the emulator now does too, so every
// test here meets the real wire. These drive the paths that make several upstream
// requests in one PUT, where an answer left open would hold the next one's connection.

// exchangeLog records, in order, what confshim asked the data plane and its status.
type exchangeLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *exchangeLog) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusCapture{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		if r.URL.Path == "/apisix/admin" {
			return // the watch's pings
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, fmt.Sprintf("%s %s %d", r.Method, strings.TrimPrefix(r.URL.Path, "/apisix/admin"), sw.status))
	})
}

func (l *exchangeLog) since(n int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines[n:]...)
}

// stateReads counts the reads of the configuration (GET or HEAD /configs) since line n.
func (l *exchangeLog) stateReads(n int) int {
	reads := 0
	for _, line := range l.since(n) {
		if strings.HasPrefix(line, "GET /configs") || strings.HasPrefix(line, "HEAD /configs") {
			reads++
		}
	}
	return reads
}

func (l *exchangeLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lines)
}

func count(lines []string, line string) int {
	n := 0
	for _, l := range lines {
		if l == line {
			n++
		}
	}
	return n
}

// renameMetricsRule is the story: the global rule that carries prometheus is
// renamed (id 1 → prometheus, as ADC names it) and a route is added, in one sync.
func renameMetricsRule(withRoute bool) (before, after adcclient.Config) {
	before = config("v1")
	before["global_rules"] = []map[string]any{{"id": "1", "plugins": map[string]any{"prometheus": map[string]any{}}}}
	after = config("v1")
	after["global_rules"] = []map[string]any{{"id": "prometheus", "plugins": map[string]any{"prometheus": map[string]any{"prefer_name": true}}}}
	if withRoute {
		after["routes"] = append(after["routes"], route("r-new", "/new", nil))
	}
	return before, after
}

// renamed lands the metrics rule as id 1, waits for the workers to apply it, then
// syncs the rename: the stack, the client, the renamed configuration, the answer and
// how long it took.
func renamed(t *testing.T, o stackOptions, withRoute bool) (*stack, *adcclient.Client, adcclient.Config, *adcclient.Result, time.Duration) {
	t.Helper()
	s := newStack(t, o)
	c := s.client(true)
	before, after := renameMetricsRule(withRoute)
	mustLand(t, sync1(t, c, before))
	s.em.ApplyNow() // the workers have applied the first configuration (their lag is not this test's subject)
	start := time.Now()
	res := sync1(t, c, after)
	return s, c, after, res, time.Since(start)
}

// TestChunkedRenameOfTheMetricsRuleLandsInOneSync: against chunked answers both steps
// land in the client's one sync, well within its timeout (before the fix the second
// PUT waited for the decide connection until the client gave up).
func TestChunkedRenameOfTheMetricsRuleLandsInOneSync(t *testing.T) {
	t.Parallel()
	var log exchangeLog
	s, _, _, res, took := renamed(t, stackOptions{fallback: true, fallbackAnswer: proxy.AnswerAccepted, appliedLag: 300 * time.Millisecond, wrap: log.wrap}, true)
	mustLand(t, res)
	if took > 5*time.Second {
		t.Fatalf("the sync took %s: a request waited for a connection", took)
	}
	rules := jsonOf(s.doc(t)["global_rules"])
	if !strings.Contains(rules, `"prometheus"`) || strings.Contains(rules, `"id":"1"`) {
		t.Fatalf("global rules after one sync: %s, want only the renamed rule", rules)
	}
	mustContain(t, s.items(t, "routes"), `"r-new"`)
	lines := log.since(0)
	if got := count(lines, "PUT /configs 202"); got != 3 { // the first configuration, then the rename's two
		t.Fatalf("exchanges %q: want two accepted PUTs (corrected, then the held rule)", lines)
	}
	if count(lines, "PUT /configs 400") != 1 || count(lines, "POST /configs/validate 400") < 2 || count(lines, "POST /configs/validate 200") < 2 {
		t.Fatalf("exchanges %q: want the rejected PUT, the validate that names the rule and the one that passes it", lines)
	}
}

// TestChunkedSecondStepThatNeverPassesLandsNextSync: the workers apply later than the
// second step's 2 s window; the client gets the corrected PUT's 202 at the window's
// end, the rule stays held, and the next sync lands it.
func TestChunkedSecondStepThatNeverPassesLandsNextSync(t *testing.T) {
	s, c, after, res, took := renamed(t, stackOptions{fallback: true, fallbackAnswer: proxy.AnswerAccepted, appliedLag: 2500 * time.Millisecond}, false)
	mustLand(t, res)
	mustContain(t, res.Header.Get("X-Confshim-Actions"), "global_rules=backfilled")
	if took < 2*time.Second || took > 4*time.Second {
		t.Fatalf("answered after %s, want at the end of the 2 s window", took)
	}
	if rules := jsonOf(s.doc(t)["global_rules"]); strings.Contains(rules, "prometheus") {
		t.Fatalf("global rules %s: the held rule landed although it never validated", rules)
	}
	s.em.ApplyNow() // the workers have applied the corrected PUT (their lag is not this test's subject)
	res = sync1(t, c, after)
	mustLand(t, res)
	if rules := jsonOf(s.doc(t)["global_rules"]); !strings.Contains(rules, `"prometheus"`) {
		t.Fatalf("global rules after the next sync: %s, want the renamed rule", rules)
	}
	if got := counter(s.metrics.HeldBackItems.WithLabelValues("global_rules")); got != 0 {
		t.Fatalf("held_back_items{global_rules} = %v after it landed", got)
	}
}

// TestChunkedDeadlineAnswersWithTheLastCompleteAnswer: with --upstream-timeout shorter
// than the second step's window, the PUT's deadline ends it; the client gets the
// corrected PUT's 202 (what was applied) in time, counted unavailable.
func TestChunkedDeadlineAnswersWithTheLastCompleteAnswer(t *testing.T) {
	s, _, _, res, took := renamed(t, stackOptions{fallback: true, fallbackAnswer: proxy.AnswerAccepted, appliedLag: 2500 * time.Millisecond, timeout: time.Second}, true)
	mustLand(t, res)
	if took > 1800*time.Millisecond {
		t.Fatalf("answered after %s, want within the 1 s deadline", took)
	}
	mustContain(t, s.items(t, "routes"), `"r-new"`) // what the corrected PUT applied
	if got := counter(s.metrics.FallbackPuts.WithLabelValues("unavailable")); got != 1 {
		t.Fatalf("fallback_puts_total{unavailable} = %v, want 1", got)
	}
	if got := counter(s.metrics.FallbackPuts.WithLabelValues("applied")); got != 1 {
		t.Fatalf("fallback_puts_total{applied} = %v, want 1 (the corrected PUT)", got)
	}
}

// TestChunkedRoundsOn314ReadTheAcceptedCopies: on 3.14 each round is a rejected PUT
// naming one item, and without a kept configuration (re-seeding off) the accepted
// copies are read from the data plane, on the same connection, between two PUTs.
func TestChunkedRoundsOn314ReadTheAcceptedCopies(t *testing.T) {
	t.Parallel()
	var log exchangeLog
	s := newStack(t, stackOptions{fallback: true, fallbackAnswer: proxy.AnswerAccepted, version: "3.14.1", wrap: log.wrap})
	c := s.client(true)
	mustLand(t, sync1(t, c, withRoutes(route("r1", "/old", nil), route("r2", "/two", nil))))
	n := log.len()
	res := sync1(t, c, withRoutes(route("r1", "/changed", unknownPlugin), route("r2", "/two", unknownPlugin), route("r3", "/three", nil)))
	mustLand(t, res)
	routes := s.items(t, "routes")
	if !strings.Contains(routes, `"/old"`) || !strings.Contains(routes, `"/three"`) || strings.Contains(routes, "nope") {
		t.Fatalf("routes %s", routes)
	}
	lines := log.since(n)
	if count(lines, "PUT /configs 400") != 2 || count(lines, "PUT /configs 202") != 1 {
		t.Fatalf("exchanges %q: want two rounds and one accepted PUT", lines)
	}
}
