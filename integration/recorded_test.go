package integration

import (
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
)

// TestRecordedADCSequence replays ADC 0.28's own PUT bodies (testdata/adc, byte for
// byte, with the digest ADC sent) in the order they were recorded, with the operator's
// out-of-band secrets write between 01 and 02: against the bare emulator 02 is rejected
// as it was on the wire; through confshim every one lands, the secrets manager
// survives, and the route plugin change of 04 is applied.
func TestRecordedADCSequence(t *testing.T) {
	t.Parallel()
	body := func(name string) string {
		b, err := os.ReadFile("../testdata/adc/" + name + ".body.json")
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	digest := func(b string) string {
		s := sha1.Sum([]byte(b))
		return hex.EncodeToString(s[:])
	}
	operator := func(s *stack) {
		s.oobPut(t, func(doc map[string]any) {
			doc["secrets_conf_version"] = float64(1)
			doc["secrets"] = []any{map[string]any{"id": "vault/1", "uri": "http://127.0.0.1:8200", "prefix": "kv/apisix", "token": "example-vault-token"}}
		})
	}
	for _, through := range []bool{false, true} {
		s := newStack(t, stackOptions{})
		base := pick(s, through)
		b01 := body("01-initial-sync-fresh-dataplane")
		if status, _ := rawPut(t, base, b01, digest(b01)); status != http.StatusAccepted {
			t.Fatalf("01: %d", status)
		}
		operator(s)
		b02 := body("02-stale-secrets-conf-version-rejected")
		status, hdr := rawPut(t, base, b02, digest(b02))
		if !through {
			if status != http.StatusBadRequest {
				t.Fatalf("bare 02: want the recorded 400, got %d", status)
			}
			continue
		}
		if status != http.StatusAccepted || !strings.Contains(hdr.Get("X-Confshim-Actions"), "secrets=preserved") {
			t.Fatalf("02 through confshim: %d %q", status, hdr.Get("X-Confshim-Actions"))
		}
		mustContain(t, s.items(t, "upstreams"), "10.244.0.13") // 02's endpoint change landed
		// 03 re-sends what the data plane holds (plugin_metadata and upstreams
		// re-stamped): settled, a no-op answered 204 (§8.1, §8.2); 04 changes a route.
		for _, step := range []struct {
			name string
			want int
		}{{"03-bypasscache-reinit-echoes-secrets", http.StatusNoContent}, {"04-route-change-untouched-sections-echo-cache", http.StatusAccepted}} {
			b := body(step.name)
			if status, hdr := rawPut(t, base, b, digest(b)); status != step.want {
				t.Fatalf("%s: %d %q, want %d", step.name, status, hdr.Get("X-Confshim-Actions"), step.want)
			}
		}
		mustContain(t, s.items(t, "secrets"), "vault/1")
		var sent map[string]json.RawMessage
		_ = json.Unmarshal([]byte(body("04-route-change-untouched-sections-echo-cache")), &sent)
		if got, want := s.items(t, "routes"), canonicalItems(sent["routes"]); got != want {
			t.Fatalf("04's route change not applied:\n got %s\nwant %s", got, want)
		}
	}
}
