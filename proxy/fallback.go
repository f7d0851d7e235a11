package proxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/internal/dataplane"
	"github.com/confshim/confshim/metrics"
	"github.com/confshim/confshim/rewrite"
)

// Fallback (contract §8.5, --fallback backfill): APISIX applies a PUT all or nothing, so
// one item it rejects would fail every sync. When APISIX answers a forwarded PUT 400 for
// an item, confshim asks it which items it rejects (POST /configs/validate, or on 3.13
// and 3.14 the PUT's own "invalid <key> at index <i>" message), replaces each by the copy
// of the same id the data plane last accepted or leaves it out (and any item of the PUT
// that refers to one left out), and forwards the corrected PUT once. If anything in
// that fails, the client gets APISIX's first answer unchanged.

// FallbackAnswer is --fallback-answer: what the client is told when items were held back.
type FallbackAnswer string

const (
	// AnswerRejection: APISIX's own rejection of a held item (400), while the rest of
	// the sync is applied, so that a controller reports exactly the held items.
	AnswerRejection FallbackAnswer = "rejection"
	// AnswerAccepted: APISIX's answer to the corrected PUT.
	AnswerAccepted FallbackAnswer = "accepted"
)

// ParseFallbackAnswer reads --fallback-answer.
func ParseFallbackAnswer(s string) (FallbackAnswer, error) {
	switch a := FallbackAnswer(s); a {
	case AnswerRejection, AnswerAccepted:
		return a, nil
	}
	return "", fmt.Errorf("want rejection or accepted, got %q", s)
}

// maxPrefixRounds bounds the rounds on 3.13/3.14, one held item per round.
const maxPrefixRounds = 8

// fallbackResult is the corrected PUT that APISIX accepted.
type fallbackResult struct {
	ans      *apisix.Answer
	out      outgoingPut
	prepared *rewrite.Prepared // the corrected body, for the kept configuration
	held     []dataplane.Held
	changed  []string           // sections whose content is a correction, not the client's decided copy
	versions map[string]float64 // a second step's versions (above the corrected PUT's)
	plan     *rewrite.Plan      // the correction of the forwarded body (a second step starts from it)
	accepted *rewrite.Accepted  // the accepted copies it was made with (and a second step too)
}

