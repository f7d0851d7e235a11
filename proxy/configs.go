package proxy

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/internal/dataplane"
	"github.com/confshim/confshim/internal/reseed"
	"github.com/confshim/confshim/metrics"
	"github.com/confshim/confshim/rewrite"
)

// The configs PUT (contract §5 and §8) is a pipeline of stages, each a value in and a
// value out:
//
//	authorize  the caller's credentials          → may it write (APISIX's probe)
//	receive    the request                       → received: the body read and scanned
//	lock       the PUT lock                      → scope: the sync under the lock
//	decide     received, the state (stateFor)    → decided: the body and rewrite's result
//	send       decided                           → APISIX's answer
//	fall back  a 400 (rejectedPut)               → fallbackResult: what was held, what landed
//	conclude   the answer                        → answer for the client, and the record
//	file       the record                        → /debug/config, the log line
//
// A conflict, a closed decide connection or a stale fallback sends the sync back to
// decide (retries says why), never further back.

// syncer is the configs PUT: what every sync needs, read-only after New but for the
// body layouts it learns.
type syncer struct {
	timeout       time.Duration  // --upstream-timeout: the PUT's one deadline under the lock
	skipItemLists bool           // no ids per sync (§7): the benchmarks' baseline
	answerHeld    FallbackAnswer // --fallback-answer
	api           *apisix.Client
	rw            *rewrite.Rewriter
	dp            *dataplane.Belief
	watch         *reseed.Watcher // nil with --reseed-interval 0
	bodies        *bodyReader
	states        *stateReader
	decider       *decider
	fallback      *fallback
	send          sender
	notes         notes
	replies
	asItCame http.HandlerFunc               // a PUT APISIX will refuse goes as it came
	layout   atomic.Pointer[rewrite.Layout] // the last JSON body's shape, for PrepareLike
}

// putRequest is one configs PUT on its way through the stages: what the client sent
// (never changed), the sync under the lock, and what it leaves to be filed.
type putRequest struct {
	s             *syncer
	w             *capturingWriter
	sc            *scope
	rcv           received
	rec           syncRecord   // what the log line and /debug/config show, filled as it goes
	touched       touchedItems // which items an accepted sync touched, listed once the lock is free
	appliedStatus int          // APISIX's 2xx when the client is told of held items with a 400
}

// maxRedials bounds how often one PUT is decided again because the connection its
// state was read on closed (a restarting data plane).
const maxRedials = 2

// ServeHTTP is contract §5 and §8: ask APISIX whether the caller may write before
// buffering anything, read the body within the memory budget, decide, forward one
// complete PUT, retry once on a version conflict, answer with APISIX's response plus
// X-Confshim-Actions.
func (s *syncer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	cw := &capturingWriter{ResponseWriter: w}
	start := time.Now()
	pr := &putRequest{s: s, w: cw, rec: syncRecord{start: start, corr: correlationOf(r)},
		sc: &scope{r: r, creds: apisix.CredentialsOf(r), start: start, lent: &lent{}}}
	defer pr.file() // after the lock is given back
	if !pr.authorize() {
		return
	}
	var arrived func([]byte)
	var a *arrival
	if scansArriving(r) {
		a = startArrival(s.rw)
		arrived = a.offer
	}
	body, release, ok := s.bodies.read(cw, r, arrived)
	var scan *rewrite.BodyScan
	if a != nil {
		scan = a.end() // before the buffer can be given back
	}
	if !ok {
		return
	}
	pr.sc.lent.releases = append(pr.sc.lent.releases, release)
	defer pr.sc.lent.giveAllBack()
	if !pr.receive(body, scan) || !pr.lock() {
		return
	}
	if a := pr.underLock(); a != nil {
		a.write(cw) // the lock is free again: the next PUT need not wait for this client
	}
	pr.rec.items = pr.touched.diff(s.rw) // while the body's buffer is still ours
}

