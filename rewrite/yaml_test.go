package rewrite

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	yaml "go.yaml.in/yaml/v3"
)

// decodeYAMLDoc reads a document's top level with go.yaml.in/yaml/v3 (a port of
// libyaml, APISIX's parser) as the oracle of where top-level keys are.
func decodeYAMLDoc(body []byte) (*yaml.Node, bool) {
	var doc yaml.Node
	if err := yaml.Unmarshal(body, &doc); err != nil || len(doc.Content) == 0 {
		return nil, false
	}
	return doc.Content[0], true
}

func plainKeys(root *yaml.Node) ([]string, bool) {
	var keys []string
	for i := 0; i+1 < len(root.Content); i += 2 {
		k := root.Content[i]
		if k.Kind != yaml.ScalarNode || k.Tag == "!!merge" || k.Anchor != "" {
			return nil, false
		}
		keys = append(keys, k.Value)
	}
	return keys, true
}

// FuzzYAMLScan checks the YAML pass against the oracle: for every document the
// oracle reads as a mapping with scalar keys, the pass finds the same keys in the same
// order (or refuses); it never calls a mapping "not an object"; and a version it reads
// has the oracle's scalar text.
//
// Its seeds, run by every go test, include documents built to misplace a key: block
// scalars with indicators, multi-line quoted and plain scalars, flow collections across
// lines, quotes in comments.
func FuzzYAMLScan(f *testing.F) {
	for _, s := range yamlSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		obj, err := scanYAML(body)
		root, ok := decodeYAMLDoc(body)
		var refuse *RefuseError
		switch {
		case errors.Is(err, refuseNotObject):
			if ok && root.Kind == yaml.MappingNode && len(root.Content) > 0 {
				t.Fatalf("called a mapping not an object:\n%s", body)
			}
			return
		case errors.As(err, &refuse):
			return
		case err != nil:
			t.Fatalf("unexpected error %v", err)
		}
		if !ok || root.Kind != yaml.MappingNode || obj.yaml == nil {
			return // invalid YAML (APISIX rejects it whole), or the JSON path
		}
		keys, ok := plainKeys(root)
		if !ok {
			return
		}
		var got []string
		for _, m := range obj.members {
			got = append(got, m.name)
		}
		if !reflect.DeepEqual(got, keys) && !(len(got) == 0 && len(keys) == 0) {
			t.Fatalf("top-level keys:\n got %q\nwant %q\n%s", got, keys, body)
		}
		for i, m := range obj.members {
			if !strings.HasSuffix(m.name, versionSuffix) || m.valueStart < 0 {
				continue
			}
			v := root.Content[2*i+1]
			raw := string(body[m.valueStart:m.valueEnd])
			if v.Kind != yaml.ScalarNode || (v.Style == 0 && v.Value != raw) {
				t.Fatalf("%s: read %q, the oracle %q", m.name, raw, v.Value)
			}
		}
	})
}

