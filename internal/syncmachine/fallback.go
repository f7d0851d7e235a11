package syncmachine

import (
	"errors"
	"net/http"
	"slices"
	"time"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/internal/dataplane"
	"github.com/confshim/confshim/metrics"
	"github.com/confshim/confshim/rewrite"
)

// After the PUT: an accepted answer is recorded (one transition) and, when it held
// items back that wait for what the data plane holds, the second step looks for them;
// a version conflict, or a data plane that moved under a fallback, decides the whole
// sync again once (§5.4); a closed decide connection redials at most maxRedials times;
// a 400 for an item starts the fallback's rounds (§8.5, --fallback backfill): APISIX
// is asked which items it rejects, each is replaced by its accepted copy or left out,
// and the corrected PUT is sent once. What cannot go on ends on the last complete
// answer.

// putAnswered is APISIX's answer to a decided PUT (or its absence).
func (s *Sync) putAnswered(ev Event) Action {
	s.took = ev.Took
	if ev.Err != nil {
		return s.putLost(ev)
	}
	ans := ev.Answer
	switch {
	case apisix.IsConflict(ans):
		return s.moved(ans, nil)
	case ans.Status/100 == 2:
		return s.accepted(ans, s.decidedOutcome(ans), s.round.sent)
	}
	s.refused(ans)
	if s.second.deciding {
		return s.end(nil) // the second PUT refused: the sync ends on what it applied
	}
	if apisix.IsDictFull(ans) {
		return s.tooBig(s.round.sent)
	}
	s.rejection = ans
	if s.fallbackApplies(ans) {
		return s.startFallback(ans)
	}
	return s.end(ans)
}

// putLost: a decided PUT got no answer. The connection its state was read on closed (a
// restarting data plane, most likely): whatever happened to the PUT, a fresh read
// shows it, and the decision taken on it is the right one either way.
func (s *Sync) putLost(ev Event) Action {
	r := &s.round
	switch {
	case s.second.deciding && neverSent(ev.Err):
		return s.end(nil) // the sync ends on what it applied
	case s.second.deciding:
		// whether APISIX applied it is unknown: confshim believes nothing and says so
		// (the first PUT, the rest of the sync, is applied)
		s.tx.Forget()
		return s.fail(Failure{Kind: FailUpstream, Err: ev.Err, What: "the second PUT of --fallback backfill (APISIX may have applied it; the rest of the sync is applied)"})
	case r.res != nil && r.untouched == "" && s.redials < maxRedials && (errors.Is(ev.Err, apisix.ErrRedial) || ev.Broke):
		s.redials++
		s.tx.Forget() // the PUT may have landed: what the read shows is not a stranger's
		s.note(Note{Kind: NoteRedial, Err: ev.Err})
		return s.to(phaseReturn, AwaitReturn{Until: s.in.Start.Add(restartPatience)})
	}
	return s.fail(Failure{Kind: FailUpstream, Err: ev.Err, What: "PUT " + apisix.ConfigsPath})
}

// neverSent: the PUT did not leave confshim (the decide connection it must go on had
// closed, or was still held by an unread answer).
func neverSent(err error) bool {
	return errors.Is(err, apisix.ErrRedial) || errors.Is(err, apisix.ErrConnectionHeld)
}

// decidedOutcome is what an accepted decided PUT tells the belief.
func (s *Sync) decidedOutcome(ans *apisix.Answer) dataplane.Outcome {
	o := s.outcome(ans, s.body.prepared, s.body.held)
	o.NoOp = s.round.sent.NoOp
	if len(s.body.held) > 0 && s.body.prepared != nil && s.in.Prepared != nil {
		o.Correction = rewrite.CorrectionOf(s.in.Prepared, s.body.prepared, s.body.held, s.conn.Server)
	}
	return o
}

func (s *Sync) outcome(ans *apisix.Answer, took *rewrite.Prepared, held []HeldItem) dataplane.Outcome {
	res := s.round.res
	if s.round.untouched != "" {
		res = nil
	}
	return dataplane.Outcome{Status: ans.Status, Digest: ans.Header.Get("X-Digest"), LastModified: ans.Header.Get("X-Last-Modified"),
		Res: res, Prepared: took, Conn: s.conn.ID, Fallback: s.cfg.Fallback, Held: held}
}