// correct is called after APISIX answered a decided PUT 400; nil means the client
// gets that first answer. lost is a corrected PUT's transport error: it was sent and got
// no answer, so whether APISIX applied it is unknown.
func (b backfill) correct(out outgoingPut, res *rewrite.Result, respBody []byte) (fb *fallbackResult, lost error) {
	pr := b.putRequest
	p := pr.p
	if !p.cfg.Fallback || res == nil || pr.prepared == nil || !pr.prepared.IsJSON() || !apisix.ItemLevel(respBody) {
		return nil, nil
	}
	ctx, cancel := b.budgeted()
	defer cancel()
	forwarded, err := p.rw.Prepare(out.body) // scanned once, for every round
	if err != nil {
		return nil, nil
	}
	var accepted *rewrite.Accepted // read once, when the first item is held
	plan := rewrite.NewPlan(forwarded)
	var held []dataplane.Held
	for round := 0; ; round++ {
		found, ok := b.rejections(ctx, round, plan, respBody)
		if !ok || len(found) == 0 {
			if round == 0 {
				p.m.FallbackPut(metrics.FallbackUnavailable)
				p.log.Info().Str("event", "fallback").Str("result", "unavailable").Msg("APISIX rejected an item but did not say which one; its answer goes to the client")
			} else {
				p.m.FallbackPut(metrics.FallbackRejected)
			}
			return nil, nil
		}
		if round > 0 { // APISIX counted in the corrected body: find the client's index
			for i := range found {
				found[i].Index = plan.OriginalIndex(found[i].Section, found[i].Index)
			}
		}
		if accepted == nil {
			if accepted, err = b.acceptedCopies(ctx); err != nil {
				b.unavailable("the copies the data plane accepted could not be read", err)
				return nil, nil
			}
		}
		b.refuseCopies(ctx, plan, accepted, found)
		held = mergeHeld(held, b.hold(plan, accepted, found))
		corrected, err := plan.Apply()
		if err != nil {
			return nil, nil
		}
		next := b.corrected(out, corrected, held)
		if ctx.Err() != nil { // the deadline: nothing corrected was sent, the first answer stands
			b.unavailable("the PUT's deadline passed before the corrected PUT", ctx.Err())
			return nil, nil
		}
		if !b.affords("the corrected PUT") {
			return nil, nil // nothing corrected was sent: the first answer stands
		}
		if holds, err := p.stillHolds(ctx, pr.creds, pr.tx.Digest(), pr.tx.LastModified(), res.SendsUnion()); err != nil || !holds {
			return nil, staleBelief{} // APISIX closed the connection, and what it holds moved: decide again
		}
		r2, done, err := b.timedPut(next) // the PUT's own deadline: never cut by the budget
		pr.sent = append(pr.sent, done)
		if err != nil {
			p.m.FallbackPut(metrics.FallbackUnavailable)
			if errors.Is(err, apisix.ErrRedial) || errors.Is(err, apisix.ErrConnectionHeld) {
				return nil, nil // never sent: the first answer stands
			}
			return nil, err
		}
		if apisix.IsConflict(r2) {
			// the belief the sync was decided on is stale (APISIX ≥ 3.15 checks items
			// before versions, so an out-of-band write shows only now): decide again,
			// holding what APISIX was found to reject before that PUT, without asking again
			p.m.FallbackPut(metrics.FallbackRejected)
			pr.carried = held
			return nil, staleBelief{}
		}
		if r2.Status/100 == 2 {
			prepared, err := p.rw.Prepare(corrected)
			if err != nil {
				return nil, nil
			}
			p.m.FallbackPut(metrics.FallbackApplied)
			return &fallbackResult{ans: r2, out: next, prepared: prepared, held: held, plan: plan, accepted: accepted}, nil
		}
		if r2.Status != http.StatusBadRequest || p.api.HasValidate() || !apisix.ItemLevel(r2.Body) {
			p.m.FallbackPut(metrics.FallbackRejected)
			p.log.Info().Str("event", "fallback").Str("result", "rejected").Int("status", r2.Status).Str("error", errorMessage(r2.Body)).
				Msg("APISIX rejected the corrected PUT too; its first answer goes to the client")
			return nil, nil
		}
		respBody = r2.Body // 3.13/3.14: the next round names the next item
	}
}

// rejections are the items APISIX rejects in this round: validate's answer (3.15+, the
// first round), or the PUT's own "invalid <key> at index <i>" message (3.13/3.14, one a
// round, at most maxPrefixRounds). ok is false when APISIX did not say.
func (b backfill) rejections(ctx context.Context, round int, plan *rewrite.Plan, respBody []byte) ([]rewrite.Rejection, bool) {
	pr := b.putRequest
	if pr.p.api.HasValidate() {
		if round > 0 {
			return nil, false
		}
		return b.validateItems(ctx, plan)
	}
	r, ok := apisix.PutRejection(respBody)
	if !ok || round >= maxPrefixRounds {
		return nil, false
	}
	return []rewrite.Rejection{r}, true
}