// authorize asks APISIX, with the caller's credentials, whether it may use the
// configuration; a caller APISIX refuses costs no more than a plain proxy would (§5.7).
func (pr *putRequest) authorize() bool {
	s, r := pr.s, pr.sc.r
	err := s.states.probe(r.Context(), pr.sc.creds)
	var refused apisix.RefusedError
	switch {
	case errors.As(err, &refused):
		s.m.Untouch(metrics.UntouchedRefused)
		s.asItCame(pr.w, r)
		return false
	case err != nil:
		s.stateReadFailed(pr.w, r, err)
		return false
	}
	return true
}

// receive scans the body before the lock, so that concurrent clients do it in parallel
// (scan: what was scanned while it arrived, nil for none).
func (pr *putRequest) receive(body []byte, scan *rewrite.BodyScan) bool {
	r := pr.sc.r
	rcv := received{in: rewrite.Input{Body: body}}
	if v := r.Header.Values("X-Digest"); len(v) > 0 {
		rcv.in.Digest, rcv.in.HasDigest = v[0], true
	}
	start := time.Now()
	prepared, untouched, err := pr.s.prepare(r, body, scan)
	rcv.scanned = time.Since(start)
	var refuse *rewrite.RefuseError
	if errors.As(err, &refuse) {
		pr.s.refuse(pr.w, refuse)
		return false
	}
	rcv.prepared, rcv.untouched = prepared, untouched
	pr.rcv = rcv
	pr.rec.bytesIn, pr.rec.clientDigest, pr.rec.prepared = len(body), rcv.in.Digest, prepared
	return true
}

// prepare scans the body without any state: it returns the prepared body, or the
// reason to forward it untouched, or a *rewrite.RefuseError.
func (s *syncer) prepare(r *http.Request, body []byte, scan *rewrite.BodyScan) (*rewrite.Prepared, metrics.UntouchedReason, error) {
	if !identityEncoded(r) {
		// APISIX does not decode request bodies either; decoding here would change what
		// it decides. Forwarded untouched, header and body still match.
		s.log.Info().Str("event", "forward_untouched").Str("reason", "content-encoding").Msg("configs PUT not rewritten; APISIX will judge it")
		return nil, metrics.UntouchedEncoded, nil
	}
	var prepared *rewrite.Prepared
	var err error
	switch {
	case isYAML(r):
		prepared, err = s.rw.PrepareYAML(body)
	case scan != nil:
		prepared, err = s.rw.PrepareArrived(body, scan, s.layout.Load())
	default:
		prepared, err = s.rw.PrepareLike(body, s.layout.Load())
	}
	if err == nil && prepared.Layout() != nil {
		s.layout.Store(prepared.Layout()) // the next sync is most likely this one again
	}
	var skip *rewrite.SkipError
	if errors.As(err, &skip) {
		s.log.Info().Str("event", "forward_untouched").Str("reason", skip.Reason).Msg("configs PUT not rewritten; APISIX will judge it")
		return nil, metrics.UntouchedInvalid, nil
	}
	return prepared, "", err
}

// scansArriving: the body is scanned as it arrives — JSON that goes to APISIX as sent
// (YAML is scanned whole: lyaml's reading of a document depends on what follows).
func scansArriving(r *http.Request) bool { return !isYAML(r) && identityEncoded(r) }

// identityEncoded: the body is sent as it is (APISIX decodes no request body either).
func identityEncoded(r *http.Request) bool {
	enc := r.Header.Get("Content-Encoding")
	return enc == "" || strings.EqualFold(enc, "identity")
}

func isYAML(r *http.Request) bool {
	return strings.HasPrefix(r.Header.Get("Content-Type"), "application/yaml") // APISIX's test, §1.3
}

// lock serialises PUTs; the body was read first so a slow client cannot hold the lock.
func (pr *putRequest) lock() bool {
	tx, ok := pr.s.dp.Lock(pr.sc.r.Context())
	if !ok {
		pr.s.clientGone(pr.w)
		return false
	}
	pr.sc.tx = tx
	return true
}

