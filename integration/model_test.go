package integration

// The contract as a model (issue 36). contractModel is told the history — the
// client's syncs and their answers, the operator's out-of-band writes, restarts — and
// says what the data plane must hold: client-owned sections as the client last
// landed them (§5.1, a held item left out with --fallback backfill, §8.5), preserved
// sections as their writer left them (§5.3), merged sections by owner (§8.6), and
// what the client's answer must be (§8.5: a 2xx only when every item it sent is
// programmed). TestContractModel drives confshim against the emulator through seeded
// interleavings of those events over every combination of --merge, --fallback,
// --fallback-answer and --trust-connection, and compares after every step. A failing
// seed prints its trace and how to replay it: MODEL_SEED=<seed> MODEL_FLAGS=<combo>.
//
// What may wait, and for how long: after a data-plane restart the configuration comes
// back within 3 s (§8.4: the watch re-seeds it); until then the data plane may hold
// nothing. A state-only restart behind an intermediary, which no ping can see, waits
// for the watch's next budgeted look (at most a minute) or the client's next sync,
// which reads first and re-seeds before it is decided. Out-of-band writes confshim had not seen when the data plane restarted
// (no sync landed since, the watch had not looked) may be lost: the data plane then
// holds the newest one confshim saw, or any of the ones written after it (the
// documented limit of a watch that does not decode the configuration at every ping).
// A sync answered with an error confshim gave before APISIX answered (a 502/503/504
// while the data plane restarts, a PUT past --upstream-timeout) may or may not have
// landed until the next one lands. An operator write that comes between confshim's look
// and a PUT of the sync may be overwritten by that PUT (no look closes that window,
// §5.4): the write before it then stands; with a write before the sync as well, the
// retry's second version conflict is the client's answer (§5.4).
//
// Every answer is checked against the data plane, not against the model's notes: a 2xx
// (with --fallback-answer rejection) only when every item sent is there as sent; a 400
// naming held items only when the rest landed with exactly those held (r-bad left out,
// r1 as the data plane last accepted it, the renamed rule left out) — or, without
// X-Confshim-Actions' backfilled, when nothing landed (failing safe); APISIX's own 400
// only for a sync with an item it refuses, and then nothing landed.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confshim/confshim/internal/testsupport/adcclient"
	"github.com/confshim/confshim/internal/testsupport/apisixtest"
	"github.com/confshim/confshim/internal/testsupport/emulator"
	"github.com/confshim/confshim/internal/testsupport/race"
	"github.com/confshim/confshim/proxy"
)

// modelFlags is one combination of the flags that decide how mechanisms combine.
type modelFlags struct {
	merge    bool // --merge global_rules,secrets (else both default: secrets preserved)
	fallback bool // --fallback backfill
	answer   proxy.FallbackAnswer
	trust    proxy.TrustMode
	via      bool // an intermediary marks every answer (Via), and restarts are state-only
	// v319: APISIX 3.19, whose workers apply a PUT 30 ms late and which answers ADC 0.30's
	// ?wait with 200 once they have, 202 when the wait ends first (§13)
	v319 bool
}

func (f modelFlags) String() string {
	s := fmt.Sprintf("merge=%v,fallback=%v", f.merge, f.fallback)
	if f.fallback {
		s += ",answer=" + string(f.answer)
	}
	s += ",trust=" + string(f.trust)
	if f.via {
		s += ",via"
	}
	if f.v319 {
		s += ",apisix=3.19"
	}
	return s
}

// modelCombinations is every combination the model runs.
func modelCombinations() []modelFlags {
	var out []modelFlags
	for _, merge := range []bool{false, true} {
		for _, fb := range []struct {
			on     bool
			answer proxy.FallbackAnswer
		}{{false, proxy.AnswerRejection}, {true, proxy.AnswerRejection}, {true, proxy.AnswerAccepted}} {
			for _, trust := range []proxy.TrustMode{proxy.TrustAuto, proxy.TrustAlways, proxy.TrustNever} {
				out = append(out, modelFlags{merge: merge, fallback: fb.on, answer: fb.answer, trust: trust})
			}
			// behind a marked intermediary a state-only restart cannot be seen on the
			// connection: auto must read, as never does
			out = append(out, modelFlags{merge: merge, fallback: fb.on, answer: fb.answer, trust: proxy.TrustAuto, via: true})
			// APISIX 3.19's ?wait: 200 once applied, 202 when not within the wait
			out = append(out, modelFlags{merge: merge, fallback: fb.on, answer: fb.answer, trust: proxy.TrustAuto, v319: true})
		}
	}
	return out
}

// desired is the client's declared configuration: a route variant, items APISIX refuses
// (§8.5) and, with --merge, a secret and a global rule of its own besides the operator's.
type desired struct {
	variant string
	bad     bool // adds r-bad, a new route APISIX refuses (an unknown plugin): left out
	r1bad   bool // r1 changed into a copy APISIX refuses: backfilled with its accepted copy
	// renamed: the client's tracing rule renamed, its plugin with it: refused while the
	// applied old rule holds the plugin, it lands in §8.5's second step
	renamed bool
	// contested: the data plane held the client's rule under its other id when the sync
	// began (or held nothing, or its workers apply late): the rule may be refused
	contested bool
	secret    int // vault/ctrl's token (0: none), sent by an ADC 0.28 leader (ADC 0.30 never sends secrets)
	gen       adcclient.Generation
}

