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

// fallback is what §8.5 needs, read-only after New.
type fallback struct {
	on     bool          // --fallback backfill
	budget time.Duration // how long a sync with fallback work may take (FallbackBudget)
	api    *apisix.Client
	rw     *rewrite.Rewriter
	states *stateReader
	send   sender
	notes  notes
}

// backfill is the fallback's work for one sync: the sync's scope under the lock.
type backfill struct {
	*fallback
	sc *scope
}

// of is the fallback of the sync in sc.
func (f *fallback) of(sc *scope) backfill { return backfill{f, sc} }

// rejectedPut is what the rounds start from: a decided PUT that APISIX answered 400.
type rejectedPut struct {
	out       outgoingPut
	res       *rewrite.Result
	in        rewrite.Input     // the body decided (its X-Digest as the client sent it, or a correction's)
	prepared  *rewrite.Prepared // and as scanned (nil: not scanned, never corrected)
	rejection []byte            // APISIX's 400
}

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

// correction is the rounds' work so far: the forwarded body's plan (split once, for
// every round), the accepted copies (read once, when the first item is held) and every
// item held.
type correction struct {
	plan     *rewrite.Plan
	accepted *rewrite.Accepted
	held     []dataplane.Held
}

// correct is called after APISIX answered a decided PUT 400; nil means the client
// gets that first answer. lost is a corrected PUT's transport error: it was sent and got
// no answer, so whether APISIX applied it is unknown.
func (b backfill) correct(rj rejectedPut) (fb *fallbackResult, lost error) {
	if !b.on || rj.res == nil || rj.prepared == nil || !rj.prepared.IsJSON() || !apisix.ItemLevel(rj.rejection) {
		return nil, nil
	}
	ctx, cancel := b.budgeted()
	defer cancel()
	forwarded, err := b.rw.Prepare(rj.out.body)
	if err != nil {
		return nil, nil
	}
	c := &correction{plan: rewrite.NewPlan(forwarded)}
	for round := 0; ; round++ {
		next, ok := b.nextCorrection(ctx, c, round, rj)
		if !ok {
			return nil, nil
		}
		ans, err := b.sendCorrected(ctx, c, rj.res, next)
		switch {
		case ans == nil:
			return nil, err
		case ans.Status/100 == 2:
			return b.appliedResult(ans, next, c), nil
		case !b.anotherRound(ans):
			return nil, nil
		}
		rj.rejection = ans.Body // 3.13/3.14: the next round names the next item
	}
}

// nextCorrection is one round's corrected PUT: the items APISIX rejects in it found,
// held (backfilled or left out) and the body spliced; false when the round cannot go
// on (APISIX did not say, the copies could not be read) and the first answer stands.
func (b backfill) nextCorrection(ctx context.Context, c *correction, round int, rj rejectedPut) (outgoingPut, bool) {
	found, ok := b.rejections(ctx, round, c.plan, rj.rejection)
	if !ok || len(found) == 0 {
		if round == 0 {
			b.notes.m.FallbackPut(metrics.FallbackUnavailable)
			b.notes.log.Info().Str("event", "fallback").Str("result", "unavailable").Msg("APISIX rejected an item but did not say which one; its answer goes to the client")
		} else {
			b.notes.m.FallbackPut(metrics.FallbackRejected)
		}
		return outgoingPut{}, false
	}
	if round > 0 { // APISIX counted in the corrected body: find the client's index
		for i := range found {
			found[i].Index = c.plan.OriginalIndex(found[i].Section, found[i].Index)
		}
	}
	if c.accepted == nil {
		var err error
		if c.accepted, err = b.acceptedCopies(ctx); err != nil {
			b.unavailable("the copies the data plane accepted could not be read", err)
			return outgoingPut{}, false
		}
	}
	b.refuseCopies(ctx, c.plan, c.accepted, found)
	c.held = mergeHeld(c.held, b.hold(c.plan, c.accepted, found))
	corrected, err := c.plan.Apply()
	if err != nil {
		return outgoingPut{}, false
	}
	return correctedPut(rj, corrected, c.held), true
}

// sendCorrected sends a round's corrected PUT when the deadline, the budget and the
// data plane allow; a nil answer ends the rounds (lost: see correct; a staleBelief:
// decide again).
func (b backfill) sendCorrected(ctx context.Context, c *correction, res *rewrite.Result, next outgoingPut) (*apisix.Answer, error) {
	if ctx.Err() != nil { // the deadline: nothing corrected was sent, the first answer stands
		b.unavailable("the PUT's deadline passed before the corrected PUT", ctx.Err())
		return nil, nil
	}
	if !b.affords("the corrected PUT") {
		return nil, nil // nothing corrected was sent: the first answer stands
	}
	v := b.sc.tx.View()
	if holds, err := b.states.stillHolds(ctx, b.sc.creds, v.Digest, v.LastModified, res.SendsUnion()); err != nil || !holds {
		return nil, staleBelief{} // APISIX closed the connection, and what it holds moved: decide again
	}
	ans, err := b.send.send(b.sc, apisix.Decide, next) // the PUT's own deadline: never cut by the budget
	if err != nil {
		b.notes.m.FallbackPut(metrics.FallbackUnavailable)
		if errors.Is(err, apisix.ErrRedial) || errors.Is(err, apisix.ErrConnectionHeld) {
			return nil, nil // never sent: the first answer stands
		}
		return nil, err
	}
	if apisix.IsConflict(ans) {
		// the belief the sync was decided on is stale (APISIX ≥ 3.15 checks items
		// before versions, so an out-of-band write shows only now): decide again,
		// holding what APISIX was found to reject before that PUT, without asking again
		b.notes.m.FallbackPut(metrics.FallbackRejected)
		return nil, staleBelief{carried: c.held}
	}
	return ans, nil
}

// appliedResult is the corrected PUT APISIX accepted (nil when its body cannot be scanned
// again: the first answer stands).
func (b backfill) appliedResult(ans *apisix.Answer, next outgoingPut, c *correction) *fallbackResult {
	prepared, err := b.rw.Prepare(next.body)
	if err != nil {
		return nil
	}
	b.notes.m.FallbackPut(metrics.FallbackApplied)
	return &fallbackResult{ans: ans, out: next, prepared: prepared, held: c.held, plan: c.plan, accepted: c.accepted}
}

// anotherRound: APISIX rejected the corrected PUT for an item it names on its own
// (3.13/3.14, no validate): the next round holds that one too. Otherwise the rounds end.
func (b backfill) anotherRound(ans *apisix.Answer) bool {
	if ans.Status == http.StatusBadRequest && !b.api.HasValidate() && apisix.ItemLevel(ans.Body) {
		return true
	}
	b.notes.m.FallbackPut(metrics.FallbackRejected)
	b.notes.log.Info().Str("event", "fallback").Str("result", "rejected").Int("status", ans.Status).Str("error", errorMessage(ans.Body)).
		Msg("APISIX rejected the corrected PUT too; its first answer goes to the client")
	return false
}

// rejections are the items APISIX rejects in this round: validate's answer (3.15+, the
// first round), or the PUT's own "invalid <key> at index <i>" message (3.13/3.14, one a
// round, at most maxPrefixRounds). ok is false when APISIX did not say.
func (b backfill) rejections(ctx context.Context, round int, plan *rewrite.Plan, respBody []byte) ([]rewrite.Rejection, bool) {
	if b.api.HasValidate() {
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
	if !b.api.HasValidate() {
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
		errs, ok := b.api.ValidateSection(ctx, b.sc.creds, section, raws)
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

// correctedPut is the corrected PUT: its body, and a digest of its own (another body
// than the client's, so APISIX never answers it 204 for the client's digest).
func correctedPut(rj rejectedPut, body []byte, held []dataplane.Held) outgoingPut {
	out := rj.out
	next := outgoingPut{body: body, digest: out.digest, setDigest: out.setDigest}
	if rj.in.HasDigest {
		base := out.digest
		if !out.setDigest {
			base = rj.in.Digest
		}
		next.digest, next.setDigest = base+"+backfill:"+correctionHash(held), true
	}
	return next
}

// afterRejection is §8.5 after APISIX answered a decided PUT 400: the corrected PUT that
// APISIX accepted (then, where held items now pass, the second one), or nil. Every
// answer was read whole, so each request finds its connection free. lost: see
// correct.
func (b backfill) afterRejection(rj rejectedPut) (*fallbackResult, error) {
	fb, lost := b.correct(rj)
	if fb == nil {
		return nil, lost
	}
	fb.changed = backfilledSections(fb.held)
	fb2, err := b.secondStep(fb, rj.res)
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
// write's, not a stranger's. carried: what a fallback of this sync held before it met
// the conflict, held again before the PUT decided anew without asking APISIX again.
type staleBelief struct {
	landed  bool
	carried []dataplane.Held
}

func (staleBelief) Error() string {
	return "the data plane's state moved under the sync; deciding again"
}

// unavailable counts and logs a fallback that could not go on: the client gets the last
// complete answer confshim has.
func (b backfill) unavailable(why string, err error) {
	b.notes.m.FallbackPut(metrics.FallbackUnavailable)
	b.notes.log.Info().Str("event", "fallback").Str("result", "unavailable").Str("error", apisix.SafeError(err)).
		Msg(why + "; the last complete answer goes to the client")
}

// allHeld is every item a PUT held back: before it (the steady state) and after
// APISIX rejected the corrected body (new items).
func allHeld(before []dataplane.Held, fb *fallbackResult) []dataplane.Held {
	if fb == nil {
		return before
	}
	return append(slices.Clip(before), fb.held...)
}

// validateItems asks APISIX which items of the sections the PUT carries it rejects,
// in pieces under its 1.5 MiB cap; false when it could not say. The plan's split of
// each section serves the correction too.
func (b backfill) validateItems(ctx context.Context, plan *rewrite.Plan) ([]rewrite.Rejection, bool) {
	var found []rewrite.Rejection
	for _, section := range plan.ItemSections() {
		items := plan.Items(section)
		if len(items) == 0 {
			continue
		}
		errs, ok := b.api.ValidateSection(ctx, b.sc.creds, section, rawItems(items))
		if !ok {
			return nil, false
		}
		found = append(found, errs...)
	}
	return found, true
}

// passes validates one item alone: true when APISIX answered and accepts it now.
func (b backfill) passes(ctx context.Context, section string, raw []byte) bool {
	errs, ok := b.api.ValidateSection(ctx, b.sc.creds, section, [][]byte{raw})
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
	now := time.Now()
	var held []dataplane.Held
	for _, h := range plan.Hold(found, accepted) {
		item := dataplane.Held{Section: h.Section, ID: h.ID, Error: clipString(h.Error, maxDebugMessage), Since: now, Backfilled: h.Backfilled,
			DependsOnState: apisix.StateDependent(h.Error),
			Sum:            b.rw.ItemFingerprint(h.Raw), Raw: h.Raw, Server: b.api.Server()}
		prev, seen := b.sc.tx.View().HeldItem(h.Section, h.ID)
		if seen && prev.Sum == item.Sum {
			item.Since = prev.Since // said when it was first held back
		} else {
			outcome := "left_out"
			if item.Backfilled {
				outcome = "backfilled"
			}
			b.notes.log.Warn().Str("event", "held_back").Str("section", rewrite.Clip(item.Section)).Str("id", rewrite.Clip(item.ID)).
				Str("outcome", outcome).Str("error", item.Error).Msg("APISIX rejects this item; the rest of the sync goes on without it")
		}
		held = append(held, item)
	}
	return held
}

// acceptedCopies are the copies of items the data plane last accepted: the kept
// configuration, else the data plane's own copy (read when not known).
func (b backfill) acceptedCopies(ctx context.Context) (*rewrite.Accepted, error) {
	v := b.sc.tx.View()
	switch {
	case v.Kept != nil:
		items := map[string][]byte{}
		for s, raw := range v.Kept.Items {
			items[s] = raw
		}
		return rewrite.NewAccepted(items), nil
	case v.State != nil && v.State.ItemsKnown:
		return rewrite.NewAccepted(v.State.Items), nil
	}
	st, _, _, err := b.states.readState(ctx, b.sc.creds)
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
func (f *fallback) correctionOf(client, corrected *rewrite.Prepared, held []dataplane.Held) *dataplane.Correction {
	c := &dataplane.Correction{Server: f.api.Server(), Sections: map[string]rewrite.SectionCorrection{}}
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
// the data plane holds is validated again, alone, and goes when it passes. client is
// the client's body as scanned, carried what a fallback of this sync held before it had
// to be decided again. It returns the corrected client body, or nil when nothing is held.
func (b backfill) steadyState(ctx context.Context, client *rewrite.Prepared, carried []dataplane.Held) ([]byte, []dataplane.Held) {
	known := b.knownHeld(carried)
	if !b.on || len(known) == 0 || client == nil || !client.IsJSON() {
		return nil, nil
	}
	sections := map[string]bool{}
	stateDependent := false
	for _, h := range known {
		sections[h.Section] = true
		stateDependent = stateDependent || h.DependsOnState
	}
	// The same client bytes of every held section as in the last sync, on the same
	// APISIX, nothing to validate again: the last correction serves as it is.
	if len(carried) == 0 {
		if corrected, held := b.reuseCorrection(client, sections, stateDependent); corrected != nil {
			return corrected, held
		}
	}
	plan := rewrite.NewPlan(client)
	found := b.stillRejected(ctx, plan, sections, known)
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

// stillRejected are the known held items the client sent again unchanged: each held
// section is split once (the plan keeps it for the correction) and its items matched
// by id and content (§8.1's identity: a re-stamped modifiedIndex does not count), so
// ADC's re-stamped syncs are held back the same. One rejected for what the data plane
// holds goes when it passes alone now.
func (b backfill) stillRejected(ctx context.Context, plan *rewrite.Plan, sections map[string]bool, known map[string]dataplane.Held) []rewrite.Rejection {
	var found []rewrite.Rejection
	for section := range sections {
		for i, it := range plan.Items(section) {
			h, ok := known[section+"\x00"+it.ID]
			if !ok || it.ID == "" || h.Server != b.api.Server() || h.Sum != b.rw.ItemFingerprint(it.Raw) {
				continue // changed, or another APISIX: it goes and APISIX judges it
			}
			if h.DependsOnState && b.passes(ctx, section, it.Raw) {
				continue // the conflict is gone: it lands now
			}
			found = append(found, rewrite.Rejection{Section: section, Index: i, Error: h.Error})
		}
	}
	return found
}

// knownHeld are the items known to be rejected, by section and id: those held back in
// the last accepted sync, and those a fallback of this sync held before it had to be
// decided again (these win).
func (b backfill) knownHeld(carried []dataplane.Held) map[string]dataplane.Held {
	if len(carried) == 0 {
		return b.sc.tx.View().Held
	}
	known := maps.Clone(b.sc.tx.View().Held)
	if known == nil {
		known = map[string]dataplane.Held{}
	}
	for _, h := range carried {
		known[h.Section+"\x00"+h.ID] = h
	}
	return known
}

// reuseCorrection is the correction made before the last accepted PUT, applied again
// when every held section carries the same client bytes on the same APISIX (and none
// waits for what the data plane holds): no split, no validate.
func (b backfill) reuseCorrection(client *rewrite.Prepared, sections map[string]bool, stateDependent bool) ([]byte, []dataplane.Held) {
	tx := b.sc.tx
	cached := tx.View().Correction
	if cached == nil || stateDependent || cached.Server != b.api.Server() {
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
	corrected, ok := client.Reapply(corrections)
	if !ok {
		return nil, nil
	}
	held := make([]dataplane.Held, 0, len(tx.View().Held))
	for _, h := range tx.View().Held {
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
	passed := b.awaitPassing(ctx, waiting)
	if passed == nil {
		return nil, nil
	}
	next, held, versions, ok := b.secondPut(fb, res, passed)
	if !ok {
		return nil, nil
	}
	if ctx.Err() != nil {
		b.unavailable("the PUT's deadline passed before the second PUT", ctx.Err())
		return nil, nil
	}
	if !b.affords("the second PUT") {
		return nil, nil
	}
	if holds, err := b.states.stillHolds(ctx, b.sc.creds, fb.ans.Header.Get("X-Digest"), fb.ans.Header.Get("X-Last-Modified"), res.SendsUnion()); err != nil || !holds {
		return nil, staleBelief{landed: true}
	}
	return b.sendSecond(next, held, versions, len(passed))
}

// awaitPassing validates the waiting items again, alone, until some pass (their ids,
// by section) or the window, the budget or the deadline ends (nil).
func (b backfill) awaitPassing(ctx context.Context, waiting []dataplane.Held) map[string]bool {
	deadline := time.Now().Add(secondStepWindow)
	if end := b.budgetEnd().Add(-b.sc.lent.took); end.Before(deadline) {
		deadline = end // the second PUT must still fit in the budget
	}
	for time.Now().Before(deadline) {
		ok := map[string]bool{}
		for _, h := range waiting {
			if b.passes(ctx, h.Section, h.Raw) {
				ok[h.Section+"\x00"+h.ID] = true
			}
		}
		if len(ok) > 0 {
			return ok
		}
		select {
		case <-ctx.Done():
			b.unavailable("the PUT's deadline passed while held items were validated again", ctx.Err())
			return nil
		case <-time.After(secondStepPause):
		}
	}
	if ctx.Err() != nil {
		b.unavailable("the PUT's deadline passed while held items were validated again", ctx.Err())
	}
	return nil
}

// secondPut is the forwarded body again, holding back only what still fails, the
// sections that change once more at a version above the corrected PUT's.
func (b backfill) secondPut(fb *fallbackResult, res *rewrite.Result, passed map[string]bool) (outgoingPut, []dataplane.Held, map[string]float64, bool) {
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
			if o.Section != h.Section {
				continue
			}
			if v, ok := rewrite.NextVersion(o.Version); ok {
				versions[h.Section] = v
			}
		}
	}
	held := b.hold(plan, fb.accepted, still)
	plan.Splice.Versions = versions
	body, err := plan.Apply()
	if err != nil {
		return outgoingPut{}, nil, nil, false
	}
	return outgoingPut{body: body, digest: fb.out.digest + "+2", setDigest: fb.out.setDigest}, held, versions, true
}

// sendSecond sends the second PUT; nil: the client gets the first corrected PUT's answer.
func (b backfill) sendSecond(next outgoingPut, held []dataplane.Held, versions map[string]float64, landed int) (*fallbackResult, error) {
	r2, err := b.send.send(b.sc, apisix.Decide, next)
	switch {
	case err != nil:
		// the second PUT got no answer: the state is read afresh next time (the second
		// may have landed)
		b.sc.tx.Forget()
		b.unavailable("the second PUT got no answer", err)
		return nil, nil
	case apisix.IsConflict(r2):
		return nil, staleBelief{landed: true}
	case r2.Status/100 != 2:
		return nil, nil
	}
	prepared, err := b.rw.Prepare(next.body)
	if err != nil {
		return nil, nil
	}
	b.notes.log.Info().Str("event", "fallback").Str("result", "second_put").Int("landed", landed).
		Msg("items rejected for what the data plane held passed once the rest was applied; sent in a second PUT")
	return &fallbackResult{ans: r2, out: next, prepared: prepared, held: held, versions: versions}, nil
}

// FallbackBudget is how long a sync with fallback work may take before its client is
// answered with what is known (§8.5): the controller gives ADC 15 s per sync.
const FallbackBudget = 10 * time.Second

// budgetEnd is when the sync's fallback work must stop, counted from its arrival.
func (b backfill) budgetEnd() time.Time { return b.sc.start.Add(b.budget) }

// budgeted is the PUT's context bounded by the fallback's budget, for what may be cut
// short without leaving an outcome unknown: validate calls, the waits between them.
func (b backfill) budgeted() (context.Context, context.CancelFunc) {
	return context.WithDeadline(b.sc.ctx, b.budgetEnd())
}

// affords: a PUT as long as the last one still fits in the budget; otherwise the client
// is answered with what is known, and nothing more is sent.
func (b backfill) affords(what string) bool {
	if time.Until(b.budgetEnd()) > b.sc.lent.took {
		return true
	}
	b.unavailable("the budget of a sync with fallback work ("+b.budget.String()+") ends before "+what, context.DeadlineExceeded)
	return false
}

// secondStepWindow and secondStepPause: how long and how often held items are
// validated again after the corrected PUT (APISIX's workers apply within about 1 s).
const (
	secondStepWindow = 2 * time.Second
	secondStepPause  = 200 * time.Millisecond
)
