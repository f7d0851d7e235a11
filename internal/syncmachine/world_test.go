package syncmachine_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/internal/dataplane"
	"github.com/confshim/confshim/internal/syncmachine"
	"github.com/confshim/confshim/internal/testsupport/emulator"
	"github.com/confshim/confshim/rewrite"
)

// A world is one sync's surroundings, without a socket: the emulated APISIX (held
// against real ones by its own tests) on a clock the test turns, the belief, an
// operator who writes straight to the data plane, and a driver that does each action
// the machine asks for — or, where the sequence under test says so, answers it
// otherwise: a write racing in first, a connection that breaks before or after APISIX
// applied the PUT, a restart, no verdict, the budget or the deadline running out.

// answer is one way APISIX can answer an action; natural is the emulator's own answer.
type answer int

const (
	natural      answer = iota
	writeBefore         // the operator writes straight to the data plane first
	fail                // no usable answer (a closed connection, no verdict)
	lostAfter           // a PUT APISIX applied, whose answer the connection lost
	timedOut            // a PUT APISIX applied, answered after the deadline
	restarted           // the data plane restarts (empty) with the PUT in its socket
	budgetOut           // the action takes until past the fallback's budget
	workersSlow         // ?wait: the workers did not apply within it (202, not 200)
	deadlineOut         // a pause the PUT's deadline ends
	dictFull            // APISIX validated the PUT but its standalone-config dict is too small
	slowConflict        // the operator writes first, and the PUT takes until past the budget
	tieBefore           // the operator's read-modify-write of its tracing rule alone (+1) lands first
)

func (a answer) String() string {
	return [...]string{"natural", "write-before", "fail", "lost-after", "timed-out", "restarted", "budget-out", "workers-slow", "deadline-out", "dict-full", "slow-conflict", "tie-before"}[a]
}

// alphabet is every answer an action may get in the enumeration.
func (w *world) alphabet(act syncmachine.Action) []answer {
	switch act.(type) {
	case syncmachine.Head, syncmachine.Read:
		return []answer{natural, writeBefore, fail}
	case syncmachine.Reseed:
		return []answer{natural, fail}
	case syncmachine.Validate:
		return []answer{natural, writeBefore, fail, budgetOut}
	case syncmachine.Put:
		out := []answer{natural, writeBefore, fail, lostAfter, timedOut, restarted, budgetOut, dictFull, slowConflict}
		if w.sc.wait {
			out = append(out, workersSlow)
		}
		if w.sc.tie && w.f.merge {
			out = append(out, tieBefore)
		}
		return out
	case syncmachine.Pause:
		return []answer{natural, deadlineOut}
	}
	return []answer{natural}
}

// scenario is a client's previous syncs and the sync under test.
type scenario struct {
	name    string
	version string // APISIX's
	wait    bool   // the client PUTs with ?wait (ADC 0.30 on APISIX ≥ 3.19)
	// heldBefore: an earlier sync lands only with --fallback backfill
	heldBefore bool
	// tie: the sync changes a merged section at the data plane's version + 1, the version
	// an operator's read-modify-write of it picks too (its PUTs may meet tieBefore)
	tie    bool
	before []doc // the client's syncs before the one under test (each landed)
	sync   doc   // the sync under test
}

// flags are the confshim flags a world runs with.
type flags struct {
	merge    bool // --merge global_rules,secrets (else secrets preserved, global_rules the client's)
	fallback bool
	reject   bool // --fallback-answer rejection
	trusted  bool // --trust-connection auto on a loopback upstream (else never)
}

func (f flags) String() string {
	return fmt.Sprintf("merge=%v,fallback=%v,rejection=%v,trusted=%v", f.merge, f.fallback, f.reject, f.trusted)
}

// doc is a client's configuration: each section's items and version.
type doc struct {
	sections map[string][]map[string]any
	versions map[string]float64
}

