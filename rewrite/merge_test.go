package rewrite

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/confshim/confshim/internal/testsupport/emulator"
)

// TestMergePropertyAgainstTheEmulator drives random sequences of client snapshots and
// out-of-band writes through the rewrite of a --merge section and the emulator: after
// every accepted client sync, the data plane's section is exactly the client's latest
// snapshot plus the out-of-band items whose ids the client never sent (contract §8.6).
func TestMergePropertyAgainstTheEmulator(t *testing.T) {
	t.Parallel()
	const section = "secrets"
	for seq := 0; seq < 60; seq++ {
		rng := rand.New(rand.NewPCG(uint64(seq), 7))
		rw := NewMerging(nil, []string{section})
		em, _ := emulator.New(emulator.Options{})
		srv := &propServer{t: t, em: em}
		var record *Record
		var owned Ownership
		everSent := map[string]bool{}
		oob := map[string]string{} // id → its content, as the out-of-band writer last wrote it
		var clientVersion int
		for step := 0; step < 25; step++ {
			if rng.IntN(3) == 0 { // an out-of-band write: add or change one of its own ids
				doc := em.Document()
				if doc == nil {
					doc = map[string]any{}
				}
				delete(doc, "X-Digest")
				delete(doc, "X-Last-Modified")
				id := fmt.Sprintf("oob/%d", rng.IntN(4))
				if rng.IntN(4) == 0 {
					id = fmt.Sprintf("c/%d", rng.IntN(5)) // an id the client may send too
				}
				content := fmt.Sprintf("oob-%d-%d", seq, step)
				items, _ := doc[section].([]any)
				items = slices.DeleteFunc(items, func(it any) bool { return it.(map[string]any)["id"] == id })
				doc[section] = append(items, map[string]any{"id": id, "uri": "http://" + content})
				v, _ := doc[section+"_conf_version"].(float64)
				doc[section+"_conf_version"] = v + 1
				body, _ := json.Marshal(doc)
				if code, msg := srv.put(body); code != http.StatusAccepted {
					t.Fatalf("seq %d step %d: out-of-band write %d %s", seq, step, code, msg)
				}
				if !everSent[id] {
					oob[id] = content
				}
				continue
			}
			// a client snapshot: a random subset of its ids, sometimes changed
			snapshot := []any{}
			for i := 0; i < 5; i++ {
				if rng.IntN(2) == 0 {
					id := fmt.Sprintf("c/%d", i)
					snapshot = append(snapshot, map[string]any{"id": id, "uri": fmt.Sprintf("http://client-%d", rng.IntN(2))})
					everSent[id] = true
					delete(oob, id) // it becomes the client's
				}
			}
			clientVersion++ // ADC's clock; often below the data plane's after oob writes
			req := map[string]any{section + "_conf_version": clientVersion, section: snapshot}
			body, _ := json.Marshal(req)
			st, err := ParseState(srv.get())
			if err != nil {
				t.Fatal(err)
			}
			res, err := rw.Rewrite(Input{Body: body, Digest: "c", HasDigest: true, State: st, Record: record, Owned: owned})
			if err != nil {
				t.Fatalf("seq %d step %d: %v", seq, step, err)
			}
			if code, msg := srv.put(res.Body); code != http.StatusAccepted {
				t.Fatalf("seq %d step %d: APISIX answered %d %s to %s", seq, step, code, msg, res.Body)
			}
			record, owned = res.Commit(false), res.Ownership(owned)
			// the expectation: the snapshot, plus out-of-band items never sent by the client
			want := map[string]string{}
			for _, it := range snapshot {
				m := it.(map[string]any)
				want[m["id"].(string)] = m["uri"].(string)
			}
			for id, content := range oob {
				want[id] = "http://" + content
			}
			got := map[string]string{}
			items, _ := em.Document()[section].([]any)
			for _, it := range items {
				m := it.(map[string]any)
				got[m["id"].(string)] = m["uri"].(string)
			}
			if fmt.Sprint(sortedMap(got)) != fmt.Sprint(sortedMap(want)) {
				t.Fatalf("seq %d step %d: the data plane holds\n %v\nwant\n %v\nforwarded %s", seq, step, sortedMap(got), sortedMap(want), res.Body)
			}
		}
	}
}

func sortedMap(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

func TestCountItems(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]int{
		``: 0, `[]`: 0, ` [ ] `: 0, `{}`: 0, `[{"a":"],["}]`: 1, `[1, "x,y", [2,3], {"k":[4]}]`: 4, `[{"id":"r1"},{"id":"r2"}]`: 2,
	} {
		if got := CountItems([]byte(raw)); got != want {
			t.Errorf("CountItems(%s) = %d, want %d", raw, got, want)
		}
	}
}

func TestItemID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ section, item, want string }{
		{"routes", `{"id":"r1","uri":"/a"}`, "r1"},
		{"routes", ` { "uri" : "/a" , "id" : 7 } `, "7"},
		{"routes", `{"plugins":{"id":"not-this"},"id":"r2"}`, "r2"},
		{"routes", `{"desc":"\"id\":\"x\"","id":"r3"}`, "r3"},
		{"routes", `{"i\u0064":"escaped"}`, "escaped"},
		{"routes", `{"uri":"/a"}`, ""},
		{"consumers", `{"username":"jack"}`, "jack"},
		{"consumers", `{"username":"jack","id":"jack/credentials/k"}`, "jack/credentials/k"},
		{"routes", `{"username":"jack"}`, ""},
		{"routes", `[1]`, ""},
		{"routes", `{"id":null}`, ""},
	} {
		if got := itemID(tc.section, []byte(tc.item)); got != tc.want {
			t.Errorf("itemID(%s, %s) = %q, want %q", tc.section, tc.item, got, tc.want)
		}
	}
}