const (
	badRoute    = "r-bad"
	renamedRule = "prometheus-2"
)

func (d desired) config(merge bool) adcclient.Config {
	cfg := config(d.variant)
	if d.r1bad {
		r1 := maps.Clone(cfg["routes"][0])
		plugins := maps.Clone(r1["plugins"].(map[string]any))
		plugins["nope"] = map[string]any{}
		r1["plugins"] = plugins
		cfg["routes"] = append([]map[string]any{r1}, cfg["routes"][1:]...)
	}
	if d.bad {
		cfg["routes"] = append(slices.Clone(cfg["routes"]), map[string]any{"id": badRoute, "uris": []any{"/bad"}, "plugins": map[string]any{"nope": map[string]any{}}})
	}
	if d.renamed {
		renamed := maps.Clone(cfg["global_rules"][0])
		renamed["id"] = renamedRule
		cfg["global_rules"] = []map[string]any{renamed}
	}
	if merge {
		cfg["secrets"] = []map[string]any{} // declared: an ADC 0.28 that manages secrets deletes what it dropped
		if d.secret > 0 {
			cfg["secrets"] = []map[string]any{secretItem("vault/ctrl", fmt.Sprintf("ctrl-%d", d.secret))}
		}
	}
	return cfg
}

// ruleID is the id of the client's tracing rule.
func (d desired) ruleID() string {
	if d.renamed {
		return renamedRule
	}
	return "prometheus"
}

// refusable are the items of d APISIX may refuse, as section/id.
func (d desired) refusable() []string {
	var out []string
	if d.contested {
		out = append(out, "global_rules/"+d.ruleID())
	}
	if d.r1bad {
		out = append(out, "routes/r1")
	}
	if d.bad {
		out = append(out, "routes/"+badRoute)
	}
	return out
}

// landing is what the data plane holds for the client once a sync of d landed: d, its
// refused items held back — r-bad left out, r1 as the data plane last accepted it (the
// route of variant r1At) — and the renamed rule left out where its second step did not
// happen (ruleHeld).
type landing struct {
	d        desired
	r1At     string // "": r1 as d sends it
	ruleHeld bool
	fresh    bool // this sync's outcome (the sync showed confshim the operator's newest write)
}

// r1Variant is the variant of the r1 the data plane holds.
func (l landing) r1Variant() string {
	if l.r1At != "" {
		return l.r1At
	}
	return l.d.variant
}

// onDataPlane is the client's configuration as the data plane holds it after l.
func (l landing) onDataPlane(merge bool) adcclient.Config {
	cfg := l.d.config(merge)
	cfg["routes"] = slices.DeleteFunc(slices.Clone(cfg["routes"]), func(it map[string]any) bool { return it["id"] == badRoute })
	if l.r1At != "" {
		cfg["routes"][0] = config(l.r1At)["routes"][0]
	}
	if l.ruleHeld {
		cfg["global_rules"] = slices.DeleteFunc(slices.Clone(cfg["global_rules"]), func(it map[string]any) bool { return it["id"] == l.d.ruleID() })
	}
	return cfg
}

// held are the items l holds back, as section/id, sorted.
func (l landing) held() []string {
	var out []string
	if l.ruleHeld {
		out = append(out, "global_rules/"+l.d.ruleID())
	}
	if l.r1At != "" {
		out = append(out, "routes/r1")
	}
	if l.d.bad {
		out = append(out, "routes/"+badRoute)
	}
	return out
}

// contractModel is what the contract says the data plane holds.
type contractModel struct {
	flags modelFlags
	// landed are what the data plane may hold for the client: after a sync whose outcome
	// the answer shows, exactly the one it shows (or, for a 400, the rest landed or
	// nothing did: the data plane decides which); after one whose outcome is unknown,
	// any of the ones before it or it
	landed []landing
	// the operator's writes are numbered; op is the newest, known the newest confshim
	// surely saw, pending the ones written since; after a data-plane restart the data
	// plane may hold known or any of newer
	op, known int
	pending   []int
	newer     []int
	lost      bool // a restart since the last check that found the operator's items
	// matched is the landing the last check found on the data plane
	matched landing
	// ruleAt: the operator's tracing rule is from this write, not the newest (0: it is),
	// after its newest write raced a sync that replaced the rule and not the secret
	ruleAt int
	// unobserved are the landings before a sync whose outcome confshim did not learn (a
	// PUT answered after --upstream-timeout, which may land later), until confshim has
	// seen the data plane again: what it kept is "the newest configuration confshim
	// knew" (§8.4), so a re-seed before then may restore one of them
	unobserved []landing
	// raced: the operator's newest write came between confshim's decision (its look or
	// read) and a PUT of the sync: a PUT that replaces its section may overwrite it, the
	// documented limit of §5.4 (no look closes that window); the write before it stands
	raced bool
}

// clientSections are the sections the client owns whole.
func (m *contractModel) clientSections() []string {
	s := []string{"routes", "services", "upstreams", "consumers"}
	if !m.flags.merge {
		s = append(s, "global_rules")
	}
	return s
}

