package syncmachine

import (
	"errors"
	"maps"
	"slices"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/metrics"
	"github.com/confshim/confshim/rewrite"
)

// Deciding (§5.4): the state a sync is decided on is believed — the connection it was
// confirmed on is trusted and still open — or shown current by a HEAD, or read. A data
// plane found empty gets the kept configuration back first (§8.4). The body is the
// client's, or its correction with the items this APISIX is known to reject held back
// (§8.5's steady state). A decision that needs more than the belief (a version the
// clock did not choose, the data plane's own items in the body) is made again on a
// state shown current.

// decide starts a decision (fresh: read, whatever is believed).
func (s *Sync) decide(fresh bool) Action {
	s.round = round{fresh: fresh}
	if fresh {
		s.tiesLost = nil // the read decides on what the data plane holds, the tie's PUT included
	}
	if s.in.Untouched != "" {
		s.round.untouched = s.in.Untouched
		return s.send()
	}
	v := s.tx.View()
	if fresh || v.State == nil || s.conn.NoHead {
		return s.to(phaseRead, Read{})
	}
	if s.conn.Trusted && v.Trusts(s.conn.ID) {
		s.round.state = v.State // unread: APISIX's version check proves it
		return s.stateKnown()
	}
	return s.to(phaseLook, Head{})
}

// to enters phase with its action.
func (s *Sync) to(p Phase, a Action) Action {
	s.phase = p
	return a
}

// looked: a HEAD that shows what confshim believes proves it; anything else is read.
func (s *Sync) looked(ev Event) Action {
	if ev.Err != nil {
		return s.stateFailed(ev.Err)
	}
	if v := s.tx.View(); ev.Meta != nil && v.Matches(ev.Meta.Digest, ev.Meta.LastModified) {
		s.tx.Confirm(s.conn.ID)
		s.round.state, s.round.proven = v.State, true
		return s.stateKnown()
	}
	return s.to(phaseRead, Read{})
}

// readState records a read: the state, and the out-of-band writes it shows.
func (s *Sync) readState(ev Event) Action {
	if ev.Err != nil {
		return s.stateFailed(ev.Err)
	}
	s.recordRead(ev.Read)
	return s.stateKnown()
}

func (s *Sync) recordRead(r StateRead) {
	moves := s.tx.Read(r.State, r.Digest, r.LastModified, s.conn.NoHead, s.conn.ID)
	if len(moves) > 0 {
		s.note(Note{Kind: NoteMoves, Moves: moves, How: s.learnt})
	}
	s.round.state, s.round.proven = r.State, true
}

// stateKnown: a data plane found empty gets the kept configuration back before
// anything is decided on it (§8.4: the client's sync beat the watch to a restarted
// data plane; its preserved and merged sections would go out empty).
func (s *Sync) stateKnown() Action {
	v := s.tx.View()
	if s.cfg.Reseeds && !s.round.reseeded && v.Kept != nil && v.Empty(s.conn.NoHead) {
		s.round.reseeded = true
		return s.to(phaseReseed, Reseed{})
	}
	return s.steadyState()
}

func (s *Sync) reseeded(ev Event) Action {
	if ev.Reseeded {
		s.round.state = s.tx.View().State
		return s.steadyState()
	}
	return s.to(phaseReseedRead, Read{})
}

// rereadAfterReseed: the kept configuration did not go back; someone may have written
// meanwhile, and then the sync is decided on what the data plane holds.
func (s *Sync) rereadAfterReseed(ev Event) Action {
	if ev.Err != nil {
		return s.stateFailed(ev.Err)
	}
	s.recordRead(ev.Read)
	if s.tx.View().Empty(s.conn.NoHead) {
		return s.fail(Failure{Kind: FailReseedPending, Err: errReseedPending})
	}
	return s.steadyState()
}

