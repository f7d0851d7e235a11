package rewrite

import "testing"

// TestLostTies: a changed merged section sent at vS+1 — the version an operator's
// read-modify-write of the same state picks too — is judged from the state read after
// APISIX accepted the PUT: at that very version with other items, APISIX kept the
// writer's copy (an equal version means "keep"); at a higher one, a writer came after
// and only the client's items are looked for; a version the clock chose is no tie, nor
// is a section the client owns whole.
func TestLostTies(t *testing.T) {
	rw := NewMerging(DefaultPreserve, []string{"routes"}) // routes shared with an operator, for the test
	const before = `[{"id":"r1","uris":["/a"]}]`
	for _, tc := range []struct {
		name      string
		vR        string // the client's routes_conf_version (vS is 1000)
		now       float64
		yaml      bool
		managed   bool    // routes not merged
		readV     float64 // what the read after the PUT shows
		readItems string
		tie, lost bool
	}{
		{name: "the client's change landed", vR: "1001", readV: 1001, readItems: `[{"id":"r1","uris":["/b"]}]`, tie: true},
		{name: "landed, with schema defaults the data plane added", vR: "1001", readV: 1001, readItems: `[{"id":"r1","uris":["/b"],"status":1,"priority":0}]`, tie: true},
		{name: "a writer's copy differing in one value", vR: "1001", readV: 1001, readItems: `[{"id":"r1","uris":["/b","/c"]}]`, tie: true, lost: true},
		{name: "a writer's copy at the same version was kept", vR: "1001", readV: 1001, readItems: `[{"id":"r1","uris":["/a"]},{"id":"op","uris":["/op"]}]`, tie: true, lost: true},
		{name: "a deletion kept out at the same version", vR: "1001", readV: 1001, readItems: `[{"id":"r1","uris":["/b"]},{"id":"gone","uris":["/x"]}]`, tie: true, lost: true},
		{name: "a later writer kept the items sent", vR: "1001", readV: 1002, readItems: `[{"id":"r1","uris":["/b"]},{"id":"op","uris":["/op"]}]`, tie: true},
		{name: "a later writer without the items sent", vR: "1001", readV: 1002, readItems: `[{"id":"r1","uris":["/a"]}]`, tie: true, lost: true},
		{name: "a data plane that lost its state is §8.4's", vR: "1001", readV: 0, readItems: `[]`, tie: true},
		{name: "a stale change bumped on a clock behind is a tie too", vR: "900", now: 999, readV: 1001, readItems: before, tie: true, lost: true},
		{name: "a bump the clock chose is none", vR: "900", now: 5000, readV: 5000, readItems: before},
		{name: "the client's version above vS+1 is none", vR: "1002", readV: 1002, readItems: before},
		{name: "a section the client owns whole is not judged", vR: "1001", managed: true, readV: 1001, readItems: before},
		{name: "a YAML body's items are not read", vR: "1001", yaml: true, readV: 1001, readItems: before},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(`{"routes_conf_version":` + tc.vR + `,"routes":[{"id":"r1","uris":["/b"]}]}`)
			if tc.yaml {
				body = []byte("routes_conf_version: " + tc.vR + "\nroutes:\n  - id: r1\n    uris: [/b]\n")
			}
			st := &State{Versions: map[string]float64{"routes": 1000}, Items: map[string][]byte{"routes": []byte(before)}, ItemsKnown: true}
			rw := rw
			if tc.managed {
				rw = New(DefaultPreserve)
			}
			prepare := rw.Prepare
			if tc.yaml {
				prepare = rw.PrepareYAML
			}
			p, err := prepare(body)
			if err != nil {
				t.Fatal(err)
			}
			res, err := rw.Decide(p, Input{Body: body, State: st, Now: tc.now, Owned: Ownership{"routes": {"r1", "gone"}}})
			if err != nil {
				t.Fatal(err)
			}
			if got := res.SentAtATie(); got != tc.tie {
				t.Fatalf("SentAtATie %v, want %v (%s)", got, tc.tie, res.Actions())
			}
			if !tc.tie {
				return
			}
			read := &State{Versions: map[string]float64{"routes": tc.readV}, Items: map[string][]byte{"routes": []byte(tc.readItems)}, ItemsKnown: true}
			lost, err := rw.LostTies(res, res.Body, read)
			if err != nil {
				t.Fatal(err)
			}
			if (len(lost) > 0) != tc.lost {
				t.Fatalf("lost %+v, want lost %v", lost, tc.lost)
			}
			if tc.lost && (lost[0].Section != "routes" || lost[0].From != 1000 || lost[0].To != tc.readV) {
				t.Fatalf("lost %+v, want routes from 1000 to %v", lost[0], tc.readV)
			}
		})
	}
}

// TestLostTiesOfAMergedSection: after a higher version, only the client's own items of a
// merged section are looked for; the kept ones (an operator's) are the writer's to change.
func TestLostTiesOfAMergedSection(t *testing.T) {
	rw := NewMerging(DefaultPreserve, []string{"global_rules"})
	body := []byte(`{"global_rules_conf_version":1001,"global_rules":[{"id":"mine","plugins":{"cors":{}}}]}`)
	st := &State{Versions: map[string]float64{"global_rules": 1000}, ItemsKnown: true,
		Items: map[string][]byte{"global_rules": []byte(`[{"id":"ops","plugins":{"zipkin":{"v":1}}}]`)}}
	p, err := rw.Prepare(body)
	if err != nil {
		t.Fatal(err)
	}
	res, err := rw.Decide(p, Input{Body: body, State: st, Owned: Ownership{"global_rules": {"mine"}}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.SentAtATie() {
		t.Fatalf("the union at vS+1 is not a tie: %s", res.Actions())
	}
	for _, tc := range []struct {
		name  string
		v     float64
		items string
		lost  bool
	}{
		{"landed", 1001, `[{"id":"mine","plugins":{"cors":{}}},{"id":"ops","plugins":{"zipkin":{"v":1}}}]`, false},
		{"an operator's copy kept at the tie", 1001, `[{"id":"ops","plugins":{"zipkin":{"v":2}}}]`, true},
		{"a later operator write changed its own item", 1002, `[{"id":"mine","plugins":{"cors":{}}},{"id":"ops","plugins":{"zipkin":{"v":3}}}]`, false},
		{"a later operator write without the client's item", 1002, `[{"id":"ops","plugins":{"zipkin":{"v":3}}}]`, true},
		{"cjson's {} for an empty object", 1001, `[{"id":"mine","plugins":{"cors":[]}},{"id":"ops","plugins":{"zipkin":{"v":1}}}]`, false},
	} {
		read := &State{Versions: map[string]float64{"global_rules": tc.v}, ItemsKnown: true, Items: map[string][]byte{"global_rules": []byte(tc.items)}}
		lost, err := rw.LostTies(res, res.Body, read)
		if err != nil {
			t.Fatal(err)
		}
		if (len(lost) > 0) != tc.lost {
			t.Errorf("%s: lost %+v, want lost %v", tc.name, lost, tc.lost)
		}
	}
}