// operatorSecret and operatorRule are the operator's items at write n.
func operatorSecret(n int) map[string]any { return secretItem("vault/1", fmt.Sprintf("op-%d", n)) }
func operatorRule(n int) map[string]any   { return rule("platform-tracing", "zipkin", n) }

// check reports what is wrong with doc, or "": every section must match one landing the
// model allows, and the operator's items one write it allows. The landing that fits is
// the model's from then on.
func (m *contractModel) check(doc map[string]any) string {
	if doc == nil {
		return "the data plane holds nothing"
	}
	var fits []landing
	var why string
	for _, l := range m.landed {
		if msg := m.checkClient(doc, l); msg == "" {
			fits = append(fits, l)
		} else if why == "" {
			why = msg
		}
	}
	if len(fits) == 0 {
		return why + fmt.Sprintf(" (%d landings allowed)", len(m.landed))
	}
	ops := []int{m.op}
	if m.lost {
		ops = append([]int{m.known}, m.newer...)
	}
	raced := m.raced && m.op > 0
	if raced && !slices.Contains(ops, m.op-1) {
		ops = append(ops, m.op-1)
	}
	m.raced = false
	for _, l := range fits {
		for _, n := range ops {
			ruleAt := 0 // the raced write survived in one section and not the other
			for _, r := range []int{m.op, m.op - 1} {
				if raced && r != n && ruleAt == 0 && m.checkOperatorWrites(doc, l, n, r) == "" {
					ruleAt = r
				}
			}
			if m.checkOperator(doc, l, n) == "" || ruleAt != 0 {
				if ruleAt != 0 {
					m.ruleAt = ruleAt
				}
				if l.fresh && !m.lost {
					m.known, m.pending = m.op, nil
				}
				m.matched = l
				l.fresh = false
				m.landed = []landing{l}
				if n != m.op { // the restart lost the writes after n
					m.op, m.known, m.pending = n, n, nil
				}
				m.newer, m.lost = nil, false
				return ""
			}
		}
	}
	return m.checkOperator(doc, fits[0], ops[len(ops)-1]) + fmt.Sprintf(" (operator writes allowed: %v)", ops)
}

// checkClient: every client-owned section holds the client's items as l says, content
// equal but for modifiedIndex.
func (m *contractModel) checkClient(doc map[string]any, l landing) string {
	cfg := l.onDataPlane(m.flags.merge)
	for _, section := range m.clientSections() {
		raw, _ := json.Marshal(doc[section])
		if got, want := canonicalItems(raw), wantItems(cfg, section); got != want && !(emptyItems(got) && emptyItems(want)) {
			return fmt.Sprintf("%s: %s, want %s", section, got, want)
		}
	}
	return ""
}

// emptyItems: no items, however the data plane spells it (cjson stores [] as {}, a
// section absent reads null).
func emptyItems(canonical string) bool { return canonical == "null" || canonical == "[]" }

// checkOperator: secrets preserved hold the operator's write n (§5.3); merged sections
// hold the client's items as l says plus the operator's (§8.6).
func (m *contractModel) checkOperator(doc map[string]any, l landing, n int) string {
	if m.ruleAt != 0 && n == m.op {
		return m.checkOperatorWrites(doc, l, n, m.ruleAt)
	}
	return m.checkOperatorWrites(doc, l, n, n)
}

// checkOperatorWrites: the operator's secret from write n, its tracing rule from write
// nRule — apart only when its newest write raced a PUT of the sync, which replaces the
// sections it sends at higher versions and not the one an equal version kept (§5.4).
func (m *contractModel) checkOperatorWrites(doc map[string]any, l landing, n, nRule int) string {
	var secrets, rules []map[string]any
	if n > 0 {
		secrets = append(secrets, operatorSecret(n))
	}
	if m.flags.merge {
		cfg := l.onDataPlane(true)
		rules = append(rules, cfg["global_rules"]...)
		if nRule > 0 {
			rules = append(rules, operatorRule(nRule))
		}
		secrets = append(secrets, cfg["secrets"]...)
		raw, _ := json.Marshal(doc["global_rules"])
		if got, want := sortedItems(raw), sortedItems(mustJSON(rules)); got != want {
			return fmt.Sprintf("global_rules: %s, want %s", got, want)
		}
	}
	raw, _ := json.Marshal(doc["secrets"])
	if got, want := sortedItems(raw), sortedItems(mustJSON(secrets)); got != want {
		return fmt.Sprintf("secrets: %s, want %s", got, want)
	}
	return ""
}

