package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/confshim/confshim/metrics"
	"github.com/confshim/confshim/rewrite"
)

// dataPlane is what confshim knows of APISIX between PUTs; guarded by putLock.
type dataPlane struct {
	state        *rewrite.State
	digest       string // X-Digest and X-Last-Modified the state belongs to
	lastModified string
	record       *rewrite.Record
}

// RefusedError: APISIX refused a request confshim made with the caller's credentials
// (401/403); the caller's PUT then goes to APISIX untouched, to be refused in its words.
type RefusedError struct{ Status int }

func (e RefusedError) Error() string { return fmt.Sprintf("state read refused with %d", e.Status) }

// StateStatusError: APISIX answered a state read with an unexpected status.
type StateStatusError struct {
	Method string
	Status int
}

func (e StateStatusError) Error() string {
	return fmt.Sprintf("%s %s answered %d", e.Method, ConfigsPath, e.Status)
}

// BadStateError: APISIX answered the state read, but not with a usable document.
type BadStateError struct{ Err error }

func (e BadStateError) Error() string { return e.Err.Error() }

const conflictMessage = "_conf_version must be greater than or equal to"

// untouchedReason says why a configs PUT is forwarded without a rewrite (the reason
// label of confshim_configs_put_untouched_total); "" means it is rewritten.
type untouchedReason string

const (
	untouchedRefused untouchedReason = "refused" // APISIX refused the caller's credentials
	untouchedEncoded untouchedReason = "encoded" // a Content-Encoding confshim does not decode (APISIX neither)
	untouchedInvalid untouchedReason = "invalid" // not parseable, or a non-numeric version: APISIX rejects it whole
)

// putConfigs is contract §5 and §8: ask APISIX whether the caller may write before
// buffering anything, read the body within the memory budget, decide, forward one
// complete PUT, retry once on a version conflict, answer with APISIX's response plus
// X-Confshim-Actions.
func (p *Proxy) putConfigs(w http.ResponseWriter, r *http.Request) {
	creds := credentialsOf(r)
	probe, err := p.probe(r.Context(), creds)
	var refused RefusedError
	switch {
	case errors.As(err, &refused):
		// §5.7: a caller APISIX refuses costs no more than a plain proxy would.
		p.m.Untouched.WithLabelValues(string(untouchedRefused)).Inc()
		p.passthrough(w, r)
		return
	case err != nil:
		p.stateReadFailed(w, r, err)
		return
	}

	body, release, ok := p.readBody(w, r)
	if !ok {
		return
	}
	var sent []<-chan struct{} // the transport may still read our buffers until these close
	defer func() { go func() { waitAll(sent); release() }() }()

	// Scan before taking the lock: concurrent clients do it in parallel.
	start := time.Now()
	prepared, untouched, err := p.prepare(r, body)
	prepareTime := time.Since(start)
	var refuse *rewrite.RefuseError
	if errors.As(err, &refuse) {
		p.refuse(w, refuse)
		return
	}

	// Serialise PUTs; the body was read first so a slow client cannot hold the lock.
	select {
	case p.putLock <- struct{}{}:
		defer func() { <-p.putLock }()
	case <-r.Context().Done():
		p.m.ClientDisconnects.Inc()
		w.WriteHeader(statusClientGone)
		return
	}

	in := rewrite.Input{Body: body}
	if v := r.Header.Values("X-Digest"); len(v) > 0 {
		in.Digest, in.HasDigest = v[0], true
	}
	for attempt := 0; ; attempt++ {
		var res *rewrite.Result
		if untouched == "" {
			res, untouched, err = p.decideUnderLock(r, creds, probe, prepared, prepareTime, in, attempt > 0)
			probe = nil // used once: a retry reads the state afresh
			if errors.As(err, &refuse) {
				p.refuse(w, refuse)
				return
			}
			if err != nil {
				p.stateReadFailed(w, r, err)
				return
			}
		}
		if untouched != "" {
			p.m.Untouched.WithLabelValues(string(untouched)).Inc()
		}
		out := p.outgoing(in, res)
		resp, respBody, done, err := p.forwardPut(r, out)
		sent = append(sent, done)
		if res != nil && res.Changed {
			buf := res.Body[:0]
			sentNow := done
			defer func() { go func() { <-sentNow; p.putBuf(&buf) }() }()
		}
		if err != nil {
			p.upstreamFailed(w, r, err, "PUT "+ConfigsPath)
			return
		}
		p.writes.Add(1)
		if resp.StatusCode == http.StatusBadRequest && bytes.Contains(respBody, []byte(conflictMessage)) {
			p.dp.state = nil // something wrote in between: never trust the cache again
			if res != nil && attempt == 0 {
				resp.Body.Close()
				p.m.ConflictRetries.Inc()
				p.log.Info().Str("event", "conflict_retry").Msg("APISIX rejected a version a concurrent write raised; reading its state again")
				continue
			}
		}
		p.count(res, out, resp)
		p.keepAfterPut(resp, res, prepared, creds) // before remember: it reads the state the PUT was decided on
		p.remember(resp, res)
		p.respond(w, resp, respBody, res)
		return
	}
}

