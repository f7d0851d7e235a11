//go:build !race

package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/confshim/confshim/internal/testsupport/apisixtest"
	"github.com/confshim/confshim/internal/testsupport/emulator"
	"github.com/confshim/confshim/internal/testsupport/wait"
)

// debugDoc reads /debug/config from a running binary.
func debugDoc(t *testing.T, b *runningBinary) (map[string]any, string) {
	t.Helper()
	resp, err := testHTTP.Get(b.metricsURL + "/debug/config")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("/debug/config: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("/debug/config is not JSON: %v\n%s", err, raw)
	}
	return doc, string(raw)
}

// field walks a decoded document: field(doc, "last_accepted", "status").
func field(v any, path ...string) any {
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

func sectionEntry(v any, name string) map[string]any {
	list, _ := v.([]any)
	for _, e := range list {
		if m, ok := e.(map[string]any); ok && m["section"] == name {
			return m
		}
	}
	return nil
}

// TestBinaryDebugConfig reads /debug/config after a repaired sync, a rejected one and
// a re-seed, and checks each field against what happened (issue 21).
func TestBinaryDebugConfig(t *testing.T) {
	dp := apisixtest.Start(t, apisixtest.Options{Emulator: emulator.Options{AdminKey: adminKey}})
	em := dp.Emulator
	s := &stack{em: em, dp: dp, dpURL: dp.URL, logs: &syncBuffer{}}
	b := startBinary(t, s.dpURL, "--admin-key", adminKey, "--reseed-interval", "100ms", "--upstream", "http://user:hunter2@"+dp.Addr)
	adminPut(t, s.dpURL, `{"secrets_conf_version":1,"secrets":[{"id":"vault/1","uri":"http://vault:8200","prefix":"kv","token":"t"}]}`, "oob")

	// a repaired sync: stale secrets preserved, routes bumped
	body := `{"routes_conf_version":1,"routes":[{"id":"r1","uris":["/get"]},{"id":"r2","uris":["/x"]}],"secrets_conf_version":0}`
	status, hdr := rawPut(t, b.url, body, "sync-1")
	if status != http.StatusAccepted {
		t.Fatalf("repaired sync: %d", status)
	}
	doc, raw := debugDoc(t, b)
	if strings.Contains(raw, "hunter2") {
		t.Fatal("the upstream's password is in /debug/config")
	}
	if got := field(doc, "data_plane", "url"); got != dp.URL {
		t.Fatalf("data_plane.url = %v", got)
	}
	if got := field(doc, "data_plane", "server"); got != "APISIX/3.17.0" {
		t.Fatalf("data_plane.server = %v", got)
	}
	if got := field(doc, "data_plane", "digest"); got != hdr.Get("X-Digest") {
		t.Fatalf("data_plane.digest = %v, want %s", got, hdr.Get("X-Digest"))
	}
	if got := field(doc, "data_plane", "last_modified"); got != hdr.Get("X-Last-Modified") {
		t.Fatalf("data_plane.last_modified = %v, want %s", got, hdr.Get("X-Last-Modified"))
	}
	acc := field(doc, "last_accepted")
	if field(acc, "status") != float64(202) || field(acc, "client_digest") != "sync-1" || field(acc, "forwarded_digest") != hdr.Get("X-Digest") ||
		field(acc, "bytes_in") != float64(len(body)) {
		t.Fatalf("last_accepted: %v", acc)
	}
	routes, secrets := sectionEntry(field(acc, "sections"), "routes"), sectionEntry(field(acc, "sections"), "secrets")
	if routes["action"] != "bumped" || routes["version"] != float64(em.SectionVersion("routes")) || routes["items"] != float64(2) {
		t.Fatalf("last_accepted routes: %v", routes)
	}
	if secrets["action"] != "preserved" || secrets["items"] != float64(1) {
		t.Fatalf("last_accepted secrets: %v", secrets)
	}
	if field(doc, "last_rejected") != nil {
		t.Fatalf("last_rejected before any rejection: %v", field(doc, "last_rejected"))
	}
	ring, _ := field(doc, "recent_syncs").([]any)
	if len(ring) != 1 || !strings.Contains(fmt.Sprint(field(ring[0], "actions")), "routes=bumped") {
		t.Fatalf("recent_syncs: %v", ring)
	}

	// a rejected one: APISIX refuses a route it cannot validate
	bad := fmt.Sprintf(`{"routes_conf_version":%d,"routes":[{"id":"r1","uri":123}]}`, int(em.SectionVersion("routes"))+1)
	if status, _ := rawPut(t, b.url, bad, "sync-2"); status != http.StatusBadRequest {
		t.Fatalf("invalid sync: %d", status)
	}
	doc, _ = debugDoc(t, b)
	rej := field(doc, "last_rejected")
	if field(rej, "status") != float64(400) || field(rej, "by") != "apisix" ||
		!strings.Contains(fmt.Sprint(field(rej, "error_msg")), `property "uri" validation failed`) ||
		!strings.Contains(fmt.Sprint(field(rej, "sections")), "routes") {
		t.Fatalf("last_rejected: %v", rej)
	}
	if field(doc, "last_accepted", "client_digest") != "sync-1" {
		t.Fatal("a rejected sync replaced last_accepted")
	}

	// a re-seed: the data plane restarts empty; the watch restores it
	s.restartDataPlane(t, 100*time.Millisecond)
	wait.For(t, "a re-seed in /debug/config", func() bool {
		doc, _ = debugDoc(t, b)
		return field(doc, "kept", "last_reseed", "result") == "restored"
	})
	kept := field(doc, "kept")
	if r := sectionEntry(field(kept, "sections"), "routes"); r["items"] != float64(2) || r["version"] != float64(em.SectionVersion("routes")) {
		t.Fatalf("kept routes: %v", r)
	}
	if field(kept, "last_reseed", "status") != float64(202) {
		t.Fatalf("kept.last_reseed: %v", field(kept, "last_reseed"))
	}
	if d := em.Document(); d == nil || field(doc, "data_plane", "digest") != d["X-Digest"] {
		t.Fatalf("data_plane.digest %v after the re-seed, the data plane holds %v", field(doc, "data_plane", "digest"), d["X-Digest"])
	}
}

// TestBinaryDebugConfigHoldsNoValues plants secret-looking values in every section, in
// JSON and in YAML bodies, and checks that none of them reaches /debug/config.
func TestBinaryDebugConfigHoldsNoValues(t *testing.T) {
	dp := apisixtest.Start(t, apisixtest.Options{Emulator: emulator.Options{AdminKey: adminKey}})
	dpURL := dp.URL
	b := startBinary(t, dpURL, "--admin-key", adminKey, "--preserve", "")
	var planted []string
	secret := func(kind string) string {
		v := fmt.Sprintf("PLANTED-%s-%d", kind, len(planted))
		planted = append(planted, v)
		return v
	}
	for round, yaml := range []bool{false, true} {
		v := round + 2
		doc := fmt.Sprintf(`{"routes_conf_version":%[1]d,"routes":[{"id":"r1","uri":"/a","desc":"%s","hosts":["%s.example.com"]}],`+
			`"services_conf_version":%[1]d,"services":[{"id":"s1","desc":"%s"}],`+
			`"upstreams_conf_version":%[1]d,"upstreams":[{"id":"u1","type":"roundrobin","nodes":{"%s.internal:80":1}}],`+
			`"consumers_conf_version":%[1]d,"consumers":[{"username":"jack","desc":"%s"}],`+
			`"global_rules_conf_version":%[1]d,"global_rules":[{"id":"g1","plugins":{"prometheus":{"prefer_name":true}},"desc":"%s"}],`+
			`"plugin_metadata_conf_version":%[1]d,"plugin_metadata":[{"id":"http-logger","log_format":{"x":"%s"}}],`+
			`"secrets_conf_version":%[1]d,"secrets":[{"id":"vault/1","uri":"http://vault:8200","prefix":"kv","token":"%s"}]}`,
			v, secret("desc"), secret("host"), secret("desc"), secret("node"), secret("desc"), secret("desc"), secret("format"), secret("token"))
		req, _ := http.NewRequest(http.MethodPut, b.url+"/apisix/admin/configs", strings.NewReader(doc))
		req.Header.Set("X-API-KEY", adminKey)
		req.Header.Set("X-Digest", fmt.Sprint("d", round))
		if yaml {
			req.Header.Set("Content-Type", "application/yaml") // JSON text is YAML too
		}
		resp, err := testHTTP.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			t.Fatalf("round %d: %d %s", round, resp.StatusCode, msg)
		}
		// and a rejected one carrying values too
		rejected := strings.Replace(doc, `"uri":"/a"`, `"uri":123`, 1)
		rejected = strings.Replace(rejected, fmt.Sprintf(`"routes_conf_version":%d`, v), fmt.Sprintf(`"routes_conf_version":%d`, v+10), 1)
		if status, _ := rawPut(t, b.url, rejected, fmt.Sprint("r", round)); status != http.StatusBadRequest {
			t.Fatalf("round %d: the rejected sync got %d", round, status)
		}
	}
	_, raw := debugDoc(t, b)
	for _, v := range planted {
		if strings.Contains(raw, v) {
			t.Fatalf("/debug/config holds the value %s:\n%s", v, raw)
		}
	}
	if strings.Contains(raw, adminKey) {
		t.Fatal("/debug/config holds the admin key")
	}
}