// refuseCopies asks the data plane (validate, 3.15+) whether it takes the accepted
// copies the rejected items would be backfilled with: a copy it refuses too (a key
// another consumer now holds, on 3.18) would fail the corrected PUT the same way, so
// its item is left out instead. One validate call per section with copies to check.
func (b backfill) refuseCopies(ctx context.Context, plan *rewrite.Plan, accepted *rewrite.Accepted, found []rewrite.Rejection) {
	pr := b.putRequest
	if !pr.p.api.HasValidate() {
		return // 3.13/3.14: the next round's message names a refused copy
	}
	ids, copies := map[string][]string{}, map[string][][]byte{}
	for _, r := range found {
		items := plan.Items(r.Section)
		if r.Index < 0 || r.Index >= len(items) || items[r.Index].ID == "" {
			continue
		}
		if raw, ok := accepted.Lookup(r.Section, items[r.Index].ID); ok {
			ids[r.Section] = append(ids[r.Section], items[r.Index].ID)
			copies[r.Section] = append(copies[r.Section], raw)
		}
	}
	for section, raws := range copies {
		errs, ok := pr.p.api.ValidateSection(ctx, pr.creds, section, raws)
		if !ok {
			continue // unknown: the corrected PUT tells
		}
		for _, e := range errs {
			if e.Index >= 0 && e.Index < len(ids[section]) {
				accepted.Refuse(section, ids[section][e.Index])
			}
		}
	}
}

// mergeHeld adds the newly held items, an item held again (its copy refused: now left
// out) replacing its earlier entry.
func mergeHeld(held, more []dataplane.Held) []dataplane.Held {
	for _, h := range more {
		i := slices.IndexFunc(held, func(o dataplane.Held) bool { return o.Section == h.Section && o.ID == h.ID })
		if i >= 0 {
			held[i] = h
			continue
		}
		held = append(held, h)
	}
	return held
}

// corrected is the corrected PUT: its body, and a digest of its own (another body than
// the client's, so APISIX never answers it 204 for the client's digest).
func (b backfill) corrected(out outgoingPut, body []byte, held []dataplane.Held) outgoingPut {
	pr := b.putRequest
	next := outgoingPut{body: body, digest: out.digest, setDigest: out.setDigest}
	if pr.in.HasDigest {
		base := out.digest
		if !out.setDigest {
			base = pr.in.Digest
		}
		next.digest, next.setDigest = base+"+backfill:"+correctionHash(held), true
	}
	return next
}

// afterRejection is §8.5 after APISIX answered a decided PUT 400: the corrected PUT that
// APISIX accepted (then, where held items now pass, the second one), or nil. Every
// answer was read whole, so each request finds its connection free. lost: see
// correct.
func (b backfill) afterRejection(out outgoingPut, res *rewrite.Result, respBody []byte) (*fallbackResult, error) {
	fb, lost := b.correct(out, res, respBody)
	if fb == nil {
		return nil, lost
	}
	fb.changed = backfilledSections(fb.held)
	fb2, err := b.secondStep(fb, res)
	if err != nil {
		return nil, err
	}
	if fb2 != nil {
		fb2.changed = fb.changed
		fb = fb2
	}
	return fb, nil
}

// staleBelief: a PUT sent for the client met a version conflict (or the data plane
// moved while its connection closed): the belief the sync was decided on is stale, and
// the whole sync is decided again on a fresh read (§5.4, §8.5). landed: a corrected
// PUT of this sync was applied before, so the versions confshim believed are its own
// write's, not a stranger's.
type staleBelief struct{ landed bool }

func (staleBelief) Error() string {
	return "the data plane's state moved under the sync; deciding again"
}

// unavailable counts and logs a fallback that could not go on: the client gets the last
// complete answer confshim has.
func (b backfill) unavailable(why string, err error) {
	pr := b.putRequest
	pr.p.m.FallbackPut(metrics.FallbackUnavailable)
	pr.p.log.Info().Str("event", "fallback").Str("result", "unavailable").Str("error", apisix.SafeError(err)).
		Msg(why + "; the last complete answer goes to the client")
}

// allHeld is every item this PUT held back: before it (the steady state) and after
// APISIX rejected the corrected body (new items).
func (b backfill) allHeld(fb *fallbackResult) []dataplane.Held {
	pr := b.putRequest
	if fb == nil {
		return pr.heldUpfront
	}
	return append(slices.Clip(pr.heldUpfront), fb.held...)
}

