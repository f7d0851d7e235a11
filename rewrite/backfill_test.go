package rewrite

import (
	"strconv"
	"strings"
	"testing"

	"github.com/valyala/fastjson"
	"golang.org/x/tools/txtar"

	"github.com/confshim/confshim/internal/sections"
)

// FuzzBackfill: holding any item of any body back leaves valid JSON with one item
// fewer in that section, and every other member as it was.
func FuzzBackfill(f *testing.F) {
	f.Add([]byte(`{"routes":[{"id":"r1"},{"id":"r2","desc":"],\"["}],"x":1}`), uint8(1))
	f.Add([]byte(`{"routes":[ 1 , "a,b" , [2,[3]] ],"routes_conf_version":2}`), uint8(2))
	f.Fuzz(func(t *testing.T, body []byte, index uint8) {
		prepared, err := New(nil).Prepare(body)
		if err != nil || fastjson.ValidateBytes(body) != nil {
			return
		}
		raw, _ := prepared.JSONItems("routes")
		items, err := splitItems("routes", raw)
		if err != nil || len(items) == 0 {
			return
		}
		i := int(index) % len(items)
		var splice itemSplice
		splice.Hold("routes", i, nil)
		got, err := splice.Apply(body)
		if err != nil {
			t.Fatal(err)
		}
		if err := fastjson.ValidateBytes(got); err != nil {
			t.Fatalf("%s → %s: %v", body, got, err)
		}
		after, err := New(nil).Prepare(got)
		if err != nil {
			t.Fatal(err)
		}
		raw2, _ := after.JSONItems("routes")
		items2, _ := splitItems("routes", raw2)
		if len(items2) != len(items)-1 {
			t.Fatalf("%d items, then %d", len(items), len(items2))
		}
		var want []string
		for j, it := range items {
			if j != i {
				want = append(want, string(it.Raw))
			}
		}
		for j, it := range items2 {
			if string(it.Raw) != want[j] {
				t.Fatalf("item %d changed: %s, want %s", j, it.Raw, want[j])
			}
		}
	})
}

func TestReferences(t *testing.T) {
	t.Parallel()
	refs := references(sections.APISIX(), []byte(`{"id":"r1","service_id":"s1","upstream_id":7,"plugin_config_id":"","labels":{"service_id":"x"}}`))
	if len(refs) != 2 || refs[0] != (reference{"services", "s1"}) || refs[1] != (reference{"upstreams", "7"}) {
		t.Fatalf("%v", refs)
	}
}

// TestBackfillGolden runs testdata/backfill: a body, the holds (section, index, the
// replacement or "-" to leave it out) and versions to set, and the corrected body.
func TestBackfillGolden(t *testing.T) {
	t.Parallel()
	eachGolden(t, "../testdata/backfill", func(t *testing.T, _ string, a *txtar.Archive) {
		var splice itemSplice
		b, _ := body(a, "body.json")
		if holds, ok := body(a, "holds"); ok {
			for _, line := range strings.Split(string(holds), "\n") {
				section, rest, _ := strings.Cut(line, " ")
				index, with, _ := strings.Cut(rest, " ")
				i, err := strconv.Atoi(index)
				if err != nil {
					t.Fatalf("holds line %q", line)
				}
				if with == "-" {
					splice.Hold(section, i, nil)
				} else {
					splice.Hold(section, i, []byte(with))
				}
			}
		}
		if versions, ok := body(a, "versions"); ok {
			splice.Versions = map[string]float64{}
			for _, line := range strings.Split(string(versions), "\n") {
				section, v, _ := strings.Cut(line, " ")
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					t.Fatalf("versions line %q", line)
				}
				splice.Versions[section] = f
			}
		}
		got, err := splice.Apply(b)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := body(a, "want.json")
		if string(got) != string(want) {
			t.Fatalf("got  %s\nwant %s", got, want)
		}
		if err := fastjson.ValidateBytes(got); err != nil {
			t.Fatalf("not JSON: %v", err)
		}
	})
}

// TestItemSectionsAreUnclipped: the fallback decides with full section names (Sections
// clips them for reports).
func TestItemSectionsAreUnclipped(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("s", 80)
	p, err := New(nil).Prepare([]byte(`{"` + long + `":[{"id":"a"}],"` + long + `_conf_version":1,"routes_conf_version":2}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := p.ItemSections(); len(got) != 1 || got[0] != long {
		t.Fatalf("%v", got)
	}
	if raw, _ := p.JSONItems(p.ItemSections()[0]); string(raw) != `[{"id":"a"}]` {
		t.Fatalf("%s", raw)
	}
}
