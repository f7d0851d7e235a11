package rewrite

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"hash/maphash"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/valyala/fastjson"
)

var update = flag.Bool("update", false, "rewrite the want sections of testdata/rewrite/*.txtar")

// archive is a txtar file: a comment, then "-- name --" sections.
type archive struct {
	comment string
	files   map[string][]byte
	order   []string
}

func parseArchive(data []byte) archive {
	a := archive{files: map[string][]byte{}}
	var name string
	var cur []byte
	flush := func() {
		if name != "" {
			a.files[name] = cur
			a.order = append(a.order, name)
		} else {
			a.comment = string(cur)
		}
	}
	for _, line := range strings.SplitAfter(string(data), "\n") {
		if strings.HasPrefix(line, "-- ") && strings.HasSuffix(strings.TrimRight(line, "\n"), " --") {
			flush()
			name, cur = strings.TrimSuffix(strings.TrimPrefix(strings.TrimRight(line, "\n"), "-- "), " --"), nil
			continue
		}
		cur = append(cur, line...)
	}
	flush()
	return a
}

func (a archive) format() []byte {
	var b bytes.Buffer
	b.WriteString(a.comment)
	for _, n := range a.order {
		fmt.Fprintf(&b, "-- %s --\n", n)
		b.Write(a.files[n])
		if len(a.files[n]) > 0 && !bytes.HasSuffix(a.files[n], []byte("\n")) {
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

func (a *archive) set(name string, data []byte) {
	if _, ok := a.files[name]; !ok {
		a.order = append(a.order, name)
	}
	a.files[name] = data
}

// body returns a section without the one newline txtar adds.
func (a archive) body(name string) ([]byte, bool) {
	b, ok := a.files[name]
	return bytes.TrimSuffix(b, []byte("\n")), ok
}

// recordFrom builds a Record from {"section":{"version":N,"items":<raw>}}; the raw
// items bytes are hashed exactly as written, as the proxy hashes what it forwarded.
func recordFrom(t *testing.T, rw *Rewriter, data []byte) *Record {
	t.Helper()
	obj, err := scanObject(data, nil)
	if err != nil {
		t.Fatalf("record: %v", err)
	}
	rec := &Record{entries: map[string]recordEntry{}}
	for _, m := range obj.members {
		entry := data[m.valueStart:m.valueEnd]
		inner, err := scanObject(entry, nil)
		if err != nil {
			t.Fatalf("record %s: %v", m.key, err)
		}
		var e recordEntry
		for _, f := range inner.members {
			raw := entry[f.valueStart:f.valueEnd]
			switch string(f.key) {
			case "version":
				e.version = fastjson.MustParseBytes(raw).GetFloat64()
			case "items":
				e.sum = maphash.Bytes(rw.seed, raw)
			}
		}
		rec.entries[string(m.key)] = e
	}
	return rec
}

func report(res *Result, err error) string {
	var b strings.Builder
	var skip *SkipError
	var refuse *RefuseError
	switch {
	case errors.As(err, &skip):
		fmt.Fprintf(&b, "forward untouched: %s\n", skip.Reason)
		return b.String()
	case errors.As(err, &refuse):
		fmt.Fprintf(&b, "refuse: %s\n", refuse.Reason)
		return b.String()
	case err != nil:
		fmt.Fprintf(&b, "error: %v\n", err)
		return b.String()
	}
	for _, c := range res.Changes {
		from := "absent"
		if !c.FromAbsent {
			from = formatVersion(c.From)
		}
		fmt.Fprintf(&b, "%s %s %s -> %s", c.Section, c.Action, from, formatVersion(c.To))
		if c.Dropped {
			b.WriteString(" dropped")
		}
		b.WriteByte('\n')
	}
	if len(res.Thinned) > 0 {
		fmt.Fprintf(&b, "thinned: %s (%d bytes)\n", strings.Join(res.Thinned, ","), res.ThinnedBytes)
	}
	fmt.Fprintf(&b, "changed: %v\nnoop: %v\nactions: %s\ndigest: %s\n", res.Changed, res.NoOp, res.Actions(), res.Digest)
	return b.String()
}

// TestGolden runs every testdata/rewrite/*.txtar case: state.json (a GET body; absent
// = a fresh data plane), optional record.json, request.json, optional digest and
// preserve → want.json (the forwarded body) and want.report.
func TestGolden(t *testing.T) {
	paths, err := filepath.Glob("../testdata/rewrite/*.txtar")
	if err != nil || len(paths) == 0 {
		t.Fatalf("no golden cases: %v", err)
	}
	for _, path := range paths {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txtar"), func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			a := parseArchive(data)
			preserve := DefaultPreserve
			if p, ok := a.body("preserve"); ok {
				preserve = strings.Split(strings.TrimSpace(string(p)), ",")
			}
			rw := New(preserve)
			st := freshState()
			if s, ok := a.body("state.json"); ok {
				if st, err = ParseState(s); err != nil {
					t.Fatalf("state: %v", err)
				}
			}
			var rec *Record
			if r, ok := a.body("record.json"); ok {
				rec = recordFrom(t, rw, r)
			}
			req, _ := a.body("request.json")
			wantName, prepare := "want.json", rw.Prepare
			if y, ok := a.files["request.yaml"]; ok {
				req, wantName, prepare = y, "want.yaml", rw.PrepareYAML
			}
			in := Input{Body: req, State: st, Record: rec}
			if d, ok := a.body("digest"); ok {
				in.Digest, in.HasDigest = string(d), true
			}
			var res *Result
			p, err := prepare(req)
			if err == nil {
				res, err = rw.Decide(p, in)
			}
			gotReport := report(res, err)
			var gotBody []byte
			if err == nil {
				gotBody = res.Body
				if wantName == "want.json" {
					if verr := fastjson.ValidateBytes(gotBody); verr != nil {
						t.Fatalf("output is not valid JSON: %v", verr)
					}
				} else if _, yerr := rw.PrepareYAML(gotBody); yerr != nil {
					t.Fatalf("output YAML does not scan again: %v", yerr)
				}
				if !res.Changed && !bytes.Equal(gotBody, req) {
					t.Fatal("an unchanged result must forward the request's own bytes")
				}
			}
			if *update {
				if gotBody != nil {
					a.set(wantName, append(gotBody, '\n'))
				}
				a.set("want.report", []byte(gotReport))
				if err := os.WriteFile(path, a.format(), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			wantBody, _ := a.body(wantName)
			if !bytes.Equal(gotBody, wantBody) {
				t.Errorf("body:\n got %s\nwant %s", gotBody, wantBody)
			}
			if want := string(a.files["want.report"]); gotReport != want {
				t.Errorf("report:\n got %s\nwant %s", gotReport, want)
			}
		})
	}
}

// freshState is what a never-written APISIX 3.14+ reports: 13 versions at 0.
func freshState() *State {
	st := &State{Versions: map[string]float64{}, Items: map[string][]byte{}, ItemsKnown: true}
	for _, s := range KnownSections {
		st.Versions[s] = 0
	}
	return st
}

func formatVersion(v float64) string { return string(appendVersion(nil, v)) }