// validateItems asks APISIX which items of the sections the PUT carries it rejects,
// in pieces under its 1.5 MiB cap; false when it could not say. The plan's split of
// each section serves the correction too.
func (b backfill) validateItems(ctx context.Context, plan *rewrite.Plan) ([]rewrite.Rejection, bool) {
	pr := b.putRequest
	var found []rewrite.Rejection
	for _, section := range plan.ItemSections() {
		items := plan.Items(section)
		if len(items) == 0 {
			continue
		}
		errs, ok := pr.p.api.ValidateSection(ctx, pr.creds, section, rawItems(items))
		if !ok {
			return nil, false
		}
		found = append(found, errs...)
	}
	return found, true
}

// passes validates one item alone: true when APISIX answered and accepts it now.
func (b backfill) passes(ctx context.Context, section string, raw []byte) bool {
	pr := b.putRequest
	errs, ok := pr.p.api.ValidateSection(ctx, pr.creds, section, [][]byte{raw})
	return ok && len(errs) == 0
}

func rawItems(items []rewrite.Item) [][]byte {
	out := make([][]byte, len(items))
	for i, it := range items {
		out[i] = it.Raw
	}
	return out
}

// hold adds the rejected items to the plan (rewrite.Plan.Hold: backfilled or left out,
// and what they strand), and keeps for each what the next syncs need: its content's
// fingerprint, since when, on which APISIX. It says each newly held item once.
func (b backfill) hold(plan *rewrite.Plan, accepted *rewrite.Accepted, found []rewrite.Rejection) []dataplane.Held {
	pr := b.putRequest
	now := time.Now()
	var held []dataplane.Held
	for _, h := range plan.Hold(found, accepted) {
		item := dataplane.Held{Section: h.Section, ID: h.ID, Error: clipString(h.Error, maxDebugMessage), Since: now, Backfilled: h.Backfilled,
			DependsOnState: apisix.StateDependent(h.Error),
			Sum:            pr.p.rw.ItemFingerprint(h.Raw), Raw: h.Raw, Server: pr.p.api.Server()}
		prev, seen := pr.tx.HeldItem(h.Section, h.ID)
		if seen && prev.Sum == item.Sum {
			item.Since = prev.Since // said when it was first held back
		} else {
			outcome := "left_out"
			if item.Backfilled {
				outcome = "backfilled"
			}
			pr.p.log.Warn().Str("event", "held_back").Str("section", rewrite.Clip(item.Section)).Str("id", rewrite.Clip(item.ID)).
				Str("outcome", outcome).Str("error", item.Error).Msg("APISIX rejects this item; the rest of the sync goes on without it")
		}
		held = append(held, item)
	}
	return held
}

// acceptedCopies are the copies of items the data plane last accepted: the kept
// configuration, else the data plane's own copy (read when not known).
func (b backfill) acceptedCopies(ctx context.Context) (*rewrite.Accepted, error) {
	pr := b.putRequest
	p := pr.p
	switch {
	case pr.tx.Kept() != nil:
		items := map[string][]byte{}
		for s, raw := range pr.tx.Kept().Items {
			items[s] = raw
		}
		return rewrite.NewAccepted(items), nil
	case pr.tx.State() != nil && pr.tx.State().ItemsKnown:
		return rewrite.NewAccepted(pr.tx.State().Items), nil
	}
	st, _, _, err := p.readState(ctx, pr.creds)
	if err != nil {
		return nil, err
	}
	return rewrite.NewAccepted(st.Items), nil
}

// correctionHash makes the corrected PUT's digest differ from the client's body's.
func correctionHash(held []dataplane.Held) string {
	keys := make([]string, len(held))
	for i, h := range held {
		keys[i] = h.Section + "\x00" + h.ID + "\x00" + strconv.FormatBool(h.Backfilled)
	}
	slices.Sort(keys)
	sum := sha256.Sum256([]byte(strings.Join(keys, "\n")))
	return hex.EncodeToString(sum[:8])
}

