package rewrite

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/confshim/confshim/internal/testsupport/fixture"
)

// arrive feeds body to a BodyScan in pieces of the given sizes (cycled), each prefix
// in a fresh array as a growing buffer would give it, then prepares it.
func arrive(rw *Rewriter, body []byte, pieces []int, splitAbove, fed int) (*Prepared, error) {
	bs := rw.NewBodyScan()
	bs.splitAbove = splitAbove
	for n, k := 0, 0; n < fed; k++ {
		n = min(fed, n+max(pieces[k%len(pieces)], 1))
		bs.Feed(slices.Clone(body[:n]))
	}
	return rw.PrepareArrived(body, bs, nil)
}

// samePrepared: an arriving scan is exactly Prepare, members, sums and errors alike.
func samePrepared(t *testing.T, rw *Rewriter, body []byte, pieces []int) {
	t.Helper()
	samePreparedSplit(t, rw, body, pieces, splitAbove, len(body))
	// the scan behind the bytes (loopback): most is left at Finish, split between two
	// scanners wherever the body looks like it allows
	samePreparedSplit(t, rw, body, pieces, 0, len(body)/3)
	samePreparedSplit(t, rw, body, pieces, 0, 0)
}

func samePreparedSplit(t *testing.T, rw *Rewriter, body []byte, pieces []int, split, fed int) {
	t.Helper()
	want, werr := rw.Prepare(body)
	got, gerr := arrive(rw, body, pieces, split, fed)
	if fmt.Sprint(werr) != fmt.Sprint(gerr) {
		t.Fatalf("pieces %v: error %v, Prepare says %v", pieces, gerr, werr)
	}
	if werr != nil {
		return
	}
	if got.obj.close != want.obj.close || !slices.Equal(got.sums, want.sums) || len(got.obj.members) != len(want.obj.members) {
		t.Fatalf("pieces %v: close %d sums %v members %d, want %d %v %d", pieces, got.obj.close, got.sums, len(got.obj.members), want.obj.close, want.sums, len(want.obj.members))
	}
	for i, m := range got.obj.members {
		w := want.obj.members[i]
		if string(m.key) != string(w.key) || m.name != w.name || m.start != w.start || m.valueStart != w.valueStart || m.valueEnd != w.valueEnd {
			t.Fatalf("pieces %v: member %d %+v, want %+v", pieces, i, m, w)
		}
		if len(m.key) > 0 && &m.key[0] != &body[m.start+1] {
			t.Fatalf("member %q keeps an earlier prefix's bytes", m.key)
		}
	}
}

func TestArrivingScanIsPrepare(t *testing.T) {
	t.Parallel()
	rw := New(DefaultPreserve)
	bodies := map[string]string{
		"sections":  `{"routes_conf_version":3,"routes":[{"id":"r1","uri":"/a","plugins":{"x":{"a":[1,2.5e3,true,null]}}},{"id":"r\u00e9"}],"secrets":[]}`,
		"spaces":    " \n {\t\"a\" : [ 1 , {\"b\":\"c\\\"}\"} ] , \"k\\u0041\" : -0.5E+2 }  \n",
		"empty":     `{}`,
		"not json":  `{"routes":[{"id":"r1"},]}`,
		"cut":       `{"routes":[{"id":"r1"}`,
		"trailing":  `{"a":1} x`,
		"array":     `[1,2,3]`,
		"repeated":  `{"a":1,"a":2}`,
		"ws only":   "   ",
		"bad later": `{"routes":[{"id":"r1"},{"id":"r2","uri":tru}]}`,
		"split ok":  `{"a":1,"routes":[{"id":"r1"},{"id":"r2"},{"id":"r3"},{"id":"r4"}],"b":[2]}`,
		"split bad": `{"routes":[{"id":"r1"},{"id":"r2"},{"id":"r3"},{"id":"r4",x}]}`,
		"no item":   `{"routes":[{"p":[{"a":1},{"b":2},{"c":3},{"d":4}]}],"s":"},{\"x"}`,
		"in string": `{"a":"xxxxxxxxxxxxxxxxxxxxxxxxxx},{\"y\":1}"}`,
	}
	for name, body := range bodies {
		for _, pieces := range [][]int{{1}, {2, 3}, {7}, {64}, {len(body)}} {
			t.Run(fmt.Sprintf("%s/%v", name, pieces), func(t *testing.T) { samePrepared(t, rw, []byte(body), pieces) })
		}
	}
	big := fixture.Stale(100).Request
	for _, pieces := range [][]int{{1 << 10}, {1500, 64 << 10, 3}, {32 << 10}} {
		samePrepared(t, rw, big, pieces)
	}
}

// The work of an arriving scan stays linear however the body is cut: one string of a
// megabyte arriving a byte at a time is scanned again only each time it doubled.
func TestArrivingScanIsLinear(t *testing.T) {
	t.Parallel()
	body := []byte(`{"a":"` + string(make([]byte, 1<<20)) + `"}`)
	for i := 6; i < len(body)-2; i++ {
		body[i] = 'x'
	}
	rw := New(nil)
	bs := rw.NewBodyScan()
	tries := 0
	for n := 1; n <= len(body); n++ {
		if n >= bs.retryAt {
			tries++
		}
		bs.Feed(body[:n])
	}
	if tries > 64 {
		t.Fatalf("%d scans of a %d-byte body fed a byte at a time: not linear", tries, len(body))
	}
	if _, err := rw.PrepareArrived(body, bs, nil); err != nil {
		t.Fatal(err)
	}
}

// FuzzArrivingScan: any body, cut anywhere, is prepared exactly as Prepare prepares it.
func FuzzArrivingScan(f *testing.F) {
	seedCorpus(f, func(b []byte) { f.Add(b, uint64(1)) })
	rw := New(DefaultPreserve)
	f.Fuzz(func(t *testing.T, body []byte, seed uint64) {
		r := rand.New(rand.NewPCG(seed, seed>>7))
		pieces := []int{1 + r.IntN(16), 1 + r.IntN(256), 1 + r.IntN(4)}
		samePrepared(t, rw, body, pieces)
	})
}
