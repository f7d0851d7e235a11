package rewrite

import (
	"strings"
	"testing"

	"github.com/confshim/confshim/internal/sections"
)

// TestPlanHoldsToAFixedPoint: a rejected item with an accepted copy is backfilled, one
// without is left out, and every item that refers to one left out — also through a
// chain — is held back with it; nothing else moves.
func TestPlanHoldsToAFixedPoint(t *testing.T) {
	t.Parallel()
	body := `{"routes_conf_version":2,"routes":[{"id":"r1","service_id":"s-new"},{"id":"r2","uri":"/ok"},{"id":"r3","plugins":{"nope":{}}}],` +
		`"services_conf_version":2,"services":[{"id":"s-new","upstream_id":"u-bad"},{"id":"s-old"}],` +
		`"upstreams_conf_version":2,"upstreams":[{"id":"u-bad","nodes":"x"}]}`
	p, err := New(nil).Prepare([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	accepted := NewAccepted(map[string][]byte{"routes": []byte(`[{"id":"r3","uri":"/accepted"}]`)})
	plan := NewPlan(p)
	held := plan.Hold([]Rejection{{Section: "upstreams", Index: 0, Error: "bad nodes"}, {Section: "routes", Index: 2, Error: "unknown plugin"}, {Section: "routes", Index: 9}}, accepted)
	var got []string
	for _, h := range held {
		word := "left_out"
		if h.Backfilled {
			word = "backfilled"
		}
		got = append(got, h.Section+"/"+h.ID+"="+word)
	}
	want := "upstreams/u-bad=left_out routes/r3=backfilled services/s-new=left_out routes/r1=left_out"
	if strings.Join(got, " ") != want {
		t.Fatalf("held %v\nwant %s", got, want)
	}
	out, err := plan.Apply()
	if err != nil {
		t.Fatal(err)
	}
	wantBody := `{"routes_conf_version":2,"routes":[{"id":"r2","uri":"/ok"},{"id":"r3","uri":"/accepted"}],` +
		`"services_conf_version":2,"services":[{"id":"s-old"}],"upstreams_conf_version":2,"upstreams":[]}`
	if string(out) != wantBody {
		t.Fatalf("corrected\n got %s\nwant %s", out, wantBody)
	}
	// APISIX counts in the corrected body: its index 1 of routes is the body's 2
	if i := plan.OriginalIndex("routes", 1); i != 2 {
		t.Fatalf("OriginalIndex(routes, 1) = %d, want 2", i)
	}
	if i := plan.IndexOf("services", "s-old"); i != 1 {
		t.Fatalf("IndexOf(services, s-old) = %d, want 1", i)
	}
	// a second step starts afresh on the same body: nothing held yet
	if again := plan.Fresh(); again.Splice.Held("routes", 0) || len(again.Items("routes")) != 3 {
		t.Fatal("a fresh plan must share the splits and hold nothing")
	}
}

// TestReferencesReadTopLevelMembersOnly: a reference is a top-level field; one nested
// in an object is not, an escaped key counts as lua-cjson reads it, the last of a
// repeated field wins.
func TestReferencesReadTopLevelMembersOnly(t *testing.T) {
	t.Parallel()
	refs := references(sections.APISIX(), []byte(`{"labels":{"service_id":"x"},"service_\u0069d":"s1","upstream_id":"u1","upstream_id":"u2","group_id":null}`))
	if len(refs) != 2 || refs[0] != (reference{"services", "s1"}) || refs[1] != (reference{"upstreams", "u2"}) {
		t.Fatalf("references %+v", refs)
	}
}

// TestReapplyNeedsTheSameClientBytes: a correction made before is applied again only to
// the very client bytes it was made for; any other byte of a held section means split
// and match again.
func TestReapplyNeedsTheSameClientBytes(t *testing.T) {
	t.Parallel()
	rw := New(nil)
	body := `{"routes_conf_version":2,"routes":[{"id":"r1","plugins":{"nope":{}}},{"id":"r2"}]}`
	p, err := rw.Prepare([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	sum, _ := p.SectionSum("routes")
	c := map[string]sectionCorrection{"routes": {ClientSum: sum, Items: []byte(`[{"id":"r1","uri":"/accepted"},{"id":"r2"}]`)}}
	out, ok := p.Reapply(c)
	if want := `{"routes_conf_version":2,"routes":[{"id":"r1","uri":"/accepted"},{"id":"r2"}]}`; !ok || string(out) != want {
		t.Fatalf("reapplied %s (%v), want %s", out, ok, want)
	}
	changed, _ := rw.Prepare([]byte(strings.Replace(body, `"r2"`, `"r3"`, 1)))
	if _, ok := changed.Reapply(c); ok {
		t.Fatal("a correction was applied to other client bytes")
	}
	if _, ok := p.Reapply(nil); ok {
		t.Fatal("nothing to reapply is no correction")
	}
}