// correctionOf is the correction of an accepted pre-held sync, kept for the same client
// bytes next time (nil when a held section cannot be kept so).
func (p *Proxy) correctionOf(client, corrected *rewrite.Prepared, held []dataplane.Held) *dataplane.Correction {
	c := &dataplane.Correction{Server: p.api.Server(), Sections: map[string]rewrite.SectionCorrection{}}
	for _, section := range backfilledSections(held) {
		sum, ok := client.SectionSum(section)
		items, _ := corrected.JSONItems(section)
		if !ok || items == nil {
			return nil
		}
		c.Sections[section] = rewrite.SectionCorrection{ClientSum: sum, Items: bytes.Clone(items)}
	}
	return c
}

// steadyState is the steady state of §8.5: before the PUT, an item held back in the last
// accepted sync and sent again byte for byte is held back again — with no failed round
// trip and no validate call while APISIX's version is unchanged; one rejected for what
// the data plane holds is validated again, alone, and goes when it passes. It returns
// the corrected client body, or nil when nothing is held.
func (b backfill) steadyState(ctx context.Context) ([]byte, []dataplane.Held) {
	pr := b.putRequest
	p := pr.p
	known := b.knownHeld()
	if !p.cfg.Fallback || len(known) == 0 || pr.prepared == nil || !pr.prepared.IsJSON() {
		return nil, nil
	}
	var found []rewrite.Rejection
	sections := map[string]bool{}
	stateDependent := false
	for _, h := range known {
		sections[h.Section] = true
		stateDependent = stateDependent || h.DependsOnState
	}
	// The same client bytes of every held section as in the last sync, on the same
	// APISIX, nothing to validate again: the last correction serves as it is.
	if len(pr.carried) == 0 {
		if corrected, held := b.reuseCorrection(sections, stateDependent); corrected != nil {
			return corrected, held
		}
	}
	// Otherwise each held section is split once (the plan keeps it for the correction)
	// and its items matched by id and content (§8.1's identity: a re-stamped
	// modifiedIndex does not count), so ADC's re-stamped syncs are held back the same.
	plan := rewrite.NewPlan(pr.prepared)
	for section := range sections {
		for i, it := range plan.Items(section) {
			h, ok := known[section+"\x00"+it.ID]
			if !ok || it.ID == "" || h.Server != p.api.Server() || h.Sum != p.rw.ItemFingerprint(it.Raw) {
				continue // changed, or another APISIX: it goes and APISIX judges it
			}
			if h.DependsOnState && b.passes(ctx, section, it.Raw) {
				continue // the conflict is gone: it lands now
			}
			found = append(found, rewrite.Rejection{Section: section, Index: i, Error: h.Error})
		}
	}
	if len(found) == 0 {
		return nil, nil
	}
	accepted, err := b.acceptedCopies(ctx)
	if err != nil {
		return nil, nil
	}
	for _, h := range known {
		if !h.Backfilled {
			accepted.Refuse(h.Section, h.ID) // left out last time: its copy is no use
		}
	}
	held := b.hold(plan, accepted, found)
	corrected, err := plan.Apply()
	if err != nil {
		return nil, nil
	}
	return corrected, held
}

// knownHeld are the items known to be rejected, by section and id: those held back in
// the last accepted sync, and those a fallback of this sync held before it had to be
// decided again (these win).
func (b backfill) knownHeld() map[string]dataplane.Held {
	pr := b.putRequest
	if len(pr.carried) == 0 {
		return pr.tx.HeldBack()
	}
	known := maps.Clone(pr.tx.HeldBack())
	if known == nil {
		known = map[string]dataplane.Held{}
	}
	for _, h := range pr.carried {
		known[h.Section+"\x00"+h.ID] = h
	}
	return known
}