// FuzzYAMLSplice checks that a spliced YAML body means what the client's did, except
// for the version values the rewrite set and the sections it removed.
func FuzzYAMLSplice(f *testing.F) {
	for _, s := range yamlSeeds {
		f.Add([]byte(s))
	}
	state := []byte(`{"routes_conf_version":7,"routes":[{"id":"r1","uri":"/a"}],"secrets_conf_version":2,"secrets":[{"id":"v/1"}],"upstreams_conf_version":3}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		st, _ := ParseState(state)
		rw := New(DefaultPreserve)
		p, err := rw.PrepareYAML(body)
		if err != nil {
			return
		}
		res, err := rw.Decide(p, Input{Body: body, State: st, Digest: "d", HasDigest: true})
		if err != nil || !res.Changed {
			return
		}
		var before, after map[string]any
		if yaml.Unmarshal(body, &before) != nil {
			return // APISIX rejects it whole
		}
		if err := yaml.Unmarshal(res.Body, &after); err != nil {
			t.Fatalf("the splice broke a valid document: %v\n%s\n---- became\n%s", err, body, res.Body)
		}
		removed := map[string]bool{}
		for _, s := range res.Thinned {
			removed[s] = true
		}
		set := map[string]float64{}
		for _, c := range res.Changes {
			set[c.Section+versionSuffix] = c.To
			if c.Dropped {
				removed[c.Section] = true
			}
		}
		for k, v := range before {
			if _, isSet := set[k]; isSet || removed[k] {
				continue
			}
			if fmt.Sprintf("%#v", after[k]) != fmt.Sprintf("%#v", v) { // NaN ≠ NaN for DeepEqual
				t.Fatalf("%s changed: %v → %v\n%s\n---- became\n%s", k, v, after[k], body, res.Body)
			}
		}
		for k := range removed {
			if _, still := after[k]; still {
				t.Fatalf("%s still present", k)
			}
		}
		for k, want := range set {
			if got, _ := after[k].(int); float64(got) != want {
				if gotF, _ := after[k].(float64); gotF != want {
					t.Fatalf("%s = %v, want %v", k, after[k], want)
				}
			}
		}
	})
}

var yamlSeeds = []string{
	"routes_conf_version: 3\nroutes:\n  - {id: r1, uri: /a}\nsecrets_conf_version: 0\n",
	"routes_conf_version: 3\nroutes:\n- id: r1\n  uri: /a\n  desc: |\n    text\n    secrets_conf_version: 9\nsecrets:\n  - id: v/1\n",
	"a: yes\nb: 0755\n", "- 1\n", "~", "a: [", "a: .nan", "a: &x [1]\nb: *x\n", "? [1, 2]\n: 3\n",
	"---\na: 1\n---\nb: 2\n",
	"routes: [\n{id: r1},\n]\nsecrets_conf_version: 1\n",
	"routes:\n  - name: \"multi\nline\"\nsecrets_conf_version: 1\n",
	"routes:\n  - desc: plain\n      continued \"x\n    id: r1\nupstreams_conf_version: 1\n",
	"secrets: &s\n  - id: v/1\nroutes:\n  - <<: *s\nroutes_conf_version: 1\n",
	"routes_conf_version: 1_0\nroutes: []\n",
	"'routes_conf_version': 0x10 # hex\n\"secrets\": []\n",
	"{\"routes_conf_version\": 1, \"routes\": []}",
	"routes_conf_version: 1\n...\nsecrets_conf_version: 9\n",
	// built to make a line-based reader misplace a top-level key

	"routes: |2\n  secrets_conf_version: 9\nsecrets_conf_version: 1\n",
	"routes: |+\n  a\n\n\nsecrets_conf_version: 1\n",
	"routes: >-\n    folded\n  secrets_conf_version: 9\nsecrets_conf_version: 1\n",
	"routes: \"multi\n line \\\" \nsecrets_conf_version: 9\"\nsecrets_conf_version: 1\n",
	"routes: 'it''s\nsecrets_conf_version: 9'\nsecrets_conf_version: 1\n",
	"routes: [\"]\", {a: '}'}, # ]\n  x]\nsecrets_conf_version: 1\n",
	"routes: plain\n  secrets_conf_version 9\nsecrets_conf_version: 1\n",
	"routes:\n- a\n- b: |\n    secrets_conf_version: 9\n- c\nsecrets_conf_version: 1\n",
	"routes: &a:b [1]\nupstreams: *a:b\nsecrets_conf_version: 1\n",
	"routes: # \"quote in a comment\n  - 1\nsecrets_conf_version: 1\n",
	"routes:\n  - {id: r1,\nsecrets_conf_version: 9}\nsecrets_conf_version: 1\n",
	"routes:\n  ? complex\n  : value\nsecrets_conf_version: 1\n",
	"routes: [a,\n\tb]\nsecrets_conf_version: 1\n",
	"routes:\n  - |\n   text\n  secrets_conf_version: 9\nsecrets_conf_version: 1\n",
	"routes: !!str tagged\nsecrets_conf_version: 1\n",
	"routes: \"a\\\n  b\"\nsecrets_conf_version: 1\n",
	"\"routes\": 1\n'secrets_conf_version': 1\n",
	"routes: a # comment: not a key\nsecrets_conf_version: 1\n",
	"routes: x\n ...\nsecrets_conf_version: 1\n",
	"routes: [\n  \"a\",\n  'b'\n]\nsecrets_conf_version: 1\n",
}

// TestYAMLAnchorSectionIsNotThinned: a section whose anchor another section's alias
// uses keeps its items on the second sync (issue 18: it was refused with 400 on every
// sync after the first, although nothing needed repair); the rest is still thinned.
func TestYAMLAnchorSectionIsNotThinned(t *testing.T) {
	t.Parallel()
	rw := New(DefaultPreserve)
	body := []byte("routes_conf_version: 2\nroutes:\n  - id: r1\n    uri: /a\n    plugins: &cors\n      cors: {}\n" +
		"services_conf_version: 2\nservices:\n  - id: s1\n    plugins: *cors\n" +
		"ssls_conf_version: 2\nssls:\n  - id: t1\n    snis: [a.example.com]\n")
	decide := func(st *State, rec *Record) *Result {
		t.Helper()
		p, err := rw.PrepareYAML(body)
		if err != nil {
			t.Fatal(err)
		}
		res, err := rw.Decide(p, Input{Body: body, Digest: "d", HasDigest: true, State: st, Record: rec})
		if err != nil {
			t.Fatalf("decide: %v", err)
		}
		return res
	}
	first := decide(&State{Versions: map[string]float64{"routes": 1, "services": 1, "ssls": 1}}, nil)
	applied := first.AppliedState()
	second := decide(applied, first.Commit(false))
	if !second.Changed || !slices.Contains(second.Thinned, "ssls") {
		t.Fatalf("an unchanged section without anchors must still be thinned: %v", second.Thinned)
	}
	if slices.Contains(second.Thinned, "routes") {
		t.Fatal("routes holds the anchor services refers to: it must not be thinned")
	}
	// services only uses the anchor: thinning it leaves the anchor unused, which is fine
	if !bytes.Contains(second.Body, []byte("&cors")) || !slices.Contains(second.Thinned, "services") {
		t.Fatalf("want the anchor kept and services thinned:\n%s", second.Body)
	}
	if _, ok := decodeYAMLDoc(second.Body); !ok {
		t.Fatalf("the forwarded body is not YAML:\n%s", second.Body)
	}
	// services changes, routes does not: still no refusal, and the alias finds its anchor
	body = bytes.Replace(body, []byte("  - id: s1\n"), []byte("  - id: s1\n    desc: changed\n"), 1)
	body = bytes.Replace(body, []byte("services_conf_version: 2"), []byte("services_conf_version: 3"), 1)
	third := decide(applied, first.Commit(false))
	if slices.Contains(third.Thinned, "routes") || !bytes.Contains(third.Body, []byte("*cors")) {
		t.Fatalf("the alias in a changed section lost its anchor:\n%s", third.Body)
	}
}
