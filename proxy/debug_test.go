package proxy

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// /debug/config as an operator reads it: the data plane without credentials, the last
// accepted and rejected syncs, the ring, the kept configuration with its state file and
// re-seed, and ?id= answering only the syncs that touched an id.
func TestDebugConfigDocument(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil, func(c *Config) {
		c.Upstream = strings.Replace(c.Upstream, "http://", "http://operator:hunter2@", 1)
		c.ReseedInterval, c.StateDir = time.Hour, t.TempDir() // kept, never started
	})
	accepted := `{"routes_conf_version":1,"routes":[{"id":"r1","uri":"/a"},{"id":"r2","uri":"/b"}]}`
	if r := do(t, "PUT", f.url+"/apisix/admin/configs", accepted, withKey(map[string]string{"X-Digest": "c1", "Traceparent": "00-abc-def-01"})); r.status != http.StatusAccepted {
		t.Fatalf("accepted sync: %d %s", r.status, r.body)
	}
	if r := do(t, "PUT", f.url+"/apisix/admin/configs", `{"routes_conf_version":`, withKey(nil)); r.status/100 != 4 {
		t.Fatalf("broken sync: %d %s", r.status, r.body)
	}
	f.p.notes.debug.noteStateWrite(errors.New("disk full"))
	f.p.notes.debug.noteReseed("skipped", 0, 3*time.Millisecond)

	doc := getDebug[debugConfig](t, f.p, "")
	dp := doc.DataPlane
	if strings.Contains(dp.URL, "hunter2") || !strings.HasPrefix(dp.URL, "http://127.0.0.1:") {
		t.Errorf("data plane URL %q: want it without user information", dp.URL)
	}
	if dp.LastAnswerAt == nil || dp.LastStatus == 0 || dp.Server == "" || dp.Trust.Mode != string(TrustAuto) || !dp.Trust.Trusted {
		t.Errorf("data plane %+v", dp)
	}
	if a := doc.LastAccepted; a == nil || a.Status != http.StatusAccepted || a.ClientDigest != "c1" || a.BytesIn != len(accepted) || len(a.Sections) == 0 {
		t.Fatalf("last accepted %+v", doc.LastAccepted)
	}
	if items := sectionItems(doc.LastAccepted.Sections, "routes"); items == nil || *items != 2 {
		t.Errorf("routes items in the last accepted sync: %v, want the kept 2", items)
	}
	if r := doc.LastRejected; r == nil || r.Status/100 != 4 || r.ErrorMsg == "" {
		t.Errorf("last rejected %+v", doc.LastRejected)
	}
	if len(doc.RecentSyncs) != 2 || doc.RecentSyncs[0].Traceparent != "00-abc-def-01" || doc.RecentSyncs[0].SyncID == "" {
		t.Errorf("recent syncs %+v", doc.RecentSyncs)
	}
	k := doc.Kept
	if k == nil || k.StateFile == nil || k.StateFile.Path == "" || k.StateFile.LastError != "disk full" || k.LastReseed == nil || k.LastReseed.Result != "skipped" {
		t.Fatalf("kept %+v", k)
	}
	if k.Digest == "" || k.Bytes == 0 || len(k.Sections) == 0 {
		t.Errorf("kept configuration %+v", k)
	}

	for _, tc := range []struct {
		id   string
		want int
	}{{"r1", 1}, {"nope", 0}} {
		got := getDebug[struct {
			ID    string          `json:"id"`
			Syncs []DebugSyncLine `json:"syncs"`
		}](t, f.p, "?id="+tc.id)
		if got.ID != tc.id || got.Syncs == nil || len(got.Syncs) != tc.want {
			t.Errorf("?id=%s: %+v, want %d syncs", tc.id, got, tc.want)
		}
	}
	f.p.notes.debug.noteStateWrite(nil)
	if sf := f.p.DebugConfig().Kept.StateFile; sf.LastError != "" || sf.LastWrite == nil {
		t.Errorf("after a good write: %+v", sf)
	}
}

func getDebug[T any](t *testing.T, p *Proxy, query string) T {
	t.Helper()
	rec := httptest.NewRecorder()
	p.DebugHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/config"+query, nil))
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" || rec.Header().Get("Cache-Control") != "no-store" {
		t.Fatalf("/debug/config%s: %d %v", query, rec.Code, rec.Header())
	}
	var v T
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
		t.Fatalf("/debug/config%s: %v", query, err)
	}
	return v
}

func sectionItems(sections []debugSection, name string) *int {
	for _, s := range sections {
		if s.Section == name {
			return s.Items
		}
	}
	return nil
}

// TestClipString: clipString bounds what a client or APISIX put in the document.
func TestClipString(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{{"short", 8, "short"}, {"exactly8", 8, "exactly8"}, {"far too long", 3, "far…"}} {
		if got := clipString(tc.in, tc.n); got != tc.want {
			t.Errorf("clipString(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}