// sortedItems is canonicalItems compared as a set (secrets' order changes nothing, §8.1).
func sortedItems(raw []byte) string {
	var items []json.RawMessage
	_ = json.Unmarshal([]byte(canonicalItems(raw)), &items)
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = string(it)
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// namedItems are the items a rejection names (errors[]), as section/id, sorted.
func namedItems(body string) []string {
	var v struct {
		Errors []struct {
			Type string `json:"resource_type"`
			ID   any    `json:"resource_id"`
		} `json:"errors"`
	}
	_ = json.Unmarshal([]byte(body), &v)
	var out []string
	for _, e := range v.Errors {
		out = append(out, e.Type+"/"+fmt.Sprint(e.ID))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// landings are the ways d lands with the renamed rule held or not: r1, when refused,
// backfilled with each copy the data plane may have last accepted; secrets as secrets
// lists (a body without the secrets' items keeps or empties the client's, §8.6).
func (m *contractModel) landings(d desired, ruleHeld []bool, secrets []int) []landing {
	var out []landing
	r1s := []string{""}
	if d.r1bad {
		r1s = nil
		for _, l := range m.landed {
			r1s = append(r1s, l.r1Variant())
		}
		slices.Sort(r1s)
		r1s = slices.Compact(r1s)
	}
	for _, secret := range secrets {
		for _, r1 := range r1s {
			for _, rh := range ruleHeld {
				if rh && !d.contested {
					continue
				}
				dd := d
				dd.secret = secret
				out = append(out, landing{d: dd, r1At: r1, ruleHeld: rh, fresh: true})
			}
		}
	}
	return out
}

// answered tells the model how a sync of d was answered (secrets: what the client's
// secret may be once it landed); it returns what is wrong with the answer itself, or "".
// What landed is then decided from the data plane (check).
func (m *contractModel) answered(d desired, secrets []int, status int, body, actions string) string {
	fb, accepted := m.flags.fallback, m.flags.fallback && m.flags.answer == proxy.AnswerAccepted
	named := namedItems(body)
	switch {
	case status/100 == 2:
		if !accepted && (d.bad || d.r1bad) {
			return fmt.Sprintf("answered %d although %v are not programmed", status, d.refusable())
		}
		held := []bool{false} // a 2xx: every item as sent (§8.5, true to the letter)
		if accepted {
			held = []bool{false, true} // accepted: the corrected PUT's answer, the rule's second step or not
		}
		m.landed = m.landings(d, held, secrets)
	case status == http.StatusBadRequest && m.raced && strings.Contains(body, "must be greater than or equal to"):
		// a write before the sync and one racing its retry: the second version conflict
		// goes back to the client (§5.4); what a PUT of the sync applied before it may
		// stand, or nothing did
		if strings.Contains(actions, "=backfilled") {
			return fmt.Sprintf("a version conflict with %q: %s", actions, body)
		}
		earlier := m.landings(d, []bool{false, true}, secrets)
		for i := range earlier {
			earlier[i].fresh = false
		}
		m.landed = append(m.landed, earlier...)
	case status == http.StatusBadRequest:
		refusable := d.refusable()
		if len(refusable) == 0 {
			return fmt.Sprintf("a sync APISIX can take was rejected: %s", body)
		}
		if slices.ContainsFunc(named, func(id string) bool { return !slices.Contains(refusable, id) }) {
			return fmt.Sprintf("the 400 names %v, want some of %v: %s", named, refusable, body)
		}
		var rest []landing
		switch {
		case len(named) == 0:
			// APISIX's own answer to a PUT (it names no id): nothing landed — without
			// --fallback, or failing safe (§8.5)
			if strings.Contains(actions, "=backfilled") {
				return fmt.Sprintf("a 400 with %q that names no held item: %s", actions, body)
			}
		case fb && !accepted:
			// the rest landed with exactly the named items held (r-bad and r1 never
			// land; the rule did unless it is named), or nothing did
			if (!d.bad || slices.Contains(named, "routes/"+badRoute)) && (!d.r1bad || slices.Contains(named, "routes/r1")) {
				rest = m.landings(d, []bool{slices.Contains(named, "global_rules/"+d.ruleID())}, secrets)
			}
			if strings.Contains(actions, "=backfilled") && len(rest) == 0 {
				return fmt.Sprintf("a 400 with %q that does not name every held item (%v): %s", actions, named, body)
			}
		}
		if strings.Contains(actions, "=backfilled") {
			m.landed = rest // the rest landed (§8.5)
		} else {
			m.landed = append(rest, m.landed...) // or nothing did: the data plane tells
		}
	default: // confshim's own error while the data plane restarts: the outcome is unknown
		if !fb && (d.bad || d.r1bad) {
			return "" // APISIX refuses such a sync whole
		}
		unknown := m.landings(d, []bool{false, true}, secrets)
		for i := range unknown {
			unknown[i].fresh = false // nothing shows what confshim saw
		}
		if m.unobserved == nil {
			m.unobserved = slices.Clone(m.landed)
		}
		m.landed = append(m.landed, unknown...)
		return ""
	}
	m.unobserved = nil // APISIX answered the sync: confshim read or proved the state first
	return ""
}

// wrote: the operator wrote straight to the data plane.
func (m *contractModel) wrote() int {
	m.ruleAt = 0 // a read-modify-write of the whole document: both from this write
	m.op++
	m.pending = append(m.pending, m.op)
	return m.op
}

// restarted: the data plane lost what confshim had not seen (or comes back with it).
func (m *contractModel) restarted() {
	m.newer = append(slices.Clone(m.newer), m.pending...)
	m.lost = true
	m.landed = append(m.landed, m.unobserved...) // what a re-seed may restore
}

// modelHook is what the wrap between confshim and the emulator does next.
type modelHook struct {
	// an out-of-band write: 1 before the sync's first PUT, 2 before its first validate,
	// 3 before its second PUT (a fallback's corrected one: the sync is decided again)
	oobBefore atomic.Int32
	puts      atomic.Int32 // the sync's PUTs so far (oobBefore 3)
	restartAt atomic.Bool  // a restart instead of the next PUT
	closeNext atomic.Int32 // answers left that announce Connection: close
	// slowValidate: the sync's nth fallback validate waits slowBy first (the budget ends)
	slowValidate atomic.Int32
	validates    atomic.Int32
	slowBy       time.Duration
	// slowPut: the next PUT waits past --upstream-timeout, then lands (slowLands) or
	// not; slowDone is closed once it has
	slowPut   atomic.Bool
	slowLands bool
	slowDone  chan struct{}
	// shortWait: the next PUT's ?wait ends before the workers apply it (202 on 3.19)
	shortWait atomic.Bool
	via       bool
	write     func() // the operator's write, from the wrap
	restart   func()
	fired     atomic.Bool
}

// armSync resets the per-sync counts before a sync.
func (h *modelHook) armSync() {
	h.puts.Store(0)
	h.validates.Store(0)
}

func (h *modelHook) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h.via {
			w.Header().Set("Via", "1.1 mesh-proxy")
		}
		if h.closeNext.Load() > 0 && h.closeNext.Add(-1) >= 0 {
			w.Header().Set("Connection", "close")
		}
		if r.Header.Get("X-Model-Operator") == "" { // not the operator's own write
			isPut := r.Method == http.MethodPut && r.URL.Path == "/apisix/admin/configs"
			// the fallback's validate: not the probe's empty one, not ADC 0.30's own
			// re-validation after the answer (a passthrough, with the client's User-Agent)
			isValidate := r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/validate") && r.ContentLength > 2 &&
				!strings.HasPrefix(r.UserAgent(), adcclient.UserAgent)
			nth := int32(0)
			if isPut {
				nth = h.puts.Add(1)
			}
			if (isPut && nth == 1 && h.oobBefore.CompareAndSwap(1, 0)) || (isValidate && h.oobBefore.CompareAndSwap(2, 0)) ||
				(isPut && nth == 2 && h.oobBefore.CompareAndSwap(3, 0)) {
				h.write()
				h.fired.Store(true)
			}
			if isValidate && h.validates.Add(1) == h.slowValidate.Load() {
				h.slowValidate.Store(0)
				time.Sleep(h.slowBy)
			}
			if isPut && h.restartAt.CompareAndSwap(true, false) {
				h.restart()
				h.fired.Store(true)
				return
			}
			if isPut && h.shortWait.Load() && r.URL.Query().Has("wait") {
				h.shortWait.Store(false)
				q := r.URL.Query()
				q.Set("wait", "1")
				r.URL.RawQuery = q.Encode()
			}
			if isPut && h.slowPut.CompareAndSwap(true, false) {
				defer close(h.slowDone)
				body, _ := io.ReadAll(r.Body) // all of it arrived before the wait
				r.Body = io.NopCloser(bytes.NewReader(body))
				time.Sleep(h.slowBy)
				if !h.slowLands {
					return // the data plane never took it
				}
				// the data plane takes it after confshim gave up on the answer
				r = r.WithContext(context.Background())
			}
		}
		next.ServeHTTP(w, r)
	})
}

