package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
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
	noHead       bool // HEAD /apisix/admin/configs answered 404: APISIX 3.13, read with GET
	record       *rewrite.Record
}

// errRefused: APISIX refused confshim's state read (401/403) with the caller's key.
type errRefused struct{ status int }

func (e errRefused) Error() string { return fmt.Sprintf("state read refused with %d", e.status) }

// errStateStatus: APISIX answered the state read with an unexpected status.
type errStateStatus struct {
	method string
	status int
}

func (e errStateStatus) Error() string {
	return fmt.Sprintf("%s %s answered %d", e.method, ConfigsPath, e.status)
}

const conflictMessage = "_conf_version must be greater than or equal to"

// putConfigs is contract §5: read the body, read the data plane's state, decide,
// forward one complete PUT, retry once on a version conflict, answer with APISIX's
// response plus X-Confshim-Actions.
func (p *Proxy) putConfigs(w http.ResponseWriter, r *http.Request) {
	body, release, ok := p.readBody(w, r)
	if !ok {
		return
	}
	defer release()

	// Validate and scan before taking the lock: concurrent clients do it in parallel.
	start := time.Now()
	prepared, isYAML, untouched, refuse := p.prepare(r, body)
	prepareTime := time.Since(start)
	if refuse {
		p.writeError(w, http.StatusBadRequest, "the configuration must be an object: APISIX would read this body as {} and delete every section")
		return
	}

	// Serialise PUTs; the body was read first so a slow client cannot hold the lock.
	select {
	case p.putLock <- struct{}{}:
		defer func() { <-p.putLock }()
	case <-r.Context().Done():
		p.m.ClientDisconnects.Inc()
		return
	}

	in := rewrite.Input{Body: body}
	if v := r.Header.Values("X-Digest"); len(v) > 0 {
		in.Digest, in.HasDigest = v[0], true
	}
	creds := credentialsOf(r, p.cfg.AdminKey)
	for attempt := 0; ; attempt++ {
		var res *rewrite.Result
		if untouched == "" {
			var err error
			res, untouched, err = p.decide(r, creds, prepared, prepareTime, in, attempt > 0)
			if err != nil {
				p.stateReadFailed(w, r, err)
				return
			}
		}
		if untouched != "" {
			p.m.Passthrough.WithLabelValues(untouched).Inc()
		}
		resp, respBody, err := p.forwardPut(r, in, res, isYAML)
		if res != nil && res.Changed {
			buf := res.Body[:0]
			defer p.putBuf(&buf)
		}
		if err != nil {
			p.upstreamFailed(w, r, err, "PUT "+ConfigsPath)
			return
		}
		if resp.StatusCode == http.StatusBadRequest && bytes.Contains(respBody, []byte(conflictMessage)) {
			p.dp.state = nil // something wrote in between: never trust the cache again
			if res != nil && attempt == 0 {
				resp.Body.Close()
				p.m.ConflictRetries.Inc()
				p.log.Info().Str("event", "conflict_retry").Msg("APISIX rejected a version a concurrent write raised; reading its state again")
				continue
			}
		}
		p.remember(resp, res)
		p.respond(w, resp, respBody, res)
		return
	}
}

// prepare reads the body without any state: it returns the prepared body, whether it
// came as YAML, the reason to forward it untouched ("encoded", "invalid"), or refuse
// for a body that parses but is not an object.
func (p *Proxy) prepare(r *http.Request, body []byte) (prepared *rewrite.Prepared, isYAML bool, untouched string, refuse bool) {
	if enc := r.Header.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") {
		// APISIX does not decode request bodies either; decoding here would change what
		// it decides. Forwarded untouched, header and body still match.
		p.log.Info().Str("event", "forward_untouched").Str("reason", "content-encoding "+enc).Msg("configs PUT not rewritten; APISIX will judge it")
		return nil, false, "encoded", false
	}
	jsonBody := body
	isYAML = strings.HasPrefix(r.Header.Get("Content-Type"), "application/yaml") // APISIX's test, §1.3
	var err error
	if isYAML {
		jsonBody, err = rewrite.YAMLToJSON(body)
	}
	if err == nil {
		prepared, err = p.rw.Prepare(jsonBody)
	}
	var skip *rewrite.SkipError
	switch {
	case errors.Is(err, rewrite.ErrNotObject):
		return nil, isYAML, "", true
	case errors.As(err, &skip):
		p.log.Info().Str("event", "forward_untouched").Str("reason", skip.Reason).Msg("configs PUT not rewritten; APISIX will judge it")
		return nil, isYAML, "invalid", false
	}
	return prepared, isYAML, "", false
}

