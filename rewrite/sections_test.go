package rewrite

import (
	"slices"
	"strings"
	"testing"

	"github.com/confshim/confshim/internal/sections"
)

// TestASectionIsOneTableEntry: a section APISIX grows is one entry in the table of
// sections; this test builds a table with "widgets" (order-free, referred to by
// widget_id) and finds it in every place a Rewriter knows sections from — the sections
// decided, the order-free comparison, the references a fallback follows. (The metrics'
// labels are APISIX's table's: metrics' TestSectionLabelsAreTheTables.)
func TestASectionIsOneTableEntry(t *testing.T) {
	t.Parallel()
	table := append(sections.APISIX(), sections.Section{Name: "widgets", OrderFree: true, ReferencedBy: "widget_id"})
	if sections.APISIX().Known("widgets") {
		t.Fatal("appending to APISIX's table changed it")
	}
	if !orderFree(table, "widgets") {
		t.Fatal("widgets are not order-free")
	}
	refs := references(table, []byte(`{"id":"r1","widget_id":"w1","service_id":"s1"}`))
	if len(refs) != 2 || !slices.Contains(refs, reference{Section: "widgets", ID: "w1"}) {
		t.Fatalf("references %v", refs)
	}
	// the same widgets in another order are equal: raised, not bumped
	st, err := ParseState([]byte(`{"widgets_conf_version":5,"widgets":[{"id":"a","v":1},{"id":"b","v":2}]}`))
	if err != nil {
		t.Fatal(err)
	}
	res, err := newWithTable(table, nil).Rewrite(Input{Body: []byte(`{"widgets_conf_version":3,"widgets":[{"id":"b","v":2},{"id":"a","v":1}]}`), State: st, Digest: "d", HasDigest: true})
	if err != nil || res.Actions() != "widgets=raised" {
		t.Fatalf("reordered widgets: %q %v", res.Actions(), err)
	}
	// a section known from the table is decided even when neither side names it
	res, err = newWithTable(table, []string{"widgets"}).Rewrite(Input{Body: []byte(`{"routes_conf_version":1}`), State: st, Digest: "d", HasDigest: true})
	if err != nil || !strings.Contains(res.Actions(), "widgets=preserved") {
		t.Fatalf("a preserved widgets section: %q %v", res.Actions(), err)
	}
}