// refuse answers a body confshim must not forward (contract §6): 400, nothing forwarded.
func (p *Proxy) refuse(w http.ResponseWriter, refuse *rewrite.RefuseError) {
	p.m.Refused.WithLabelValues("unrepairable").Inc()
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

// prepare scans the body without any state: it returns the prepared body, or the
// reason to forward it untouched, or a *rewrite.RefuseError.
func (p *Proxy) prepare(r *http.Request, body []byte) (*rewrite.Prepared, untouchedReason, error) {
	if enc := r.Header.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") {
		// APISIX does not decode request bodies either; decoding here would change what
		// it decides. Forwarded untouched, header and body still match.
		p.log.Info().Str("event", "forward_untouched").Str("reason", "content-encoding").Msg("configs PUT not rewritten; APISIX will judge it")
		return nil, untouchedEncoded, nil
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
		return nil, untouchedInvalid, nil
	}
	return prepared, "", err
}

// decideUnderLock reads the data plane's state and runs the rewrite. It returns the
// reason to forward untouched instead when there is one.
func (p *Proxy) decideUnderLock(r *http.Request, creds credentials, probe *probeResult, prepared *rewrite.Prepared, prepareTime time.Duration, in rewrite.Input, fresh bool) (*rewrite.Result, untouchedReason, error) {
	st, err := p.stateFor(r.Context(), creds, probe, fresh)
	var refused RefusedError
	if errors.As(err, &refused) {
		return nil, untouchedRefused, nil // APISIX will refuse the PUT itself, in its own words
	}
	if err != nil {
		return nil, "", err
	}
	in.State, in.Record = st, p.dp.record
	buf := p.getBuf()
	in.Buf = *buf
	start := time.Now()
	res, err := p.rw.Decide(prepared, in)
	if errors.Is(err, rewrite.ErrStateIncomplete) {
		if st, err = p.stateFor(r.Context(), creds, nil, true); err != nil {
			p.putBuf(buf)
			if errors.As(err, &refused) {
				return nil, untouchedRefused, nil
			}
			return nil, "", err
		}
		in.State = st
		start = time.Now()
		res, err = p.rw.Decide(prepared, in)
	}
	p.m.RewriteDuration.Observe((prepareTime + time.Since(start)).Seconds())
	if res == nil || !res.Changed {
		p.putBuf(buf)
	}
	var skip *rewrite.SkipError
	switch {
	case errors.As(err, &skip):
		p.log.Info().Str("event", "forward_untouched").Str("reason", skip.Reason).Msg("configs PUT not rewritten; APISIX will judge it")
		return nil, untouchedInvalid, nil
	case err != nil:
		return nil, "", err
	}
	if len(res.Changes) > 0 {
		p.logDecision(res)
	}
	return res, "", nil
}

// maxLoggedSections bounds a decision's log line (§5.7): a body may name thousands.
const maxLoggedSections = 32