// stateFailed: the state could not be had. APISIX refused the caller: the body goes
// as it came, and APISIX refuses it in its own words. A second step's decision ends
// on what the sync applied; any other is the sync's failure (nothing was forwarded).
func (s *Sync) stateFailed(err error) Action {
	s.putBuffer()
	s.round.res = nil
	var refused apisix.RefusedError
	switch {
	case s.second.deciding && s.applied != nil:
		s.unavailable("the data plane's state could not be read for the second step", err)
		return s.end(nil)
	case errors.As(err, &refused):
		s.round.untouched = metrics.UntouchedRefused
		return s.send()
	}
	return s.fail(Failure{Kind: FailStateRead, Err: err, Applied: len(s.touched) > 0})
}

// steadyWork is the steady state being worked out: the client's body split once, the
// known held items it carries again, and the ones still to validate alone.
type steadyWork struct {
	plan  *rewrite.Plan
	known map[string]HeldItem
	check []rewrite.Rejection
}

// steadyState works out, when it must, the body this sync is decided on: the client's
// with the items this APISIX is known to reject held back (§8.5), else the client's.
func (s *Sync) steadyState() Action {
	if !s.holdAgain {
		return s.decideBody()
	}
	s.holdAgain = false
	client := upfront{in: s.in.Client, prepared: s.in.Prepared}
	s.body = client
	known := s.knownHeld()
	if !s.cfg.Fallback || len(known) == 0 || client.prepared == nil || !client.prepared.IsJSON() {
		return s.decideBody()
	}
	v := s.tx.View()
	if len(s.carried) == 0 && !s.second.deciding {
		// the same client bytes of every held section as in the last sync, on the same
		// APISIX, nothing to validate again: the last correction serves as it is
		if corrected, ok := client.prepared.ReuseCorrection(v.Correction, s.conn.Server, known); ok {
			return s.corrected(corrected, sortedHeld(v.Held))
		}
	}
	w := &steadyWork{plan: rewrite.NewPlan(client.prepared), known: known}
	s.round.steady = w
	return s.steadyNext()
}

// knownHeld are the items known to be rejected: those held in the last accepted sync,
// and those a fallback of this sync held before it was decided again (these win).
func (s *Sync) knownHeld() map[string]HeldItem {
	held := s.tx.View().Held
	if len(s.carried) == 0 {
		return held
	}
	known := maps.Clone(held)
	if known == nil {
		known = map[string]HeldItem{}
	}
	for _, h := range s.carried {
		known[h.Key()] = h
	}
	return known
}

// steadyNext validates, alone, the next known item rejected for what the data plane
// held; when none is left, holds what is still rejected.
func (s *Sync) steadyNext() Action {
	w := s.round.steady
	hold, check := s.cfg.Rewriter.StillRejected(w.plan, w.known, s.conn.Server, s.recheck)
	if len(check) > 0 {
		w.check = check
		r := check[0]
		return s.to(phaseSteadyCheck, Validate{Section: r.Section, Items: [][]byte{w.plan.Items(r.Section)[r.Index].Raw}, Until: s.budgetEnd()})
	}
	if len(hold) == 0 {
		return s.decideBody()
	}
	v := s.tx.View()
	accepted := acceptedOf(v)
	if accepted == nil {
		return s.to(phaseSteadyCopies, Read{})
	}
	return s.holdBeforePut(accepted, hold)
}

// steadyChecked: what validate said of one item alone (no answer: it stays held).
func (s *Sync) steadyChecked(ev Event) Action {
	w := s.round.steady
	r := w.check[0]
	s.recheck[rewrite.HeldKey(r.Section, w.plan.Items(r.Section)[r.Index].ID)] = ev.Err == nil && len(ev.Found) == 0
	return s.steadyNext()
}

// steadyCopies: the data plane's own copies, read for the backfill (not a state this
// sync is decided on). Without them the client's body goes and APISIX judges it.
func (s *Sync) steadyCopies(ev Event) Action {
	if ev.Err != nil || ev.Read.State == nil {
		return s.decideBody()
	}
	hold, _ := s.cfg.Rewriter.StillRejected(s.round.steady.plan, s.round.steady.known, s.conn.Server, s.recheck)
	return s.holdBeforePut(rewrite.NewAccepted(ev.Read.State.Items), hold)
}

