package proxy

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/internal/dataplane"
	"github.com/confshim/confshim/metrics"
	"github.com/confshim/confshim/rewrite"
)

// BadStateError: APISIX answered the state read, but not with a usable document.
type BadStateError struct{ Err error }

func (e BadStateError) Error() string { return e.Err.Error() }

// putRequest is one configs PUT on its way through confshim: what the caller sent, what
// was decided on it, and the buffers to give back. Its methods are the steps of
// putConfigs, in order.
type putRequest struct {
	p     *Proxy
	w     http.ResponseWriter
	r     *http.Request
	ctx   context.Context // under the lock: the request's, bounded by the PUT's deadline
	tx    *dataplane.Tx   // the PUT lock held: the belief, read and changed
	creds apisix.Credentials

	in          rewrite.Input // the body to decide on and its digest (a correction before the PUT replaces the client's)
	clientSent  string        // the X-Digest the client sent, as it sent it
	prepared    *rewrite.Prepared
	untouched   metrics.UntouchedReason
	prepareTime time.Duration

	releases []func()          // buffers and budget to give back
	sent     []<-chan struct{} // the transport may read our buffers until these close

	// §8.5: items held back before the PUT (the steady state), and the body forwarded
	learnt         string // how a fresh read would learn an out-of-band write
	heldUpfront    []dataplane.Held
	holdChecked    bool
	clientPrepared *rewrite.Prepared // the client's own body, when it was corrected before the PUT
	clientBody     []byte            // and its bytes and digest
	clientDigest   string
	carried        []dataplane.Held // items a fallback of this sync held before it was decided again

	// for /debug/config
	start            time.Time
	res              *rewrite.Result
	forwardedDigest  string
	bytesOut         int
	answeredByAPISIX bool
	appliedStatus    int           // APISIX's 2xx when the client is told of held items with a 400
	putTook          time.Duration // how long the last PUT of this sync took (§8.5's budget)

	// which items the sync touched (§7), computed once the lock is free
	corr    correlation
	touched touchedItems
	items   []rewrite.ItemChanges
}

// maxRedials bounds how often one PUT is decided again because the connection its
// state was read on closed (a restarting data plane).
const maxRedials = 2

// putConfigs is contract §5 and §8: ask APISIX whether the caller may write before
// buffering anything, read the body within the memory budget, decide, forward one
// complete PUT, retry once on a version conflict, answer with APISIX's response plus
// X-Confshim-Actions.
func (p *Proxy) putConfigs(w http.ResponseWriter, r *http.Request) {
	cw := &capturingWriter{ResponseWriter: w}
	pr := &putRequest{p: p, w: cw, r: r, creds: apisix.CredentialsOf(r), start: time.Now(), learnt: learntByReread, corr: correlationOf(r)}
	defer pr.record(cw) // after the lock is given back
	if !pr.authorize() || !pr.readBody() {
		return
	}
	defer pr.release()
	if !pr.prepare() || !pr.lock() {
		return
	}
	if a := pr.underLock(); a != nil {
		a.write(pr.w) // the lock is free again: the next PUT need not wait for this client
	}
	pr.items = pr.touched.diff(p.rw) // while the body's buffer is still ours
}

// underLock decides and sends within the PUT's one deadline: every upstream call it
// makes (state reads, the PUT, a conflict's retry, the fallback's validate calls and
// corrected PUTs) shares --upstream-timeout, so nothing here can hang longer.
func (pr *putRequest) underLock() *answer {
	defer pr.tx.Unlock()
	ctx, cancel := context.WithTimeout(pr.r.Context(), pr.p.cfg.UpstreamTimeout)
	defer cancel()
	pr.ctx = ctx
	return pr.forward()
}