// refused records an answer that applied nothing (the belief stops trusting the
// connection: the next sync looks first).
func (s *Sync) refused(ans *apisix.Answer) {
	s.tx.Answered(dataplane.Outcome{Status: ans.Status})
}

// accepted records a PUT APISIX accepted — the belief's one transition for it — and
// what the client's answer is drawn from; then the second step, when held items wait
// for what the data plane holds.
func (s *Sync) accepted(ans *apisix.Answer, o dataplane.Outcome, sent Outgoing) Action {
	v := s.tx.View()
	t := Touched{Held: o.Held}
	if ans.Status != http.StatusNoContent { // a 204 took nothing from the body
		t.Before, t.DecidedOn, t.Res, t.After = v.KeptState(), s.round.in.State, o.Res, o.Prepared
	}
	s.touched = append(s.touched, t)
	s.tiesLost = nil // a PUT decided again was accepted: it carries the change
	for _, m := range s.tx.Answered(o) {
		s.note(Note{Kind: NoteUnowned, Merge: m})
	}
	s.applied = &appliedPut{answer: ans, res: o.Res, sent: sent, prepared: o.Prepared, held: o.Held}
	s.second.deciding = false
	if ans.Status != http.StatusNoContent && o.Res.SentAtATie() {
		if s.fallbackWork() && !s.affords("reading back a section sent at the data plane's version + 1") {
			return s.tieUnverified(ErrTieBudget)
		}
		return s.to(phaseTie, Read{Until: s.readBackUntil()})
	}
	return s.afterAccepted()
}

// ErrTieBudget: the budget of a sync with fallback work left no time to read back.
var ErrTieBudget = errors.New("the budget of a sync with fallback work ended before the read-back")

// fallbackWork: the sync did §8.5's work (rounds, a hold before the PUT, the second
// step), so it is answered within its budget.
func (s *Sync) fallbackWork() bool {
	return s.fb != nil || s.second.taken || len(s.body.held) > 0 || len(s.carried) > 0
}

// readBackUntil bounds the read-back: by the budget in a sync with fallback work,
// else by the PUT's deadline (zero: the driver's own).
func (s *Sync) readBackUntil() time.Time {
	if s.fallbackWork() {
		return s.budgetEnd()
	}
	return time.Time{}
}

// tieUnverified ends a sync whose accepted PUT could not be read back (see tieRead).
func (s *Sync) tieUnverified(err error) Action {
	ties := s.applied.res.TiedSections()
	s.tx.TieLost(ties, nil, "", "")
	changes := make([]rewrite.Change, len(ties))
	for i, t := range ties {
		changes[i] = rewrite.Change{Section: t}
	}
	return s.fail(Failure{Kind: FailTieUnverified, Err: err, Applied: true, Ties: changes})
}

// tieRead: the data plane's state after a PUT that sent a changed section at vS+1. A
// writer's read-modify-write of the same state picks that version too, and APISIX
// keeps what it holds at an equal version: where the read shows the writer's copy
// there, the client's change did not land, so the sync is decided again on this read
// (once, as after a version conflict; §5.4), the change bumped above the writer's. A
// read that fails (or that a sync with fallback work has no budget left for) leaves the
// 2xx unproven: the client is told the PUT was applied and could not be read back, and
// the record vouches no more for those sections, so the next sync compares them.
func (s *Sync) tieRead(ev Event) Action {
	a := s.applied
	if ev.Err != nil {
		if s.fallbackWork() && !s.now.Before(s.budgetEnd()) {
			ev.Err = ErrTieBudget // the read-back was cut where the budget ends, not by APISIX
		}
		return s.tieUnverified(ev.Err)
	}
	s.recordRead(ev.Read)
	lost, err := s.cfg.Rewriter.LostTies(a.res, a.sent.Body, ev.Read.State)
	if err != nil || len(lost) == 0 {
		return s.afterAccepted()
	}
	sections, moves := make([]string, len(lost)), make([]dataplane.Move, len(lost))
	for i, c := range lost {
		sections[i], moves[i] = c.Section, dataplane.Move{Section: c.Section, From: c.From, To: c.To}
	}
	s.tx.TieLost(sections, ev.Read.State, ev.Read.Digest, ev.Read.LastModified)
	s.note(Note{Kind: NoteMoves, Moves: moves, How: learntByTie})
	// the sync's answer is no longer this PUT's: until a PUT decided again is accepted,
	// it ends on the loss (FailTieLost, in end), the rest applied
	s.tiesLost, s.earlier = lost, append(s.earlier, a.res)
	if s.conflicted {
		return s.fail(Failure{Kind: FailTieLost, Ties: lost, Applied: true})
	}
	s.conflicted = true // the decision again avoids a tie (Input.AvoidTies): no second read-back
	s.note(Note{Kind: NoteConflictRetry})
	if len(a.held) > 0 {
		s.carried, s.holdAgain = a.held, true
	}
	s.applied, s.fb, s.second.deciding = nil, nil, false
	s.round = round{fresh: true, state: ev.Read.State, proven: true}
	return s.stateKnown()
}

