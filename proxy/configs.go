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
	"github.com/confshim/confshim/internal/syncmachine"
	"github.com/confshim/confshim/metrics"
	"github.com/confshim/confshim/rewrite"
)

// The configs PUT (contract §5 and §8) is a pipeline of stages, each a value in and a
// value out:
//
//	authorize  the caller's credentials          → may it write (APISIX's probe)
//	receive    the request                       → received: the body read and scanned
//	lock       the PUT lock                      → scope: the sync under the lock
//	sync       received, the belief              → syncmachine.Final (drive.go: the machine's actions done)
//	conclude   the final state                   → the client's answer, the record
//	file       the record                        → /debug/config, the log line
//
// Under the lock the sync is internal/syncmachine's state machine — decide, send, a
// conflict's or a redial's decision again, the fallback's rounds, the second step, the
// budget — and drive.go does each action's I/O and nothing else.

// received is the client's PUT as read and scanned before the lock.
type received struct {
	in        rewrite.Input // the body and the X-Digest as the client sent them
	prepared  *rewrite.Prepared
	untouched metrics.UntouchedReason // why it goes to APISIX as it came ("" to decide)
	scanned   time.Duration           // the scan's time, counted into the rewrite's
}

// syncer is the configs PUT: what every sync needs, read-only after New but for the
// body layouts it learns.
type syncer struct {
	timeout       time.Duration // --upstream-timeout: the PUT's one deadline under the lock
	skipItemLists bool          // no ids per sync (§7): the benchmarks' baseline
	api           *apisix.Client
	rw            *rewrite.Rewriter
	dp            *dataplane.Belief
	watch         *reseed.Watcher // nil with --reseed-interval 0
	bodies        *bodyReader
	states        *stateReader
	machine       *syncmachine.Config
	fallbackOn    bool // --fallback backfill
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
	rec           syncRecord            // what the log line and /debug/config show, filled as it goes
	touched       []syncmachine.Touched // what each accepted PUT took, listed once the lock is free
	appliedStatus int                   // APISIX's 2xx when the client is told of held items with a 400
}

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
	pr.rec.items = touchedIDs(pr.touched, s.rw) // while the body's buffer is still ours
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
		s.stateReadFailed(pr.w, r, err, "nothing was forwarded")
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

// underLock runs the sync within the PUT's one deadline: every upstream call it makes
// (state reads, the PUTs, a conflict's retry, the fallback's validate calls and
// corrected PUTs) shares --upstream-timeout, so nothing here can hang longer.
func (pr *putRequest) underLock() *clientAnswer {
	defer pr.sc.tx.Unlock()
	ctx, cancel := context.WithTimeout(pr.sc.r.Context(), pr.s.timeout)
	defer cancel()
	pr.sc.ctx = ctx
	return pr.conclude(pr.drive())
}

// conclude files what the sync ended on (the record, the metrics, the ids it touched,
// the caller kept for the watch) and returns the client's answer from the machine's
// final state, or nil when confshim answered with an error of its own.
func (pr *putRequest) conclude(f *syncmachine.Final) *clientAnswer {
	s := pr.s
	if f.Failure != nil {
		pr.failed(f.Failure)
		return nil
	}
	if f.Untouched != "" {
		s.m.Untouch(f.Untouched)
	}
	pr.rec.res, pr.rec.bytesOut, pr.rec.by = f.Res, len(f.Sent.Body), "apisix"
	pr.rec.forwarded = pr.rcv.in.Digest
	if f.Sent.SetDigest {
		pr.rec.forwarded = f.Sent.Digest
	}
	for _, res := range f.Earlier { // decided again after a lost tie: their rewrites happened too
		s.notes.count(res, syncmachine.Outgoing{}, f.Answer)
	}
	s.notes.count(f.Res, f.Sent, f.Answer)
	if f.Accepted() {
		s.m.ConfigTooBigBytes.Set(0)
		if !s.skipItemLists {
			pr.touched = f.Touched
		}
		if s.fallbackOn {
			s.notes.lastHeld(f.Held)
		}
		if s.watch != nil {
			s.watch.NoteCaller(pr.sc.creds)
		}
	}
	ans, actions := f.Reply()
	if ans != f.Answer { // the client is told of held items: APISIX applied the rest
		pr.appliedStatus = f.Answer.Status
	}
	return &clientAnswer{ans: ans, actions: actions}
}

// failed answers a sync that ended without a usable answer from APISIX.
func (pr *putRequest) failed(f *syncmachine.Failure) {
	s, w, r := pr.s, pr.w, pr.sc.r
	var refuse *rewrite.RefuseError
	switch {
	case f.Kind == syncmachine.FailRefused && errors.As(f.Err, &refuse):
		s.refuse(w, refuse)
	case f.Kind == syncmachine.FailReseedPending:
		s.log.Warn().Str("event", "reseed_pending").Msg("the data plane lost its configuration and re-seeding it did not succeed; nothing forwarded, the client retries")
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "the data plane lost its configuration and restoring the kept one did not succeed yet; nothing was forwarded, retry")
	case f.Kind == syncmachine.FailUpstream:
		s.upstreamFailed(w, r, f.Err, f.What)
	case f.Kind == syncmachine.FailTooBig:
		s.tooBig(w, f, time.Now())
	case f.Kind == syncmachine.FailTieLost:
		s.tieLost(w, f.Ties)
	case f.Kind == syncmachine.FailTieUnverified && errors.Is(f.Err, syncmachine.ErrTieBudget):
		writeError(w, http.StatusBadGateway, syncmachine.ErrTieBudget.Error()+"; "+tieUnverified(f.Ties))
	case f.Kind == syncmachine.FailTieUnverified:
		s.stateReadFailed(w, r, f.Err, tieUnverified(f.Ties))
	case f.Applied:
		s.stateReadFailed(w, r, f.Err, "an earlier PUT of this sync was applied, then the data plane moved; nothing more was forwarded")
	default:
		s.stateReadFailed(w, r, f.Err, "nothing was forwarded")
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