// decide reads the data plane's state and runs the rewrite. It returns the reason to
// forward untouched instead ("refused", "invalid", "overflow") when there is one.
func (p *Proxy) decide(r *http.Request, creds credentials, prepared *rewrite.Prepared, prepareTime time.Duration, in rewrite.Input, fresh bool) (*rewrite.Result, string, error) {
	st, err := p.stateFor(r.Context(), creds, fresh)
	var refused errRefused
	if errors.As(err, &refused) {
		return nil, "refused", nil // APISIX will refuse the PUT itself, in its own words
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
		if st, err = p.stateFor(r.Context(), creds, true); err != nil {
			p.putBuf(buf)
			if errors.As(err, &refused) {
				return nil, "refused", nil
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
		return nil, "invalid", nil
	case err != nil:
		return nil, "", err
	}
	if res.Changed {
		p.logDecision(res)
		for _, c := range res.Changes {
			p.m.SectionRewrites.WithLabelValues(metrics.SectionLabel(c.Section), string(c.Action)).Inc()
		}
	}
	return res, "", nil
}

func (p *Proxy) logDecision(res *rewrite.Result) {
	arr := zerolog.Arr()
	for _, c := range res.Changes {
		d := zerolog.Dict().Str("section", c.Section).Str("action", string(c.Action)).Float64("to", c.To)
		if !c.FromAbsent {
			d = d.Float64("from", c.From)
		}
		if c.Dropped {
			d = d.Bool("items_dropped", true)
		}
		arr = arr.Dict(d)
	}
	p.log.Info().Str("event", "rewrite").Str("actions", res.Actions()).Array("sections", arr).Msg("configs PUT repaired")
}

// errBadState: APISIX answered the state read, but not with a usable document.
type errBadState struct{ err error }

func (e errBadState) Error() string { return e.err.Error() }

// stateReadFailed answers a PUT whose data plane state could not be read: nothing was
// forwarded. An answer APISIX gave but confshim cannot use is a 502; no answer at all
// is classified like any upstream failure (502, or 504 on a timeout).
func (p *Proxy) stateReadFailed(w http.ResponseWriter, r *http.Request, err error) {
	var status errStateStatus
	var bad errBadState
	if errors.As(err, &status) || errors.As(err, &bad) {
		p.m.UpstreamErrors.WithLabelValues("other").Inc()
		p.writeError(w, http.StatusBadGateway, "cannot read the data plane's state: "+err.Error()+"; nothing was forwarded")
		return
	}
	p.upstreamFailed(w, r, err, "read the data plane's state before the PUT; nothing was forwarded")
}

// stateFor returns the data plane's state, revalidating the cached copy with a HEAD
// (APISIX ≥ 3.14) and reading it with GET when it changed, is unknown, or fresh is set.
func (p *Proxy) stateFor(ctx context.Context, creds credentials, fresh bool) (*rewrite.State, error) {
	if !fresh && p.dp.state != nil && !p.dp.noHead {
		resp, err := p.sideRequest(ctx, http.MethodHead, creds)
		if err != nil {
			return nil, err
		}
		resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusOK:
			if resp.Header.Get("X-Digest") == p.dp.digest && resp.Header.Get("X-Last-Modified") == p.dp.lastModified {
				return p.dp.state, nil
			}
		case resp.StatusCode == http.StatusNotFound:
			p.dp.noHead = true
		case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
			return nil, errRefused{resp.StatusCode}
		}
		// anything else (a changed state, an odd status): the GET below decides
	}
	resp, err := p.sideRequest(ctx, http.MethodGet, creds)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return nil, errRefused{resp.StatusCode}
	case resp.StatusCode != http.StatusOK:
		return nil, errStateStatus{http.MethodGet, resp.StatusCode}
	}
	body, err := readAllSized(resp, 4*p.cfg.MaxBodyBytes)
	if err != nil {
		return nil, err // errBadState (too big) or the transport's: no usable answer
	}
	st, err := rewrite.ParseState(body)
	if err != nil {
		return nil, errBadState{err}
	}
	p.dp.state = st
	p.dp.digest, p.dp.lastModified = resp.Header.Get("X-Digest"), resp.Header.Get("X-Last-Modified")
	return st, nil
}