// afterAccepted: the second step, when held items of the accepted PUT wait for what the
// data plane holds; else the sync ends on it.
func (s *Sync) afterAccepted() Action {
	ans := s.applied.answer
	waiting := dependsOnState(s.applied.held)
	if !s.cfg.Fallback || s.second.taken || len(waiting) == 0 {
		return s.end(nil)
	}
	// §8.5's second step: APISIX checks these against what its workers have applied,
	// which follows a 202 within about a second (a 200 under ?wait: already applied,
	// so one look is enough); the second PUT must still fit in the budget
	until := earliest(s.now.Add(secondStepWindow), s.budgetEnd().Add(-s.took))
	if ans.Status == http.StatusOK {
		until = s.now.Add(1) // one pass, no pause
	}
	s.second = secondStep{taken: true, waiting: waiting, until: until}
	if !s.now.Before(until) {
		return s.end(nil)
	}
	return s.awaitNext()
}

func dependsOnState(held []HeldItem) []HeldItem {
	var out []HeldItem
	for _, h := range held {
		if h.DependsOnState {
			out = append(out, h)
		}
	}
	return out
}

// awaitNext validates the next waiting item alone; after a pass, decides again when one
// passed, or pauses while the window lasts.
func (s *Sync) awaitNext() Action {
	st := &s.second
	if st.index < len(st.waiting) {
		h := st.waiting[st.index]
		return s.to(phaseAwait, Validate{Section: h.Section, Items: [][]byte{h.Raw}, Until: s.budgetEnd()})
	}
	if st.passed {
		// the second PUT is the client's body decided again on what the first left,
		// holding back only what still fails
		st.deciding, s.holdAgain, s.carried = true, true, nil
		s.note(Note{Kind: NoteSecondStep})
		return s.decide(false)
	}
	if !s.now.Before(st.until) {
		if !s.now.Before(s.in.Deadline) || !s.now.Before(s.budgetEnd()) {
			s.unavailable("the PUT's deadline passed while held items were validated again", nil)
		}
		return s.end(nil)
	}
	st.index = 0
	return s.to(phasePause, Pause{Until: earliest(s.now.Add(secondStepPause), st.until)})
}

// awaited: what validate said of one waiting item alone.
func (s *Sync) awaited(ev Event) Action {
	st := &s.second
	h := st.waiting[st.index]
	passes := ev.Err == nil && len(ev.Found) == 0
	s.recheck[h.Key()] = passes
	st.passed = st.passed || passes
	st.index++
	return s.awaitNext()
}

func (s *Sync) paused(ev Event) Action {
	if ev.Err != nil {
		s.unavailable("the PUT's deadline passed while held items were validated again", ev.Err)
		return s.end(nil)
	}
	return s.awaitNext()
}

// moved: the data plane moved under the sync — a version conflict, or a look before a
// corrected PUT that does not show the state the sync was decided on — so the belief
// it was decided on is stale: the state is read and the whole sync decided again, once
// (§5.4), holding what this sync learnt APISIX rejects without asking again. What the
// sync applied before may be gone. A second time, the client gets APISIX's answer.
func (s *Sync) moved(ans *apisix.Answer, carried []HeldItem) Action {
	s.tx.Doubt() // something wrote in between: never trust the cache again
	s.learnt = learntByConflict
	s.applied = nil
	if s.conflicted || s.round.res == nil || s.round.untouched != "" {
		return s.end(ans)
	}
	s.conflicted = true
	s.note(Note{Kind: NoteConflictRetry})
	if len(carried) > 0 {
		s.carried, s.holdAgain = carried, true
	}
	s.fb, s.second.deciding = nil, false
	return s.decide(true)
}

// fallbackWork is the fallback's rounds after a decided PUT's 400: the forwarded body's
// plan (split once, for every round), the items found and held so far, the accepted
// copies (read once), and the corrected PUT.
type fallbackWork struct {
	plan       *rewrite.Plan
	round      int
	answer     []byte   // APISIX's last 400 (3.13/3.14: it names the next item)
	sections   []string // the sections still to validate in this round
	found      []rewrite.Rejection
	accepted   *rewrite.Accepted
	copies     []rewrite.SectionCopies // the accepted copies still to validate
	copiesSeen bool
	held       []HeldItem
	next       Outgoing
}

// fallbackApplies: §8.5 looks at a decided JSON PUT that APISIX answered 400 for an item
// (not a version, not the request itself).
func (s *Sync) fallbackApplies(ans *apisix.Answer) bool {
	p := s.body.prepared
	return s.cfg.Fallback && s.round.res != nil && s.round.untouched == "" && p != nil && p.IsJSON() &&
		ans.Status == http.StatusBadRequest && apisix.ItemLevel(ans.Body)
}

func (s *Sync) startFallback(ans *apisix.Answer) Action {
	forwarded, err := s.cfg.Rewriter.Prepare(s.round.sent.Body)
	if err != nil {
		return s.end(nil)
	}
	s.fb = &fallbackWork{plan: rewrite.NewPlan(forwarded), answer: ans.Body}
	return s.roundStart()
}

// roundStart finds the items APISIX rejects in this round: validate's answer (3.15+,
// the first round), or the PUT's own "invalid <key> at index <i>" message (3.13/3.14,
// one a round).
func (s *Sync) roundStart() Action {
	fb := s.fb
	if !s.conn.HasValidate {
		r, ok := apisix.PutRejection(fb.answer)
		if !ok || fb.round >= maxPrefixRounds {
			return s.noRejections()
		}
		return s.rejectionsFound([]rewrite.Rejection{r})
	}
	if fb.round > 0 {
		return s.noRejections()
	}
	fb.sections = fb.plan.ItemSections()
	return s.validateNext()
}

func (s *Sync) validateNext() Action {
	fb := s.fb
	for len(fb.sections) > 0 {
		items := fb.plan.Items(fb.sections[0])
		if len(items) > 0 {
			return s.to(phaseFind, Validate{Section: fb.sections[0], Items: rawItems(items), Until: s.budgetEnd()})
		}
		fb.sections = fb.sections[1:]
	}
	return s.rejectionsFound(fb.found)
}

func (s *Sync) found(ev Event) Action {
	if ev.Err != nil {
		return s.noRejections() // APISIX could not say
	}
	fb := s.fb
	fb.found = append(fb.found, ev.Found...)
	fb.sections = fb.sections[1:]
	return s.validateNext()
}

// noRejections: APISIX did not say which item (or no more): its first answer stands.
func (s *Sync) noRejections() Action {
	if s.fb.round == 0 {
		s.note(Note{Kind: NoteFallback, Result: metrics.FallbackUnavailable, Why: "APISIX rejected an item but did not say which one; its answer goes to the client"})
	} else {
		s.note(Note{Kind: NoteFallback, Result: metrics.FallbackRejected})
	}
	return s.end(nil)
}

func (s *Sync) rejectionsFound(found []rewrite.Rejection) Action {
	fb := s.fb
	if len(found) == 0 {
		return s.noRejections()
	}
	if fb.round > 0 { // APISIX counted in the corrected body: find the client's index
		for i := range found {
			found[i].Index = fb.plan.OriginalIndex(found[i].Section, found[i].Index)
		}
	}
	fb.found = found
	if fb.accepted == nil {
		if fb.accepted = acceptedOf(s.tx.View()); fb.accepted == nil {
			return s.to(phaseCopies, Read{})
		}
	}
	return s.checkCopies()
}

