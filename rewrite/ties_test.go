package rewrite

import (
	"bytes"
	"testing"
)

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
		// APISIX stores items exactly as received: fields it did not get are another copy
		{name: "fields the client did not send", vR: "1001", readV: 1001, readItems: `[{"id":"r1","uris":["/b"],"status":1,"priority":0}]`, tie: true, lost: true},
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

// TestLostTiesJudgesContentAsStored (cases from a review of the first version, which
// took a stored item holding more than was sent as landed and compared numbers
// exactly): each is a read after APISIX accepted a merged section sent at vS+1; want is
// what happened to the client's change.
func TestLostTiesJudgesContentAsStored(t *testing.T) {
	for _, tc := range []struct {
		name, section, before, client, read string
		wantLost                            bool
	}{
		{ // the client removes a field of its item; an operator's +1 (same state, adds a
			// field to its own item) was kept by APISIX: the client's change is NOT there
			name: "removal kept out by a writer's copy", section: "secrets",
			before:   `[{"id":"vault/ctrl","uri":"u","token":"a","namespace":"ns1"},{"id":"vault/1","uri":"u","token":"op"}]`,
			client:   `[{"id":"vault/ctrl","uri":"u","token":"a"}]`,
			read:     `[{"id":"vault/ctrl","uri":"u","token":"a","namespace":"ns1"},{"id":"vault/1","uri":"u","token":"op","namespace":"opns"}]`,
			wantLost: true,
		},
		{ // the client removes a plugin from its global rule; the operator's copy kept
			name: "plugin removal kept out", section: "global_rules",
			before:   `[{"id":"mine","plugins":{"cors":{},"prometheus":{}}},{"id":"ops","plugins":{"zipkin":{"sample_ratio":1}}}]`,
			client:   `[{"id":"mine","plugins":{"prometheus":{}}}]`,
			read:     `[{"id":"mine","plugins":{"cors":{},"prometheus":{}}},{"id":"ops","plugins":{"zipkin":{"sample_ratio":1},"prometheus":{}}}]`,
			wantLost: true,
		},
		{ // global_rules keep their order (§8.1); the client's reorder is kept out
			name: "reorder kept out (ordered section)", section: "global_rules",
			before:   `[{"id":"a","plugins":{"cors":{}}},{"id":"b","plugins":{"prometheus":{}}},{"id":"ops","plugins":{"zipkin":{"sample_ratio":1}}}]`,
			client:   `[{"id":"b","plugins":{"prometheus":{}}},{"id":"a","plugins":{"cors":{}}}]`,
			read:     `[{"id":"a","plugins":{"cors":{}}},{"id":"b","plugins":{"prometheus":{}}},{"id":"ops","plugins":{"zipkin":{"sample_ratio":1},"x":{}}}]`,
			wantLost: true,
		},
		{ // the client's change LANDED; cjson stored 0.3333333333333333 with 14 digits
			name: "landed, a 16-digit float read back at 14 digits", section: "global_rules",
			before:   `[{"id":"mine","plugins":{"zipkin":{"sample_ratio":0.5}}}]`,
			client:   `[{"id":"mine","plugins":{"zipkin":{"sample_ratio":0.3333333333333333}}}]`,
			read:     `[{"id":"mine","plugins":{"zipkin":{"sample_ratio":0.33333333333333}}}]`,
			wantLost: false,
		},
		{ // landed; an integer of 15 digits read back as %.14g
			name: "landed, a 15-digit integer read back at 14 digits", section: "secrets",
			before:   `[{"id":"vault/ctrl","uri":"u","token":"a"}]`,
			client:   `[{"id":"vault/ctrl","uri":"u","token":"b","ttl":123456789012345}]`,
			read:     `[{"id":"vault/ctrl","uri":"u","token":"b","ttl":1.2345678901234e+14}]`,
			wantLost: false,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rw := NewMerging(DefaultPreserve, []string{tc.section})
			body := []byte(`{"` + tc.section + `_conf_version":1001,"` + tc.section + `":` + tc.client + `}`)
			st := &State{Versions: map[string]float64{tc.section: 1000}, Items: map[string][]byte{tc.section: []byte(tc.before)}, ItemsKnown: true}
			p, err := rw.Prepare(body)
			if err != nil {
				t.Fatal(err)
			}
			owned := Ownership{"secrets": {"vault/ctrl"}, "global_rules": {"mine", "a", "b"}}
			res, err := rw.Decide(p, Input{Body: body, State: st, Owned: owned})
			if err != nil {
				t.Fatal(err)
			}
			if !res.SentAtATie() {
				t.Fatalf("not a tie: %s", res.Actions())
			}
			read := &State{Versions: map[string]float64{tc.section: 1001}, Items: map[string][]byte{tc.section: []byte(tc.read)}, ItemsKnown: true}
			lost, err := rw.LostTies(res, res.Body, read)
			if err != nil {
				t.Fatal(err)
			}
			if (len(lost) > 0) != tc.wantLost {
				t.Errorf("LostTies = %+v; the client's change %s", lost, map[bool]string{true: "did NOT land (want it judged lost)", false: "landed (want it judged landed)"}[tc.wantLost])
			}
		})
	}
}

