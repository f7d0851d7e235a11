package rewrite

import "testing"

// TestABumpOnTheClockAtVSPlusOneIsUnsure: a changed section the client sent at a stale
// version is bumped to max(vS+1, Now) (§5.1). When the clock reads exactly vS+1 — the
// data plane's version was set in the previous millisecond, as by a sync just before —
// the bump is vS+1, the very number a hand-made read-modify-write PUT picks, so a
// decision taken unread on it must be Unsure (the caller looks first), as it is when
// the clock is behind (it was not: only a clock below vS+1 made it Unsure). Seen first in
// the contract model (seed 1, merge=true,fallback=true,answer=rejection,trust=auto,
// apisix=3.19, step 711): a bump at vS+1 == Now met an operator's read-modify-write +1,
// and APISIX kept the operator's copy of the section (an equal version).
func TestABumpOnTheClockAtVSPlusOneIsUnsure(t *testing.T) {
	rw := New(DefaultPreserve)
	body := []byte(`{"routes_conf_version":900,"routes":[{"id":"r1","uris":["/b"]}]}`)
	st := &State{Versions: map[string]float64{"routes": 1000}, Items: map[string][]byte{"routes": []byte(`[{"id":"r1","uris":["/a"]}]`)}, ItemsKnown: true}
	for _, tc := range []struct {
		now    float64
		unsure bool
	}{{999, true}, {1001, true}, {1002, false}} {
		p, err := rw.Prepare(body)
		if err != nil {
			t.Fatal(err)
		}
		res, err := rw.Decide(p, Input{Body: body, State: st, Now: tc.now, Unread: true})
		if err != nil {
			t.Fatal(err)
		}
		if res.Unsure() != tc.unsure {
			t.Errorf("Now %v: Unsure %v, want %v (%s)", tc.now, res.Unsure(), tc.unsure, res.Actions())
		}
	}
}
