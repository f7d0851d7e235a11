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
// while the data plane restarts) may or may not have landed until the next one lands.

import (
	"context"
	"encoding/json"
	"fmt"
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
	"github.com/confshim/confshim/proxy"
)

// modelFlags is one combination of the flags that decide how mechanisms combine.
type modelFlags struct {
	merge    bool // --merge global_rules,secrets (else both default: secrets preserved)
	fallback bool // --fallback backfill
	answer   proxy.FallbackAnswer
	trust    proxy.TrustMode
	via      bool // an intermediary marks every answer (Via), and restarts are state-only
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
		}
	}
	return out
}

// desired is the client's declared configuration: a route variant, whether it adds a
// route APISIX rejects (an unknown plugin, §8.5) and, with --merge, a secret and a
// global rule of its own besides the operator's.
type desired struct {
	variant string
	bad     bool
	secret  int // vault/ctrl's token (0: none), sent by an ADC 0.28 leader (ADC 0.30 never sends secrets)
	gen     adcclient.Generation
}

const badRoute = "r-bad"

func (d desired) config(merge bool) adcclient.Config {
	cfg := config(d.variant)
	if d.bad {
		cfg["routes"] = append(slices.Clone(cfg["routes"]), map[string]any{"id": badRoute, "uris": []any{"/bad"}, "plugins": map[string]any{"nope": map[string]any{}}})
	}
	if merge {
		cfg["secrets"] = []map[string]any{} // declared: an ADC 0.28 that manages secrets deletes what it dropped
		if d.secret > 0 {
			cfg["secrets"] = []map[string]any{secretItem("vault/ctrl", fmt.Sprintf("ctrl-%d", d.secret))}
		}
	}
	return cfg
}

// contractModel is what the contract says the data plane holds.
type contractModel struct {
	flags modelFlags
	// landed are the configurations the data plane may hold for the client: the last
	// one surely landed first, then any whose outcome is unknown
	landed []desired
	// the operator's writes are numbered; op is the newest, known the newest confshim
	// surely saw, pending the ones written since; after a data-plane restart the data
	// plane may hold known or any of newer
	op, known int
	pending   []int
	newer     []int
	lost      bool // a restart since the last check that found the operator's items
}

// clientSections are the sections the client owns whole.
func (m *contractModel) clientSections() []string {
	s := []string{"routes", "services", "upstreams", "consumers"}
	if !m.flags.merge {
		s = append(s, "global_rules")
	}
	return s
}

// wantClient is what a client-owned section holds after d landed: the client's items,
// the held route left out with --fallback backfill.
func (m *contractModel) wantClient(d desired, section string) string {
	cfg := d.config(m.flags.merge)
	items := cfg[section]
	if section == "routes" && m.flags.fallback {
		items = slices.DeleteFunc(slices.Clone(items), func(it map[string]any) bool { return it["id"] == badRoute })
	}
	return wantItems(adcclient.Config{section: items}, section)
}

// operatorSecret and operatorRule are the operator's items at write n.
func operatorSecret(n int) map[string]any { return secretItem("vault/1", fmt.Sprintf("op-%d", n)) }
func operatorRule(n int) map[string]any   { return rule("platform-tracing", "zipkin", n) }