func (d doc) body() []byte {
	out := map[string]any{}
	for s, items := range d.sections {
		if items == nil {
			items = []map[string]any{}
		}
		out[s] = items
	}
	for s, v := range d.versions {
		out[s+"_conf_version"] = v
	}
	b, _ := json.Marshal(out)
	return b
}

type world struct {
	sc     scenario
	f      flags
	em     *emulator.Emulator
	api    *apisix.Client
	clock  time.Time
	belief *dataplane.Belief
	cfg    *syncmachine.Config
	rw     *rewrite.Rewriter
	connID uint64

	// the operator's writes: ops is the newest; seenInSync the newest the machine
	// observed in the sync under test (-1: none yet); kept the newest one it read or
	// wrote over (what a re-seed restores); lossy the writes that raced a PUT which
	// replaced what they wrote (the race no belief can see); lost the writes a restart
	// emptied before the machine read them (§8.4's limit)
	ops, seenInSync, kept int
	lossy, lost           map[int]bool
	ruleOnly              map[int]bool // writes that changed the tracing rule alone (tieBefore)
	lookedSincePut        bool         // a HEAD or GET answered since the sync's last PUT

	choices []answer // the answers to give, in order; natural after them
	asked   [][]answer
	given   []answer
	trace   []string
	fault   string // a check the world makes while it runs

	dictTooSmall bool // every PUT of a sync is answered dictFull (the configuration does not fit)
	// the sync under test's arrival, and whether it did fallback work (a validate call):
	// then no PUT may leave past its 10 s budget (§8.5)
	syncStart      time.Time
	fallbackSeen   bool
	acceptedInSync bool // APISIX accepted a PUT of the sync under test (its answer arrived)
	puts           int  // PUTs that reached APISIX in syncs (each costs it a decode of the body)
	tiesLost       int  // syncs answered FailTieLost (a writer's equal version, twice)
}

func newWorld(sc scenario, f flags) *world {
	w := &world{sc: sc, f: f, clock: time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC), connID: 1, seenInSync: -1, lossy: map[int]bool{}, lost: map[int]bool{}, ruleOnly: map[int]bool{}}
	em, err := emulator.New(emulator.Options{Version: sc.version, AppliedLag: time.Second, DecodeCost: -1,
		Now: func() time.Time { return w.clock }, Sleep: func(d time.Duration) { w.clock = w.clock.Add(d) }})
	if err != nil {
		panic(err)
	}
	w.em = em
	u, _ := url.Parse("http://apisix.test")
	w.api, _ = apisix.New(apisix.Config{Upstream: u, Timeout: time.Minute, Transport: roundTripper(em.ServeHTTP)})
	preserve := []string{"plugins", "protos", "plugin_configs", "consumer_groups", "secrets"}
	var merge []string
	if f.merge {
		preserve, merge = []string{"plugins", "protos", "plugin_configs", "consumer_groups"}, []string{"global_rules", "secrets"}
	}
	w.rw = rewrite.NewMerging(preserve, merge)
	w.belief, _ = dataplane.New(dataplane.Options{Keep: true})
	w.cfg = &syncmachine.Config{Rewriter: w.rw, Fallback: f.fallback, RejectHeld: f.reject, Budget: 10 * time.Second,
		Reseeds: true, Buffers: &buffers{}, Layouts: &syncmachine.LayoutMemory{}}
	w.operatorWrite(false) // the platform team's secret (and, merged, its tracing rule) before anything
	return w
}

// roundTripper serves requests with a handler, in memory.
type roundTripper func(http.ResponseWriter, *http.Request)

func (rt roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	rt(rec, req)
	resp := rec.Result()
	resp.Request = req
	return resp, nil
}

// buffers lends plain buffers (the proxy pools them).
type buffers struct{}

func (*buffers) Get() *[]byte { b := make([]byte, 0, 4096); return &b }
func (*buffers) Put(*[]byte)  {}

func (w *world) tick(d time.Duration) { w.clock = w.clock.Add(d) }