// holdBeforePut holds the still rejected items back before the PUT: each replaced by
// its accepted copy, or left out (as it was last time: its copy is no use then).
func (s *Sync) holdBeforePut(accepted *rewrite.Accepted, hold []rewrite.Rejection) Action {
	w := s.round.steady
	for _, h := range w.known {
		if !h.Backfilled {
			accepted.Refuse(h.Section, h.ID)
		}
	}
	held := s.holdItems(w.plan, accepted, hold)
	body, err := w.plan.Apply()
	if err != nil {
		return s.decideBody()
	}
	return s.corrected(body, held)
}

// corrected makes the corrected client body the one decided, with a digest of its own.
func (s *Sync) corrected(body []byte, held []HeldItem) Action {
	prepared, err := s.cfg.Rewriter.PrepareLike(body, s.cfg.Layouts.load())
	if err != nil {
		return s.decideBody()
	}
	s.cfg.Layouts.store(prepared.Layout()) // the steady state sends this one again
	in := s.in.Client
	in.Body = body
	if in.HasDigest {
		in.Digest += "+held:" + rewrite.CorrectionHash(held) // another body than the client's
	}
	s.body = upfront{in: in, prepared: prepared, held: held}
	return s.decideBody()
}

// decideBody runs rewrite's decision on the body and the state known.
func (s *Sync) decideBody() Action {
	s.round.steady = nil
	v := s.tx.View()
	in := s.body.in
	in.State, in.Record, in.Owned = s.round.state, v.Record, v.Owned
	in.Now, in.Unread = s.nowMillis(), !s.round.proven
	in.AvoidTies = s.conflicted // decided again: no second read-back (at most four requests, §3)
	s.round.buf = s.cfg.Buffers.Get()
	in.Buf = *s.round.buf
	s.round.in = in
	res, err := s.cfg.Rewriter.Decide(s.body.prepared, in)
	if errors.Is(err, rewrite.ErrStateIncomplete) {
		// the items the decision needs are in the kept configuration when it describes
		// the state believed (after a fallback the record forgot a corrected section)
		if ks := v.KeptState(); ks != nil {
			s.round.in.State = ks
			res, err = s.cfg.Rewriter.Decide(s.body.prepared, s.round.in)
		}
	}
	s.note(Note{Kind: NoteDecided})
	switch {
	case err == nil && in.Unread && (res.Unsure() || res.NeedsProof()):
		// a version decided unread that the clock did not choose could equal one a
		// writer set meanwhile, or the data plane's items went into the body: the
		// decision stands only on a state shown current (§5.4), so look first
		s.round.res = res
		return s.to(phaseProve, Head{})
	case errors.Is(err, rewrite.ErrStateIncomplete):
		return s.to(phaseProveRead, Read{})
	}
	return s.decided(res, err)
}

// proved: the HEAD shows the belief the decision was made on, so it stands; else the
// state is read and the decision made again on it.
func (s *Sync) proved(ev Event) Action {
	if ev.Err != nil {
		return s.stateFailed(ev.Err)
	}
	if ev.Meta != nil && s.tx.View().Matches(ev.Meta.Digest, ev.Meta.LastModified) {
		s.tx.Confirm(s.conn.ID)
		s.round.proven = true
		return s.decided(s.round.res, nil)
	}
	return s.to(phaseProveRead, Read{})
}

// readForProof decides again on the state read.
func (s *Sync) readForProof(ev Event) Action {
	if ev.Err != nil {
		return s.stateFailed(ev.Err)
	}
	s.recordRead(ev.Read)
	s.round.in.State, s.round.in.Unread = ev.Read.State, false
	res, err := s.cfg.Rewriter.Decide(s.body.prepared, s.round.in)
	s.note(Note{Kind: NoteDecided})
	return s.decided(res, err)
}