func (p *Proxy) logDecision(res *rewrite.Result) {
	arr := zerolog.Arr()
	for i, c := range res.Changes {
		if i == maxLoggedSections {
			break
		}
		d := zerolog.Dict().Str("section", rewrite.Clip(c.Section)).Str("action", string(c.Action)).Float64("to", c.To)
		if !c.FromAbsent {
			d = d.Float64("from", c.From)
		}
		if c.Dropped {
			d = d.Bool("items_dropped", true)
		}
		arr = arr.Dict(d)
	}
	ev := p.log.Info().Str("event", "rewrite").Int("sections_changed", len(res.Changes)).Array("sections", arr)
	if len(res.Thinned) > 0 {
		ev = ev.Int("sections_thinned", len(res.Thinned)).Int("thinned_bytes", res.ThinnedBytes)
	}
	ev.Bool("noop", res.NoOp).Msg("configs PUT repaired")
}

// stateReadFailed answers a PUT whose data plane state could not be read: nothing was
// forwarded. An answer APISIX gave but confshim cannot use is a 502; no answer at all
// is classified like any upstream failure (502, or 504 on a timeout).
func (p *Proxy) stateReadFailed(w http.ResponseWriter, r *http.Request, err error) {
	var status StateStatusError
	var bad BadStateError
	if errors.As(err, &status) || errors.As(err, &bad) {
		p.m.UpstreamErrors.WithLabelValues("other").Inc()
		p.writeError(w, http.StatusBadGateway, "cannot read the data plane's state: "+err.Error()+"; nothing was forwarded")
		return
	}
	p.upstreamFailed(w, r, err, "read the data plane's state before the PUT; nothing was forwarded")
}

// probeResult is APISIX's answer to the caller's credentials, asked before the body
// is read: HEAD /apisix/admin/configs (≥ 3.14), or the state itself by GET (3.13).
type probeResult struct {
	at           time.Time
	writes       uint64 // Proxy.writes when the probe ran: a probe from before another PUT is stale
	head         bool
	digest       string
	lastModified string
	state        *rewrite.State // 3.13: the GET's state
}

// probe asks APISIX whether the caller may read the configuration, with exactly the
// credentials the PUT carries. A refusal is a RefusedError.
func (p *Proxy) probe(ctx context.Context, creds credentials) (*probeResult, error) {
	writes, at := p.writes.Load(), time.Now()
	if !p.noHead.Load() {
		head, status, err := p.head(ctx, creds)
		switch {
		case err != nil:
			return nil, err
		case head != nil:
			head.writes, head.at = writes, at
			return head, nil
		case status == http.StatusNotFound:
			p.noHead.Store(true) // APISIX 3.13: no HEAD on /configs
			p.log.Info().Str("event", "no_head").Msg("the data plane has no HEAD /apisix/admin/configs (APISIX 3.13): state reads use GET, re-seeding is off")
		case status != http.StatusMethodNotAllowed:
			return &probeResult{writes: writes, at: at}, nil // the state read under the lock decides
		}
	}
	st, digest, lastModified, err := p.readState(ctx, creds)
	if err != nil {
		return nil, err
	}
	return &probeResult{writes: writes, at: at, state: st, digest: digest, lastModified: lastModified}, nil
}

// probeFreshness bounds how old a probe may be to serve as the revalidation under the
// lock: a slow body must not make confshim decide on a state read long before.
const probeFreshness = time.Second

// head is HEAD /apisix/admin/configs with the caller's credentials: the metadata when
// APISIX answers 200, a RefusedError on 401/403, otherwise the status alone.
func (p *Proxy) head(ctx context.Context, creds credentials) (*probeResult, int, error) {
	resp, err := p.sideRequest(ctx, http.MethodHead, creds)
	if err != nil {
		return nil, 0, err
	}
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		return &probeResult{head: true, digest: resp.Header.Get("X-Digest"), lastModified: resp.Header.Get("X-Last-Modified")}, http.StatusOK, nil
	case http.StatusUnauthorized, http.StatusForbidden:
		return nil, resp.StatusCode, RefusedError{resp.StatusCode}
	}
	return nil, resp.StatusCode, nil
}