// operatorWrite is the operator's write straight on the data plane: its secret rotated,
// and with --merge its tracing rule changed, each version raised by one, every other
// section kept by its version (no items: APISIX keeps them). A write APISIX refuses (a
// rule moved while the workers still apply the last PUT) did not happen. ruleOnly: the
// tracing rule alone, the secret left as it is (its version too).
func (w *world) operatorWrite(ruleOnly bool) {
	d := w.em.Document()
	if d == nil {
		d = map[string]any{}
	}
	out := map[string]any{}
	for k, v := range d {
		if strings.HasSuffix(k, "_conf_version") {
			out[k] = v
		}
	}
	replace := func(section string, item map[string]any) {
		items, _ := d[section].([]any)
		list := []any{}
		for _, it := range items {
			if m, _ := it.(map[string]any); m != nil && m["id"] != item["id"] {
				list = append(list, it)
			}
		}
		out[section] = append(list, item)
		v, _ := d[section+"_conf_version"].(float64)
		out[section+"_conf_version"] = v + 1
	}
	if !ruleOnly {
		replace("secrets", operatorSecret(w.ops+1))
	}
	if w.f.merge {
		replace("global_rules", operatorRule(w.ops+1))
	}
	body, _ := json.Marshal(out)
	if rec := w.raw(http.MethodPut, "/apisix/admin/configs", body, fmt.Sprintf("operator-%d", w.ops+1)); rec.Code == http.StatusAccepted {
		w.ops++
		w.ruleOnly[w.ops] = ruleOnly
	}
}

func operatorSecret(n int) map[string]any {
	return map[string]any{"id": "vault/op", "uri": "http://vault:8200", "prefix": "kv", "token": fmt.Sprintf("op-%d", n)}
}

func operatorRule(n int) map[string]any {
	return map[string]any{"id": "platform-tracing", "plugins": map[string]any{"zipkin": map[string]any{"endpoint": "http://zipkin:9411", "sample_ratio": n}}}
}

func (w *world) raw(method, path string, body []byte, digest string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, bytes.NewReader(body))
	req.Header.Set("X-Digest", digest)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	w.em.ServeHTTP(rec, req)
	return rec
}

// facts are the connection's facts now.
func (w *world) facts() syncmachine.Conn {
	return syncmachine.Conn{ID: w.connID, Trusted: w.f.trusted, Server: w.api.Server(), HasValidate: w.api.HasValidate(), NoHead: w.api.NoHead()}
}

func (w *world) event() syncmachine.Event { return syncmachine.Event{Now: w.clock, Conn: w.facts()} }

// run runs one sync of d to its end: the machine's actions answered by the choices.
func (w *world) run(d doc, enumerated bool) (*syncmachine.Final, error) {
	tx, _ := w.belief.Lock(context.Background())
	defer tx.Unlock()
	body := d.body()
	in := rewrite.Input{Body: body, Digest: fmt.Sprintf("client-%d", w.clock.UnixNano()), HasDigest: true}
	prepared, err := w.rw.Prepare(body)
	if err != nil {
		return nil, err
	}
	start := w.clock
	w.syncStart, w.fallbackSeen, w.acceptedInSync = start, false, false
	m, act := syncmachine.Start(w.cfg, syncmachine.Input{Client: in, Prepared: prepared, Start: start, Deadline: start.Add(time.Minute)}, tx, w.event())
	for steps := 0; ; steps++ {
		m.Notes()
		if done, ok := act.(syncmachine.Done); ok {
			return done.Final, nil
		}
		if steps > 400 {
			return nil, errors.New("the sync did not end within 400 actions")
		}
		a := natural
		if enumerated {
			alpha := w.alphabet(act)
			w.asked = append(w.asked, alpha)
			if i := len(w.given); i < len(w.choices) {
				a = w.choices[i]
			}
			w.given = append(w.given, a)
		}
		phase := m.Phase()
		if _, v := act.(syncmachine.Validate); v {
			w.fallbackSeen = true
		}
		ev := w.perform(tx, act, a, in)
		got := ""
		switch {
		case ev.Answer != nil:
			got = fmt.Sprintf(" %d %.120s", ev.Answer.Status, ev.Answer.Body)
		case ev.Err != nil:
			got = " " + ev.Err.Error()
		case len(ev.Found) > 0:
			got = fmt.Sprintf(" %v", ev.Found)
		}
		w.trace = append(w.trace, fmt.Sprintf("%s %s → %s%s", phase, describe(act), a, got))
		act = m.Step(ev)
	}
}

