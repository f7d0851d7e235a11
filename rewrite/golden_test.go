package rewrite

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/maphash"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/valyala/fastjson"
	"golang.org/x/tools/txtar"
)

var update = flag.Bool("update", false, "rewrite the want sections of testdata/rewrite/*.txtar")

// goldenFiles are the sections a golden case may have; any other name fails the test
// (a misspelt "want.jsn" must not silently skip a check).
var goldenFiles = map[string]bool{
	"state.json": true, "record.json": true, "request.json": true, "request.yaml": true,
	"digest": true, "preserve": true, "want.json": true, "want.yaml": true, "want.report": true,
	"merge": true, "owned.json": true,
}

// body returns a section without the one newline txtar adds.
func body(a *txtar.Archive, name string) ([]byte, bool) {
	for _, f := range a.Files {
		if f.Name == name {
			return bytes.TrimSuffix(f.Data, []byte("\n")), true
		}
	}
	return nil, false
}

// setFile replaces (or adds) a section, for -update.
func setFile(a *txtar.Archive, name string, data []byte) {
	for i, f := range a.Files {
		if f.Name == name {
			a.Files[i].Data = data
			return
		}
	}
	a.Files = append(a.Files, txtar.File{Name: name, Data: data})
}

// recordFrom builds a Record from {"section":{"version":N,"sent":N,"items":<raw>}}
// (version: what the data plane took; sent: the client's version in that body); the
// raw items bytes are hashed exactly as written, as the proxy hashes what it forwarded.
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
			case "sent": // the version the client sent (absent: a record without it)
				e.sent = sectionVersion{fastjson.MustParseBytes(raw).GetFloat64(), true}
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

// eachGolden runs check on every txtar archive of dir, as a subtest named after it.
func eachGolden(t *testing.T, dir string, check func(t *testing.T, path string, a *txtar.Archive)) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.txtar"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no golden cases in %s: %v", dir, err)
	}
	for _, path := range paths {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txtar"), func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			check(t, path, txtar.Parse(data))
		})
	}
}

// TestGolden runs every testdata/rewrite/*.txtar case: state.json (a GET body; absent
// = a fresh data plane), optional record.json, request.json, optional digest and
// preserve → want.json (the forwarded body) and want.report.
func TestGolden(t *testing.T) {
	t.Parallel()
	eachGolden(t, "../testdata/rewrite", func(t *testing.T, path string, a *txtar.Archive) {
		var err error
		for _, f := range a.Files {
			if !goldenFiles[f.Name] {
				t.Fatalf("unknown section %q in %s", f.Name, path)
			}
		}
		preserve := DefaultPreserve
		if p, ok := body(a, "preserve"); ok {
			preserve = strings.Split(strings.TrimSpace(string(p)), ",")
		}
		var merge []string
		if m, ok := body(a, "merge"); ok {
			merge = strings.Split(strings.TrimSpace(string(m)), ",")
		}
		rw := NewMerging(preserve, merge)
		st := freshState()
		if s, ok := body(a, "state.json"); ok {
			if st, err = ParseState(s); err != nil {
				t.Fatalf("state: %v", err)
			}
		}
		var rec *Record
		if r, ok := body(a, "record.json"); ok {
			rec = recordFrom(t, rw, r)
		}
		req, _ := body(a, "request.json")
		wantName, prepare := "want.json", rw.Prepare
		if _, ok := body(a, "request.yaml"); ok {
			for _, f := range a.Files {
				if f.Name == "request.yaml" {
					req, wantName, prepare = f.Data, "want.yaml", rw.PrepareYAML
				}
			}
		}
		in := Input{Body: req, State: st, Record: rec}
		if o, ok := body(a, "owned.json"); ok {
			if err := json.Unmarshal(o, &in.Owned); err != nil {
				t.Fatalf("owned.json: %v", err)
			}
		}
		if d, ok := body(a, "digest"); ok {
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
				setFile(a, wantName, append(gotBody, '\n'))
			}
			setFile(a, "want.report", []byte(gotReport))
			if err := os.WriteFile(path, txtar.Format(a), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		wantBody, _ := body(a, wantName)
		if !bytes.Equal(gotBody, wantBody) {
			t.Errorf("body:\n got %s\nwant %s", gotBody, wantBody)
		}
		if want, _ := body(a, "want.report"); gotReport != string(want)+"\n" {
			t.Errorf("report:\n got %s\nwant %s", gotReport, want)
		}
	})
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
