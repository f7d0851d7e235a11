package rewrite

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/confshim/confshim/internal/testsupport/emulator"
)

// The property test forwards rewritten bodies to the APISIX emulator holding the state
// the rewrite was given, for many random states and requests, and checks what the
// contract promises: no section is rejected as stale; a managed section whose client
// copy changed ends up applied; an unchanged one keeps its version; a preserved one
// keeps the data plane's items and version.

var propSections = []string{"routes", "services", "upstreams", "consumers", "global_rules", "secrets", "plugin_configs"}

func propItem(section string, id int, variant int) map[string]any {
	desc := fmt.Sprintf("v%d", variant)
	switch section {
	case "consumers":
		return map[string]any{"username": fmt.Sprintf("user%d", id), "desc": desc}
	case "secrets":
		return map[string]any{"id": fmt.Sprintf("vault/%d", id), "uri": "http://vault/" + desc}
	case "upstreams":
		return map[string]any{"id": fmt.Sprintf("u%d", id), "type": "roundrobin", "desc": desc, "nodes": map[string]any{"127.0.0.1:80": 1}}
	default:
		return map[string]any{"id": fmt.Sprintf("%s%d", section[:1], id), "desc": desc, "labels": map[string]any{}}
	}
}

func propItems(rng *rand.Rand, section string, variant int) []any {
	n := rng.IntN(3)
	items := make([]any, n)
	for i := range items {
		items[i] = propItem(section, i, variant)
	}
	return items
}

type propServer struct {
	t  *testing.T
	em *emulator.Emulator
	n  int
}

func (s *propServer) put(body []byte) (int, string) { return s.putAs(body, false) }

// putAs is put of a JSON or (yaml) a YAML body.
func (s *propServer) putAs(body []byte, yaml bool) (int, string) {
	s.n++
	req := httptest.NewRequest("PUT", "/apisix/admin/configs", strings.NewReader(string(body)))
	req.Header.Set("X-Digest", fmt.Sprintf("d%d", s.n))
	if yaml {
		req.Header.Set("Content-Type", "application/yaml")
	}
	rec := httptest.NewRecorder()
	s.em.ServeHTTP(rec, req)
	b, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(b)
}

func (s *propServer) get() []byte {
	rec := httptest.NewRecorder()
	s.em.ServeHTTP(rec, httptest.NewRequest("GET", "/apisix/admin/configs", nil))
	if rec.Code != http.StatusOK {
		s.t.Fatalf("GET: %d", rec.Code)
	}
	return rec.Body.Bytes()
}

// canonical makes items comparable: JSON values, {} and [] alike, absent = none.
func canonical(v any) string {
	var norm func(any) any
	norm = func(v any) any {
		switch x := v.(type) {
		case map[string]any:
			if len(x) == 0 {
				return "empty"
			}
			out := map[string]any{}
			for k, e := range x {
				out[k] = norm(e)
			}
			return out
		case []any:
			if len(x) == 0 {
				return "empty"
			}
			out := make([]any, len(x))
			for i, e := range x {
				out[i] = norm(e)
			}
			return out
		case nil:
			return "empty"
		}
		return v
	}
	b, _ := json.Marshal(norm(v))
	return string(b)
}

func TestPropertiesAgainstTheEmulator(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	preserved := map[string]bool{"secrets": true, "plugin_configs": true}
	rw := New([]string{"secrets", "plugin_configs"})
	for iter := 0; iter < 400; iter++ {
		em, _ := emulator.New(emulator.Options{FillDefaults: iter%2 == 1})
		srv := &propServer{t: t, em: em}
		// the data plane's state, written by "someone"
		seed := map[string]any{}
		for _, s := range propSections {
			seed[s+"_conf_version"] = 1 + rng.IntN(20)
			seed[s] = propItems(rng, s, 0)
		}
		seedBody, _ := json.Marshal(seed)
		if code, body := srv.put(seedBody); code != http.StatusAccepted {
			t.Fatalf("seed: %d %s", code, body)
		}
		stateBody := srv.get()
		st, err := ParseState(stateBody)
		if err != nil {
			t.Fatal(err)
		}
		var stored map[string]any
		_ = json.Unmarshal(stateBody, &stored)

		// a client's request: per section a version case and a copy, changed or not
		req := map[string]any{}
		changed := map[string]bool{}
		for _, s := range propSections {
			vS := int(st.Version(s))
			switch rng.IntN(4) {
			case 0: // absent: the section is the client's to replace
			case 1:
				req[s+"_conf_version"] = rng.IntN(vS + 1) // stale or equal
			case 2:
				req[s+"_conf_version"] = vS
			case 3:
				req[s+"_conf_version"] = vS + 1 + rng.IntN(5)
			}
			switch rng.IntN(3) {
			case 0: // an unchanged copy, as read back (defaults and {} included)
				if items, ok := stored[s]; ok {
					req[s] = items
				}
			case 1:
				req[s] = propItems(rng, s, 1+iter)
				changed[s] = canonical(req[s]) != canonical(stored[s])
			}
			if _, present := req[s]; !present {
				// "version equal, no items" is APISIX's own way to keep a section
				v, hasV := req[s+"_conf_version"].(int)
				keep := hasV && v == vS
				changed[s] = !keep && canonical(nil) != canonical(stored[s])
			}
		}
		body, _ := json.Marshal(req)
		res, err := rw.Rewrite(Input{Body: body, Digest: "c", HasDigest: true, State: st})
		if err != nil {
			t.Fatalf("iteration %d: %v", iter, err)
		}
		code, answer := srv.put(res.Body)
		if code != http.StatusAccepted {
			t.Fatalf("iteration %d: APISIX answered %d %s to\n%s", iter, code, answer, res.Body)
		}
		after := em.Document()
		for _, s := range propSections {
			vS := st.Version(s)
			vAfter, _ := after[s+"_conf_version"].(float64)
			_, hasVersion := req[s+"_conf_version"]
			switch {
			case preserved[s]:
				if vAfter != vS || canonical(after[s]) != canonical(stored[s]) {
					t.Fatalf("iteration %d: preserved %s changed: v%v→v%v", iter, s, vS, vAfter)
				}
			case changed[s] || !hasVersion:
				if got, want := canonical(withoutDefaults(after[s])), canonical(withoutDefaults(req[s])); got != want {
					t.Fatalf("iteration %d: %s's change was not applied:\n got %s\nwant %s", iter, s, got, want)
				}
			default: // unchanged, with a version: raised, kept or settled (§8.1)
				if vAfter != vS {
					t.Fatalf("iteration %d: unchanged %s moved from v%v to v%v", iter, s, vS, vAfter)
				}
			}
		}
	}
}

// withoutDefaults drops what the emulator's --fill-defaults adds to stored items.
func withoutDefaults(v any) any {
	items, ok := v.([]any)
	if !ok {
		return v
	}
	defaults := map[string]any{"status": float64(1), "priority": float64(0), "pass_host": "pass", "scheme": "http", "hash_on": "vars"}
	out := make([]any, len(items))
	for i, raw := range items {
		item, ok := raw.(map[string]any)
		if !ok {
			out[i] = raw
			continue
		}
		cp := map[string]any{}
		for k, e := range item {
			if d, isDefault := defaults[k]; !isDefault || d != e {
				cp[k] = e
			}
		}
		out[i] = cp
	}
	return out
}