// modelRun is one seeded run of one combination.
type modelRun struct {
	t       *testing.T
	flags   modelFlags
	seed    uint64
	rng     *rand.Rand
	s       *stack
	hook    *modelHook
	m       *contractModel
	clients [2]*adcclient.Client // an ADC 0.28 and an ADC 0.30 replica
	leader  int
	want    desired
	trace   []string
	steps   int
	// outcomes counts the syncs by answer and what the data plane showed
	outcomes map[string]int
	// restartDown is how long the next restart inside a sync keeps the port closed
	restartDown time.Duration
}

func (k *modelRun) fail(format string, a ...any) {
	k.t.Helper()
	tr := k.trace
	if len(tr) > 40 {
		tr = tr[len(tr)-40:]
	}
	k.t.Fatalf("%s seed %d step %d (replay: MODEL_SEED=%d MODEL_FLAGS='%s' go test -run TestContractModel ./integration/): %s\ntrace (last %d):\n  %s\nconfshim log tail:\n%s",
		k.flags, k.seed, k.steps, k.seed, k.flags, fmt.Sprintf(format, a...), len(tr), strings.Join(tr, "\n  "), tail(k.s.logs.String(), logTail()))
}

// logTail is how many of confshim's log lines a failure shows (MODEL_LOG_TAIL, else 25).
func logTail() int {
	if v, err := strconv.Atoi(os.Getenv("MODEL_LOG_TAIL")); err == nil && v > 0 {
		return v
	}
	return 25
}

func (k *modelRun) note(format string, a ...any) {
	k.trace = append(k.trace, fmt.Sprintf("%d: ", k.steps)+fmt.Sprintf(format, a...))
	if len(k.trace) > 200 {
		k.trace = k.trace[len(k.trace)-100:]
	}
}