// underLock decides and sends within the PUT's one deadline: every upstream call it
// makes (state reads, the PUT, a conflict's retry, the fallback's validate calls and
// corrected PUTs) shares --upstream-timeout, so nothing here can hang longer.
func (pr *putRequest) underLock() *clientAnswer {
	defer pr.sc.tx.Unlock()
	ctx, cancel := context.WithTimeout(pr.sc.r.Context(), pr.s.timeout)
	defer cancel()
	pr.sc.ctx = ctx
	return pr.forward()
}

// forward decides and sends under the lock, decided again as retries allow. It returns
// APISIX's answer for the client, or nil when confshim answered with an error of its own.
func (pr *putRequest) forward() *clientAnswer {
	t := firstTry(pr.rcv)
	for fresh := false; ; fresh = true {
		d, err := pr.s.decider.decide(pr.sc, pr.rcv, fresh, t)
		if err != nil {
			pr.undecided(err)
			return nil
		}
		if d.untouched != "" {
			pr.s.m.Untouch(d.untouched)
		}
		out := outgoing(d.in, d.res, pr.sc.tx.View().Digest)
		if len(d.held) > 0 && d.in.HasDigest && !out.setDigest {
			out.digest, out.setDigest = d.in.Digest, true // the corrected body is not the client's
		}
		ans, err := pr.sendDecided(out, d.res)
		if again, a := pr.afterSend(t, d, out, ans, err); !again {
			return a
		}
	}
}

// sendDecided forwards one complete PUT: a decided body on the connection its state
// was read on, or not at all; an untouched one on the shared connection.
func (pr *putRequest) sendDecided(out outgoingPut, res *rewrite.Result) (*apisix.Answer, error) {
	conn := apisix.Shared
	if res != nil {
		conn = apisix.Decide
	}
	ans, err := pr.s.send.send(pr.sc, conn, out)
	if res != nil && res.Changed {
		buf := res.Body[:0]
		pr.sc.lent.releases = append(pr.sc.lent.releases, func() { pr.s.bodies.bufs.put(&buf) })
	}
	return ans, err
}

// afterSend is what APISIX's answer, or its absence, makes of the sync: decided again
// (true), or the client's answer (nil when confshim answered with an error of its own).
func (pr *putRequest) afterSend(t *retries, d decided, out outgoingPut, ans *apisix.Answer, err error) (again bool, a *clientAnswer) {
	s, tx := pr.s, pr.sc.tx
	switch {
	case d.res != nil && t.redials < maxRedials && (errors.Is(err, apisix.ErrRedial) || apisix.ConnectionBroke(pr.sc.r.Context(), err)):
		// The data plane closed the connection its state was read on (a restart, most
		// likely): whatever happened to this PUT, a fresh read shows it, and the
		// decision taken on that read is the right one either way.
		t.redials++
		tx.Forget() // the PUT may have landed: what the read shows is not a stranger's
		s.log.Info().Str("event", "redial").Str("error", apisix.SafeError(err)).Msg("the connection the data plane's state was read on closed; deciding again on a fresh read")
		pr.awaitReturn()
		return true, nil
	case err != nil:
		s.upstreamFailed(pr.w, pr.sc.r, err, "PUT "+apisix.ConfigsPath)
		return false, nil
	case apisix.IsConflict(ans):
		tx.Doubt() // something wrote in between: never trust the cache again
		if d.res != nil && !t.conflicted {
			t.conflicted = true
			pr.decideAgain(t, staleBelief{})
			return true, nil
		}
	}
	var fb *fallbackResult
	if ans.Status == http.StatusBadRequest {
		var answered bool
		if fb, again, answered = pr.fallBack(t, d, out, ans); again || answered {
			return again, nil
		}
		if fb != nil {
			ans, out = fb.ans, fb.out
		}
	}
	return false, pr.conclude(d, ans, out, fb)
}

