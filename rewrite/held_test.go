package rewrite

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/tools/txtar"
)

// TestHeldGolden runs testdata/fallback: §8.5's pure choices about held items (held.go),
// one choice a case, named by its "op" section:
//
//   - still-rejected: body.json, the known held items (known: "section id server kind
//     item", kind what-it-is or state), the data plane's server and what this sync
//     learnt by validating alone (recheck: "section id pass|fail") → want: one line an
//     item, "hold|check section index id";
//   - reuse-correction: the correction made before a PUT (CorrectionOf: first.json, the
//     client's body then; corrected.json, what went; held: "section id backfilled|left-out";
//     correction-server), then body.json on server with the known held items → want:
//     the correction's sections, and the body reapplied or "not reused";
//   - copies-to-check: body.json, rejections ("section index"), accepted.json (the
//     accepted items by section) and refused ("section id") → want: "section id copy";
//   - merge-held: held and more → want: the merged list;
//   - correction-hash: held → want: the hash.
//
// go test -run TestHeldGolden ./rewrite/ -update writes the want sections anew.
func TestHeldGolden(t *testing.T) {
	eachGolden(t, "../testdata/fallback", func(t *testing.T, path string, a *txtar.Archive) {
		for _, f := range a.Files {
			if !heldGoldenFiles[f.Name] {
				t.Fatalf("unknown section %q in %s", f.Name, path)
			}
		}
		op, _ := body(a, "op")
		rw := New(nil)
		var got string
		switch string(op) {
		case "still-rejected":
			got = stillRejectedGolden(t, rw, a)
		case "reuse-correction":
			got = reuseCorrectionGolden(t, rw, a)
		case "copies-to-check":
			got = copiesToCheckGolden(t, rw, a)
		case "merge-held":
			got = heldLines(MergeHeld(heldItems(t, a, "held"), heldItems(t, a, "more")))
		case "correction-hash":
			got = CorrectionHash(heldItems(t, a, "held")) + "\n"
		default:
			t.Fatalf("unknown op %q", op)
		}
		if *update {
			setFile(a, "want", []byte(got))
			if err := os.WriteFile(path, txtar.Format(a), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		if want, _ := body(a, "want"); got != string(want)+"\n" {
			t.Errorf("got:\n%s\nwant:\n%s", got, want)
		}
	})
}

var heldGoldenFiles = map[string]bool{
	"op": true, "body.json": true, "known": true, "server": true, "recheck": true, "first.json": true,
	"corrected.json": true, "held": true, "more": true, "correction-server": true, "rejections": true,
	"accepted.json": true, "refused": true, "want": true,
}

// lines are a section's non-empty lines.
func lines(a *txtar.Archive, name string) []string {
	raw, _ := body(a, name)
	var out []string
	for _, l := range strings.Split(string(raw), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

func prepared(t *testing.T, rw *Rewriter, a *txtar.Archive, name string) *Prepared {
	t.Helper()
	raw, ok := body(a, name)
	if !ok {
		t.Fatalf("no %s", name)
	}
	p, err := rw.Prepare(raw)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return p
}

// knownItems reads "section id server kind item" lines as held items, keyed by HeldKey.
func knownItems(t *testing.T, rw *Rewriter, a *txtar.Archive) map[string]HeldItem {
	t.Helper()
	out := map[string]HeldItem{}
	for _, l := range lines(a, "known") {
		f := strings.SplitN(l, " ", 5)
		if len(f) != 5 || (f[3] != "what-it-is" && f[3] != "state") {
			t.Fatalf("known line %q", l)
		}
		h := HeldItem{Section: f[0], ID: f[1], Server: f[2], DependsOnState: f[3] == "state", Raw: []byte(f[4]),
			Sum: rw.ItemFingerprint([]byte(f[4])), Error: "unknown plugin [nope]"}
		if h.DependsOnState {
			h.Error = "plugin 'prometheus' already exists in global rule with id 'g1'"
		}
		out[h.Key()] = h
	}
	return out
}

// heldItems reads "section id backfilled|left-out" lines.
func heldItems(t *testing.T, a *txtar.Archive, name string) []HeldItem {
	t.Helper()
	var out []HeldItem
	for _, l := range lines(a, name) {
		f := strings.Fields(l)
		if len(f) < 3 || (f[2] != "backfilled" && f[2] != "left-out") {
			t.Fatalf("%s line %q", name, l)
		}
		out = append(out, HeldItem{Section: f[0], ID: f[1], Backfilled: f[2] == "backfilled", Error: strings.Join(f[3:], " ")})
	}
	return out
}

func heldLines(held []HeldItem) string {
	var b strings.Builder
	for _, h := range held {
		outcome := "left-out"
		if h.Backfilled {
			outcome = "backfilled"
		}
		fmt.Fprintf(&b, "%s %s %s %s\n", h.Section, h.ID, outcome, h.Error)
	}
	return strings.ReplaceAll(b.String(), " \n", "\n")
}

func stillRejectedGolden(t *testing.T, rw *Rewriter, a *txtar.Archive) string {
	pl := NewPlan(prepared(t, rw, a, "body.json"))
	recheck := Recheck{}
	for _, l := range lines(a, "recheck") {
		f := strings.Fields(l)
		if len(f) != 3 || (f[2] != "pass" && f[2] != "fail") {
			t.Fatalf("recheck line %q", l)
		}
		recheck[HeldKey(f[0], f[1])] = f[2] == "pass"
	}
	server, _ := body(a, "server")
	hold, check := rw.StillRejected(pl, knownItems(t, rw, a), string(server), recheck)
	var b strings.Builder
	for _, set := range []struct {
		word string
		rs   []Rejection
	}{{"hold", hold}, {"check", check}} {
		for _, r := range set.rs {
			fmt.Fprintf(&b, "%s %s %d %s\n", set.word, r.Section, r.Index, pl.Items(r.Section)[r.Index].ID)
		}
	}
	if b.Len() == 0 {
		return "nothing held, nothing checked: every item goes as sent\n"
	}
	return b.String()
}

func reuseCorrectionGolden(t *testing.T, rw *Rewriter, a *txtar.Archive) string {
	cserver, _ := body(a, "correction-server")
	c := CorrectionOf(prepared(t, rw, a, "first.json"), prepared(t, rw, a, "corrected.json"), heldItems(t, a, "held"), string(cserver))
	var b strings.Builder
	if c == nil {
		b.WriteString("correction: none (a held section cannot be kept)\n")
	} else {
		sections := slices.Sorted(func(yield func(string) bool) {
			for s := range c.Sections {
				if !yield(s) {
					return
				}
			}
		})
		for _, s := range sections {
			fmt.Fprintf(&b, "correction: %s %s\n", s, c.Sections[s].Items)
		}
	}
	server, _ := body(a, "server")
	if out, ok := prepared(t, rw, a, "body.json").ReuseCorrection(c, string(server), knownItems(t, rw, a)); ok {
		fmt.Fprintf(&b, "reused: %s\n", out)
	} else {
		b.WriteString("not reused\n")
	}
	return b.String()
}

func copiesToCheckGolden(t *testing.T, rw *Rewriter, a *txtar.Archive) string {
	pl := NewPlan(prepared(t, rw, a, "body.json"))
	var found []Rejection
	for _, l := range lines(a, "rejections") {
		section, index, _ := strings.Cut(l, " ")
		i, err := strconv.Atoi(index)
		if err != nil {
			t.Fatalf("rejections line %q", l)
		}
		found = append(found, Rejection{Section: section, Index: i, Error: "unknown plugin [nope]"})
	}
	raw, _ := body(a, "accepted.json")
	var sections map[string]json.RawMessage
	if err := json.Unmarshal(raw, &sections); err != nil {
		t.Fatalf("accepted.json: %v", err)
	}
	items := map[string][]byte{}
	for s, v := range sections {
		items[s] = v
	}
	accepted := NewAccepted(items)
	for _, l := range lines(a, "refused") {
		section, id, _ := strings.Cut(l, " ")
		accepted.Refuse(section, id)
	}
	var b strings.Builder
	for _, sc := range pl.CopiesToCheck(found, accepted) {
		for i, id := range sc.IDs {
			fmt.Fprintf(&b, "%s %s %s\n", sc.Section, id, sc.Raws[i])
		}
	}
	if b.Len() == 0 {
		return "no copies to check\n"
	}
	return b.String()
}