// operatorWrite is the operator's read-modify-write straight on the data plane: the
// secret rotated (and with --merge its tracing rule changed), every other version kept.
func (k *modelRun) operatorWrite() {
	n := k.m.wrote()
	// on 3.19 the workers apply a PUT 30 ms late, and APISIX checks a global rule's
	// plugins against what they applied: the operator writes once they have (else its
	// copy of the client's renamed rule is refused beside the old one still applied)
	for deadline := time.Now().Add(time.Second); !k.s.em.Applied() && time.Now().Before(deadline); {
		time.Sleep(2 * time.Millisecond)
	}
	doc := k.s.em.Document()
	if doc == nil {
		doc = map[string]any{}
	}
	delete(doc, "X-Digest")
	delete(doc, "X-Last-Modified")
	replace := func(section string, item map[string]any) {
		items, _ := doc[section].([]any)
		out := []any{}
		placed := false
		for _, it := range items {
			if m, _ := it.(map[string]any); m != nil && m["id"] == item["id"] {
				out, placed = append(out, item), true
				continue
			}
			out = append(out, it)
		}
		if !placed {
			out = append(out, item)
		}
		doc[section] = out
		v, _ := doc[section+"_conf_version"].(float64)
		doc[section+"_conf_version"] = v + 1
	}
	replace("secrets", operatorSecret(n))
	if k.flags.merge {
		replace("global_rules", operatorRule(n))
	}
	body, _ := json.Marshal(doc)
	req, _ := http.NewRequest(http.MethodPut, k.s.dpURL+"/apisix/admin/configs", strings.NewReader(string(body)))
	req.Header.Set("X-API-KEY", adminKey)
	req.Header.Set("X-Digest", fmt.Sprintf("operator-%d-%d", k.seed, n))
	req.Header.Set("X-Model-Operator", "1")
	resp, err := benchClient.Do(req)
	if err != nil {
		k.fail("the operator's write: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		k.fail("the operator's write: %d", resp.StatusCode)
	}
}

func (k *modelRun) client() *adcclient.Client { return k.clients[k.leader] }

// sync sends the leader's sync of k.want and checks the answer and the data plane.
func (k *modelRun) sync(what string) {
	k.t.Helper()
	d := k.want
	d.gen = k.client().Gen
	d.contested = true
	if doc := k.s.em.Document(); doc != nil && !k.flags.v319 {
		other := desired{renamed: !d.renamed}.ruleID()
		rules, _ := doc["global_rules"].([]any)
		d.contested = slices.ContainsFunc(rules, func(it any) bool { m, _ := it.(map[string]any); return m["id"] == other })
	}
	k.hook.armSync()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	res, err := k.client().Sync(ctx, d.config(k.flags.merge))
	cancel()
	status, body, sent, actions := 0, "", "", ""
	secrets := []int{d.secret}
	if err == nil {
		status, body, actions = res.Status, string(res.Body), res.Header.Get("X-Confshim-Actions")
		var doc map[string]json.RawMessage
		_ = json.Unmarshal(res.Sent, &doc)
		sent = fmt.Sprintf("secrets %.120s at %s", doc["secrets"], doc["secrets_conf_version"])
		if _, has := doc["secrets"]; !has {
			// a body without the secrets' items (ADC 0.30 never sends secrets; ADC 0.28
			// echoes a cache filled from a data plane without them) says nothing of them
			// at no version or the version the client last sent: the client's secret stays
			// as the last sync that carried it left it; at a version it moved, the
			// client's own secrets go (§8.6 as amended) — whether the record holds the
			// version is confshim's, so the data plane tells
			secrets = nil
			for _, l := range k.m.landed {
				secrets = append(secrets, l.d.secret)
			}
			if _, has := doc["secrets_conf_version"]; has {
				secrets = append(secrets, 0)
			}
			slices.Sort(secrets)
			secrets = slices.Compact(secrets)
		}
	}
	if k.hook.slowDone != nil {
		<-k.hook.slowDone // a PUT past the timeout has landed or been dropped
		k.hook.slowDone = nil
	}
	k.m.raced = k.m.raced && k.hook.fired.Load()
	k.note("%s: %s sync %+v (%s) → %d %s %.160s", what, d.gen, d, sent, status, actions, body)
	if msg := k.m.answered(d, secrets, status, body, actions); msg != "" {
		k.fail("%s", msg)
	}
	outcome := "confshim's own error or no answer (outcome unknown)"
	if status/100 == 2 || status == http.StatusBadRequest {
		if msg := k.m.check(k.s.em.Document()); msg != "" {
			k.fail("after a sync answered %d: %s", status, msg)
		}
		switch l := k.m.matched; {
		case status/100 == 2:
			outcome = fmt.Sprintf("%d, held on the data plane %v", status, l.held())
		case l.fresh:
			outcome = fmt.Sprintf("400 naming %v, the rest landed", namedItems(body))
		default:
			outcome = "400, nothing landed"
		}
	}
	k.outcomes[outcome]++
}

// within reports whether the data plane holds what the model allows within d.
func (k *modelRun) within(d time.Duration) bool {
	for deadline := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		if k.m.check(k.s.em.Document()) == "" {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// eventually waits up to 3 s for the data plane to hold what the model allows.
func (k *modelRun) eventually(what string) {
	k.t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		msg := k.m.check(k.s.em.Document())
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			k.fail("%s: after 3 s %s", what, msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (k *modelRun) restartDataPlane() {
	if k.flags.via {
		k.s.em.Restart() // behind the proxy: the connection stays open
		return
	}
	k.s.restartDataPlane(k.t, time.Duration(20+k.rng.IntN(80))*time.Millisecond)
}

// restartConfshim starts a new confshim, with the same --state-dir or (without --merge:
// a merged section's ownership lives there) with none; the clients keep their caches,
// aimed at it.
func (k *modelRun) restartConfshim(withDir bool) {
	if !withDir {
		k.s.opts.stateDir = ""
	} else if k.s.opts.stateDir == "" {
		k.s.opts.stateDir = k.t.TempDir() // an empty one: nothing kept yet
	}
	k.s.startProxy(k.t)
	for i, c := range k.clients {
		next := adcclient.New(k.s.proxyURL, adminKey)
		next.Gen = c.Gen
		next.Adopt(c)
		k.clients[i] = next
	}
}

func (k *modelRun) step() {
	k.steps++
	newVariant := func() { k.want.variant = fmt.Sprintf("v%d", k.rng.IntN(50)) }
	switch n := k.rng.IntN(100); {
	case n < 24:
		newVariant()
		k.sync("change")
	case n < 30:
		k.sync("same")
	case n < 34:
		k.want.bad = !k.want.bad
		k.sync("toggle the rejected new route")
	case n < 38:
		k.want.r1bad = !k.want.r1bad
		k.sync("toggle r1 changed into a copy APISIX rejects")
	case n < 42:
		k.want.renamed = !k.want.renamed
		k.sync("rename the tracing rule, its plugin with it")
	case n < 46 && k.flags.merge:
		k.want.secret = k.rng.IntN(4) // none, or a token to add or change
		k.sync("the client's secret")
	case n < 56:
		k.operatorWrite()
		k.note("operator write %d", k.m.op)
		if k.rng.IntN(2) == 0 {
			k.sync("the instant after an operator write")
		}
	case n < 64:
		mode := int32(1 + k.rng.IntN(3))
		k.hook.fired.Store(false)
		k.hook.oobBefore.Store(mode)
		newVariant()
		if k.flags.merge && k.rng.IntN(2) == 0 {
			k.want.secret = k.rng.IntN(4) // a merged union that changes
		}
		// a refused item in the same sync: a new one, a changed one, the rule renamed
		switch k.rng.IntN(4) {
		case 0:
			k.want.bad = !k.want.bad
		case 1:
			k.want.r1bad = !k.want.r1bad
		case 2:
			k.want.renamed = !k.want.renamed
		}
		k.m.raced = mode != 2
		k.sync(map[int32]string{1: "an operator write racing the PUT", 2: "an operator write during the fallback's validate",
			3: "an operator write racing the sync's second PUT"}[mode])
		k.m.raced = false
		k.hook.oobBefore.Store(0) // not fired when the sync sent no such request: nothing written
	case n < 67:
		k.leader = 1 - k.leader
		k.sync("leader change")
	case n < 70:
		k.hook.closeNext.Store(int32(1 + k.rng.IntN(3)))
		newVariant()
		k.sync("answers that close their connection")
		k.hook.closeNext.Store(0)
	case n < 73:
		k.note("data-plane restart at idle")
		k.restartDataPlane()
		k.m.restarted()
		if k.flags.via && !k.within(3*time.Second) {
			// behind the proxy no ping sees the restart: the watch finds it at its next
			// look, which the cost budget spaces by what looks cost (up to a minute, more
			// on a loaded machine whose answers are slow), or the next sync does, reading
			// first and re-seeding before it is decided (§8.4)
			k.sync("the next sync after a state-only restart the watch has not looked at yet")
		}
		k.eventually("re-seed after an idle restart")
	case n < 76 && !k.flags.via:
		k.restartDown = time.Duration(100+k.rng.IntN(400)) * time.Millisecond
		k.hook.fired.Store(false)
		k.hook.restartAt.Store(true)
		k.m.restarted()
		newVariant()
		k.sync("a restart with the PUT in its socket")
		k.hook.restartAt.Store(false)
		k.eventually("after a restart inside a sync")
	case n < 79:
		k.note("data-plane restart, then a bypassCache sync at once")
		k.restartDataPlane()
		k.m.restarted()
		k.client().Invalidate()
		k.sync("bypassCache as the data plane returns")
		k.eventually("after a bypassCache sync")
	case n < 82:
		withDir := k.flags.merge || k.rng.IntN(2) == 0
		k.note("confshim restart (state dir %v)", withDir)
		k.restartConfshim(withDir)
		// memory only, the new process knows nothing until a sync lands: a data-plane
		// restart before that loses the operator's writes by design (§8.4), so the
		// client syncs first, as the soak does
		k.sync("first sync after a confshim restart")
	case n < 84 && k.flags.fallback:
		// the fallback's budget runs out: its first validate (finding what APISIX
		// refuses) or its second (the copies, or the rule's second step) answers late
		k.hook.slowBy = modelFallbackBudget + 100*time.Millisecond
		k.hook.slowValidate.Store(int32(1 + k.rng.IntN(2)))
		newVariant()
		k.want.renamed = !k.want.renamed
		if k.rng.IntN(2) == 0 {
			k.want.bad = !k.want.bad
		}
		k.sync("the fallback's budget runs out")
		k.hook.slowValidate.Store(0)
	case n < 85 && k.rng.IntN(3) == 0:
		// a PUT answered after --upstream-timeout: the data plane takes it late, or never
		k.hook.slowBy = modelUpstreamTimeout + 200*time.Millisecond
		k.hook.slowLands = k.rng.IntN(2) == 0
		k.hook.slowDone = make(chan struct{})
		k.hook.slowPut.Store(true)
		newVariant()
		k.sync(fmt.Sprintf("a PUT past the timeout (lands: %v)", k.hook.slowLands))
		if k.hook.slowPut.CompareAndSwap(true, false) {
			k.hook.slowDone = nil // the sync sent no PUT
		}
	case n < 88 && k.flags.v319:
		// ADC 0.30's ?wait ends before the workers apply the PUT: 202, and the client
		// keeps its cache as it was (not applied)
		k.leader = 1
		k.hook.shortWait.Store(true)
		newVariant()
		k.sync("a ?wait that ends before the workers apply")
		k.hook.shortWait.Store(false)
	default:
		if msg := k.m.check(k.s.em.Document()); msg != "" {
			k.fail("at idle: %s", msg)
		}
	}
}

// The model's --upstream-timeout and §8.5's budget: short, so that a step that runs them
// out costs little.
const (
	modelUpstreamTimeout = time.Second
	modelFallbackBudget  = 500 * time.Millisecond
)

// runModel runs steps of one combination from seed.
func runModel(t *testing.T, flags modelFlags, seed uint64, steps int, budget time.Duration) int {
	hook := &modelHook{via: flags.via}
	var merge []string
	if flags.merge {
		merge = []string{"global_rules", "secrets"}
	}
	eo := emulator.Options{AdminKey: adminKey, LoadTime: 30 * time.Millisecond}
	if flags.v319 {
		eo.Version, eo.AppliedLag = "3.19.0", 30*time.Millisecond
	}
	dp := apisixtest.Start(t, apisixtest.Options{Wrap: hook.wrap, Emulator: eo})
	s := &stack{em: dp.Emulator, logs: &syncBuffer{}, dp: dp, dpURL: dp.URL, timeout: modelUpstreamTimeout,
		opts: stackOptions{merge: merge, fallback: flags.fallback, fallbackAnswer: flags.answer, trust: flags.trust,
			reseed: 20 * time.Millisecond, stateDir: t.TempDir(), adminKey: adminKey, fallbackBudget: modelFallbackBudget}}
	s.startProxy(t)
	k := &modelRun{t: t, flags: flags, seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), s: s, hook: hook,
		m: &contractModel{flags: flags}, want: desired{variant: "v0"}, outcomes: map[string]int{}}
	hook.write = func() { k.operatorWrite(); k.note("operator write %d from the wrap", k.m.op) }
	hook.restart = func() {
		k.note("restart with the PUT in its socket")
		s.restartDataPlane(t, k.restartDown) // drawn before the sync: the wrap runs on another goroutine
	}
	k.clients = [2]*adcclient.Client{adcclient.New(s.proxyURL, adminKey), adcclient.New030(s.proxyURL, adminKey)}
	k.m.landed = []landing{{d: desired{variant: "v0"}}} // replaced by the first sync
	k.sync("first")
	start := time.Now()
	for k.steps < steps && time.Since(start) < budget {
		k.step()
	}
	for _, o := range slices.Sorted(maps.Keys(k.outcomes)) {
		t.Logf("  %6d syncs answered %s", k.outcomes[o], o)
	}
	return k.steps
}

// TestContractModel runs every combination for a fixed set of seeds (the CI set, a
// few seconds); MODEL_STEPS and MODEL_DURATION make it longer (make model), MODEL_SEED
// and MODEL_FLAGS replay one run.
func TestContractModel(t *testing.T) {
	// the CI size: 40 steps per combination and seed, the combinations in parallel (each
	// has its own emulator and proxy; most of a step is waiting on them). Under the race
	// detector, whose job is the concurrency every combination's mechanisms have from
	// their first steps, 12: the steps cost it five times the CPU (make test runs the
	// model again without -race, at MODEL_STEPS=100)
	steps, budget := 40, time.Minute
	if race.Enabled {
		steps = 12
	}
	if v, err := strconv.Atoi(os.Getenv("MODEL_STEPS")); err == nil {
		steps = v
	}
	if v, err := time.ParseDuration(os.Getenv("MODEL_DURATION")); err == nil {
		budget = v
	}
	seeds := []uint64{1}
	if v, err := strconv.ParseUint(os.Getenv("MODEL_SEED"), 10, 64); err == nil {
		seeds = []uint64{v}
	} else if os.Getenv("MODEL_RANDOM") != "" {
		seeds = []uint64{uint64(time.Now().UnixNano())}
	}
	var total atomic.Int64
	t.Run("combinations", func(t *testing.T) {
		for _, flags := range modelCombinations() {
			if f := os.Getenv("MODEL_FLAGS"); f != "" && f != flags.String() {
				continue
			}
			for _, seed := range seeds {
				t.Run(fmt.Sprintf("%s/seed=%d", flags, seed), func(t *testing.T) {
					t.Parallel()
					n := runModel(t, flags, seed, steps, budget)
					total.Add(int64(n))
					t.Logf("%s seed %d: %d steps", flags, seed, n)
				})
			}
		}
	})
	held := "every check held"
	if t.Failed() {
		held = "a check failed"
	}
	t.Logf("%d steps of the runs that completed, over %d combinations: %s", total.Load(), len(modelCombinations()), held)
}
