package syncmachine

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/internal/dataplane"
	"github.com/confshim/confshim/metrics"
	"github.com/confshim/confshim/rewrite"
)

// Final is how a sync ended: what the client is answered (Reply) and what the driver
// files (the record, the metrics, the ids it touched).
type Final struct {
	// Failure: confshim answers with an error of its own; nothing below counts.
	Failure *Failure
	// Answer is APISIX's answer the client's is drawn from: the last PUT of this sync
	// APISIX accepted, when one was accepted since the data plane last moved; else
	// APISIX's answer that ended it (a rejection, a 401, …).
	Answer *apisix.Answer
	// Held are the client's items the data plane does not hold as sent after Answer.
	Held      []HeldItem
	Res       *rewrite.Result // the decision Answer is to (nil: the body went as it came)
	Sent      Outgoing        // the PUT Answer is to
	Untouched metrics.UntouchedReason
	// Touched is what each accepted PUT of the sync took, for the ids it touched.
	Touched []Touched
	// Earlier are accepted decisions of the sync before the one Answer is to (a PUT a
	// writer's equal version kept a section out of, decided again): their rewrites are
	// part of what the sync did (the header, the metrics).
	Earlier []*rewrite.Result

	rejectHeld bool // --fallback-answer rejection
}

// Touched is one accepted PUT, as the ids it touched are listed after the lock.
type Touched struct {
	Before    *rewrite.State    // the data plane's items before: the kept configuration's
	DecidedOn *rewrite.State    // else the state the sync was decided on, when it had items
	Res       *rewrite.Result   // which sections took their items from the body
	After     *rewrite.Prepared // what APISIX took
	Held      []HeldItem
}

// Failure is confshim's own answer to a sync that got no usable answer from APISIX.
type Failure struct {
	Kind FailureKind
	Err  error
	What string // FailUpstream: what got no answer
	// Applied: FailStateRead after a PUT of this sync was accepted (the data plane moved
	// under it, and the state to decide again on could not be read)
	Applied bool
	// FailTooBig: the configuration APISIX could not store, whether this sync sent it
	// (Repeat false) or it was refused at Oversized.At and not sent again (before RetryAt)
	Oversized *dataplane.Oversized
	Repeat    bool
	// FailTieLost: the sections a writer's copy kept at the version the sync sent, after
	// it was decided again once already; FailTieUnverified: the sections not read back
	Ties []rewrite.Change
}

// RetryAt is when a configuration APISIX refused for its size is sent again unchanged.
func (f *Failure) RetryAt() time.Time { return f.Oversized.At.Add(OversizedPatience) }

// FailureKind says which of confshim's own answers a failure gets (contract §6).
type FailureKind int

const (
	FailRefused       FailureKind = iota + 1 // 400: a body that cannot be repaired; nothing forwarded
	FailReseedPending                        // 503: the emptied data plane could not be re-seeded first
	FailStateRead                            // 502/504: the state could not be read; nothing forwarded
	FailUpstream                             // 502/504: a PUT got no answer
	FailTooBig                               // 500: APISIX cannot store a configuration this size
	FailTieLost                              // 409: a writer's copy kept at the version sent, twice
	FailTieUnverified                        // 502/504: an accepted PUT sent at a tie could not be read back
)

// Accepted: the client's answer is drawn from a PUT APISIX accepted (the rest of a sync
// with held items included).
func (f *Final) Accepted() bool {
	return f.Failure == nil && f.Answer != nil && f.Answer.Status/100 == 2
}

// Reply is the client's answer, from the final state alone: APISIX's answer, plus
// X-Confshim-Actions (never on a refusal of the caller). With --fallback-answer
// rejection, a 2xx is given only when every item the client sent is on the data plane
// as sent (§8.5); otherwise the client gets APISIX's rejection of the held items while
// the rest is applied, so that a controller reports exactly those.
func (f *Final) Reply() (ans *apisix.Answer, actions string) {
	ans = f.Answer
	// backfilled says the rest of the sync landed without the held items: never on an
	// answer after which nothing was applied (failing safe, §8.5: APISIX's first answer)
	var held []HeldItem
	if f.Accepted() {
		held = f.Held
	}
	actions = actionsHeader(ans, f.Res, held, f.Earlier)
	if f.Accepted() && len(f.Held) > 0 && f.rejectHeld {
		ans = heldRejection(ans, f.Held)
	}
	return ans, actions
}