// TestAMergedYAMLChangeAtVSPlusOneGoesAtTheClock: a YAML body's merged section (the data
// plane holding only the client's items) is forwarded as a managed one, its items not
// read (§5.6), so it cannot be read back after the PUT: a change sent at vS+1 goes at
// the clock's version instead, above any read-modify-write +1; above vS+1 it goes as is.
func TestAMergedYAMLChangeAtVSPlusOneGoesAtTheClock(t *testing.T) {
	rw := NewMerging(DefaultPreserve, []string{"secrets"})
	st := &State{Versions: map[string]float64{"secrets": 1000}, ItemsKnown: true,
		Items: map[string][]byte{"secrets": []byte(`[{"id":"vault/ctrl","uri":"u","token":"a"}]`)}}
	for _, tc := range []struct {
		vR, want string
	}{{"1001", "5000"}, {"1002", "1002"}} {
		body := []byte("secrets_conf_version: " + tc.vR + "\nsecrets:\n  - id: vault/ctrl\n    uri: u\n    token: b\n")
		p, err := rw.PrepareYAML(body)
		if err != nil {
			t.Fatal(err)
		}
		res, err := rw.Decide(p, Input{Body: body, State: st, Now: 5000, Owned: Ownership{"secrets": {"vault/ctrl"}}})
		if err != nil {
			t.Fatal(err)
		}
		if want := "secrets_conf_version: " + tc.want + "\n"; !bytes.HasPrefix(res.Body, []byte(want)) {
			t.Errorf("vR %s: forwarded %q, want it to start %q", tc.vR, res.Body, want)
		}
		if res.SentAtATie() {
			t.Errorf("vR %s: a YAML section counted as a tie to read back", tc.vR)
		}
	}
}

// TestLostTiesAtAHigherVersionSeesDeletionsAndOrder: read back at a higher version (a
// writer came after), a deletion or a reorder of the client's own items that a writer's
// copy kept out is not on the data plane: lost, at either version.
func TestLostTiesAtAHigherVersionSeesDeletionsAndOrder(t *testing.T) {
	rw := NewMerging(DefaultPreserve, []string{"global_rules"})
	before := `[{"id":"a","plugins":{"cors":{}}},{"id":"b","plugins":{"gzip":{}}},{"id":"x","plugins":{"zipkin":{}}}]`
	for _, tc := range []struct{ name, sent, readAtHigher string }{
		{"deletion of x", `[{"id":"a","plugins":{"cors":{}}},{"id":"b","plugins":{"gzip":{}}}]`, before},
		{"reorder b,a (global_rules keep their order)", `[{"id":"b","plugins":{"gzip":{}}},{"id":"a","plugins":{"cors":{}}},{"id":"x","plugins":{"zipkin":{}}}]`, before},
	} {
		body := []byte(`{"global_rules_conf_version":1001,"global_rules":` + tc.sent + `}`)
		st := &State{Versions: map[string]float64{"global_rules": 1000}, Items: map[string][]byte{"global_rules": []byte(before)}, ItemsKnown: true}
		p, _ := rw.Prepare(body)
		res, err := rw.Decide(p, Input{Body: body, State: st, Owned: Ownership{"global_rules": {"a", "b", "x"}}})
		if err != nil || !res.SentAtATie() {
			t.Fatalf("%s: tie %v err %v", tc.name, res.SentAtATie(), err)
		}
		for _, v := range []float64{1001, 1002} {
			read := &State{Versions: map[string]float64{"global_rules": v}, Items: map[string][]byte{"global_rules": []byte(tc.readAtHigher)}, ItemsKnown: true}
			lost, _ := rw.LostTies(res, res.Body, read)
			if len(lost) == 0 {
				t.Errorf("%s read at %v: not on the data plane, taken as landed", tc.name, v)
			}
		}
	}
}
