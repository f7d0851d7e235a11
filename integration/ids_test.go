package integration

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/confshim/confshim/proxy"
	"github.com/confshim/confshim/rewrite"
)

// Issue 33: which items a sync touched, and which controller sync it was — ids and
// correlation in /debug/config and the sync's log line, never values.

// lastSync is the newest of /debug/config's recent syncs.
func lastSync(t *testing.T, s *stack) proxy.DebugSyncLine {
	t.Helper()
	syncs := s.proxy.DebugConfig().RecentSyncs
	if len(syncs) == 0 {
		t.Fatal("no sync in /debug/config")
	}
	return syncs[len(syncs)-1]
}

func sectionItems(line proxy.DebugSyncLine, section string) *rewrite.ItemChanges {
	for i := range line.Items {
		if line.Items[i].Section == section {
			return &line.Items[i]
		}
	}
	return nil
}

func TestSyncListsTheIDsItTouched(t *testing.T) {
	t.Parallel()
	// the lists compare with the kept configuration, kept while re-seeding is on
	s := newStack(t, stackOptions{fallback: true, reseed: time.Hour})
	c := s.client(true)
	mustLand(t, sync1(t, c, withRoutes(route("r2", "/two", nil), route("r3", "/three", nil))))
	res := sync1(t, c, withRoutes(route("r1", "/one", nil), route("r2", "/TWO", nil)))
	mustLand(t, res)
	routes := sectionItems(lastSync(t, s), "routes")
	if routes == nil {
		t.Fatalf("no routes in the sync's items: %+v", lastSync(t, s).Items)
	}
	if got := []string{strings.Join(routes.Added.IDs, ","), strings.Join(routes.Changed.IDs, ","), strings.Join(routes.Removed.IDs, ",")}; strings.Join(got, " ") != "r1 r2 r3" {
		t.Fatalf("added, changed, removed: %q, want r1 r2 r3", got)
	}
	if len(lastSync(t, s).Items) != 1 {
		t.Fatalf("sections listed %+v: only routes changed", lastSync(t, s).Items)
	}

	// a reordered upstreams section is the same set: nothing listed
	cfg := withRoutes(route("r1", "/one", nil), route("r2", "/TWO", nil))
	cfg["upstreams"] = append(cfg["upstreams"], map[string]any{"id": "u2", "type": "roundrobin", "nodes": []any{map[string]any{"host": "10.0.0.2", "port": 80, "weight": 1}}})
	mustLand(t, sync1(t, c, cfg))
	cfg["upstreams"][0], cfg["upstreams"][1] = cfg["upstreams"][1], cfg["upstreams"][0]
	mustLand(t, sync1(t, c, cfg))
	if items := lastSync(t, s).Items; len(items) != 0 {
		t.Fatalf("a reordered upstreams section listed %+v", items)
	}

	// a held-back item is listed as held, with its section
	cfg = withRoutes(route("r1", "/one", nil), route("r2", "/TWO", unknownPlugin))
	res = sync1(t, c, cfg)
	mustNameHeld(t, res.Status, res.Body, "r2")
	if routes := sectionItems(lastSync(t, s), "routes"); routes == nil || !routes.Held.Has("r2") || routes.Held.Count != 1 {
		t.Fatalf("held back: %+v", lastSync(t, s).Items)
	}

	// ?id= finds the syncs that touched an id
	rec := httptest.NewRecorder()
	s.proxy.DebugHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/config?id=r3", nil))
	var found struct {
		ID    string                `json:"id"`
		Syncs []proxy.DebugSyncLine `json:"syncs"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &found); err != nil || found.ID != "r3" || len(found.Syncs) != 2 {
		t.Fatalf("?id=r3: %s (want the sync that added it and the one that removed it)", rec.Body)
	}
	mustContain(t, s.logs.String(), `"removed":["r3"]`)
}

// TestCorrelationIsKeptAndForwarded: traceparent and X-Request-Id reach APISIX
// unchanged and are kept with the sync (log line, /debug/config); without them the
// sync has confshim's own id.
func TestCorrelationIsKeptAndForwarded(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{})
	const traceparent, requestID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "req-42"
	body := `{"routes_conf_version":1,"routes":[{"id":"r1","uri":"/a"}]}`
	req, _ := http.NewRequest(http.MethodPut, s.proxyURL+"/apisix/admin/configs", strings.NewReader(body))
	req.Header.Set("X-API-KEY", adminKey)
	req.Header.Set("X-Digest", "c1")
	req.Header.Set("traceparent", traceparent)
	req.Header.Set("X-Request-Id", requestID)
	resp, err := testHTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("sync: %d", resp.StatusCode)
	}
	put := s.em.LastPut()
	if put.Header.Get("Traceparent") != traceparent || put.Header.Get("X-Request-Id") != requestID {
		t.Fatalf("APISIX got traceparent %q, X-Request-Id %q", put.Header.Get("Traceparent"), put.Header.Get("X-Request-Id"))
	}
	line := lastSync(t, s)
	if line.Traceparent != traceparent || line.RequestID != requestID || len(line.SyncID) != 16 {
		t.Fatalf("/debug/config sync: %+v", line)
	}
	logs := s.logs.String()
	mustContain(t, logs, `"traceparent":"`+traceparent+`"`)
	mustContain(t, logs, `"request_id":"`+requestID+`"`)
	rawPut(t, s.proxyURL, body, "c2")
	if line := lastSync(t, s); line.SyncID == "" || line.Traceparent != "" || line.RequestID != "" {
		t.Fatalf("a sync without correlation: %+v", line)
	}
}

// TestNoValueFromTheBodyIsShown: hostile strings in every field of every item never
// appear in /debug/config or the log; only ids do, cut at 64 bytes.
func TestNoValueFromTheBodyIsShown(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{fallback: true, reseed: time.Hour})
	c := s.client(true)
	const secret = "SeCrEt-\u2028\"}{<script>-hunter2"
	hostile := func(id string, plugins map[string]any) map[string]any {
		r := route(id, "/"+secret, plugins)
		r["desc"], r["name"] = secret, secret
		r["labels"] = map[string]any{"k": secret}
		return r
	}
	mustLand(t, sync1(t, c, config("v1")))
	longID := "r-" + strings.Repeat("i", 200)
	cfg := withRoutes(hostile("r1", map[string]any{"proxy-rewrite": map[string]any{"uri": "/" + secret}}), hostile(longID, nil),
		hostile("r-bad", map[string]any{"nope": map[string]any{"token": secret}}))
	cfg["upstreams"][0]["desc"] = secret
	sync1(t, c, cfg)
	var doc bytes.Buffer
	_ = json.NewEncoder(&doc).Encode(s.proxy.DebugConfig())
	for what, text := range map[string]string{"/debug/config": doc.String(), "the log": s.logs.String()} {
		for _, needle := range []string{"hunter2", "SeCrEt", "script"} {
			if strings.Contains(text, needle) {
				t.Fatalf("%s shows a value from the body (%q)", what, needle)
			}
		}
		if strings.Contains(text, strings.Repeat("i", 100)) {
			t.Fatalf("%s shows an id longer than 64 bytes", what)
		}
	}
	mustContain(t, doc.String(), `"r-bad"`)
}
