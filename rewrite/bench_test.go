package rewrite

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/confshim/confshim/internal/testsupport/fixture"
	"github.com/valyala/fastjson"
)

type benchCase struct {
	in  Input
	rw  *Rewriter
	len int
}

// steady builds the input as it is on every sync after the first: confshim's record
// of its last write describes the data plane.
func steady(b *testing.B, p fixture.Pair, withRecord bool) benchCase {
	b.Helper()
	st, err := ParseState(p.State)
	if err != nil {
		b.Fatal(err)
	}
	rw := New(DefaultPreserve)
	in := Input{Body: p.Request, Digest: "0123456789abcdef0123456789abcdef01234567", HasDigest: true, State: st}
	if withRecord {
		res, err := rw.Rewrite(in)
		if err != nil {
			b.Fatal(err)
		}
		in.Record = res.Commit(true)
	}
	return benchCase{in: in, rw: rw, len: len(p.Request)}
}

func runRewrite(b *testing.B, c benchCase, wantChanged bool) {
	b.SetBytes(int64(c.len))
	b.ReportAllocs()
	in := c.in
	for b.Loop() {
		res, err := c.rw.Rewrite(in)
		if err != nil || res.Changed != wantChanged {
			b.Fatalf("err %v changed %v", err, res != nil && res.Changed)
		}
		if res.Changed {
			in.Buf = res.Body[:0] // the proxy pools its buffers the same way
		}
	}
}

// benchSizes runs the rewrite on every fixture size, with or without a record.
func benchSizes(b *testing.B, pair func(routes int) fixture.Pair, withRecord bool) {
	for _, size := range fixture.Sizes {
		p := pair(size.Routes)
		b.Run(size.Name, func(b *testing.B) { runRewrite(b, steady(b, p, withRecord), true) })
	}
}

// BenchmarkRewrite is the steady state: three stale sections raised and secrets preserved.
func BenchmarkRewrite(b *testing.B) { benchSizes(b, fixture.Stale, true) }

// BenchmarkRewriteCold has no record: the stale sections are compared with the data
// plane's items.
func BenchmarkRewriteCold(b *testing.B) { benchSizes(b, fixture.Stale, false) }

// BenchmarkRewriteClean has nothing to repair: every section is at the data plane's
// version, so each is sent without its items (§8.3) and the sync is a no-op (§8.2).
func BenchmarkRewriteClean(b *testing.B) { benchSizes(b, fixture.Clean, true) }

// benchBody runs op on the stale fixture's request of every size.
func benchBody(b *testing.B, op func(body []byte) error) {
	for _, size := range fixture.Sizes {
		body := fixture.Stale(size.Routes).Request
		b.Run(size.Name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if err := op(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkValidate is the floor: fastjson.ValidateBytes of the same body.
func BenchmarkValidate(b *testing.B) { benchBody(b, fastjson.ValidateBytes) }

// BenchmarkScan is the validating top-level scanner alone, to compare with Validate.
func BenchmarkScan(b *testing.B) {
	var buf [48]member
	benchBody(b, func(body []byte) error {
		_, err := scanObject(body, buf[:0])
		return err
	})
}

// BenchmarkOneRouteIDs is issue 33's price: a one-route change on the 10k fixture,
// decided (the steady state's record), then with the sync's id lists — the changed
// section compared with the data plane's copy item by item. ids/decide is the ratio.
func BenchmarkOneRouteIDs(b *testing.B) {
	p := fixture.Stale(10000)
	p.Request = bytes.Replace(p.Request, []byte(`"uris":["/app-5000",`), []byte(`"uris":["/app-5000-moved",`), 1)
	c := steady(b, p, true)
	st := c.in.State
	b.Run("decide", func(b *testing.B) { runRewrite(b, c, true) })
	b.Run("decide+ids", func(b *testing.B) {
		b.SetBytes(int64(c.len))
		b.ReportAllocs()
		in := c.in
		prepared, err := c.rw.Prepare(in.Body) // the proxy has it: the client's body, scanned once
		if err != nil {
			b.Fatal(err)
		}
		items, _ := prepared.JSONItems("routes")
		for b.Loop() {
			res, err := c.rw.Rewrite(in)
			if err != nil {
				b.Fatal(err)
			}
			in.Buf = res.Body[:0]
			if d := c.rw.DiffItems("routes", st.Items["routes"], items); d.Changed.Count != 1 {
				b.Fatalf("changed %d routes, want 1", d.Changed.Count)
			}
		}
	})
}

// manyRoutes is n routes r000000… with uri, and their ids.
func manyRoutes(n int, uri string) (string, []string) {
	var b strings.Builder
	ids := make([]string, n)
	b.WriteString("[")
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		ids[i] = fmt.Sprintf("r%06d", i)
		fmt.Fprintf(&b, `{"id":%q,"uris":[%q]}`, ids[i], uri)
	}
	b.WriteString("]")
	return b.String(), ids
}

// BenchmarkLostTies reads back a 20,000-route merged section at a higher version (the
// client's items looked for one by one): linear in the section.
func BenchmarkLostTies(b *testing.B) {
	rw := NewMerging(DefaultPreserve, []string{"routes"})
	before, ids := manyRoutes(20000, "/a")
	after, _ := manyRoutes(20000, "/b")
	body := []byte(`{"routes_conf_version":1001,"routes":` + after + `}`)
	st := &State{Versions: map[string]float64{"routes": 1000}, Items: map[string][]byte{"routes": []byte(before)}, ItemsKnown: true}
	p, err := rw.Prepare(body)
	if err != nil {
		b.Fatal(err)
	}
	res, err := rw.Decide(p, Input{Body: body, State: st, Owned: Ownership{"routes": ids}})
	if err != nil || !res.SentAtATie() {
		b.Fatalf("tie %v err %v", res.SentAtATie(), err)
	}
	read := &State{Versions: map[string]float64{"routes": 1002}, Items: map[string][]byte{"routes": []byte(after)}, ItemsKnown: true}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if lost, _ := rw.LostTies(res, res.Body, read); len(lost) != 0 {
			b.Fatal("lost")
		}
	}
}