// record files the PUT for /debug/config.
func (pr *putRequest) record(cw *capturingWriter) {
	by := "confshim"
	if pr.answeredByAPISIX {
		by = "apisix"
	}
	status := cw.status
	if pr.appliedStatus != 0 && status == http.StatusBadRequest {
		status = pr.appliedStatus // /debug/config shows what APISIX applied, as with accepted
	}
	pr.p.recordSync(syncRecord{start: pr.start, status: status, corr: pr.corr, items: pr.items, by: by, errorMsg: cw.head, in: &pr.in, clientDigest: pr.clientSent,
		prepared: pr.prepared, res: pr.res, forwarded: pr.forwardedDigest, bytesOut: pr.bytesOut})
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

// authorize asks APISIX, with the caller's credentials, whether it may use the
// configuration; a caller APISIX refuses costs no more than a plain proxy would (§5.7).
func (pr *putRequest) authorize() bool {
	err := pr.p.probe(pr.r.Context(), pr.creds)
	var refused apisix.RefusedError
	switch {
	case errors.As(err, &refused):
		pr.p.m.Untouch(metrics.UntouchedRefused)
		pr.p.passthrough(pr.w, pr.r)
		return false
	case err != nil:
		pr.p.stateReadFailed(pr.w, pr.r, err)
		return false
	}
	return true
}

func (pr *putRequest) readBody() bool {
	body, release, ok := pr.p.readBody(pr.w, pr.r)
	if !ok {
		return false
	}
	pr.in.Body = body
	pr.releases = append(pr.releases, release)
	if v := pr.r.Header.Values("X-Digest"); len(v) > 0 {
		pr.in.Digest, pr.in.HasDigest = v[0], true
		pr.clientSent = v[0]
	}
	return true
}

// release gives the buffers back once the transport let go of them: at once in the
// usual case (APISIX read the whole body before it answered), so that the next PUT
// finds them in the pool; later, on its own goroutine, when a body is still being sent.
func (pr *putRequest) release() {
	run := func() {
		for _, f := range pr.releases {
			f()
		}
	}
	if waitAllFor(pr.sent, 100*time.Millisecond) {
		run()
		return
	}
	go func() { waitAll(pr.sent); run() }()
}

// prepare scans the body before the lock, so that concurrent clients do it in parallel.
func (pr *putRequest) prepare() bool {
	start := time.Now()
	prepared, untouched, err := pr.p.prepare(pr.r, pr.in.Body)
	pr.prepareTime = time.Since(start)
	var refuse *rewrite.RefuseError
	if errors.As(err, &refuse) {
		pr.p.refuse(pr.w, refuse)
		return false
	}
	pr.prepared, pr.untouched = prepared, untouched
	return true
}

// lock serialises PUTs; the body was read first so a slow client cannot hold the lock.
func (pr *putRequest) lock() bool {
	if tx, ok := pr.p.dp.Lock(pr.r.Context()); ok {
		pr.tx = tx
		return true
	}
	pr.p.m.ClientDisconnects.Inc()
	pr.w.WriteHeader(statusClientGone)
	return false
}

// forward decides and sends under the lock. It returns APISIX's answer for the client,
// or nil when it answered with an error of its own.
func (pr *putRequest) forward() *answer {
	p := pr.p
	conflictRetried, redials := false, 0
	for fresh := false; ; fresh = true {
		var res *rewrite.Result
		if pr.untouched == "" {
			var err error
			if res, err = pr.decide(fresh); err != nil {
				pr.undecided(err)
				return nil
			}
		}
		if pr.untouched != "" {
			p.m.Untouch(pr.untouched)
		}
		out := p.outgoing(pr.in, res, pr.tx.Digest())
		if len(pr.heldUpfront) > 0 && pr.in.HasDigest && !out.setDigest {
			out.digest, out.setDigest = pr.in.Digest, true // the corrected body is not the client's
		}
		ans, err := pr.send(out, res)
		if res != nil && redials < maxRedials && (errors.Is(err, apisix.ErrRedial) || apisix.ConnectionBroke(pr.r.Context(), err)) {
			// The data plane closed the connection its state was read on (a restart, most
			// likely): whatever happened to this PUT, a fresh read shows it, and the
			// decision taken on that read is the right one either way.
			redials++
			pr.tx.Forget() // the PUT may have landed: what the read shows is not a stranger's
			p.log.Info().Str("event", "redial").Str("error", apisix.SafeError(err)).Msg("the connection the data plane's state was read on closed; deciding again on a fresh read")
			pr.awaitReturn()
			continue
		}
		if err != nil {
			p.upstreamFailed(pr.w, pr.r, err, "PUT "+apisix.ConfigsPath)
			return nil
		}
		if apisix.IsConflict(ans) {
			pr.tx.Doubt() // something wrote in between: never trust the cache again
			if res != nil && !conflictRetried {
				conflictRetried = true
				pr.decideAgain(staleBelief{})
				continue
			}
		}
		var fb *fallbackResult
		if ans.Status == http.StatusBadRequest {
			var lost error
			fb, lost = pr.backfill().afterRejection(out, res, ans.Body)
			var stale staleBelief
			switch {
			case errors.As(lost, &stale) && !conflictRetried:
				conflictRetried = true
				pr.decideAgain(stale)
				if len(pr.carried) > 0 {
					pr.holdChecked = false // what this sync learnt APISIX rejects is held before the PUT
				}
				continue
			case errors.As(lost, &stale):
				// stale twice: APISIX's first answer is the client's; what it holds is read next time
				pr.tx.Forget()
				fb = nil
			case lost != nil:
				// a corrected PUT got no answer: whether APISIX applied it is unknown,
				// so confshim believes nothing and says so
				pr.tx.Forget()
				p.upstreamFailed(pr.w, pr.r, lost, "the corrected PUT of --fallback backfill (APISIX may have applied it)")
				return nil
			}
			if fb != nil {
				ans, out = fb.ans, fb.out
			}
		}
		return pr.conclude(ans, out, res, fb)
	}
}

// conclude records APISIX's answer to this sync (for /debug/config, the metrics, the
// ids it touched and the belief's one transition) and builds the client's answer: with
// --fallback-answer rejection, APISIX's rejection of the held items while the rest is
// applied (§8.5: a 2xx only when everything the client sent is programmed).
func (pr *putRequest) conclude(ans *apisix.Answer, out outgoingPut, res *rewrite.Result, fb *fallbackResult) *answer {
	p := pr.p
	pr.res, pr.bytesOut, pr.answeredByAPISIX = res, len(out.body), true
	pr.forwardedDigest = pr.in.Digest
	if out.setDigest {
		pr.forwardedDigest = out.digest
	}
	prepared := pr.prepared
	if fb != nil {
		prepared = fb.prepared // what APISIX took is the corrected body
	}
	p.count(res, out, ans)
	held := pr.backfill().allHeld(fb)
	if ans.Status/100 == 2 && !p.cfg.SkipItemLists {
		pr.touched = touchedItems{held: held}
		if ans.Status != http.StatusNoContent { // a 204 took nothing from the body
			pr.touched.before, pr.touched.fallback, pr.touched.res, pr.touched.after = pr.tx.KeptState(), pr.in.State, res, prepared
		}
	}
	pr.answered(ans, res, prepared, out, fb, held) // the belief's one transition for this answer
	if ans.Status/100 == 2 {
		p.noteLastHeld(held)
	}
	a := &answer{ans: ans, actions: actionsHeader(ans, res, held)}
	if ans.Status/100 == 2 && len(held) > 0 && p.cfg.FallbackAnswer == AnswerRejection {
		// the rest is applied; the client learns exactly what was not (§8.5)
		pr.appliedStatus, a.ans = ans.Status, heldRejection(ans, held)
	}
	return a
}

// undecided answers a sync that could not be decided; nothing was forwarded.
func (pr *putRequest) undecided(err error) {
	p := pr.p
	var refuse *rewrite.RefuseError
	switch {
	case errors.As(err, &refuse):
		p.refuse(pr.w, refuse)
	case errors.Is(err, errReseedPending):
		p.log.Warn().Str("event", "reseed_pending").Msg("the data plane lost its configuration and re-seeding it did not succeed; nothing forwarded, the client retries")
		pr.w.Header().Set("Retry-After", "1")
		p.writeError(pr.w, http.StatusServiceUnavailable, "the data plane lost its configuration and restoring the kept one did not succeed yet; nothing was forwarded, retry")
	default:
		p.stateReadFailed(pr.w, pr.r, err)
	}
}

// errReseedPending: the data plane was found empty and the kept configuration could not
// be put back first; the sync is not decided on the empty state.
var errReseedPending = errors.New("the data plane lost its configuration; re-seeding it did not succeed")

// restartPatience is how long after its arrival a sync whose connection broke (a data
// plane restarting, ≈ 1–2 s for a container) waits for the data plane to answer again
// before a fresh decision: the client then gets the answer of the APISIX that came
// back, not a 502.
const restartPatience = 5 * time.Second

// awaitReturn waits, within the PUT's deadline and restartPatience, until the data
// plane answers HEAD /apisix/admin again (no key needed, nothing decoded).
func (pr *putRequest) awaitReturn() {
	deadline := pr.start.Add(restartPatience)
	for time.Now().Before(deadline) {
		if pr.p.api.Alive(pr.ctx, "", time.Second) {
			return
		}
		select {
		case <-pr.ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// decideAgain: a PUT of this sync met a version conflict, so the belief it was decided
// on was stale: the state is read and the whole sync decided again, once (§5.4).
func (pr *putRequest) decideAgain(stale staleBelief) {
	p := pr.p
	if stale.landed {
		pr.tx.Forget() // a corrected PUT of this sync moved versions: nobody else's doing
	} else {
		pr.tx.Doubt()
		pr.learnt = learntByConflict
	}
	p.m.ConflictRetries.Inc()
	p.log.Info().Str("event", "conflict_retry").Msg("APISIX rejected a version a concurrent write raised; reading its state and deciding the sync again")
}

// send forwards one complete PUT. A decided body goes on the connection its state was
// read on, or not at all (apisix.ErrRedial).
func (pr *putRequest) send(out outgoingPut, res *rewrite.Result) (*apisix.Answer, error) {
	conn, ctx := apisix.Shared, pr.ctx
	if res != nil {
		conn, ctx = apisix.Decide, apisix.NoRedial(ctx)
	}
	start := time.Now()
	ans, done, err := pr.p.forwardPut(ctx, conn, pr.r, out)
	pr.putTook = time.Since(start)
	pr.sent = append(pr.sent, done)
	if res != nil && res.Changed {
		buf := res.Body[:0]
		pr.releases = append(pr.releases, func() { pr.p.putBuf(&buf) })
	}
	return ans, err
}

// decide reads the data plane's state and runs the rewrite; it sets pr.untouched
// instead when the body goes to APISIX as it came.
func (pr *putRequest) decide(fresh bool) (*rewrite.Result, error) {
	p, ctx := pr.p, pr.ctx
	st, verified, err := pr.decisionState(fresh)
	var refused apisix.RefusedError
	if errors.As(err, &refused) {
		pr.untouched = metrics.UntouchedRefused // APISIX will refuse the PUT itself, in its own words
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if !pr.holdChecked {
		pr.holdChecked = true
		pr.holdKnownRejections()
	}
	pr.in.State, pr.in.Record, pr.in.Owned = st, pr.tx.Record(), pr.tx.Owned()
	pr.in.Now, pr.in.Unread = float64(time.Now().UnixMilli()), !verified
	buf := p.getBuf()
	pr.in.Buf = *buf
	start := time.Now()
	res, err := p.rw.Decide(pr.prepared, pr.in)
	if errors.Is(err, rewrite.ErrStateIncomplete) {
		// the items the decision needs are in the kept configuration when it describes
		// the state believed (after a fallback the record forgot a corrected section)
		if ks := pr.tx.KeptState(); ks != nil {
			pr.in.State = ks
			res, err = p.rw.Decide(pr.prepared, pr.in)
		}
	}
	if err == nil && !verified && (res.Unsure() || res.NeedsProof()) {
		// a version decided unread that the clock did not choose could equal one a
		// writer set meanwhile, or the data plane's items went into the body: the
		// decision stands only on a state shown current (§5.4), so look first
		ok, herr := p.revalidate(ctx, pr.tx, pr.creds)
		switch {
		case herr != nil:
			p.putBuf(buf)
			return nil, herr
		case !ok:
			err = rewrite.ErrStateIncomplete // decided again on a fresh read, just below
		}
	}
	if errors.Is(err, rewrite.ErrStateIncomplete) {
		if st, _, err = p.stateFor(ctx, pr.tx, pr.creds, true, pr.learnt); err != nil {
			p.putBuf(buf)
			if errors.As(err, &refused) {
				pr.untouched = metrics.UntouchedRefused
				return nil, nil
			}
			return nil, err
		}
		pr.in.State, pr.in.Unread = st, false
		start = time.Now()
		res, err = p.rw.Decide(pr.prepared, pr.in)
	}
	p.m.RewriteDuration.Observe((pr.prepareTime + time.Since(start)).Seconds())
	if res == nil || !res.Changed {
		p.putBuf(buf)
	}
	var skip *rewrite.SkipError
	switch {
	case errors.As(err, &skip):
		p.log.Info().Str("event", "forward_untouched").Str("reason", skip.Reason).Msg("configs PUT not rewritten; APISIX will judge it")
		pr.untouched = metrics.UntouchedInvalid
		return nil, nil
	case err != nil:
		return nil, err
	}
	if len(res.Changes) > 0 {
		p.logDecision(res)
	}
	return res, nil
}

// decisionState is the state this sync is decided on (verified: shown current for it).
// A data plane found empty gets the kept configuration back first (§8.4: the client's
// sync beat the watch to a restarted data plane); a sync is never decided on the empty
// state while there is one to restore (its preserved and merged sections would go out
// empty, and the kept configuration with them: §5.4).
func (pr *putRequest) decisionState(fresh bool) (*rewrite.State, bool, error) {
	p, ctx := pr.p, pr.ctx
	st, verified, err := p.stateFor(ctx, pr.tx, pr.creds, fresh, pr.learnt)
	if err != nil || !pr.tx.Empty(p.api.NoHead()) || !p.dp.Keeps() || pr.tx.Kept() == nil {
		return st, verified, err
	}
	if p.watch.ReseedLocked(ctx, pr.tx, time.Now(), &pr.creds) {
		return pr.tx.State(), verified, nil
	}
	if st, verified, err = p.stateFor(ctx, pr.tx, pr.creds, true, pr.learnt); err == nil && pr.tx.Empty(p.api.NoHead()) {
		return nil, false, errReseedPending
	}
	return st, verified, err // someone wrote meanwhile: decided on what it holds
}

// holdKnownRejections holds back, before the PUT, the items this APISIX is known to
// reject (§8.5's steady state): the body decided becomes the corrected one.
func (pr *putRequest) holdKnownRejections() {
	p := pr.p
	if pr.clientPrepared != nil { // decided again: the client's own body is held back afresh
		pr.in.Body, pr.prepared, pr.in.Digest, pr.heldUpfront = pr.clientBody, pr.clientPrepared, pr.clientDigest, nil
	}
	corrected, held := pr.backfill().steadyState(pr.ctx)
	if corrected == nil {
		return
	}
	prepared, err := p.rw.PrepareLike(corrected, p.correctedLayout.Load())
	if err != nil {
		return
	}
	p.correctedLayout.Store(prepared.Layout()) // the steady state sends this one again
	pr.clientPrepared, pr.clientBody, pr.clientDigest = pr.prepared, pr.in.Body, pr.in.Digest
	pr.in.Body, pr.prepared, pr.heldUpfront = corrected, prepared, held
	if pr.in.HasDigest {
		pr.in.Digest += "+held:" + correctionHash(held) // another body than the client's
	}
}

// refuse answers a body confshim must not forward (contract §6): 400, nothing forwarded.
func (p *Proxy) refuse(w http.ResponseWriter, refuse *rewrite.RefuseError) {
	p.m.Refuse(metrics.RefusedUnrepairable)
	p.log.Info().Str("event", "refused").Str("reason", refuse.Reason).Msg("configs PUT refused; nothing forwarded")
	p.writeError(w, http.StatusBadRequest, refuse.Reason)
}

func isYAML(r *http.Request) bool {
	return strings.HasPrefix(r.Header.Get("Content-Type"), "application/yaml") // APISIX's test, §1.3
}

func waitAll(chans []<-chan struct{}) {
	for _, c := range chans {
		<-c
	}
}

// waitAllFor is waitAll for at most d; false when some channel is still open.
func waitAllFor(chans []<-chan struct{}, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for _, c := range chans {
		select {
		case <-c:
		case <-timer.C:
			return false
		}
	}
	return true
}

// prepare scans the body without any state: it returns the prepared body, or the
// reason to forward it untouched, or a *rewrite.RefuseError.
func (p *Proxy) prepare(r *http.Request, body []byte) (*rewrite.Prepared, metrics.UntouchedReason, error) {
	if enc := r.Header.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") {
		// APISIX does not decode request bodies either; decoding here would change what
		// it decides. Forwarded untouched, header and body still match.
		p.log.Info().Str("event", "forward_untouched").Str("reason", "content-encoding").Msg("configs PUT not rewritten; APISIX will judge it")
		return nil, metrics.UntouchedEncoded, nil
	}
	var prepared *rewrite.Prepared
	var err error
	if isYAML(r) {
		prepared, err = p.rw.PrepareYAML(body)
	} else if prepared, err = p.rw.PrepareLike(body, p.layout.Load()); err == nil {
		p.layout.Store(prepared.Layout()) // the next sync is most likely this one again
	}
	var skip *rewrite.SkipError
	if errors.As(err, &skip) {
		p.log.Info().Str("event", "forward_untouched").Str("reason", skip.Reason).Msg("configs PUT not rewritten; APISIX will judge it")
		return nil, metrics.UntouchedInvalid, nil
	}
	return prepared, "", err
}

// stateReadFailed answers a PUT whose data plane state could not be read: nothing was
// forwarded. An answer APISIX gave but confshim cannot use is a 502; no answer at all
// is classified like any upstream failure (502, or 504 on a timeout).
func (p *Proxy) stateReadFailed(w http.ResponseWriter, r *http.Request, err error) {
	var status apisix.StatusError
	var bad BadStateError
	if errors.As(err, &status) || errors.As(err, &bad) {
		p.m.UpstreamError(metrics.OtherError)
		p.writeError(w, http.StatusBadGateway, "cannot read the data plane's state: "+err.Error()+"; nothing was forwarded")
		return
	}
	p.upstreamFailed(w, r, err, "read the data plane's state before the PUT; nothing was forwarded")
}

// probe asks APISIX, with exactly the credentials the PUT carries, whether the caller
// may use the configuration (apisix.Client.Probe).
func (p *Proxy) probe(ctx context.Context, creds apisix.Credentials) error {
	return p.api.Probe(ctx, creds, p.stateLimit())
}

// stateLimit bounds a configuration confshim reads from the data plane.
func (p *Proxy) stateLimit() int64 { return 4 * p.cfg.MaxBodyBytes }

// outgoingPut is the PUT confshim forwards: the body and the X-Digest to send.
type outgoingPut struct {
	body      []byte
	digest    string
	setDigest bool
	noop      bool // the data plane's own digest, so that APISIX answers 204 (§8.2)
}

// outgoing builds what to forward: the client's bytes, or the rewritten ones.
func (p *Proxy) outgoing(in rewrite.Input, res *rewrite.Result, dpDigest string) outgoingPut {
	out := outgoingPut{body: in.Body}
	if res == nil || !res.Changed {
		return out
	}
	out.body = res.Body
	if in.HasDigest {
		out.digest, out.setDigest = res.Digest, true
		if res.NoOp && dpDigest != "" {
			out.digest, out.noop = dpDigest, true
		}
	}
	return out
}

// forwardPut sends one complete PUT, with the client's headers (hop-by-hop ones
// removed, X-Digest as decided), and reads APISIX's answer whole. done closes when the
// transport let go of the body.
func (p *Proxy) forwardPut(ctx context.Context, conn apisix.Conn, r *http.Request, out outgoingPut) (*apisix.Answer, <-chan struct{}, error) {
	header := r.Header.Clone()
	apisix.RemoveHopHeaders(header)
	header.Del("Expect")
	header.Del("Content-Length")
	if out.setDigest {
		header.Del("X-Digest")
		header.Set("X-Digest", out.digest)
	}
	return p.api.Put(ctx, conn, p.api.ForwardURL(r), header, out.body)
}

// count feeds the decision's metrics once APISIX answered.
func (p *Proxy) count(res *rewrite.Result, out outgoingPut, ans *apisix.Answer) {
	if res == nil {
		return
	}
	for _, c := range res.Changes {
		p.m.SectionRewrites.WithLabelValues(metrics.SectionLabel(c.Section), string(c.Action)).Inc()
	}
	p.m.ThinnedBytes.Add(float64(res.ThinnedBytes))
	if out.noop && ans.Status == http.StatusNoContent {
		p.m.NoopPuts.Inc()
	}
}

// answered records APISIX's answer in the belief (one transition, dataplane.Answered),
// says once per merged section that confshim had no memory of ownership, and keeps
// the credentials of a caller whose PUT APISIX accepted for re-seeding.
func (pr *putRequest) answered(ans *apisix.Answer, res *rewrite.Result, prepared *rewrite.Prepared, out outgoingPut, fb *fallbackResult, held []dataplane.Held) {
	p := pr.p
	o := dataplane.Outcome{Status: ans.Status, Digest: ans.Header.Get("X-Digest"), LastModified: ans.Header.Get("X-Last-Modified"),
		Res: res, Prepared: prepared, NoOp: out.noop, Conn: p.api.DecideConn(),
		Fallback: p.cfg.Fallback, Held: held}
	if fb != nil {
		o.Backfilled, o.Versions = fb.changed, fb.versions
	} else if len(pr.heldUpfront) > 0 {
		o.Correction = p.correctionOf(pr.clientPrepared, pr.prepared, pr.heldUpfront)
	}
	unowned := pr.tx.Answered(o)
	if ans.Status/100 == 2 && p.watch != nil {
		p.watch.NoteCaller(pr.creds)
	}
	for _, m := range unowned {
		p.log.Warn().Str("event", "merge_unowned").Str("section", rewrite.Clip(m.Section)).Int("kept", m.Kept).
			Strs("kept_ids", m.KeptIDs).Int("kept_ids_not_named", m.Kept-len(m.KeptIDs)).
			Msg("no memory of which items the client owns in this merged section (a restart without --state-dir): items missing from its copy are kept, not deleted")
	}
}

// answer is APISIX's answer to the client's PUT, read whole, to be written once the
// lock is free.
type answer struct {
	ans     *apisix.Answer
	actions string // X-Confshim-Actions, "" for none
}

// write answers the client with APISIX's status, headers and body.
func (a *answer) write(w http.ResponseWriter) {
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
