package syncmachine_test

import (
	"testing"
	"time"

	"github.com/confshim/confshim/internal/syncmachine"
)

// TestTooBigNotSentAgain: a configuration APISIX could not store (its standalone-config
// dict is too small; APISIX empties the dict when it refuses it) fails with confshim's
// FailTooBig, and the same configuration — the same content under fresh versions, as
// ADC sends it — is not sent again within OversizedPatience while the data plane holds
// what it held then, or nothing; a changed configuration, another configuration on the
// data plane, or the minute passed sends it; a PUT that lands forgets it.
func TestTooBigNotSentAgain(t *testing.T) {
	t.Parallel()
	sc := scenarios()[1]
	w := newWorld(sc, flags{fallback: true, reject: true})
	for _, d := range sc.before {
		if f, err := w.run(d, false); err != nil || !f.Accepted() {
			t.Fatalf("the sync before: %v %+v", err, f)
		}
	}
	w.dictTooSmall = true
	base := next(sc.sync, 2000, map[string][]map[string]any{"routes": {route("r1", "/old", false), route("r2", "/two", false), route("r3", "/three", false)}})
	restamped := func(d doc, v float64) doc {
		out := next(d, 0, nil)
		for s := range out.versions {
			out.versions[s] = v
		}
		return out
	}
	step := func(name string, d doc, wantSent, wantRepeat bool) {
		t.Helper()
		before := w.puts
		f, err := w.run(d, false)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if f.Failure == nil || f.Failure.Kind != syncmachine.FailTooBig {
			t.Fatalf("%s: ended %+v, want FailTooBig\n%v", name, f, w.trace)
		}
		if sent := w.puts > before; sent != wantSent || f.Failure.Repeat != wantRepeat {
			t.Fatalf("%s: sent %v (want %v), repeat %v (want %v)", name, sent, wantSent, f.Failure.Repeat, wantRepeat)
		}
		o := f.Failure.Oversized
		if o == nil || o.Bytes < 100 || !f.Failure.RetryAt().Equal(o.At.Add(syncmachine.OversizedPatience)) {
			t.Fatalf("%s: oversized %+v, retry at %v", name, o, f.Failure.RetryAt())
		}
	}
	step("the first try", base, true, false)
	w.tick(10 * time.Second)
	step("the same content, versions stamped afresh", restamped(base, 5000), false, true)
	w.tick(40 * time.Second)
	step("again within the minute", restamped(base, 6000), false, true)
	changed := next(base, 7000, map[string][]map[string]any{"routes": {route("r1", "/old", false), route("r2", "/two", false), route("r4", "/four", false)}})
	step("a changed configuration", changed, true, false)
	step("that one again at once", restamped(changed, 8000), false, true)
	w.tick(61 * time.Second)
	step("the minute passed", restamped(changed, 9000), true, false)
	w.operatorWrite(false)
	w.tick(time.Second)
	step("the data plane moved", restamped(changed, 10000), true, false)

	// the dict raised and APISIX restarted: the watch puts back what the data plane
	// held, so it holds what it held at the refusal and the same configuration waits
	// for the rest of the minute (a restart cannot be told from the refusal emptying
	// the dict); then it lands
	w.dictTooSmall = false
	w.em.Restart()
	w.watchReseeds()
	step("after a restart that restored the same data plane", restamped(changed, 11000), false, true)
	w.tick(time.Minute)
	if f, err := w.run(restamped(changed, 12000), false); err != nil || !f.Accepted() {
		t.Fatalf("once it fits: %v %+v\n%v", err, f, w.trace)
	}
	tx, _ := w.belief.Lock(t.Context())
	defer tx.Unlock()
	if o := tx.View().Oversized; o != nil {
		t.Fatalf("a PUT landed, the refusals are still remembered: %+v", o)
	}
}