// TestUnionNamesWhatItKeeps: the kept ids are named for the log, at most maxKeptIDs,
// each cut at 64 bytes; the count stays whole.
func TestUnionNamesWhatItKeeps(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 100)
	var dp []string
	for i := 0; i < 25; i++ {
		dp = append(dp, fmt.Sprintf(`{"id":"%s%d"}`, long, i))
	}
	_, _, kept, ids, err := union("secrets", []byte(`[{"id":"mine"}]`), []byte("["+strings.Join(dp, ",")+"]"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if kept != 25 || len(ids) != maxKeptIDs {
		t.Fatalf("kept %d, named %d: want 25 and %d", kept, len(ids), maxKeptIDs)
	}
	for _, id := range ids {
		if len(id) > 64+len("…") {
			t.Fatalf("a kept id of %d bytes: want it cut at 64", len(id))
		}
	}
}

// TestMergedSectionLeftOut (§8.6 as amended): syncs through the rewrite and the
// emulator, each remembered as the proxy remembers an accepted one (the record, the
// memory of ownership). A body that leaves secrets out says nothing about them at the
// version the client last sent, also after a body that carried them and after another
// that left them out; at a version it moved, the client's own vault/ctrl goes and the
// operator's vault/op stays.
func TestMergedSectionLeftOut(t *testing.T) {
	t.Parallel()
	const ctrl = `{"id":"vault/ctrl","uri":"http://vault:8200","prefix":"kv/ctrl","token":"c"}`
	type step struct {
		body string
		yaml bool
		want string // the ids the data plane holds after it
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"carried, then left out at its version, then moved", []step{
			{`{"secrets_conf_version":4,"secrets":[` + ctrl + `]}`, false, "vault/ctrl,vault/op"},
			{`{"secrets_conf_version":4}`, false, "vault/ctrl,vault/op"},
			{`{"secrets_conf_version":4}`, false, "vault/ctrl,vault/op"},
			{`{"secrets_conf_version":9}`, false, "vault/op"},
		}},
		{"left out twice at one version, then moved below the data plane's", []step{
			{`{"secrets_conf_version":2,"secrets":[` + ctrl + `]}`, false, "vault/ctrl,vault/op"}, // bumped above the operator's 3
			{`{"secrets_conf_version":2}`, false, "vault/ctrl,vault/op"},
			{`{"secrets_conf_version":2}`, false, "vault/ctrl,vault/op"},
			{`{"secrets_conf_version":3}`, false, "vault/op"},
		}},
		{"never a version: nothing said", []step{
			{`{"secrets_conf_version":4,"secrets":[` + ctrl + `]}`, false, "vault/ctrl,vault/op"},
			{`{}`, false, "vault/ctrl,vault/op"},
			{`{"routes_conf_version":1}`, false, "vault/ctrl,vault/op"},
		}},
		{"YAML left out at its version, then moved", []step{
			{`{"secrets_conf_version":4,"secrets":[` + ctrl + `]}`, false, "vault/ctrl,vault/op"},
			{"secrets_conf_version: 4\n", true, "vault/ctrl,vault/op"},
			{"secrets_conf_version: 8\n", true, "refused"}, // the union would have to be written into YAML
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rw := NewMerging(nil, []string{"secrets"})
			em, _ := emulator.New(emulator.Options{})
			srv := &propServer{t: t, em: em}
			if code, msg := srv.put([]byte(`{"secrets_conf_version":3,"secrets":[{"id":"vault/op","uri":"http://vault:8200","prefix":"kv/op","token":"o"}]}`)); code != http.StatusAccepted {
				t.Fatalf("the operator's write: %d %s", code, msg)
			}
			var record *Record
			var owned Ownership
			for i, s := range tc.steps {
				st, err := ParseState(srv.get())
				if err != nil {
					t.Fatal(err)
				}
				prepare := rw.Prepare
				if s.yaml {
					prepare = rw.PrepareYAML
				}
				p, err := prepare([]byte(s.body))
				var res *Result
				if err == nil {
					res, err = rw.Decide(p, Input{Body: []byte(s.body), Digest: "c", HasDigest: true, State: st, Record: record, Owned: owned})
				}
				var refuse *RefuseError
				if errors.As(err, &refuse) && s.want == "refused" {
					continue
				}
				if err != nil {
					t.Fatalf("step %d: %v", i+1, err)
				}
				if code, msg := srv.putAs(res.Body, s.yaml); code != http.StatusAccepted && code != http.StatusNoContent {
					t.Fatalf("step %d: APISIX answered %d %s to %s", i+1, code, msg, res.Body)
				}
				record, owned = res.Commit(false), res.Ownership(owned)
				var ids []string
				items, _ := em.Document()["secrets"].([]any)
				for _, it := range items {
					ids = append(ids, it.(map[string]any)["id"].(string))
				}
				if got := strings.Join(ids, ","); got != s.want {
					t.Fatalf("step %d (%s): the data plane holds %s, want %s; forwarded %s", i+1, s.body, got, s.want, res.Body)
				}
			}
		})
	}
}
