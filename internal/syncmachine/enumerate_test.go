package syncmachine_test

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confshim/confshim/internal/testsupport/race"
)

// TestEveryAnswerSequence drives the state machine, without a socket, through every
// sequence of APISIX answers to the calls it makes in which at most maxFaults answers
// are not the emulated APISIX's own (a write racing in, no answer, an answer lost after
// APISIX applied the PUT, a restart, the budget or the deadline running out, workers
// slower than ?wait), for syncs that change a refused route, add one, rename the
// metrics global rule (§8.5's second step) and all of that at once under ?wait,
// over the flags that decide how mechanisms combine. After each sequence it checks,
// from the data plane and the client's answer — not from the machine's bookkeeping:
//   - a 2xx only when every item the client sent is on the data plane as sent (with
//     --fallback-answer accepted: but in the sections the answer says were backfilled);
//     a rejection naming held items only when the rest is applied and those are not;
//   - a merged union that replaces the data plane's copy is sent only on a state the
//     sync observed after the operator's last write before its decision (§5.4);
//   - the operator's items are from its newest write, but for a write that raced a PUT
//     replacing them, or one a restart lost before confshim read it (§8.4's limit).
//
// ENUMERATE_FAULTS raises the bound (make enumerate).
func TestEveryAnswerSequence(t *testing.T) {
	t.Parallel()
	maxFaults := 2
	if race.Enabled {
		maxFaults = 1 // the race detector costs five times as much; make test runs the set of 2 without it
	}
	if v, err := strconv.Atoi(os.Getenv("ENUMERATE_FAULTS")); err == nil {
		maxFaults = v
	}
	var total, tiesLost atomic.Int64
	start, combos := time.Now(), 0
	t.Run("all", func(t *testing.T) {
		for _, sc := range scenarios() {
			for _, f := range flagSets(sc) {
				combos++
				t.Run(sc.name+"/"+f.String(), func(t *testing.T) {
					t.Parallel()
					runs, ties := enumerate(t, sc, f, maxFaults)
					total.Add(int64(runs))
					tiesLost.Add(int64(ties))
				})
			}
		}
	})
	t.Logf("%d answer sequences (at most %d faults each) over %d scenarios and %d flag combinations, in %s; %d ended on a writer's equal version not sent again (FailTieLost)",
		total.Load(), maxFaults, len(scenarios()), combos, time.Since(start).Round(time.Millisecond), tiesLost.Load())
	if maxFaults >= 2 && tiesLost.Load() == 0 && !t.Failed() {
		t.Errorf("no sequence reached the answer to a writer's equal version not sent again (FailTieLost): the enumeration lost a path")
	}
}

// flagSets are the flag combinations a scenario runs with.
func flagSets(sc scenario) []flags {
	var out []flags
	for _, merge := range []bool{false, true} {
		for _, reject := range []bool{true, false} {
			for _, trusted := range []bool{true, false} {
				out = append(out, flags{merge: merge, fallback: true, reject: reject, trusted: trusted})
			}
		}
		if !sc.heldBefore {
			out = append(out, flags{merge: merge, trusted: true})
		}
	}
	return out
}

// enumerate runs every answer sequence of one scenario under f, depth first: each run
// replays a prefix of chosen answers, then APISIX's own; every position past the
// prefix branches into each other answer while faults are left. It returns how many
// sequences ran, and how many of them ended in FailTieLost.
func enumerate(t *testing.T, sc scenario, f flags, maxFaults int) (runs, ties int) {
	t.Helper()
	stack := [][]answer{nil}
	for len(stack) > 0 {
		prefix := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		w := runOne(t, sc, f, prefix)
		runs++
		ties += w.tiesLost
		faults := 0
		for _, a := range prefix {
			if a != natural {
				faults++
			}
		}
		if faults >= maxFaults {
			continue
		}
		for i := len(prefix); i < len(w.given); i++ {
			for _, alt := range w.asked[i][1:] {
				next := append(append([]answer(nil), w.given[:i]...), alt)
				stack = append(stack, next)
			}
		}
	}
	return runs, ties
}

// runOne runs the scenario's earlier syncs, then the sync under test with the answers
// chosen, and checks what it left.
func runOne(t *testing.T, sc scenario, f flags, choices []answer) *world {
	t.Helper()
	w := newWorld(sc, f)
	for i, d := range sc.before {
		final, err := w.run(d, false)
		if err != nil || !final.Accepted() {
			t.Fatalf("earlier sync %d did not land: %v %+v", i, err, final)
		}
	}
	w.seenInSync, w.lookedSincePut, w.choices = -1, false, choices
	final, err := w.run(sc.sync, true)
	if w.em.Document() == nil {
		// a data plane restarted, or emptied by refusing a document too big for its
		// dict, is the watch's to fill again (§8.4), at its next look: by then the
		// workers applied what the dict last held
		w.tick(2 * time.Second)
		w.watchReseeds()
	}
	if err == nil {
		if msg := w.check(sc.sync, final); msg != "" {
			err = fmt.Errorf("%s", msg)
		}
	}
	if err != nil {
		status := "-"
		if final != nil && final.Answer != nil {
			ans, actions := final.Reply()
			status = fmt.Sprintf("%d %s %.300s", ans.Status, actions, ans.Body)
		} else if final != nil && final.Failure != nil {
			status = fmt.Sprintf("confshim's own error %d: %v", final.Failure.Kind, final.Failure.Err)
		}
		t.Fatalf("answers %v: %v\nclient answered: %s\ntrace:\n  %s", choices, err, status, strings.Join(w.trace, "\n  "))
	}
	return w
}