// fallBack is §8.5 after APISIX answered a decided PUT 400: the corrected PUT it
// accepted (nil: its first answer stands), the sync decided again on a stale belief, or
// answered by confshim when a corrected PUT got no answer.
func (pr *putRequest) fallBack(t *retries, d decided, out outgoingPut, ans *apisix.Answer) (fb *fallbackResult, again, answered bool) {
	fb, lost := pr.s.fallback.of(pr.sc).afterRejection(rejectedPut{out: out, res: d.res, in: d.in, prepared: d.prepared, rejection: ans.Body})
	var stale staleBelief
	switch {
	case errors.As(lost, &stale) && !t.conflicted:
		t.conflicted = true
		pr.decideAgain(t, stale)
		if len(stale.carried) > 0 {
			t.carried, t.holdAgain = stale.carried, true // what this sync learnt APISIX rejects is held before the PUT
		}
		return nil, true, false
	case errors.As(lost, &stale):
		// stale twice: APISIX's first answer is the client's; what it holds is read next time
		pr.sc.tx.Forget()
		return nil, false, false
	case lost != nil:
		// a corrected PUT got no answer: whether APISIX applied it is unknown, so
		// confshim believes nothing and says so
		pr.sc.tx.Forget()
		pr.s.upstreamFailed(pr.w, pr.sc.r, lost, "the corrected PUT of --fallback backfill (APISIX may have applied it)")
		return nil, false, true
	}
	return fb, false, false
}

// decideAgain: a PUT of this sync met a version conflict, so the belief it was decided
// on was stale: the state is read and the whole sync decided again, once (§5.4).
func (pr *putRequest) decideAgain(t *retries, stale staleBelief) {
	if stale.landed {
		pr.sc.tx.Forget() // a corrected PUT of this sync moved versions: nobody else's doing
	} else {
		pr.sc.tx.Doubt()
		t.learnt = learntByConflict
	}
	pr.s.m.ConflictRetries.Inc()
	pr.s.log.Info().Str("event", "conflict_retry").Msg("APISIX rejected a version a concurrent write raised; reading its state and deciding the sync again")
}

// restartPatience is how long after its arrival a sync whose connection broke (a data
// plane restarting, ≈ 1–2 s for a container) waits for the data plane to answer again
// before a fresh decision: the client then gets the answer of the APISIX that came
// back, not a 502.
const restartPatience = 5 * time.Second