// copiesRead: the data plane's own copies, for the backfill (read once).
func (s *Sync) copiesRead(ev Event) Action {
	if ev.Err != nil || ev.Read.State == nil {
		s.unavailable("the copies the data plane accepted could not be read", ev.Err)
		return s.end(nil)
	}
	s.fb.accepted = rewrite.NewAccepted(ev.Read.State.Items)
	return s.checkCopies()
}

// checkCopies validates (3.15+) the accepted copies the rejected items would be
// backfilled with, one call per section: a copy the data plane refuses too is left out.
func (s *Sync) checkCopies() Action {
	fb := s.fb
	if !fb.copiesSeen && s.conn.HasValidate {
		fb.copiesSeen = true
		fb.copies = fb.plan.CopiesToCheck(fb.found, fb.accepted)
	}
	if len(fb.copies) > 0 {
		c := fb.copies[0]
		return s.to(phaseCheckCopies, Validate{Section: c.Section, Items: c.Raws, Until: s.budgetEnd()})
	}
	return s.holdRound()
}

func (s *Sync) copiesChecked(ev Event) Action {
	fb := s.fb
	c := fb.copies[0]
	fb.copies = fb.copies[1:]
	if ev.Err == nil { // no answer: the corrected PUT tells
		fb.accepted.RefuseCopies(c, ev.Found)
	}
	return s.checkCopies()
}

// holdRound holds the round's rejected items back and builds the corrected PUT.
func (s *Sync) holdRound() Action {
	fb := s.fb
	fb.held = rewrite.MergeHeld(fb.held, s.holdItems(fb.plan, fb.accepted, fb.found))
	body, err := fb.plan.Apply()
	if err != nil {
		return s.end(nil)
	}
	fb.next = s.correctedPut(body, fb.held)
	if !s.affords("the corrected PUT") {
		return s.end(nil) // nothing corrected was sent: the first answer stands
	}
	if s.conn.Closing || s.round.res.SendsUnion() {
		// the corrected PUT goes on a new connection, or carries the data plane's own
		// items at a version that beats APISIX's check: it stands only on the state the
		// sync was decided on (an out-of-band write during the validate calls would be
		// overwritten, §5.4)
		return s.to(phaseHolds, Head{})
	}
	return s.to(phaseCorrected, Put{Conn: apisix.Decide, Out: fb.next})
}

// correctedPut is the corrected PUT: its body, and a digest of its own (another body
// than the client's, so APISIX never answers it 204 for the client's digest).
func (s *Sync) correctedPut(body []byte, held []HeldItem) Outgoing {
	out := s.round.sent
	next := Outgoing{Body: body, Digest: out.Digest, SetDigest: out.SetDigest}
	if s.body.in.HasDigest {
		base := out.Digest
		if !out.SetDigest {
			base = s.body.in.Digest
		}
		next.Digest, next.SetDigest = base+"+backfill:"+rewrite.CorrectionHash(held), true
	}
	return next
}

// stillHolds: the look before a corrected PUT shows the state the sync was decided on,
// or the data plane moved (it restarted, or someone wrote): decided again.
func (s *Sync) stillHolds(ev Event) Action {
	v := s.tx.View()
	if ev.Err == nil && ev.Meta != nil && ev.Meta.LastModified != "" && ev.Meta.Digest == v.Digest && ev.Meta.LastModified == v.LastModified {
		return s.to(phaseCorrected, Put{Conn: apisix.Decide, Out: s.fb.next})
	}
	return s.moved(nil, s.fb.held)
}