// readAllSized reads a response body of at most limit bytes, in one allocation when
// the length is announced (io.ReadAll's doubling would leave twice the state as garbage).
func readAllSized(resp *http.Response, limit int64) ([]byte, error) {
	if resp.ContentLength > limit {
		return nil, errBadState{fmt.Errorf("data plane state is over %d bytes", limit)}
	}
	if resp.ContentLength > 0 {
		body := make([]byte, resp.ContentLength)
		_, err := io.ReadFull(resp.Body, body)
		return body, err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err == nil && int64(len(body)) > limit {
		return nil, errBadState{fmt.Errorf("data plane state is over %d bytes", limit)}
	}
	return body, err
}

// sideRequest is a request confshim makes itself, with the caller's credentials in the
// form the caller sent them, bounded by --upstream-timeout.
func (p *Proxy) sideRequest(ctx context.Context, method string, creds credentials) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.UpstreamTimeout)
	req, err := http.NewRequestWithContext(ctx, method, p.upstreamURL(ConfigsPath, creds.query()), nil)
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

// forwardPut sends one complete PUT: the rewritten body, or the client's bytes. For a
// 400 it also returns the (bounded) body, to recognise a version conflict.
func (p *Proxy) forwardPut(r *http.Request, in rewrite.Input, res *rewrite.Result, fromYAML bool) (*http.Response, []byte, error) {
	body := in.Body
	if res != nil && res.Changed {
		body = res.Body
	}
	ctx, cancel := context.WithTimeout(r.Context(), p.cfg.UpstreamTimeout)
	out, err := http.NewRequestWithContext(ctx, http.MethodPut, p.forwardURL(r), bytes.NewReader(body))
	if err != nil {
		cancel()
		return nil, nil, err
	}
	out.Header = r.Header.Clone()
	removeHopHeaders(out.Header)
	out.Header.Del("Expect")
	out.Header.Del("Content-Length")
	if res != nil && res.Changed && in.HasDigest {
		out.Header.Del("X-Digest")
		out.Header.Set("X-Digest", res.Digest)
	}
	if res != nil && res.Changed && fromYAML {
		out.Header.Set("Content-Type", "application/json") // the repaired YAML goes as JSON
	}
	resp, err := p.transport.RoundTrip(out)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	p.sawUpstream()
	resp.Body = cancelOnClose{resp.Body, cancel}
	var head []byte
	if resp.StatusCode == http.StatusBadRequest {
		head, err = io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if err != nil {
			resp.Body.Close()
			return nil, nil, err
		}
	}
	return resp, head, nil
}

func (p *Proxy) forwardURL(r *http.Request) string {
	u := *p.upstream
	u.Path = p.upstream.Path + r.URL.Path
	u.RawPath = p.upstream.EscapedPath() + r.URL.EscapedPath()
	u.RawQuery = r.URL.RawQuery
	return u.String()
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
		p.dp.digest, p.dp.lastModified = resp.Header.Get("X-Digest"), resp.Header.Get("X-Last-Modified")
		p.dp.state = nil
		if p.dp.digest != "" && p.dp.lastModified != "" {
			p.dp.state = res.AppliedState() // the next HEAD confirms nobody wrote since
		}
	}
}