// stateFor returns the data plane's state under the PUT lock: the cached copy when a
// HEAD (the probe's, if no PUT went through since) shows nobody wrote since it was
// read, otherwise a GET.
func (p *Proxy) stateFor(ctx context.Context, creds credentials, probe *probeResult, fresh bool) (*rewrite.State, error) {
	if probe != nil && (probe.writes != p.writes.Load() || time.Since(probe.at) > probeFreshness) {
		probe = nil // another PUT went through meanwhile, or the probe is too old
	}
	if !fresh && probe != nil && probe.state != nil {
		p.setState(probe.state, probe.digest, probe.lastModified)
		return probe.state, nil
	}
	if !fresh && p.dp.state != nil && !p.noHead.Load() {
		if probe == nil || !probe.head {
			var err error
			if probe, _, err = p.head(ctx, creds); err != nil {
				return nil, err
			}
		}
		// anything but a match (a changed state, an odd status): the GET below decides
		if probe != nil && probe.digest == p.dp.digest && probe.lastModified == p.dp.lastModified {
			return p.dp.state, nil
		}
	}
	st, digest, lastModified, err := p.readState(ctx, creds)
	if err != nil {
		return nil, err
	}
	p.setState(st, digest, lastModified)
	return st, nil
}

func (p *Proxy) setState(st *rewrite.State, digest, lastModified string) {
	p.dp.state, p.dp.digest, p.dp.lastModified = st, digest, lastModified
}

// readState is GET /apisix/admin/configs with the caller's credentials.
func (p *Proxy) readState(ctx context.Context, creds credentials) (*rewrite.State, string, string, error) {
	resp, err := p.sideRequest(ctx, http.MethodGet, creds)
	if err != nil {
		return nil, "", "", err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return nil, "", "", RefusedError{resp.StatusCode}
	case resp.StatusCode != http.StatusOK:
		return nil, "", "", StateStatusError{http.MethodGet, resp.StatusCode}
	}
	body, err := readAllSized(resp, 4*p.cfg.MaxBodyBytes)
	if err != nil {
		return nil, "", "", err // BadStateError (too big) or the transport's: no usable answer
	}
	st, err := rewrite.ParseState(body)
	if err != nil {
		return nil, "", "", BadStateError{err}
	}
	return st, resp.Header.Get("X-Digest"), resp.Header.Get("X-Last-Modified"), nil
}

// readAllSized reads a response body of at most limit bytes, in one allocation when
// the length is announced (io.ReadAll's doubling would leave twice the state as garbage).
func readAllSized(resp *http.Response, limit int64) ([]byte, error) {
	if resp.ContentLength > limit {
		return nil, BadStateError{fmt.Errorf("data plane state is over %d bytes", limit)}
	}
	if resp.ContentLength > 0 {
		body := make([]byte, resp.ContentLength)
		_, err := io.ReadFull(resp.Body, body)
		return body, err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err == nil && int64(len(body)) > limit {
		return nil, BadStateError{fmt.Errorf("data plane state is over %d bytes", limit)}
	}
	return body, err
}

// sideRequest is a request confshim makes for a caller, with the caller's credentials
// exactly as sent, bounded by --upstream-timeout.
func (p *Proxy) sideRequest(ctx context.Context, method string, creds credentials) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.UpstreamTimeout)
	req, err := http.NewRequestWithContext(ctx, method, p.upstreamURL(ConfigsPath, creds.rawQuery), nil)
	if err != nil {
		cancel()
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	creds.apply(req)
	resp, err := p.transport.RoundTrip(req)
	if err != nil {
		cancel()
		return nil, err
	}
	p.sawUpstream()
	resp.Body = cancelOnClose{resp.Body, cancel}
	return resp, nil
}

type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

// outgoingPut is the PUT confshim forwards: the body and the X-Digest to send.
type outgoingPut struct {
	body      []byte
	digest    string
	setDigest bool
	noop      bool // the data plane's own digest, so that APISIX answers 204 (§8.2)
}

// outgoing builds what to forward: the client's bytes, or the rewritten ones.
func (p *Proxy) outgoing(in rewrite.Input, res *rewrite.Result) outgoingPut {
	out := outgoingPut{body: in.Body}
	if res == nil || !res.Changed {
		return out
	}
	out.body = res.Body
	if in.HasDigest {
		out.digest, out.setDigest = res.Digest, true
		if res.NoOp && p.dp.digest != "" {
			out.digest, out.noop = p.dp.digest, true
		}
	}
	return out
}