// correctedAnswered is APISIX's answer to a corrected PUT.
func (s *Sync) correctedAnswered(ev Event) Action {
	s.took = ev.Took
	fb := s.fb
	if ev.Err != nil {
		s.note(Note{Kind: NoteFallback, Result: metrics.FallbackUnavailable})
		if neverSent(ev.Err) {
			return s.end(nil) // the first answer stands
		}
		// whether APISIX applied it is unknown, so confshim believes nothing and says so
		s.tx.Forget()
		return s.fail(Failure{Kind: FailUpstream, Err: ev.Err, What: "the corrected PUT of --fallback backfill (APISIX may have applied it)"})
	}
	ans := ev.Answer
	switch {
	case apisix.IsConflict(ans):
		// the belief the sync was decided on is stale (APISIX ≥ 3.15 checks items before
		// versions, so an out-of-band write shows only now)
		s.note(Note{Kind: NoteFallback, Result: metrics.FallbackRejected})
		return s.moved(ans, fb.held)
	case ans.Status/100 == 2:
		s.note(Note{Kind: NoteFallback, Result: metrics.FallbackApplied})
		took, _ := s.cfg.Rewriter.Prepare(fb.next.Body) // nil: the kept configuration is read back
		o := s.outcome(ans, took, slices.Concat(s.body.held, fb.held))
		o.Backfilled = rewrite.HeldSections(fb.held) // their content is a correction, not the decided copy
		return s.accepted(ans, o, fb.next)
	}
	s.refused(ans)
	if apisix.IsDictFull(ans) {
		s.note(Note{Kind: NoteFallback, Result: metrics.FallbackRejected, Status: ans.Status, Why: "APISIX could not store the corrected PUT: it does not fit its standalone-config dict"})
		return s.tooBig(fb.next)
	}
	if ans.Status == http.StatusBadRequest && !s.conn.HasValidate && apisix.ItemLevel(ans.Body) {
		// 3.13/3.14 name one item a PUT: the next round holds that one too
		fb.round++
		fb.answer, fb.found, fb.copies, fb.copiesSeen = ans.Body, nil, nil, false
		return s.roundStart()
	}
	s.note(Note{Kind: NoteFallback, Result: metrics.FallbackRejected, Status: ans.Status, Why: "APISIX rejected the corrected PUT too; its first answer goes to the client", Message: apisix.ErrorMessage(ans.Body)})
	return s.end(nil)
}

// holdItems holds the rejected items in the plan (backfilled or left out, and what
// they strand) and keeps for each what the next syncs need; it says each newly held
// item once.
func (s *Sync) holdItems(plan *rewrite.Plan, accepted *rewrite.Accepted, found []rewrite.Rejection) []HeldItem {
	v := s.tx.View()
	var held []HeldItem
	for _, h := range plan.Hold(found, accepted) {
		item := HeldItem{Section: h.Section, ID: h.ID, Error: rewrite.ClipMessage(h.Error), Since: s.now, Backfilled: h.Backfilled,
			DependsOnState: apisix.StateDependent(h.Error), Sum: s.cfg.Rewriter.ItemFingerprint(h.Raw), Raw: h.Raw, Server: s.conn.Server}
		if prev, seen := v.HeldItem(h.Section, h.ID); seen && prev.Sum == item.Sum {
			item.Since = prev.Since // said when it was first held back
		} else {
			s.note(Note{Kind: NoteHeldBack, Held: item})
		}
		held = append(held, item)
	}
	return held
}

// acceptedOf are the copies the data plane last accepted as the belief has them: the
// kept configuration, else the state's items (nil: read them).
func acceptedOf(v dataplane.View) *rewrite.Accepted {
	switch {
	case v.Kept != nil:
		items := make(map[string][]byte, len(v.Kept.Items))
		for s, raw := range v.Kept.Items {
			items[s] = raw
		}
		return rewrite.NewAccepted(items)
	case v.State != nil && v.State.ItemsKnown:
		return rewrite.NewAccepted(v.State.Items)
	}
	return nil
}

func rawItems(items []rewrite.Item) [][]byte {
	out := make([][]byte, len(items))
	for i, it := range items {
		out[i] = it.Raw
	}
	return out
}

// unavailable notes a fallback that could not go on: the client gets the last complete
// answer.
func (s *Sync) unavailable(why string, err error) {
	s.note(Note{Kind: NoteFallback, Result: metrics.FallbackUnavailable, Why: why + "; the last complete answer goes to the client", Err: err})
}