// The scenarios. The client is an ADC: each section's version is what it cached, a
// section it changed gets the sync's time (ms); it never sends secrets.

func route(id, uri string, bad bool) map[string]any {
	r := map[string]any{"id": id, "uris": []any{uri}, "service_id": "svc1"}
	if bad {
		r["plugins"] = map[string]any{"nope": map[string]any{}} // a plugin APISIX does not load
	}
	return r
}

func metricsRule(id string) map[string]any {
	return map[string]any{"id": id, "plugins": map[string]any{"prometheus": map[string]any{"prefer_name": id != "1"}}}
}

// base is the client's first configuration.
func base(routes []map[string]any, rules []map[string]any) doc {
	return doc{sections: map[string][]map[string]any{
		"routes":       routes,
		"services":     {{"id": "svc1", "upstream_id": "up1"}},
		"upstreams":    {{"id": "up1", "type": "roundrobin", "nodes": []any{map[string]any{"host": "10.0.0.1", "port": 80, "weight": 1}}}},
		"consumers":    {{"username": "jack"}},
		"global_rules": rules,
	}, versions: map[string]float64{"routes": 1000, "services": 1000, "upstreams": 1000, "consumers": 1000, "global_rules": 1000}}
}

// next is d with sections replaced, their versions moved to v.
func next(d doc, v float64, sections map[string][]map[string]any) doc {
	out := doc{sections: map[string][]map[string]any{}, versions: map[string]float64{}}
	for s, items := range d.sections {
		out.sections[s] = items
	}
	for s, ver := range d.versions {
		out.versions[s] = ver
	}
	for s, items := range sections {
		out.sections[s], out.versions[s] = items, v
	}
	return out
}

// aheadVersion is a version far above the clock the enumeration runs on (2026).
const aheadVersion = 9_000_000_000_000

func scenarios() []scenario {
	first := base([]map[string]any{route("r1", "/old", false), route("r2", "/two", false)}, []map[string]any{metricsRule("prometheus")})
	renameFrom := base([]map[string]any{route("r1", "/old", false)}, []map[string]any{metricsRule("1")})
	// versions above the clock (another writer's clock ran ahead): a bump is vS+1 too
	ahead := next(first, aheadVersion, map[string][]map[string]any{"global_rules": first.sections["global_rules"]})
	legacy := base([]map[string]any{route("r1", "/old", false), route("r-legacy", "/legacy", true)}, []map[string]any{metricsRule("1")})
	return []scenario{
		{name: "a changed route APISIX refuses", version: "3.17.0", before: []doc{first},
			sync: next(first, 2000, map[string][]map[string]any{"routes": {route("r1", "/changed", true), route("r2", "/two", false), route("r3", "/three", false)}})},
		{name: "a new route APISIX refuses", version: "3.17.0", before: []doc{first},
			sync: next(first, 2000, map[string][]map[string]any{
				"routes":    {route("r1", "/old", false), route("r2", "/two", false), route("r-bad", "/bad", true)},
				"upstreams": {{"id": "up1", "type": "roundrobin", "nodes": []any{map[string]any{"host": "10.0.0.2", "port": 80, "weight": 1}}}}})},
		{name: "the metrics rule renamed", version: "3.17.0", before: []doc{renameFrom},
			sync: next(renameFrom, 2000, map[string][]map[string]any{
				"global_rules": {metricsRule("prometheus")},
				"routes":       {route("r1", "/old", false), route("r-new", "/new", false)}})},
		{name: "a merged rule changed at the data plane's version + 1, and a new route APISIX refuses", version: "3.17.0", tie: true, before: []doc{first},
			sync: next(first, 1001, map[string][]map[string]any{
				"global_rules": {metricsRule("prometheus"), {"id": "client-cors", "plugins": map[string]any{"cors": map[string]any{}}}},
				"routes":       {route("r1", "/old", false), route("r2", "/two", false), route("r-bad", "/bad", true)}})},
		{name: "a merged rule changed at the data plane's version + 1, the clock behind it", version: "3.17.0", tie: true, before: []doc{ahead},
			sync: next(ahead, aheadVersion+1, map[string][]map[string]any{
				"global_rules": {metricsRule("prometheus"), {"id": "client-cors", "plugins": map[string]any{"cors": map[string]any{}}}}})},
		{name: "a held route, the rename and a new route under wait", version: "3.19.0", wait: true, heldBefore: true, before: []doc{legacy},
			sync: next(legacy, 2000, map[string][]map[string]any{
				"global_rules": {metricsRule("prometheus")},
				"routes":       {route("r1", "/old", false), route("r-legacy", "/legacy", true), route("r-new", "/new", false)}})},
	}
}
