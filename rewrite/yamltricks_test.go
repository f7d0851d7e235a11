package rewrite

import (
	"errors"
	"reflect"
	"testing"
)

// TestYAMLTricks: documents built to make a line-based reader misplace a top-level
// key. For each, the pass either finds exactly the keys libyaml (the oracle) finds, or
// refuses; it never finds other keys.
func TestYAMLTricks(t *testing.T) {
	docs := []string{
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
	for _, doc := range docs {
		obj, err := scanYAML([]byte(doc))
		root, ok := decodeYAMLDoc([]byte(doc))
		var refuse *RefuseError
		if errors.As(err, &refuse) {
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", doc, err)
			continue
		}
		if !ok {
			continue // libyaml rejects it: APISIX answers 500, nothing stored
		}
		want, ok := plainKeys(root)
		if !ok {
			continue
		}
		var got []string
		for _, m := range obj.members {
			got = append(got, m.name)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%q: found %q, libyaml %q", doc, got, want)
		}
	}
}