// end ends the sync on the last complete answer: the last PUT APISIX accepted since the
// data plane last moved, else ans, else APISIX's answer to the last decided PUT.
func (s *Sync) end(ans *apisix.Answer) Action {
	if s.applied == nil && len(s.tiesLost) > 0 {
		// an accepted PUT lost a tie and no PUT decided again was accepted since: the
		// rest of the sync is applied, the change in those sections is not
		return s.fail(Failure{Kind: FailTieLost, Ties: s.tiesLost, Applied: true})
	}
	f := &Final{Untouched: s.round.untouched, Touched: s.touched, Earlier: s.earlier, rejectHeld: s.cfg.RejectHeld}
	switch a := s.applied; {
	case a != nil:
		f.Answer, f.Held, f.Res, f.Sent = a.answer, a.held, a.res, a.sent
	default:
		if ans == nil {
			ans = s.rejection
		}
		f.Answer, f.Held, f.Res, f.Sent = ans, s.body.held, s.round.res, s.round.sent
		if s.round.untouched != "" {
			f.Res = nil
		}
	}
	return s.finish(f)
}

// fail ends the sync with confshim's own answer.
func (s *Sync) fail(why Failure) Action {
	s.putBuffer()
	return s.finish(&Final{Failure: &why, Touched: s.touched, rejectHeld: s.cfg.RejectHeld})
}

func (s *Sync) finish(f *Final) Action {
	s.final = f
	s.phase = phaseDone
	return Done{Final: f}
}

// maxRejectedItems bounds the items a held-back rejection lists (§5.7).
const maxRejectedItems = 20

// heldRejection is the client's answer when items were held back and
// --fallback-answer is rejection (§8.5): the rest of the sync is applied, but a 2xx
// would make a controller report the held items as programmed. So the client gets a
// rejection in APISIX's own shapes: 400, error_msg with APISIX's message for the first
// held item and its section and id, and errors[] as POST /configs/validate lists them
// (resource_type, resource_id, error), bounded. applied is APISIX's answer to what was
// forwarded; its headers stay but for the ones that describe a stored body.
func heldRejection(applied *apisix.Answer, held []HeldItem) *apisix.Answer {
	type itemError struct {
		Type  string `json:"resource_type"`
		ID    string `json:"resource_id"`
		Error string `json:"error"`
	}
	body := struct {
		ErrorMsg string      `json:"error_msg"`
		Errors   []itemError `json:"errors"`
	}{}
	for i, h := range held {
		if i == maxRejectedItems {
			break
		}
		body.Errors = append(body.Errors, itemError{Type: rewrite.Clip(h.Section), ID: rewrite.Clip(h.ID), Error: h.Error})
	}
	first := body.Errors[0]
	body.ErrorMsg = "invalid " + first.Type + " " + first.ID + ": " + first.Error
	raw, _ := json.Marshal(body)
	header := applied.Header.Clone()
	if header == nil {
		header = http.Header{}
	}
	for _, k := range []string{"X-Digest", "X-Last-Modified", "Content-Length"} {
		header.Del(k)
	}
	header.Set("Content-Type", "application/json")
	return &apisix.Answer{Status: http.StatusBadRequest, Header: header, Body: append(raw, '\n')}
}

// actionsHeader is X-Confshim-Actions when sections were rewritten or items held (never
// on APISIX's refusal of the caller: that would tell a stranger the decision).
func actionsHeader(ans *apisix.Answer, res *rewrite.Result, held []HeldItem, earlier []*rewrite.Result) string {
	switch {
	case ans.Status == http.StatusUnauthorized || ans.Status == http.StatusForbidden:
		return ""
	case len(held) > 0 || len(earlier) > 0:
		var entries []string
		for _, r := range append(slices.Clone(earlier), res) {
			if r != nil && len(r.Changes) > 0 {
				entries = append(entries, strings.Split(r.Actions(), ", ")...)
			}
		}
		for _, s := range rewrite.HeldSections(held) {
			entries = append(entries, rewrite.Clip(s)+"="+string(rewrite.Backfilled))
		}
		slices.Sort(entries)
		return strings.Join(slices.Compact(entries), ", ")
	case res != nil && len(res.Changes) > 0:
		return res.Actions()
	}
	return ""
}