// respond writes APISIX's answer, plus X-Confshim-Actions when the body was rewritten.
func (p *Proxy) respond(w http.ResponseWriter, resp *http.Response, head []byte, res *rewrite.Result) {
	defer resp.Body.Close()
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v
	}
	removeHopHeaders(h)
	if res != nil && res.Changed {
		h.Set("X-Confshim-Actions", res.Actions())
	}
	w.WriteHeader(resp.StatusCode)
	if len(head) > 0 {
		_, _ = w.Write(head)
	}
	_, _ = io.Copy(w, resp.Body)
}

// readBody reads the request body into a pooled buffer, at most --max-body-bytes.
func (p *Proxy) readBody(w http.ResponseWriter, r *http.Request) ([]byte, func(), bool) {
	max := p.cfg.MaxBodyBytes
	if r.ContentLength > max {
		p.writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body of %d bytes is over --max-body-bytes (%d)", r.ContentLength, max))
		return nil, nil, false
	}
	bufp := p.getBuf()
	buf := bytes.NewBuffer((*bufp)[:0])
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength) + 1)
	}
	_, err := buf.ReadFrom(io.LimitReader(r.Body, max+1))
	*bufp = buf.Bytes()
	release := func() { p.putBuf(bufp) }
	switch {
	case err != nil:
		release()
		if r.Context().Err() != nil || errors.Is(err, io.ErrUnexpectedEOF) {
			p.m.ClientDisconnects.Inc()
			w.WriteHeader(499)
			return nil, nil, false
		}
		p.writeError(w, http.StatusBadRequest, "cannot read the request body")
		return nil, nil, false
	case int64(buf.Len()) > max:
		release()
		p.writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is over --max-body-bytes (%d)", max))
		return nil, nil, false
	}
	return buf.Bytes(), release, true
}

// buffers is a small free list of body-sized buffers. sync.Pool empties itself at
// every GC, which at tens of megabytes per PUT means allocating and zeroing a new
// buffer each time; this list keeps at most cap(buffers) of them alive.
type buffers chan *[]byte

func (p *Proxy) getBuf() *[]byte {
	select {
	case b := <-p.bufs:
		return b
	default:
		b := make([]byte, 0, 64<<10)
		return &b
	}
}

func (p *Proxy) putBuf(b *[]byte) {
	*b = (*b)[:0]
	select {
	case p.bufs <- b:
	default: // the list is full: let the GC have it
	}
}

// hop-by-hop headers (RFC 9110 §7.6.1), never forwarded.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func removeHopHeaders(h http.Header) {
	for _, f := range h.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

// credentials are the caller's admin key, in the form the caller sent it (contract §5.4).
type credentials struct {
	header   []string
	apiKey   string
	hasQuery bool
	cookie   string
	hasCook  bool
}

func credentialsOf(r *http.Request, adminKey string) credentials {
	var c credentials
	c.header = r.Header.Values("X-API-KEY")
	if q := r.URL.Query(); q.Has("api_key") {
		c.apiKey, c.hasQuery = q.Get("api_key"), true
	}
	if ck, err := r.Cookie("x_api_key"); err == nil {
		c.cookie, c.hasCook = ck.Value, true
	}
	if len(c.header) == 0 && !c.hasQuery && !c.hasCook && adminKey != "" {
		c.header = []string{adminKey}
	}
	return c
}

func (c credentials) query() string {
	if !c.hasQuery {
		return ""
	}
	return "api_key=" + url.QueryEscape(c.apiKey)
}

func (c credentials) apply(req *http.Request) {
	for _, v := range c.header {
		req.Header.Add("X-API-KEY", v)
	}
	if c.hasCook {
		req.AddCookie(&http.Cookie{Name: "x_api_key", Value: c.cookie})
	}
}