// reuseCorrection is the correction made before the last accepted PUT, applied again
// when every held section carries the same client bytes on the same APISIX (and none
// waits for what the data plane holds): no split, no validate.
func (b backfill) reuseCorrection(sections map[string]bool, stateDependent bool) ([]byte, []dataplane.Held) {
	pr := b.putRequest
	p := pr.p
	cached := pr.tx.Correction()
	if cached == nil || stateDependent || cached.Server != p.api.Server() {
		return nil, nil
	}
	corrections := make(map[string]rewrite.SectionCorrection, len(sections))
	for section := range sections {
		c, have := cached.Sections[section]
		if !have {
			return nil, nil
		}
		corrections[section] = c
	}
	corrected, ok := pr.prepared.Reapply(corrections)
	if !ok {
		return nil, nil
	}
	held := make([]dataplane.Held, 0, len(pr.tx.HeldBack()))
	for _, h := range pr.tx.HeldBack() {
		held = append(held, h)
	}
	return corrected, held
}

// secondStep lands, within the same sync, held items that were rejected for what the
// data plane held (a plugin moved from one global rule to another): once the corrected
// PUT is applied they pass. APISIX checks against what its workers have applied, which
// follows a 202 by up to about a second, so validation is retried for up to 2 s. It
// returns the second PUT's result, or nil.
func (b backfill) secondStep(fb *fallbackResult, res *rewrite.Result) (*fallbackResult, error) {
	pr := b.putRequest
	p := pr.p
	var waiting []dataplane.Held
	for _, h := range fb.held {
		if h.DependsOnState {
			waiting = append(waiting, h)
		}
	}
	if len(waiting) == 0 {
		return nil, nil
	}
	ctx, cancel := b.budgeted()
	defer cancel()
	deadline := time.Now().Add(secondStepWindow)
	if end := b.budgetEnd().Add(-pr.putTook); end.Before(deadline) {
		deadline = end // the second PUT must still fit in the budget
	}
	var passed map[string]bool
	for passed == nil && time.Now().Before(deadline) {
		ok := map[string]bool{}
		for _, h := range waiting {
			if b.passes(ctx, h.Section, h.Raw) {
				ok[h.Section+"\x00"+h.ID] = true
			}
		}
		if len(ok) > 0 {
			passed = ok
			break
		}
		select {
		case <-ctx.Done():
			b.unavailable("the PUT's deadline passed while held items were validated again", ctx.Err())
			return nil, nil
		case <-time.After(secondStepPause):
		}
	}
	if passed == nil {
		if ctx.Err() != nil {
			b.unavailable("the PUT's deadline passed while held items were validated again", ctx.Err())
		}
		return nil, nil
	}
	// the forwarded body again, holding back only what still fails, the sections that
	// change once more at a version above the corrected PUT's
	plan := fb.plan.Fresh() // the forwarded body, split once already
	var still []rewrite.Rejection
	versions := map[string]float64{}
	for _, h := range fb.held {
		if !passed[h.Section+"\x00"+h.ID] {
			if i := plan.IndexOf(h.Section, h.ID); i >= 0 {
				still = append(still, rewrite.Rejection{Section: h.Section, Index: i, Error: h.Error})
			}
			continue
		}
		for _, o := range res.Outcomes() {
			if o.Section == h.Section {
				if v, ok := rewrite.NextVersion(o.Version); ok {
					versions[h.Section] = v
				}
			}
		}
	}
	held := b.hold(plan, fb.accepted, still)
	plan.Splice.Versions = versions
	body, err := plan.Apply()
	if err != nil {
		return nil, nil
	}
	if ctx.Err() != nil {
		b.unavailable("the PUT's deadline passed before the second PUT", ctx.Err())
		return nil, nil
	}
	if !b.affords("the second PUT") {
		return nil, nil
	}
	next := outgoingPut{body: body, digest: fb.out.digest + "+2", setDigest: fb.out.setDigest}
	if holds, err := p.stillHolds(ctx, pr.creds, fb.ans.Header.Get("X-Digest"), fb.ans.Header.Get("X-Last-Modified"), res.SendsUnion()); err != nil || !holds {
		return nil, staleBelief{landed: true}
	}
	r2, done, err := b.timedPut(next)
	pr.sent = append(pr.sent, done)
	if err != nil {
		// the second PUT got no answer: the client gets the first corrected PUT's, and
		// the state is read afresh next time (the second may have landed)
		pr.tx.Forget()
		b.unavailable("the second PUT got no answer", err)
		return nil, nil
	}
	if apisix.IsConflict(r2) {
		return nil, staleBelief{landed: true}
	}
	if r2.Status/100 != 2 {
		return nil, nil
	}
	prepared, err := p.rw.Prepare(body)
	if err != nil {
		return nil, nil
	}
	p.log.Info().Str("event", "fallback").Str("result", "second_put").Int("landed", len(passed)).
		Msg("items rejected for what the data plane held passed once the rest was applied; sent in a second PUT")
	return &fallbackResult{ans: r2, out: next, prepared: prepared, held: held, versions: versions}, nil
}