// decided: rewrite's verdict on the body. A body rewrite will not touch goes as it came;
// one it refuses is answered 400 with nothing forwarded.
func (s *Sync) decided(res *rewrite.Result, err error) Action {
	var skip *rewrite.SkipError
	var refuse *rewrite.RefuseError
	switch {
	case errors.As(err, &skip):
		s.putBuffer()
		s.note(Note{Kind: NoteUntouched, Why: skip.Reason})
		s.round.untouched = metrics.UntouchedInvalid
		return s.send()
	case errors.As(err, &refuse):
		s.putBuffer()
		return s.fail(Failure{Kind: FailRefused, Err: refuse})
	case err != nil:
		return s.stateFailed(err)
	}
	if !res.Changed {
		s.putBuffer() // the client's bytes go: the buffer was not used
	}
	if len(res.Changes) > 0 {
		s.note(Note{Kind: NoteDecision, Res: res})
	}
	s.round.res = res
	return s.send()
}

// putBuffer gives the decision's buffer back when its body is not sent.
func (s *Sync) putBuffer() {
	if s.round.buf != nil {
		s.cfg.Buffers.Put(s.round.buf)
		s.round.buf = nil
	}
}

// send forwards the decided PUT: a decided body on the connection its state was read on
// or not at all; one that goes as it came on the shared connection.
func (s *Sync) send() Action {
	if what := s.budgetedPut(); what != "" && !s.affords(what) {
		s.putBuffer()
		return s.end(nil)
	}
	v := s.tx.View()
	if o := s.refusedAgain(v); o != nil {
		if !s.round.proven {
			// not sent only on a state shown current: an unread belief would miss a
			// write that lets it go
			return s.to(phaseProve, Head{})
		}
		s.putBuffer()
		return s.fail(Failure{Kind: FailTooBig, Oversized: o, Repeat: true})
	}
	out := outgoing(s.body.in, s.round.res, v.Digest)
	if len(s.body.held) > 0 && s.body.in.HasDigest && !out.SetDigest {
		out.Digest, out.SetDigest = s.body.in.Digest, true // the corrected body is not the client's
	}
	s.round.sent = out
	put := Put{Conn: apisix.Shared, Out: out}
	if s.round.res != nil && s.round.untouched == "" {
		put.Conn = apisix.Decide
		if s.round.res.Changed {
			put.Release, s.round.buf = s.round.buf, nil // the driver gives it back once sent
		}
	}
	return s.to(phasePut, put)
}

// budgetedPut names the PUT about to be sent when it must fit in the fallback's budget
// (§8.5; "": it need not): the second step's, or one decided again after the data plane
// moved under the fallback's work, which began with APISIX's first answer — past the
// budget the client gets the last complete answer, not a whole PUT more.
func (s *Sync) budgetedPut() string {
	switch {
	case s.second.deciding:
		return "the second PUT"
	case s.conflicted && s.rejection != nil:
		return "the PUT decided again after the data plane moved"
	}
	return ""
}

// outgoing is what to forward: the body's bytes, or the rewritten ones.
func outgoing(in rewrite.Input, res *rewrite.Result, dpDigest string) Outgoing {
	out := Outgoing{Body: in.Body}
	if res == nil || !res.Changed {
		return out
	}
	out.Body = res.Body
	if in.HasDigest {
		out.Digest, out.SetDigest = res.Digest, true
		if res.NoOp && dpDigest != "" {
			out.Digest, out.NoOp = dpDigest, true
		}
	}
	return out
}

// sortedHeld lists held items by section and id.
func sortedHeld(held map[string]HeldItem) []HeldItem {
	out := make([]HeldItem, 0, len(held))
	for _, k := range slices.Sorted(maps.Keys(held)) {
		out = append(out, held[k])
	}
	return out
}
