package apisix

import (
	"net/http"
	"testing"

	"github.com/confshim/confshim/rewrite"
)

// TestMessages reads APISIX's own messages (the captures in testdata/apisix-wire, the
// spec's §2 and §4.1.3).
func TestMessages(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                           string
		body                           string
		conflict, item, stateDependent bool
		prefixed                       *rewrite.Rejection
	}{
		{name: "stale version (3.17 capture)", body: `{"error_msg":"secrets_conf_version must be greater than or equal to (1)"}`, conflict: true},
		{name: "unknown plugin (3.17 capture)", body: `{"error_msg":"unknown plugin [no-such-plugin]"}`, item: true},
		{name: "missing digest", body: `{"error_msg":"missing digest header"}`},
		{name: "unreadable body", body: `{"error_msg":"invalid request body: Expected value but found invalid token at character 1"}`},
		{name: "not APISIX's JSON", body: `<html>400</html>`},
		{name: "3.14 names the item", body: `{"error_msg":"invalid routes at index 3, err: unknown plugin [nope]"}`, item: true,
			prefixed: &rewrite.Rejection{Section: "routes", Index: 3, Error: "unknown plugin [nope]"}},
		{name: "a plugin another global rule uses (3.17)", body: `{"error_msg":"plugin 'prometheus' already exists in global rule with id '1'"}`, item: true, stateDependent: true},
		{name: "a key another consumer holds (3.18)", body: `{"error_msg":"duplicate key of plugin key-auth found with consumer: team-b"}`, item: true, stateDependent: true},
		{name: "a key a credential holds (3.18)", body: `{"error_msg":"duplicate key of plugin key-auth found with credential: jack/credentials/c1 of consumer: jack"}`, item: true, stateDependent: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &Answer{Status: http.StatusBadRequest, Body: []byte(tc.body)}
			if got := IsConflict(a); got != tc.conflict {
				t.Errorf("IsConflict = %v", got)
			}
			if got := ItemLevel(a.Body); got != tc.item {
				t.Errorf("ItemLevel = %v", got)
			}
			if got := StateDependent(ErrorMessage(a.Body)); got != tc.stateDependent {
				t.Errorf("StateDependent = %v", got)
			}
			r, ok := PutRejection(a.Body)
			if (tc.prefixed != nil) != ok || (ok && r != *tc.prefixed) {
				t.Errorf("PutRejection = %+v %v", r, ok)
			}
		})
	}
	if IsConflict(&Answer{Status: http.StatusAccepted, Body: []byte("_conf_version must be greater than or equal to")}) {
		t.Error("a 202 is never a conflict")
	}
}

// TestIsDictFull: only APISIX's plain-text 500 of a document larger than the
// standalone-config dict (spec §2 step 8) counts, not another 500.
func TestIsDictFull(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status int
		body   string
		want   bool
	}{
		{500, "failed to save config to shared dict: no memory", true},
		{500, "failed to save config to shared dict: no memory\n", true},
		{500, "failed to save config to shared dict: exists", false},
		{500, `{"error_msg":"failed to get config from shared dict: failed to decode json: x"}`, false},
		{500, "<html><head><title>500 Internal Server Error</title></head></html>", false},
		{400, "failed to save config to shared dict: no memory", false},
	} {
		if got := IsDictFull(&Answer{Status: tc.status, Body: []byte(tc.body)}); got != tc.want {
			t.Errorf("IsDictFull(%d %q) = %v, want %v", tc.status, tc.body, got, tc.want)
		}
	}
}
