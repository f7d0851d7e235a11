package rewrite

import (
	"bytes"
	"encoding/json"
	"errors"
	"github.com/confshim/confshim/internal/sections"
	"os"
	"path/filepath"
	"testing"
	"unicode/utf8"

	"github.com/valyala/fastjson"
	"golang.org/x/tools/txtar"
)

// seedCorpus adds the golden requests and the recorded ADC bodies.
func seedCorpus(f *testing.F, add func(body []byte)) {
	paths, _ := filepath.Glob("../testdata/rewrite/*.txtar")
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		if req, ok := body(txtar.Parse(data), "request.json"); ok {
			add(req)
		}
	}
	for _, s := range []string{`{}`, `[]`, `"x"`, `1`, `{"a":[{"b":"\u00e9\n"}]}`, ` {"a" : -0.5e+3 } `, `{"a":tru}`, `[[[[`, `{"a":1,}`, `01`, `"\x"`} {
		add([]byte(s))
	}
}

// FuzzScan checks the scanner against fastjson.ValidateBytes: both accept exactly the
// same bodies, and every member span of an object is itself valid JSON.
func FuzzScan(f *testing.F) {
	seedCorpus(f, func(b []byte) { f.Add(b) })
	f.Fuzz(func(t *testing.T, body []byte) {
		obj, err := scanObject(body, nil)
		if errors.Is(err, errTooDeep) {
			return // fastjson has no depth limit; APISIX's cjson has ours
		}
		valid := fastjson.ValidateBytes(body) == nil
		var syn *syntaxError
		if valid && errors.As(err, &syn) && syn.what == "control character in string" {
			return // fastjson misses a raw control character in a string that also has an escape
		}
		if valid != (err == nil || errors.Is(err, errNotObject)) {
			t.Fatalf("fastjson valid=%v, scanner err=%v", valid, err)
		}
		if err != nil {
			return
		}
		for _, m := range obj.members {
			if verr := fastjson.ValidateBytes(body[m.valueStart:m.valueEnd]); verr != nil {
				t.Fatalf("member %q span is not a value: %v", m.key, verr)
			}
			if body[m.start] != '"' {
				t.Fatalf("member %q does not start at its key", m.key)
			}
		}
		if body[obj.close] != '}' {
			t.Fatalf("close offset %d is not '}'", obj.close)
		}
	})
}

// FuzzRewrite checks the rewrite's invariants for any body and data plane state: no
// panic; the output is valid JSON; an unchanged result is the input itself; a changed
// one has the same top-level keys minus removed sections plus inserted versions, every
// other value unchanged, every decided version in place; and the same body against the
// state its write produced bumps nothing (no churn).
func FuzzRewrite(f *testing.F) {
	state := []byte(`{"routes_conf_version":7,"routes":[{"id":"r1","uri":"/a"}],"secrets_conf_version":2,"secrets":[{"id":"v/1"}],"widgets_conf_version":3}`)
	seedCorpus(f, func(b []byte) { f.Add(b, state) })
	f.Fuzz(func(t *testing.T, body, stateBody []byte) {
		st, err := ParseState(stateBody)
		if err != nil {
			st = freshState()
		}
		rw := New(DefaultPreserve)
		in := Input{Body: body, Digest: "d", HasDigest: true, State: st}
		res, err := rw.Rewrite(in)
		var skip *SkipError
		var refuse *RefuseError
		switch {
		case errors.As(err, &refuse), errors.As(err, &skip):
			return
		case err != nil:
			t.Fatalf("unexpected error %v", err)
		}
		if err := fastjson.ValidateBytes(res.Body); err != nil {
			t.Fatalf("output is not valid JSON: %v\n%s", err, res.Body)
		}
		if !res.Changed {
			if !bytes.Equal(res.Body, body) || res.Digest != "d" {
				t.Fatal("an unchanged result must forward the input untouched")
			}
			return
		}
		out, err := fastjson.ParseBytes(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		// the same top-level keys, minus the sections dropped or thinned, plus the versions
		// inserted, and every value not edited byte for byte the same
		removed := map[string]bool{}
		for _, section := range res.Thinned {
			removed[section] = true
		}
		set := map[string]bool{}
		for _, c := range res.Changes {
			set[c.Section+versionSuffix] = true
			if c.Dropped {
				removed[c.Section] = true
			}
		}
		parsedIn, _ := fastjson.ParseBytes(body)
		inObj, _ := parsedIn.Object()
		outObj, _ := out.Object()
		inObj.Visit(func(k []byte, v *fastjson.Value) {
			key := string(k)
			got := outObj.Get(key)
			switch {
			case removed[key]:
				if got != nil {
					t.Fatalf("%s: removed items still in the output", key)
				}
			case got == nil:
				t.Fatalf("%s: lost from the output", key)
			case !set[key] && got.String() != v.String():
				t.Fatalf("%s: changed without a decision", key)
			}
		})
		outObj.Visit(func(k []byte, _ *fastjson.Value) {
			if inObj.Get(string(k)) == nil && !set[string(k)] {
				t.Fatalf("%s: appeared from nowhere", k)
			}
		})
		for _, c := range res.Changes {
			v := out.Get(c.Section + versionSuffix)
			if v == nil || v.GetFloat64() != c.To {
				t.Fatalf("%s: want version %v in the output, got %v", c.Section, c.To, v)
			}
			if c.Dropped && out.Get(c.Section) != nil {
				t.Fatalf("%s: dropped items still in the output", c.Section)
			}
		}
		// The record is stable: the same body again, against the state the write
		// produced, changes no version the data plane holds.
		next := Input{Body: body, Digest: "d", HasDigest: true, State: res.AppliedState(), Record: res.Commit(false)}
		again, err := rw.Rewrite(next)
		if errors.Is(err, ErrStateIncomplete) && sendsUnknownSection(res, st) {
			return // the data plane ignores a section it does not know: nothing churns there
		}
		if err != nil {
			t.Fatalf("second pass: %v", err)
		}
		for _, c := range again.Changes {
			if c.Action == Bumped {
				t.Fatalf("%s bumped again: churn", c.Section)
			}
		}
	})
}

func sendsUnknownSection(res *Result, st *State) bool {
	for _, o := range res.sections {
		if _, known := st.Versions[o.section]; o.recorded && !known {
			return true
		}
	}
	return false
}

// FuzzReferences holds the scan of an item's top-level members (references, the
// fallback's fixed point reads it for every item) against encoding/json decoding the
// item: the same references, for any valid JSON object.
func FuzzReferences(f *testing.F) {
	for _, seed := range []string{
		`{"id":"r1","service_id":"s1","upstream_id":7}`,
		`{"labels":{"service_id":"x"},"service_\u0069d":"s\"1","upstream_id":"u1","upstream_id":"u2"}`,
		`{"group_id":null,"plugin_config_id":"","service_id":1.50}`,
		` { "service_id" : "a\\b" , "x" : [ "service_id" , { } ] } `,
		`[]`, `"service_id"`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, item []byte) {
		var fields map[string]json.RawMessage
		if !utf8.Valid(item) || json.Unmarshal(item, &fields) != nil || fields == nil {
			return // References reads items of a body the scan validated: JSON objects
		}
		var want []reference
		for _, rf := range sections.APISIX().References() {
			if id := idText(fields[rf.Field]); id != "" {
				want = append(want, reference{Section: rf.Section, ID: id})
			}
		}
		got := references(sections.APISIX(), item)
		if len(got) != len(want) {
			t.Fatalf("references(%q) = %v, want %v", item, got, want)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("references(%q) = %v, want %v", item, got, want)
			}
		}
	})
}