func describe(act syncmachine.Action) string {
	switch a := act.(type) {
	case syncmachine.Validate:
		return "validate " + a.Section
	case syncmachine.Put:
		if os.Getenv("ENUMERATE_BODIES") != "" {
			return fmt.Sprintf("PUT %s", a.Out.Body)
		}
		return fmt.Sprintf("PUT %d bytes", len(a.Out.Body))
	}
	return strings.ToLower(strings.TrimPrefix(fmt.Sprintf("%T", act), "syncmachine."))
}

// perform does one action as APISIX answers it under a.
func (w *world) perform(tx *dataplane.Tx, act syncmachine.Action, a answer, in rewrite.Input) syncmachine.Event {
	ctx := context.Background()
	w.tick(5 * time.Millisecond)
	if _, isPut := act.(syncmachine.Put); isPut && w.f.fallback && w.fallbackSeen && w.clock.After(w.syncStart.Add(w.cfg.Budget)) {
		w.fault = fmt.Sprintf("a PUT was sent %s after the sync's arrival, past the %s budget of a sync with fallback work", w.clock.Sub(w.syncStart), w.cfg.Budget)
	}
	if a == writeBefore || a == tieBefore {
		w.operatorWrite(a == tieBefore)
	}
	if a == budgetOut {
		w.tick(11 * time.Second)
	}
	var ev syncmachine.Event
	switch act := act.(type) {
	case syncmachine.Head:
		if a == fail {
			return w.broke(errors.New("connection reset"))
		}
		ev.Meta, _, ev.Err = w.api.Head(ctx, apisix.Decide, apisix.Credentials{})
		w.seenInSync, w.lookedSincePut = w.ops, true
	case syncmachine.Read:
		if a == fail {
			return w.broke(errors.New("connection reset"))
		}
		body, meta, err := w.api.Get(ctx, apisix.Decide, apisix.Credentials{}, 1<<30)
		if err == nil {
			st, perr := rewrite.ParseState(body)
			ev.Read, err = syncmachine.StateRead{State: st, Digest: meta.Digest, LastModified: meta.LastModified}, perr
		}
		ev.Err = err
		w.seenInSync, w.kept, w.lookedSincePut = w.ops, w.ops, true
	case syncmachine.Reseed:
		ev.Reseeded = a == natural && w.reseed(tx)
	case syncmachine.Validate:
		found, ok := w.api.ValidateSection(ctx, apisix.Credentials{}, act.Section, act.Items)
		ev.Found = found
		if !ok || a == fail {
			ev.Found, ev.Err = nil, errors.New("no verdict")
		}
	case syncmachine.Put:
		return w.put(act, a, in)
	case syncmachine.AwaitReturn:
		w.tick(100 * time.Millisecond)
	case syncmachine.Pause:
		w.clock = act.Until
		if a == deadlineOut {
			ev.Err = context.DeadlineExceeded
		}
	}
	ev.Now, ev.Conn = w.clock, w.facts()
	return ev
}

// broke: the connection broke; the next request opens another.
func (w *world) broke(err error) syncmachine.Event {
	w.connID++
	return syncmachine.Event{Now: w.clock, Conn: w.facts(), Err: err, Broke: true}
}

