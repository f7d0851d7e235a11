package rewrite

import (
	"testing"

	"github.com/confshim/confshim/integration/fixture"
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

// BenchmarkRewrite is the steady state: three stale sections raised and secrets preserved.
func BenchmarkRewrite(b *testing.B) {
	for _, size := range fixture.Sizes {
		p := fixture.Stale(size.Routes)
		b.Run(size.Name, func(b *testing.B) { runRewrite(b, steady(b, p, true), true) })
	}
}

// BenchmarkRewriteCold has no record: the stale sections are compared with the data
// plane's items.
func BenchmarkRewriteCold(b *testing.B) {
	for _, size := range fixture.Sizes {
		p := fixture.Stale(size.Routes)
		b.Run(size.Name, func(b *testing.B) { runRewrite(b, steady(b, p, false), true) })
	}
}

// BenchmarkRewriteClean has nothing to repair.
func BenchmarkRewriteClean(b *testing.B) {
	for _, size := range fixture.Sizes {
		p := fixture.Clean(size.Routes)
		b.Run(size.Name, func(b *testing.B) { runRewrite(b, steady(b, p, true), false) })
	}
}

// BenchmarkValidate is the floor: fastjson.ValidateBytes of the same body.
func BenchmarkValidate(b *testing.B) {
	for _, size := range fixture.Sizes {
		p := fixture.Stale(size.Routes)
		b.Run(size.Name, func(b *testing.B) {
			b.SetBytes(int64(len(p.Request)))
			b.ReportAllocs()
			for b.Loop() {
				if err := fastjson.ValidateBytes(p.Request); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkScan is the validating top-level scanner alone, to compare with Validate.
func BenchmarkScan(b *testing.B) {
	for _, size := range fixture.Sizes {
		p := fixture.Stale(size.Routes)
		b.Run(size.Name, func(b *testing.B) {
			b.SetBytes(int64(len(p.Request)))
			b.ReportAllocs()
			var buf [48]member
			for b.Loop() {
				if _, err := scanObject(p.Request, buf[:0]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
