package rewrite

import (
	"errors"
	"reflect"
	"testing"
)

// FuzzPrepareLike checks the layout shortcut against a full scan: for a body patched
// in place (same length), PrepareLike with the original's layout gives exactly what
// Prepare gives — the same members, names and hashes, or the same kind of error.
func FuzzPrepareLike(f *testing.F) {
	seedCorpus(f, func(req []byte) {
		f.Add(req, []byte("9"), uint16(25))
		f.Add(req, []byte(`"x"`), uint16(40))
		f.Add(req, []byte(`]`), uint16(60))
	})
	f.Fuzz(func(t *testing.T, base, patch []byte, at uint16) {
		rw := New(DefaultPreserve)
		first, err := rw.Prepare(base)
		if err != nil || len(base) == 0 {
			return
		}
		mutated := append([]byte(nil), base...)
		copy(mutated[int(at)%len(mutated):], patch)
		want, wantErr := rw.Prepare(mutated)
		got, gotErr := rw.PrepareLike(mutated, first.Layout())
		if (wantErr == nil) != (gotErr == nil) {
			t.Fatalf("full scan: %v, layout: %v\n%q", wantErr, gotErr, mutated)
		}
		if wantErr != nil {
			var wr, gr *RefuseError
			if errors.As(wantErr, &wr) != errors.As(gotErr, &gr) {
				t.Fatalf("different errors: %v, %v", wantErr, gotErr)
			}
			return
		}
		// a layout keeps names, not the raw keys (they would pin the previous body)
		named := func(ms []member) []member {
			out := append([]member(nil), ms...)
			for i := range out {
				out[i].key = nil
			}
			return out
		}
		if !reflect.DeepEqual(named(got.obj.members), named(want.obj.members)) || got.obj.close != want.obj.close || !reflect.DeepEqual(got.sums, want.sums) {
			t.Fatalf("the layout shortcut misread\n%q\n got %+v\nwant %+v", mutated, got.obj.members, want.obj.members)
		}
	})
}

func TestPrepareLikeReusesOnlyWhatIsTheSame(t *testing.T) {
	t.Parallel()
	rw := New(DefaultPreserve)
	base := []byte(`{"routes_conf_version":17,"routes":[{"id":"r1","modifiedIndex":17}],"secrets_conf_version":0}`)
	first, err := rw.Prepare(base)
	if err != nil {
		t.Fatal(err)
	}
	restamped := []byte(`{"routes_conf_version":18,"routes":[{"id":"r1","modifiedIndex":18}],"secrets_conf_version":0}`)
	p, err := rw.PrepareLike(restamped, first.Layout())
	if err != nil || p.sums[1] == first.sums[1] || p.obj.members[1].name != "routes" {
		t.Fatalf("a re-stamped body: %v %+v", err, p)
	}
	// the same length, but a value that is no longer JSON: the full scan decides
	broken := []byte(`{"routes_conf_version":18,"routes":[{"id":"r1","modifiedIndex":1x}],"secrets_conf_version":0}`)
	if _, err := rw.PrepareLike(broken, first.Layout()); err == nil {
		t.Fatal("an invalid value passed the shortcut")
	}
	// the same length, a key changed: not the same shape
	renamed := []byte(`{"routes_conf_version":17,"ROUTES":[{"id":"r1","modifiedIndex":17}],"secrets_conf_version":0}`)
	p, err = rw.PrepareLike(renamed, first.Layout())
	if err != nil || p.obj.members[1].name != "ROUTES" {
		t.Fatalf("a renamed key must be read anew: %v", err)
	}
}