// put sends a PUT as APISIX answers it under a; the union check comes first.
func (w *world) put(act syncmachine.Put, a answer, in rewrite.Input) syncmachine.Event {
	if w.replacesOperator(act.Out.Body) {
		if !w.lookedSincePut {
			w.fault = fmt.Sprintf("a merged union was sent without a look at the data plane since the sync's last PUT (operator writes: %d, the machine saw %d)", w.ops, w.seenInSync)
		}
		for n := w.seenInSync + 1; n <= w.ops; n++ {
			w.lossy[n] = true // written after the look the union was decided on: the race no belief can see
		}
	}
	w.lookedSincePut = false
	if a == slowConflict {
		w.operatorWrite(false)
		w.tick(w.cfg.Budget + time.Second)
		a = natural
	}
	if w.dictTooSmall && a == natural {
		a = dictFull
	}
	if a != fail && a != restarted {
		w.puts++
	}
	switch a {
	case fail:
		return w.broke(errors.New("connection reset"))
	case restarted:
		w.em.Restart()
		for n := w.kept + 1; n <= w.ops; n++ {
			w.lost[n] = true
		}
		return w.broke(errors.New("connection reset by peer"))
	case dictFull: // the dict is too small for it: APISIX validates it, then empties the dict
		w.em.SetDictSize(1)
		defer w.em.SetDictSize(0)
	}
	header := http.Header{"Content-Type": {"application/json"}, "X-Digest": {in.Digest}}
	if act.Out.SetDigest {
		header.Set("X-Digest", act.Out.Digest)
	}
	target := "http://apisix.test/apisix/admin/configs"
	switch {
	case w.sc.wait && a == workersSlow:
		target += "?wait=0"
	case w.sc.wait:
		target += "?wait=3000"
	}
	start := w.clock
	ans, _, err := w.api.Put(context.Background(), act.Conn, target, header, act.Out.Body)
	if err != nil {
		panic(err) // in memory: no transport error but the ones chosen
	}
	w.tick(20 * time.Millisecond)
	ev := syncmachine.Event{Now: w.clock, Conn: w.facts(), Answer: ans, Took: w.clock.Sub(start)}
	switch a {
	case lostAfter:
		return w.broke(errors.New("connection reset"))
	case timedOut:
		w.clock = w.clock.Add(time.Minute)
		return syncmachine.Event{Now: w.clock, Conn: w.facts(), Err: context.DeadlineExceeded}
	}
	if ans.Status/100 == 2 {
		w.seenInSync, w.kept = w.ops, w.ops // the answer to its own write shows the state it made
		w.acceptedInSync = true
	}
	return ev
}

// replacesOperator: a PUT body that carries a merged section's items at a version above
// the data plane's: it replaces the data plane's copy, the operator's items included.
func (w *world) replacesOperator(body []byte) bool {
	if !w.f.merge {
		return false
	}
	var b map[string]json.RawMessage
	_ = json.Unmarshal(body, &b)
	for _, s := range []string{"global_rules", "secrets"} {
		if _, has := b[s]; !has {
			continue
		}
		var v float64
		_ = json.Unmarshal(b[s+"_conf_version"], &v)
		if v > w.em.SectionVersion(s) {
			return true
		}
	}
	return false
}

// reseed is the watch's re-seed under the lock (reseed.Watcher.ReseedLocked): the kept
// configuration back into a data plane that holds nothing.
func (w *world) reseed(tx *dataplane.Tx) bool {
	k := tx.View().Kept
	if k == nil || w.em.Document() != nil {
		return false
	}
	body, err := k.Body()
	if err != nil {
		return false
	}
	digest := k.Digest
	if digest == "" {
		digest = "confshim-reseed"
	}
	rec := w.raw(http.MethodPut, "/apisix/admin/configs", body, digest)
	if rec.Code != http.StatusAccepted {
		tx.Doubt()
		return false
	}
	tx.Reseeded(k, rec.Header().Get("X-Digest"), rec.Header().Get("X-Last-Modified"), w.connID)
	return true
}

// watchReseeds is the watch finding the data plane empty after the sync: it puts the
// kept configuration back.
func (w *world) watchReseeds() {
	tx, _ := w.belief.Lock(context.Background())
	defer tx.Unlock()
	w.reseed(tx)
}