// check reports what is wrong with doc, or "": every section must match one
// configuration the model allows, and the operator's items one write it allows.
func (m *contractModel) check(doc map[string]any) string {
	if doc == nil {
		return "the data plane holds nothing"
	}
	var fits []desired
	var why string
	for _, d := range m.landed {
		if msg := m.checkClient(doc, d); msg == "" {
			fits = append(fits, d)
		} else if why == "" {
			why = msg
		}
	}
	if len(fits) == 0 {
		return why
	}
	ops := []int{m.op}
	if m.lost {
		ops = append([]int{m.known}, m.newer...)
	}
	for _, d := range fits {
		for _, n := range ops {
			if m.checkOperator(doc, d, n) == "" {
				m.landed = []desired{d}
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

func (m *contractModel) checkClient(doc map[string]any, d desired) string {
	for _, section := range m.clientSections() {
		raw, _ := json.Marshal(doc[section])
		if got, want := canonicalItems(raw), m.wantClient(d, section); got != want {
			return fmt.Sprintf("%s: %s, want %s", section, got, want)
		}
	}
	return ""
}

func (m *contractModel) checkOperator(doc map[string]any, d desired, n int) string {
	var secrets, rules []map[string]any
	if n > 0 {
		secrets = append(secrets, operatorSecret(n))
	}
	if m.flags.merge {
		rules = append(rules, d.config(true)["global_rules"]...)
		if n > 0 {
			rules = append(rules, operatorRule(n))
		}
		if d.secret > 0 {
			secrets = append(secrets, d.config(true)["secrets"]...)
		}
		raw, _ := json.Marshal(doc["global_rules"])
		if got, want := canonicalItems(raw), wantItems(adcclient.Config{"global_rules": rules}, "global_rules"); got != want {
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

// answered tells the model how a sync of d was answered; it returns what is wrong
// with the answer itself, or "".
func (m *contractModel) answered(d desired, status int, body, actions string) string {
	switch {
	case status/100 == 2:
		if d.bad && !(m.flags.fallback && m.flags.answer == proxy.AnswerAccepted) {
			return fmt.Sprintf("answered %d although %s is not programmed", status, badRoute)
		}
		m.synced(d)
	case status == http.StatusBadRequest && d.bad:
		if !strings.Contains(body, badRoute) && m.flags.fallback {
			return fmt.Sprintf("a 400 that does not name the held %s: %s", badRoute, body)
		}
		if m.flags.fallback && m.flags.answer == proxy.AnswerAccepted {
			return fmt.Sprintf("--fallback-answer accepted answered 400: %s", body)
		}
		if m.flags.fallback && strings.Contains(actions, "=backfilled") {
			m.synced(d) // the rest landed (§8.5)
		} else if m.flags.fallback {
			// APISIX's own first answer (failing safe, §8.5): nothing was applied, or the
			// answer of a sync decided again whose outcome the header does not show
			m.landed = append(m.landed, d)
		}
	case status == http.StatusBadRequest:
		return fmt.Sprintf("a sync APISIX can take was rejected: %s", body)
	default: // confshim's own error while the data plane restarts: the outcome is unknown
		m.landed = append(m.landed, d)
	}
	return ""
}

// synced: d landed, and the sync showed confshim the operator's newest write.
func (m *contractModel) synced(d desired) {
	m.landed = []desired{d}
	if !m.lost {
		m.known, m.pending = m.op, nil
	}
}

// wrote: the operator wrote straight to the data plane.
func (m *contractModel) wrote() int {
	m.op++
	m.pending = append(m.pending, m.op)
	return m.op
}

// restarted: the data plane lost what confshim had not seen (or comes back with it).
func (m *contractModel) restarted() {
	m.newer = append(slices.Clone(m.newer), m.pending...)
	m.lost = true
}

// modelHook is what the wrap between confshim and the emulator does next.
type modelHook struct {
	oobBefore atomic.Int32 // 1: an out-of-band write before the next PUT, 2: before the next validate
	restartAt atomic.Bool  // a restart instead of the next PUT
	closeNext atomic.Int32 // answers left that announce Connection: close
	via       bool
	write     func() // the operator's write, from the wrap
	restart   func()
	fired     atomic.Bool
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
			if (isPut && h.oobBefore.CompareAndSwap(1, 0)) || (isValidate && h.oobBefore.CompareAndSwap(2, 0)) {
				h.write()
				h.fired.Store(true)
			}
			if isPut && h.restartAt.CompareAndSwap(true, false) {
				h.restart()
				h.fired.Store(true)
				return
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
		k.flags, k.seed, k.steps, k.seed, k.flags, fmt.Sprintf(format, a...), len(tr), strings.Join(tr, "\n  "), tail(k.s.logs.String(), 25))
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
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	res, err := k.client().Sync(ctx, d.config(k.flags.merge))
	cancel()
	status, body, sent, actions := 0, "", "", ""
	if err == nil {
		status, body, actions = res.Status, string(res.Body), res.Header.Get("X-Confshim-Actions")
		var doc map[string]json.RawMessage
		_ = json.Unmarshal(res.Sent, &doc)
		sent = fmt.Sprintf("secrets %.120s at %s", doc["secrets"], doc["secrets_conf_version"])
		if _, has := doc["secrets"]; !has {
			// a body without the secrets' items says nothing of them (ADC 0.30 never
			// sends secrets; ADC 0.28 echoes a cache filled from an empty data plane):
			// the client's secret stays as the last sync that carried it left it
			d.secret = k.m.landed[0].secret
		}
	}
	k.note("%s: %s sync %+v (%s) → %d %.160s", what, d.gen, d, sent, status, body)
	if msg := k.m.answered(d, status, body, actions); msg != "" {
		k.fail("%s", msg)
	}
	if status/100 == 2 || status == http.StatusBadRequest {
		if msg := k.m.check(k.s.em.Document()); msg != "" {
			k.fail("after a sync answered %d: %s", status, msg)
		}
	}
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
	switch n := k.rng.IntN(100); {
	case n < 30:
		k.want.variant = fmt.Sprintf("v%d", k.rng.IntN(50))
		k.sync("change")
	case n < 38:
		k.sync("same")
	case n < 45:
		k.want.bad = !k.want.bad
		k.sync("toggle the rejected route")
	case n < 50 && k.flags.merge:
		k.want.secret = k.rng.IntN(4) // none, or a token to add or change
		k.sync("the client's secret")
	case n < 62:
		k.operatorWrite()
		k.note("operator write %d", k.m.op)
		if k.rng.IntN(2) == 0 {
			k.sync("the instant after an operator write")
		}
	case n < 68:
		mode := int32(1 + k.rng.IntN(2))
		k.hook.fired.Store(false)
		k.hook.oobBefore.Store(mode)
		k.want.variant = fmt.Sprintf("v%d", k.rng.IntN(50))
		if k.flags.merge && k.rng.IntN(2) == 0 {
			k.want.secret = k.rng.IntN(4) // a merged union that changes
		}
		k.want.bad = k.flags.fallback && mode == 2 || k.want.bad
		k.sync(map[int32]string{1: "an operator write racing the PUT", 2: "an operator write during the fallback's validate"}[mode])
		k.hook.oobBefore.Store(0) // not fired when the sync sent no such request: nothing written
	case n < 72:
		k.leader = 1 - k.leader
		k.sync("leader change")
	case n < 76:
		k.hook.closeNext.Store(int32(1 + k.rng.IntN(3)))
		k.want.variant = fmt.Sprintf("v%d", k.rng.IntN(50))
		k.sync("answers that close their connection")
		k.hook.closeNext.Store(0)
	case n < 79:
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
	case n < 82 && !k.flags.via:
		k.restartDown = time.Duration(100+k.rng.IntN(400)) * time.Millisecond
		k.hook.fired.Store(false)
		k.hook.restartAt.Store(true)
		k.m.restarted()
		k.want.variant = fmt.Sprintf("v%d", k.rng.IntN(50))
		k.sync("a restart with the PUT in its socket")
		k.hook.restartAt.Store(false)
		k.eventually("after a restart inside a sync")
	case n < 85:
		k.note("data-plane restart, then a bypassCache sync at once")
		k.restartDataPlane()
		k.m.restarted()
		k.client().Invalidate()
		k.sync("bypassCache as the data plane returns")
		k.eventually("after a bypassCache sync")
	case n < 88:
		withDir := k.flags.merge || k.rng.IntN(2) == 0
		k.note("confshim restart (state dir %v)", withDir)
		k.restartConfshim(withDir)
		// memory only, the new process knows nothing until a sync lands: a data-plane
		// restart before that loses the operator's writes by design (§8.4), so the
		// client syncs first, as the soak does
		k.sync("first sync after a confshim restart")
	default:
		if msg := k.m.check(k.s.em.Document()); msg != "" {
			k.fail("at idle: %s", msg)
		}
	}
}

// runModel runs steps of one combination from seed.
func runModel(t *testing.T, flags modelFlags, seed uint64, steps int, budget time.Duration) int {
	hook := &modelHook{via: flags.via}
	var merge []string
	if flags.merge {
		merge = []string{"global_rules", "secrets"}
	}
	dp := apisixtest.Start(t, apisixtest.Options{Wrap: hook.wrap, Emulator: emulator.Options{AdminKey: adminKey, LoadTime: 30 * time.Millisecond}})
	s := &stack{em: dp.Emulator, logs: &syncBuffer{}, dp: dp, dpURL: dp.URL, timeout: 10 * time.Second,
		opts: stackOptions{merge: merge, fallback: flags.fallback, fallbackAnswer: flags.answer, trust: flags.trust,
			reseed: 20 * time.Millisecond, stateDir: t.TempDir(), adminKey: adminKey}}
	s.startProxy(t)
	k := &modelRun{t: t, flags: flags, seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), s: s, hook: hook,
		m: &contractModel{flags: flags}, want: desired{variant: "v0"}}
	hook.write = func() { k.operatorWrite(); k.note("operator write %d from the wrap", k.m.op) }
	hook.restart = func() {
		k.note("restart with the PUT in its socket")
		s.restartDataPlane(t, k.restartDown) // drawn before the sync: the wrap runs on another goroutine
	}
	k.clients = [2]*adcclient.Client{adcclient.New(s.proxyURL, adminKey), adcclient.New030(s.proxyURL, adminKey)}
	k.m.landed = []desired{{variant: "v0"}} // replaced by the first sync
	k.sync("first")
	start := time.Now()
	for k.steps < steps && time.Since(start) < budget {
		k.step()
	}
	return k.steps
}

// TestContractModel runs every combination for a fixed set of seeds (the CI set, a
// few seconds); MODEL_STEPS and MODEL_DURATION make it longer (make model), MODEL_SEED
// and MODEL_FLAGS replay one run.
func TestContractModel(t *testing.T) {
	steps, budget := 80, 3*time.Second
	if raceBuild {
		steps = 25 // -race -count=3 -cpu 1,2 runs the package six times within go test's 10 minutes
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
	for _, flags := range modelCombinations() {
		if f := os.Getenv("MODEL_FLAGS"); f != "" && f != flags.String() {
			continue
		}
		for _, seed := range seeds {
			t.Run(fmt.Sprintf("%s/seed=%d", flags, seed), func(t *testing.T) {
				total.Add(int64(runModel(t, flags, seed, steps, budget)))
			})
		}
	}
	t.Logf("%d steps over %d combinations, every check held", total.Load(), len(modelCombinations()))
}