// forwardPut sends one complete PUT. For a 400 it also returns the (bounded) body, to
// recognise a version conflict. done closes when the transport let go of the body.
func (p *Proxy) forwardPut(r *http.Request, out outgoingPut) (*http.Response, []byte, <-chan struct{}, error) {
	body := newSentBody(out.body)
	ctx, cancel := context.WithTimeout(r.Context(), p.cfg.UpstreamTimeout)
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, p.forwardURL(r), body)
	if err != nil {
		cancel()
		body.Close()
		return nil, nil, body.done, err
	}
	req.ContentLength = int64(len(out.body))
	req.Header = r.Header.Clone()
	removeHopHeaders(req.Header)
	req.Header.Del("Expect")
	req.Header.Del("Content-Length")
	if out.setDigest {
		req.Header.Del("X-Digest")
		req.Header.Set("X-Digest", out.digest)
	}
	resp, err := p.transport.RoundTrip(req)
	if err != nil {
		cancel()
		return nil, nil, body.done, err
	}
	p.sawUpstream()
	resp.Body = cancelOnClose{resp.Body, cancel}
	var head []byte
	if resp.StatusCode == http.StatusBadRequest {
		head, err = io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if err != nil {
			resp.Body.Close()
			return nil, nil, body.done, err
		}
	}
	return resp, head, body.done, nil
}

// sentBody is a request body that says when the transport closed it: only then may
// its pooled buffer be reused (RoundTrip can return while the body is still being
// written, when APISIX answers early).
type sentBody struct {
	*bytes.Reader
	done   chan struct{}
	closed bool
}

func newSentBody(b []byte) *sentBody {
	return &sentBody{Reader: bytes.NewReader(b), done: make(chan struct{})}
}

func (s *sentBody) Close() error {
	if !s.closed {
		s.closed = true
		close(s.done)
	}
	return nil
}

func (p *Proxy) forwardURL(r *http.Request) string {
	u := *p.upstream
	u.Path = p.upstream.Path + r.URL.Path
	u.RawPath = p.upstream.EscapedPath() + r.URL.EscapedPath()
	u.RawQuery = r.URL.RawQuery
	return u.String()
}

// count feeds the decision's metrics once APISIX answered.
func (p *Proxy) count(res *rewrite.Result, out outgoingPut, resp *http.Response) {
	if res == nil {
		return
	}
	for _, c := range res.Changes {
		p.m.SectionRewrites.WithLabelValues(metrics.SectionLabel(c.Section), string(c.Action)).Inc()
	}
	p.m.ThinnedBytes.Add(float64(res.ThinnedBytes))
	if out.noop && resp.StatusCode == http.StatusNoContent {
		p.m.NoopPuts.Inc()
	}
}

// remember updates confshim's record and cached state after APISIX answered.
func (p *Proxy) remember(resp *http.Response, res *rewrite.Result) {
	switch {
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return // nothing was stored: the record still describes the data plane
	case res == nil:
		p.dp.record, p.dp.state = nil, nil // an untouched body landed: know nothing
	case resp.StatusCode == http.StatusNoContent:
		p.dp.record = res.Commit(true) // same digest: the data plane already held this
	default:
		p.dp.record = res.Commit(false)
		p.dp.state = nil
		if d, lm := resp.Header.Get("X-Digest"), resp.Header.Get("X-Last-Modified"); d != "" && lm != "" {
			p.setState(res.AppliedState(), d, lm) // the next HEAD confirms nobody wrote since
		}
	}
}

// respond writes APISIX's answer, plus X-Confshim-Actions when sections were rewritten
// (never on APISIX's refusal of the caller: that would tell a stranger the decision).
func (p *Proxy) respond(w http.ResponseWriter, resp *http.Response, head []byte, res *rewrite.Result) {
	defer resp.Body.Close()
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	removeHopHeaders(h)
	refused := resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden
	if res != nil && len(res.Changes) > 0 && !refused {
		h.Set("X-Confshim-Actions", res.Actions())
	}
	w.WriteHeader(resp.StatusCode)
	if len(head) > 0 {
		_, _ = w.Write(head)
	}
	_, _ = io.Copy(w, resp.Body)
}