// held reports the items an answer names as held back (a rejection in validate's
// shape, errors[]), by section and id.
func heldNamed(ans *apisix.Answer) (map[string]bool, bool) {
	var v struct {
		Errors []struct {
			Type string `json:"resource_type"`
			ID   string `json:"resource_id"`
		} `json:"errors"`
	}
	if json.Unmarshal(ans.Body, &v) != nil || len(v.Errors) == 0 {
		return nil, false
	}
	out := map[string]bool{}
	for _, e := range v.Errors {
		out[e.Type+"/"+e.ID] = true
	}
	return out, true
}

// items is a section of a document by id, each item decoded.
func items(raw any) map[string]any {
	out := map[string]any{}
	list, _ := raw.([]any)
	for _, it := range list {
		m, _ := it.(map[string]any)
		out[itemKey(m)] = normalize(m)
	}
	return out
}

// normalize makes a JSON value comparable: through json again, numbers as float64,
// modifiedIndex dropped (§8.1: not part of an item's content).
func normalize(v any) any {
	b, _ := json.Marshal(v)
	var out any
	_ = json.NewDecoder(io.NopCloser(bytes.NewReader(b))).Decode(&out)
	if m, ok := out.(map[string]any); ok {
		delete(m, "modifiedIndex")
	}
	return out
}

func sortedKeys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// clientSections are the sections the client owns whole.
func (w *world) clientSections() []string {
	out := []string{"routes", "services", "upstreams", "consumers"}
	if !w.f.merge {
		out = append(out, "global_rules")
	}
	return out
}

// check says what is wrong after the sync under test ended with f, from what the data
// plane holds and what the client was told ("": nothing).
func (w *world) check(d doc, f *syncmachine.Final) string {
	if w.fault != "" {
		return w.fault
	}
	if f.Failure != nil {
		if f.Failure.Kind == syncmachine.FailStateRead && f.Failure.Applied != w.acceptedInSync {
			return fmt.Sprintf("a state read failed; the answer says an earlier PUT was applied: %v, APISIX accepted one: %v", f.Failure.Applied, w.acceptedInSync)
		}
		if f.Failure.Kind == syncmachine.FailTieUnverified && (!f.Failure.Applied || !w.acceptedInSync) {
			return "answered that an accepted PUT could not be read back, but APISIX accepted no PUT of the sync"
		}
		if f.Failure.Kind == syncmachine.FailTieLost {
			w.tiesLost++
			dp := w.em.Document()
			for _, c := range f.Failure.Ties {
				got := items(dp[c.Section])
				if !slices.ContainsFunc(d.sections[c.Section], func(it map[string]any) bool { return !reflect.DeepEqual(got[itemKey(it)], normalize(it)) }) {
					return fmt.Sprintf("answered that a writer's copy of %s was kept, but the client's items are on the data plane as sent", c.Section)
				}
			}
			if !w.acceptedInSync {
				return "answered that a writer's copy was kept while the rest applied, but APISIX accepted no PUT of the sync"
			}
		}
		return w.checkOperator()
	}
	ans, actions := f.Reply()
	dp := w.em.Document()
	backfilled := map[string]bool{}
	for _, e := range strings.Split(actions, ", ") {
		if section, word, _ := strings.Cut(e, "="); word == "backfilled" {
			backfilled[section] = true
		}
	}
	named, isHeldRejection := heldNamed(ans)
	isHeldRejection = isHeldRejection && ans.Status == http.StatusBadRequest && len(backfilled) > 0
	switch {
	case ans.Status/100 == 2 && w.f.reject:
		backfilled = nil // a 2xx: everything is programmed
		fallthrough
	case ans.Status/100 == 2:
		if msg := w.checkClient(d, dp, func(section, _ string) bool { return backfilled[section] }); msg != "" {
			return fmt.Sprintf("answered %d (%s) but %s", ans.Status, actions, msg)
		}
	case isHeldRejection:
		if msg := w.checkClient(d, dp, func(section, id string) bool { return named[section+"/"+id] }); msg != "" {
			return fmt.Sprintf("answered the held items %v, the rest applied, but %s", slices.Sorted(mapKeys(named)), msg)
		}
		for key := range named {
			section, id, _ := strings.Cut(key, "/")
			if reflect.DeepEqual(items(dp[section])[id], normalize(clientItem(d, section, id))) && clientItem(d, section, id) != nil {
				return fmt.Sprintf("answered %s as held, but it is on the data plane as sent", key)
			}
		}
	}
	return w.checkOperator()
}