// backfill is §8.5 for one configs PUT: the steady state (items known to be rejected,
// held before the PUT), the rounds after APISIX rejected it, the corrected PUT, the
// second step, all within the budget. It works on the PUT it belongs to.
type backfill struct{ *putRequest }

// backfill is the PUT's fallback.
func (pr *putRequest) backfill() backfill { return backfill{pr} }

// FallbackBudget is how long a sync with fallback work may take before its client is
// answered with what is known (§8.5): the controller gives ADC 15 s per sync.
const FallbackBudget = 10 * time.Second

// budgetEnd is when the sync's fallback work must stop, counted from its arrival.
func (b backfill) budgetEnd() time.Time {
	pr := b.putRequest
	return pr.start.Add(pr.p.cfg.FallbackBudget)
}

// budgeted is the PUT's context bounded by the fallback's budget, for what may be cut
// short without leaving an outcome unknown: validate calls, the waits between them.
func (b backfill) budgeted() (context.Context, context.CancelFunc) {
	pr := b.putRequest
	return context.WithDeadline(pr.ctx, b.budgetEnd())
}

// affords: a PUT as long as the last one still fits in the budget; otherwise the client
// is answered with what is known, and nothing more is sent.
func (b backfill) affords(what string) bool {
	pr := b.putRequest
	if time.Until(b.budgetEnd()) > pr.putTook {
		return true
	}
	b.unavailable("the budget of a sync with fallback work ("+pr.p.cfg.FallbackBudget.String()+") ends before "+what, context.DeadlineExceeded)
	return false
}

// timedPut sends a PUT of this sync on the decide connection, under the PUT's own
// deadline, and keeps how long it took (the next PUT is expected to take as long).
func (b backfill) timedPut(out outgoingPut) (*apisix.Answer, <-chan struct{}, error) {
	pr := b.putRequest
	start := time.Now()
	ans, done, err := pr.p.forwardPut(apisix.NoRedial(pr.ctx), apisix.Decide, pr.r, out)
	pr.putTook = time.Since(start)
	return ans, done, err
}

// secondStepWindow and secondStepPause: how long and how often held items are
// validated again after the corrected PUT (APISIX's workers apply within about 1 s).
const (
	secondStepWindow = 2 * time.Second
	secondStepPause  = 200 * time.Millisecond
)

// noteLastHeld shows the items held back in the last accepted sync: metrics, /debug/config
// (the belief recorded them with the answer).
func (p *Proxy) noteLastHeld(held []dataplane.Held) {
	if !p.cfg.Fallback {
		return
	}
	counts := map[string]int{}
	for _, h := range held {
		counts[metrics.SectionLabel(h.Section)]++
		p.m.SectionRewrites.WithLabelValues(metrics.SectionLabel(h.Section), string(rewrite.Backfilled)).Inc()
	}
	for _, s := range append(slices.Clone(rewrite.KnownSections), "other") {
		p.m.HeldBackItems.WithLabelValues(s).Set(float64(counts[s]))
	}
	p.debug.setHeld(held)
}
