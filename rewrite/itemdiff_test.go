package rewrite

import (
	"fmt"
	"strings"
	"testing"
)

func TestDiffItems(t *testing.T) {
	t.Parallel()
	rw := New(nil)
	for _, tc := range []struct {
		name, section, before, after string
		added, changed, removed      string
	}{
		{"add, change, remove", "routes",
			`[{"id":"r2","uri":"/b"},{"id":"r3","uri":"/c"}]`,
			`[{"id":"r1","uri":"/a"},{"id":"r2","uri":"/B"}]`, "[r1]", "[r2]", "[r3]"},
		{"a re-stamped modifiedIndex is not a change", "routes",
			`[{"id":"r1","uri":"/a","modifiedIndex":1}]`, `[{"id":"r1","modifiedIndex":2,"uri":"/a"}]`, "[]", "[]", "[]"},
		{"order is not a change", "upstreams",
			`[{"id":"u1","type":"roundrobin"},{"id":"u2","type":"chash"}]`, `[{"id":"u2","type":"chash"},{"id":"u1","type":"roundrobin"}]`, "[]", "[]", "[]"},
		{"consumers by username", "consumers", `[{"username":"jack"}]`, `[{"username":"john"}]`, "[john]", "[]", "[jack]"},
		{"from nothing", "routes", ``, `[{"id":"r1"}]`, "[r1]", "[]", "[]"},
		{"an object read back for an empty section", "routes", `{}`, `[]`, "[]", "[]", "[]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := rw.DiffItems(tc.section, []byte(tc.before), []byte(tc.after))
			got := fmt.Sprint(d.Added.IDs, d.Changed.IDs, d.Removed.IDs)
			if want := tc.added + " " + tc.changed + " " + tc.removed; got != want {
				t.Fatalf("added changed removed %s, want %s", got, want)
			}
		})
	}
}

// TestDiffItemsBounded: 10,000 changed routes list 20 ids each and count them all; a
// long id is cut at 64 bytes.
func TestDiffItemsBounded(t *testing.T) {
	t.Parallel()
	var before, after strings.Builder
	before.WriteByte('[')
	after.WriteByte('[')
	for i := range 10000 {
		if i > 0 {
			before.WriteByte(',')
			after.WriteByte(',')
		}
		fmt.Fprintf(&before, `{"id":"r%d","uri":"/old"}`, i)
		fmt.Fprintf(&after, `{"id":"r%d","uri":"/new"}`, i)
	}
	long := strings.Repeat("x", 300)
	fmt.Fprintf(&after, `,{"id":"%s"}]`, long)
	before.WriteByte(']')
	d := New(nil).DiffItems("routes", []byte(before.String()), []byte(after.String()))
	if d.Changed.Count != 10000 || len(d.Changed.IDs) != maxListedIDs || d.Added.Count != 1 || d.Removed.Count != 0 {
		t.Fatalf("changed %d (%d listed), added %d, removed %d", d.Changed.Count, len(d.Changed.IDs), d.Added.Count, d.Removed.Count)
	}
	if got := d.Added.IDs[0]; len(got) > 64+len("…") || !strings.HasPrefix(got, "xxxx") {
		t.Fatalf("a long id listed as %q", got)
	}
}