func mapKeys(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func clientItem(d doc, section, id string) map[string]any {
	for _, it := range d.sections[section] {
		if itemKey(it) == id {
			return it
		}
	}
	return nil
}

// itemKey is an item's id, or a consumer's username.
func itemKey(it map[string]any) string {
	if it["id"] == nil {
		return fmt.Sprint(it["username"])
	}
	return fmt.Sprint(it["id"])
}

// checkClient: every item the client sent in its sections is on the data plane as sent
// (but the excused ones), and nothing else is there; merged sections hold the client's
// items as sent beside the operator's.
func (w *world) checkClient(d doc, dp map[string]any, excused func(section, id string) bool) string {
	for _, section := range w.clientSections() {
		got := items(dp[section])
		want := map[string]any{}
		for _, it := range d.sections[section] {
			want[itemKey(it)] = normalize(it)
		}
		for _, id := range sortedKeys(want) {
			if excused(section, id) {
				continue
			}
			if !reflect.DeepEqual(got[id], want[id]) {
				return fmt.Sprintf("%s %s is %v on the data plane, sent as %v", section, id, got[id], want[id])
			}
		}
		for _, id := range sortedKeys(got) {
			if _, sent := want[id]; !sent {
				return fmt.Sprintf("%s %s is on the data plane, the client did not send it", section, id)
			}
		}
	}
	if w.f.merge {
		got := items(dp["global_rules"])
		for _, it := range d.sections["global_rules"] {
			id := fmt.Sprint(it["id"])
			if !excused("global_rules", id) && !reflect.DeepEqual(got[id], normalize(it)) {
				return fmt.Sprintf("merged global_rules %s is %v, sent as %v", id, got[id], normalize(it))
			}
		}
	}
	return ""
}

// checkOperator: the operator's items on the data plane are from its newest write, or
// from a newer one than the machine saw when later writes raced a PUT that replaced
// them (or a restart emptied the data plane before the machine saw them).
func (w *world) checkOperator() string {
	dp := w.em.Document()
	gen := func(section, id, field string) int {
		it, _ := items(dp[section])[id].(map[string]any)
		switch v := it[field].(type) {
		case string:
			var n int
			_, _ = fmt.Sscanf(v, "op-%d", &n)
			return n
		case map[string]any:
			z, _ := v["zipkin"].(map[string]any)
			f, _ := z["sample_ratio"].(float64)
			return int(f)
		}
		return 0
	}
	floor := w.ops
	for floor > 0 && (w.lossy[floor] || w.lost[floor]) {
		floor--
	}
	check := func(what string, n, floor int) string {
		if n < floor || n > w.ops {
			return fmt.Sprintf("the operator's %s is from write %d; writes %d, the machine read %d, lossy %v, lost in a restart %v, rule only %v", what, n, w.ops, w.kept, w.lossy, w.lost, w.ruleOnly)
		}
		return ""
	}
	secretFloor := floor // the newest write that changed the secret
	for secretFloor > 0 && (w.ruleOnly[secretFloor] || w.lossy[secretFloor] || w.lost[secretFloor]) {
		secretFloor--
	}
	if msg := check("secret", gen("secrets", "vault/op", "token"), secretFloor); msg != "" {
		return msg
	}
	if w.f.merge {
		return check("tracing rule", gen("global_rules", "platform-tracing", "plugins"), floor)
	}
	return ""
}
