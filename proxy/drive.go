package proxy

import (
	"context"
	"errors"
	"time"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/internal/syncmachine"
)

// The driver of one sync's state machine (internal/syncmachine): it does what each
// action asks — a HEAD, a GET, a re-seed, a validate call, a PUT, a wait — on the
// decide connection, with the caller's credentials, within the PUT's deadline, and
// hands the machine what came of it with the time and the connection's facts. It
// decides nothing; what the machine says happened is logged and counted here.

// errNoVerdict: validate did not say which items APISIX rejects.
var errNoVerdict = errors.New("validate gave no verdict")

// drive runs the sync under the lock to its end.
func (pr *putRequest) drive() *syncmachine.Final {
	in := syncmachine.Input{Client: pr.rcv.in, Prepared: pr.rcv.prepared, Untouched: pr.rcv.untouched,
		Start: pr.sc.start, Deadline: deadlineOf(pr.sc.ctx)}
	scanned := pr.rcv.scanned // the first decision's time includes the scan before the lock
	began := time.Now()
	m, act := syncmachine.Start(pr.s.machine, in, pr.sc.tx, pr.event())
	for {
		if pr.say(m.Notes()) {
			pr.s.m.RewriteDuration.Observe((scanned + time.Since(began)).Seconds())
			scanned = 0
		}
		if done, ok := act.(syncmachine.Done); ok {
			return done.Final
		}
		ev := pr.perform(act)
		began = time.Now()
		act = m.Step(ev)
	}
}

// event is an event without an answer: the time and the connection's facts now.
func (pr *putRequest) event() syncmachine.Event {
	api := pr.s.api
	trusted, _ := pr.s.states.trustReason()
	return syncmachine.Event{Now: time.Now(), Conn: syncmachine.Conn{ID: api.DecideConn(), Closing: api.Closing(), Trusted: trusted,
		Server: api.Server(), HasValidate: api.HasValidate(), NoHead: api.NoHead()}}
}

// perform does one action's I/O.
func (pr *putRequest) perform(act syncmachine.Action) syncmachine.Event {
	s, sc := pr.s, pr.sc
	ctx := sc.ctx
	var ev syncmachine.Event
	switch a := act.(type) {
	case syncmachine.Head:
		ev.Meta, _, ev.Err = s.api.Head(ctx, apisix.Decide, sc.creds)
	case syncmachine.Read:
		rctx, cancel := ctx, context.CancelFunc(func() {})
		if !a.Until.IsZero() {
			rctx, cancel = context.WithDeadline(ctx, a.Until)
		}
		st, digest, lastModified, err := s.states.readState(rctx, sc.creds)
		cancel()
		ev.Read, ev.Err = syncmachine.StateRead{State: st, Digest: digest, LastModified: lastModified}, err
	case syncmachine.Reseed:
		ev.Reseeded = s.watch.ReseedLocked(ctx, sc.tx, time.Now(), &sc.creds)
	case syncmachine.Validate:
		vctx, cancel := context.WithDeadline(ctx, a.Until)
		found, ok := s.api.ValidateSection(vctx, sc.creds, a.Section, a.Items)
		cancel()
		ev.Found = found
		if !ok {
			ev.Err = errNoVerdict
		}
	case syncmachine.Put:
		ev.Answer, ev.Took, ev.Err = s.send.send(sc, a.Conn, a.Out)
		if a.Release != nil {
			buf := a.Release
			sc.lent.releases = append(sc.lent.releases, func() { s.bodies.bufs.Put(buf) })
		}
		ev.Broke = apisix.ConnectionBroke(sc.r.Context(), ev.Err)
	case syncmachine.AwaitReturn:
		pr.awaitReturn(a.Until)
	case syncmachine.Pause:
		ev.Err = sleepUntil(ctx, a.Until)
	}
	answered := ev
	ev = pr.event()
	answered.Now, answered.Conn = ev.Now, ev.Conn
	return answered
}

// awaitReturn waits, within the PUT's deadline and until, for the data plane to answer
// HEAD /apisix/admin again (no key needed, nothing decoded): the client then gets the
// answer of the APISIX that came back, not a 502.
func (pr *putRequest) awaitReturn(until time.Time) {
	ctx := pr.sc.ctx
	for time.Now().Before(until) {
		if pr.s.api.Alive(ctx, "", time.Second) {
			return
		}
		if sleepUntil(ctx, time.Now().Add(50*time.Millisecond)) != nil {
			return
		}
	}
}

// sleepUntil waits until t, or until ctx ends (its error).
func sleepUntil(ctx context.Context, t time.Time) error {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// deadlineOf is ctx's deadline (the PUT's), or far away.
func deadlineOf(ctx context.Context) time.Time {
	if d, ok := ctx.Deadline(); ok {
		return d
	}
	return time.Now().Add(24 * time.Hour)
}

// say logs and counts what the machine noted; true when a step decided (its time is
// the rewrite's).
func (pr *putRequest) say(notes []syncmachine.Note) (decided bool) {
	n := pr.s.notes
	for _, note := range notes {
		switch note.Kind {
		case syncmachine.NoteDecided:
			decided = true
		case syncmachine.NoteMoves:
			n.moves(note.Moves, note.How)
		case syncmachine.NoteDecision:
			n.decision(note.Res)
		case syncmachine.NoteUntouched:
			n.log.Info().Str("event", "forward_untouched").Str("reason", note.Why).Msg("configs PUT not rewritten; APISIX will judge it")
		case syncmachine.NoteRedial:
			n.log.Info().Str("event", "redial").Str("error", apisix.SafeError(note.Err)).Msg("the connection the data plane's state was read on closed; deciding again on a fresh read")
		case syncmachine.NoteConflictRetry:
			n.m.ConflictRetries.Inc()
			n.log.Info().Str("event", "conflict_retry").Msg("the data plane moved under the sync (a version conflict, or a look before a corrected PUT); reading its state and deciding the sync again")
		case syncmachine.NoteFallback:
			n.fallback(note)
		case syncmachine.NoteHeldBack:
			n.heldBack(note.Held)
		case syncmachine.NoteSecondStep:
			n.log.Info().Str("event", "fallback").Str("result", "second_put").Msg("items rejected for what the data plane held pass now that the rest is applied; deciding the second PUT")
		case syncmachine.NoteUnowned:
			n.unowned(note.Merge)
		}
	}
	return decided
}