// awaitReturn waits, within the PUT's deadline and restartPatience, until the data
// plane answers HEAD /apisix/admin again (no key needed, nothing decoded).
func (pr *putRequest) awaitReturn() {
	ctx := pr.sc.ctx
	deadline := pr.sc.start.Add(restartPatience)
	for time.Now().Before(deadline) {
		if pr.s.api.Alive(ctx, "", time.Second) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// undecided answers a sync that could not be decided; nothing was forwarded.
func (pr *putRequest) undecided(err error) {
	s := pr.s
	var refuse *rewrite.RefuseError
	switch {
	case errors.As(err, &refuse):
		s.refuse(pr.w, refuse)
	case errors.Is(err, errReseedPending):
		s.log.Warn().Str("event", "reseed_pending").Msg("the data plane lost its configuration and re-seeding it did not succeed; nothing forwarded, the client retries")
		pr.w.Header().Set("Retry-After", "1")
		writeError(pr.w, http.StatusServiceUnavailable, "the data plane lost its configuration and restoring the kept one did not succeed yet; nothing was forwarded, retry")
	default:
		s.stateReadFailed(pr.w, pr.sc.r, err)
	}
}

// conclude records APISIX's answer to this sync (for /debug/config, the metrics, the
// ids it touched and the belief's one transition) and builds the client's answer: with
// --fallback-answer rejection, APISIX's rejection of the held items while the rest is
// applied (§8.5: a 2xx only when everything the client sent is programmed).
func (pr *putRequest) conclude(d decided, ans *apisix.Answer, out outgoingPut, fb *fallbackResult) *clientAnswer {
	s := pr.s
	pr.rec.res, pr.rec.bytesOut, pr.rec.by, pr.rec.prepared = d.res, len(out.body), "apisix", d.prepared
	pr.rec.forwarded = d.in.Digest
	if out.setDigest {
		pr.rec.forwarded = out.digest
	}
	prepared := d.prepared
	if fb != nil {
		prepared = fb.prepared // what APISIX took is the corrected body
	}
	s.notes.count(d.res, out, ans)
	held := allHeld(d.held, fb)
	accepted := ans.Status/100 == 2
	if accepted && !s.skipItemLists {
		pr.touched = touchedItems{held: held}
		if ans.Status != http.StatusNoContent { // a 204 took nothing from the body
			pr.touched.before, pr.touched.decidedOn, pr.touched.res, pr.touched.after = pr.sc.tx.View().KeptState(), d.in.State, d.res, prepared
		}
	}
	pr.answered(ans, d, prepared, out, fb, held) // the belief's one transition for this answer
	if accepted && s.fallback.on {
		s.notes.lastHeld(held)
	}
	a := &clientAnswer{ans: ans, actions: actionsHeader(ans, d.res, held)}
	if accepted && len(held) > 0 && s.answerHeld == AnswerRejection {
		// the rest is applied; the client learns exactly what was not (§8.5)
		pr.appliedStatus, a.ans = ans.Status, heldRejection(ans, held)
	}
	return a
}

// answered records APISIX's answer in the belief (one transition, dataplane.Answered),
// says once per merged section that confshim had no memory of ownership, and keeps
// the credentials of a caller whose PUT APISIX accepted for the watch.
func (pr *putRequest) answered(ans *apisix.Answer, d decided, prepared *rewrite.Prepared, out outgoingPut, fb *fallbackResult, held []dataplane.Held) {
	s := pr.s
	o := dataplane.Outcome{Status: ans.Status, Digest: ans.Header.Get("X-Digest"), LastModified: ans.Header.Get("X-Last-Modified"),
		Res: d.res, Prepared: prepared, NoOp: out.noop, Conn: s.api.DecideConn(),
		Fallback: s.fallback.on, Held: held}
	if fb != nil {
		o.Backfilled, o.Versions = fb.changed, fb.versions
	} else if len(d.held) > 0 {
		o.Correction = s.fallback.correctionOf(pr.rcv.prepared, d.prepared, d.held)
	}
	for _, m := range pr.sc.tx.Answered(o) {
		s.notes.unowned(m)
	}
	if ans.Status/100 == 2 && s.watch != nil {
		s.watch.NoteCaller(pr.sc.creds)
	}
}

// file files the sync for /debug/config and its log line.
func (pr *putRequest) file() {
	rec := pr.rec
	rec.status, rec.errorMsg = pr.w.status, pr.w.head
	if pr.appliedStatus != 0 { // the client was told of held items: APISIX applied the rest
		rec.status = pr.appliedStatus // /debug/config shows what APISIX applied, as with accepted
	}
	if rec.by == "" {
		rec.by = "confshim"
	}
	pr.s.notes.synced(rec)
}

// clientAnswer is APISIX's answer to the client's PUT, read whole, to be written once the
// lock is free.
type clientAnswer struct {
	ans     *apisix.Answer
	actions string // X-Confshim-Actions, "" for none
}

// write answers the client with APISIX's status, headers and body.
func (a *clientAnswer) write(w http.ResponseWriter) {
	h := w.Header()
	for k, v := range a.ans.Header {
		h[k] = v
	}
	apisix.RemoveHopHeaders(h)
	if h.Get("Content-Length") != "" {
		h.Set("Content-Length", strconv.Itoa(len(a.ans.Body))) // the same, unless the client cut it
	}
	if a.actions != "" {
		h.Set("X-Confshim-Actions", a.actions)
	}
	w.WriteHeader(a.ans.Status)
	if len(a.ans.Body) > 0 {
		_, _ = w.Write(a.ans.Body)
	}
}

// capturingWriter keeps the status and the start of an error answer, for /debug/config.
type capturingWriter struct {
	http.ResponseWriter
	status int
	head   []byte
}

func (c *capturingWriter) WriteHeader(code int) {
	if c.status == 0 {
		c.status = code
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *capturingWriter) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	if c.status >= 400 && len(c.head) < 1024 {
		c.head = append(c.head, b[:min(len(b), 1024-len(c.head))]...)
	}
	return c.ResponseWriter.Write(b)
}

func (c *capturingWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }
