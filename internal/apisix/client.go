// Package apisix is confshim's client of APISIX's standalone Admin API: its
// connections, the caller's credentials as sent, the probe, HEAD/GET of the
// configuration (raw bytes and metadata), validate, PUT, the ping, the version and
// capabilities it detected, and how a failed request is classified. It holds no belief
// about the data plane and decides nothing: that is the caller's.
package apisix

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// ConfigsPath is the one path APISIX routes the standalone configuration on.
const ConfigsPath = "/apisix/admin/configs"

// Config is what the client needs.
type Config struct {
	Upstream *url.URL      // the Admin API base URL (validated by the caller)
	Timeout  time.Duration // bound of each request
	// Transport overrides the one built from the TLS settings (tests).
	Transport http.RoundTripper
	TLS       TLSConfig
	Logger    zerolog.Logger
	// OnAnswer is told of every HTTP answer (readiness, /debug/config's last status).
	OnAnswer func(status int)
}

// TLSConfig is the upstream side's TLS.
type TLSConfig struct {
	CAFile             string
	InsecureSkipVerify bool
	ClientCertFile     string // optional, for APISIX's admin_api_mtls
	ClientKeyFile      string
}

// Client is confshim's connection to one APISIX.
type Client struct {
	base     *url.URL
	timeout  time.Duration
	tr       transports
	log      zerolog.Logger
	onAnswer func(int)

	noHead        atomic.Bool            // HEAD /apisix/admin/configs answered 404: APISIX 3.13
	noValidate    atomic.Bool            // POST /configs/validate answered 404 although Server said 3.15+
	serverMinor   atomic.Int32           // APISIX 3.<minor> from the Server header; 0 unknown
	serverVersion atomic.Pointer[string] // the Server header as last seen
	decideUsed    atomic.Int64           // unix nanos of the decide connection's last answer
	intermediary  atomic.Pointer[string] // the first sign of something between confshim and APISIX
}

// New builds the client; an error names the flag at fault.
func New(cfg Config) (*Client, error) {
	transport := cfg.Transport
	if transport == nil {
		t, err := NewTransport(cfg.TLS, cfg.Timeout)
		if err != nil {
			return nil, err
		}
		transport = t
	}
	onAnswer := cfg.OnAnswer
	if onAnswer == nil {
		onAnswer = func(int) {}
	}
	base := *cfg.Upstream
	base.Path = strings.TrimSuffix(base.Path, "/")
	return &Client{base: &base, timeout: cfg.Timeout, tr: newTransports(transport), log: cfg.Logger, onAnswer: onAnswer}, nil
}

// NewTransport clones http.DefaultTransport with the upstream TLS settings; an error
// names the flag at fault.
func NewTransport(cfg TLSConfig, timeout time.Duration) (*http.Transport, error) {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 32
	t.IdleConnTimeout = 50 * time.Second // APISIX closes idle admin connections after 60 s
	t.WriteBufferSize = 256 << 10        // configs are megabytes: fewer, larger writes
	t.ReadBufferSize = 64 << 10
	t.ResponseHeaderTimeout = timeout
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: cfg.InsecureSkipVerify} //nolint:gosec // an explicit, loudly logged operator choice
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("--upstream-ca-file: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--upstream-ca-file: no PEM certificate in %s", cfg.CAFile)
		}
		tlsCfg.RootCAs = pool
	}
	if cfg.ClientCertFile != "" || cfg.ClientKeyFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.ClientCertFile, cfg.ClientKeyFile)
		if err != nil {
			return nil, fmt.Errorf("--upstream-client-cert-file/--upstream-client-key-file: %v", err)
		}
		tlsCfg.Certificates = []tls.Certificate{cert}
	}
	t.TLSClientConfig = tlsCfg
	return t, nil
}

// Shared is the transport of requests confshim passes through.
func (c *Client) Shared() http.RoundTripper { return c.tr.shared }

// Timeout is the bound of each request.
func (c *Client) Timeout() time.Duration { return c.timeout }

// URL is the upstream URL of path with rawQuery.
func (c *Client) URL(path, rawQuery string) string {
	u := *c.base
	u.Path = c.base.Path + path
	u.RawPath = ""
	u.RawQuery = rawQuery
	return u.String()
}

// ForwardURL is the upstream URL of a client's request, its escaping kept.
func (c *Client) ForwardURL(r *http.Request) string {
	u := *c.base
	u.Path = c.base.Path + r.URL.Path
	u.RawPath = c.base.EscapedPath() + r.URL.EscapedPath()
	u.RawQuery = r.URL.RawQuery
	return u.String()
}

// NoteAnswer learns from an answer that did not come through the client (passthrough):
// readiness and APISIX's version.
func (c *Client) NoteAnswer(resp *http.Response) {
	c.noteServer(resp.Header)
	c.noteIntermediary(resp.Header)
	c.onAnswer(resp.StatusCode)
}

// intermediarySign names what an answer showed of something between confshim and
// APISIX: a Via header, a Server that is not APISIX's (or none: APISIX always sends
// one), an X-Envoy-* header. "" when the answer looks like APISIX's own.
func intermediarySign(h http.Header) string {
	if h.Get("Via") != "" {
		return "Via"
	}
	server := h.Get("Server")
	if !strings.HasPrefix(server, "APISIX/") {
		if server == "" {
			return "no Server header"
		}
		if len(server) > 32 {
			server = server[:32]
		}
		return "Server: " + server
	}
	for k := range h {
		if len(k) > 8 && strings.EqualFold(k[:8], "X-Envoy-") {
			return "X-Envoy-*"
		}
	}
	return ""
}

// noteIntermediary remembers the first sign of an intermediary (it never goes away: a
// proxy that showed itself once may be there still).
func (c *Client) noteIntermediary(h http.Header) {
	if c.intermediary.Load() != nil {
		return
	}
	if sign := intermediarySign(h); sign != "" && c.intermediary.CompareAndSwap(nil, &sign) {
		c.log.Info().Str("event", "intermediary").Str("sign", sign).Msg("an answer shows something between confshim and APISIX")
	}
}

// Intermediary is the first sign of something between confshim and APISIX that an
// answer showed ("" none yet).
func (c *Client) Intermediary() string {
	if s := c.intermediary.Load(); s != nil {
		return *s
	}
	return ""
}

// noteServer learns APISIX's version from its Server header (APISIX/3.17.0).
func (c *Client) noteServer(h http.Header) {
	server := h.Get("Server")
	rest, ok := strings.CutPrefix(server, "APISIX/")
	if !ok {
		return
	}
	major, rest, _ := strings.Cut(rest, ".")
	minorText, _, _ := strings.Cut(rest, ".")
	minor, err := strconv.Atoi(minorText)
	if major != "3" || err != nil || minor < 0 || minor > 1000 {
		return
	}
	c.serverMinor.Store(int32(minor))
	if len(server) <= 64 {
		c.serverVersion.Store(&server)
	}
}

// Server is the Server header as last seen ("" unknown).
func (c *Client) Server() string {
	if s := c.serverVersion.Load(); s != nil {
		return *s
	}
	return ""
}

// HasValidate: the data plane is known to offer POST /apisix/admin/configs/validate.
func (c *Client) HasValidate() bool {
	return c.serverMinor.Load() >= 15 && !c.noValidate.Load()
}

// NoHead: the data plane has no HEAD /apisix/admin/configs (APISIX 3.13).
func (c *Client) NoHead() bool { return c.noHead.Load() }

// DialCount is how many connections the decide connection opened; ok is false where
// they are not counted (a test transport).
func (c *Client) DialCount() (uint64, bool) { return c.tr.dialCount() }

// UnexpectedDials is how many connections the decide connection opened that no answer
// announced (Connection: close): the ping's sign of a restart.
func (c *Client) UnexpectedDials() (uint64, bool) { return c.tr.unexpectedDials() }

// DecideIdleLimit is how long the decide connection may idle and still be expected
// open: the transport drops an idle connection after 50 s (APISIX after 60 s).
const DecideIdleLimit = 40 * time.Second

// DecideConn names the decide connection as it stands, for a belief to be tied to: it
// changes whenever the connection is redialled, and is 0 when the connection cannot be
// vouched for — its dials are not counted (a test transport), or it idled long enough
// for the transport to have dropped it (a PUT that may not redial would then be
// decided again).
func (c *Client) DecideConn() uint64 {
	n, counted := c.tr.dialCount()
	if !counted || c.tr.closing.Load() || time.Since(time.Unix(0, c.decideUsed.Load())) >= DecideIdleLimit {
		return 0
	}
	return n
}

// Closing: the decide connection's last answer said the connection closes after it,
// so the next request on it opens a new one (to whatever answers there now).
func (c *Client) Closing() bool { return c.tr.closing != nil && c.tr.closing.Load() }

func (c *Client) noteConn(conn Conn) {
	if conn == Decide {
		c.decideUsed.Store(time.Now().UnixNano())
	}
}

// Meta is what HEAD /apisix/admin/configs tells: no LastModified means the data plane
// holds nothing (nothing stored since it started).
type Meta struct{ Digest, LastModified string }

// Answer is an APISIX answer read whole: its connection is free again.
type Answer struct {
	Status int
	Header http.Header
	Body   []byte
}

// maxAnswerBytes bounds an answer to a PUT, which confshim reads whole (APISIX's Lua
// writes a few hundred bytes there at most).
const maxAnswerBytes = 1 << 20

// readAnswer reads an answer's body to its end and closes it, so that its connection
// is free for the next request at once: APISIX answers chunked (spec §12), and a
// connection whose chunked body is still open is not reused — a second request on the
// decide connection would wait for it for ever. A longer answer is cut at
// maxAnswerBytes (its connection then closes).
func (c *Client) readAnswer(resp *http.Response) (*Answer, error) {
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+1))
	if err != nil {
		return nil, err
	}
	if len(body) > maxAnswerBytes {
		c.log.Warn().Str("event", "long_answer").Int("status", resp.StatusCode).Msg("APISIX's answer is over 1 MiB; the client gets its first 1 MiB")
		body = body[:maxAnswerBytes]
	}
	return &Answer{Status: resp.StatusCode, Header: resp.Header, Body: body}, nil
}

// call is one request confshim makes of its own: the caller's credentials go on it
// (their query string and headers), a nil body sends none.
type call struct {
	method, path string
	creds        Credentials
	header       http.Header
	body         []byte
}

// roundTrip sends cl on conn, bounded by the client's timeout, and reads the answer
// whole.
func (c *Client) roundTrip(ctx context.Context, conn Conn, cl call) (*Answer, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var body io.Reader
	if cl.body != nil {
		body = bytes.NewReader(cl.body)
	}
	req, err := http.NewRequestWithContext(ctx, cl.method, c.URL(cl.path, cl.creds.rawQuery), body)
	if err != nil {
		return nil, err
	}
	if cl.body != nil {
		req.ContentLength = int64(len(cl.body))
	}
	if cl.header != nil {
		req.Header = cl.header
	}
	cl.creds.with(req.Header)
	resp, err := c.tr.pick(conn).RoundTrip(req)
	if err != nil {
		return nil, err
	}
	c.noteConn(conn)
	c.NoteAnswer(resp)
	return c.readAnswer(resp)
}

// RefusedError: APISIX refused a request confshim made with the caller's credentials
// (401/403); the caller's PUT then goes to APISIX untouched, to be refused in its words.
type RefusedError struct{ Status int }

func (e RefusedError) Error() string { return fmt.Sprintf("state read refused with %d", e.Status) }

// StatusError: APISIX answered a state read with an unexpected status.
type StatusError struct {
	Method string
	Status int
}

func (e StatusError) Error() string {
	return fmt.Sprintf("%s %s answered %d", e.Method, ConfigsPath, e.Status)
}

// TooBigError: the configuration APISIX answered is over the limit confshim reads.
type TooBigError struct{ Limit int64 }

func (e TooBigError) Error() string { return fmt.Sprintf("data plane state is over %d bytes", e.Limit) }

// Probe asks APISIX whether the caller's credentials are an admin's, with exactly the
// credentials the PUT carries, by the cheapest call the data plane offers: an empty
// POST /configs/validate (3.15+: no decode of the stored configuration), else HEAD
// /configs (3.14), else the configuration itself by GET (3.13). It proves that APISIX
// accepts the credentials for a method other than GET (a viewer key is refused by
// validate and HEAD alike); only on 3.13's GET does a viewer key pass it, and APISIX
// then refuses the PUT itself. It does not prove the PUT will be accepted. A refusal
// is a RefusedError.
func (c *Client) Probe(ctx context.Context, creds Credentials, stateLimit int64) error {
	if c.HasValidate() {
		a, err := c.roundTrip(ctx, Shared, call{method: http.MethodPost, path: ConfigsPath + "/validate", creds: creds,
			header: http.Header{"Content-Type": {"application/json"}}, body: []byte("{}")})
		switch {
		case err != nil:
			return err
		case a.Status == http.StatusUnauthorized || a.Status == http.StatusForbidden:
			return RefusedError{a.Status}
		case a.Status != http.StatusNotFound:
			return nil // the state read under the lock decides
		}
		c.noValidate.Store(true) // a front that does not route validate: HEAD from now on
	}
	if !c.noHead.Load() {
		meta, status, err := c.Head(ctx, Shared, creds)
		switch {
		case err != nil:
			return err
		case meta != nil:
			return nil
		case status == http.StatusNotFound: // APISIX 3.13 (Head noted it)
		case status != http.StatusMethodNotAllowed:
			return nil // the state read under the lock decides
		}
	}
	// a GET on the shared connection: the state under the lock is read again on the
	// decide connection, which the PUT then takes
	_, _, err := c.Get(ctx, Shared, creds, stateLimit)
	return err
}

// Head is HEAD /apisix/admin/configs with the caller's credentials: the metadata when
// APISIX answers 200, a RefusedError on 401/403, otherwise the status alone.
func (c *Client) Head(ctx context.Context, conn Conn, creds Credentials) (*Meta, int, error) {
	a, err := c.roundTrip(ctx, conn, call{method: http.MethodHead, path: ConfigsPath, creds: creds, header: jsonAccept()})
	if err != nil {
		return nil, 0, err
	}
	switch a.Status {
	case http.StatusOK:
		return &Meta{Digest: a.Header.Get("X-Digest"), LastModified: a.Header.Get("X-Last-Modified")}, http.StatusOK, nil
	case http.StatusUnauthorized, http.StatusForbidden:
		return nil, a.Status, RefusedError{a.Status}
	case http.StatusNotFound:
		if c.noHead.CompareAndSwap(false, true) {
			c.log.Info().Str("event", "no_head").Msg("the data plane has no HEAD /apisix/admin/configs (APISIX 3.13): state reads use GET, re-seeding is off")
		}
	}
	return nil, a.Status, nil
}

// Get is GET /apisix/admin/configs with the caller's credentials: the document (at
// most limit bytes) and its metadata. A refusal is a RefusedError, another status a
// StatusError, a document over limit a TooBigError.
func (c *Client) Get(ctx context.Context, conn Conn, creds Credentials, limit int64) ([]byte, Meta, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL(ConfigsPath, creds.rawQuery), nil)
	if err != nil {
		return nil, Meta{}, err
	}
	req.Header.Set("Accept", "application/json")
	creds.Apply(req)
	resp, err := c.tr.pick(conn).RoundTrip(req)
	if err != nil {
		return nil, Meta{}, err
	}
	defer resp.Body.Close()
	c.noteConn(conn)
	c.NoteAnswer(resp)
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return nil, Meta{}, RefusedError{resp.StatusCode}
	case resp.StatusCode != http.StatusOK:
		return nil, Meta{}, StatusError{http.MethodGet, resp.StatusCode}
	}
	body, err := readAllSized(resp, limit)
	if err != nil {
		return nil, Meta{}, err
	}
	return body, Meta{Digest: resp.Header.Get("X-Digest"), LastModified: resp.Header.Get("X-Last-Modified")}, nil
}

// readAllSized reads a response body of at most limit bytes, in one allocation when
// the length is announced (io.ReadAll's doubling would leave twice the state as garbage).
func readAllSized(resp *http.Response, limit int64) ([]byte, error) {
	if resp.ContentLength > limit {
		return nil, TooBigError{limit}
	}
	if resp.ContentLength > 0 {
		body := make([]byte, resp.ContentLength)
		_, err := io.ReadFull(resp.Body, body)
		return body, err
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err == nil && int64(len(body)) > limit {
		return nil, TooBigError{limit}
	}
	return body, err
}

func jsonAccept() http.Header { return http.Header{"Accept": {"application/json"}} }

// Put sends one complete PUT of body with header as given (the caller's, prepared) on
// conn, and reads APISIX's answer whole. done closes when the transport let go of
// body: only then may its buffer be reused (RoundTrip can return while the body is
// still being written, when APISIX answers early).
func (c *Client) Put(ctx context.Context, conn Conn, target string, header http.Header, body []byte) (*Answer, <-chan struct{}, error) {
	sent := newSentBody(body)
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, target, sent)
	if err != nil {
		sent.Close()
		return nil, sent.done, err
	}
	req.ContentLength = int64(len(body))
	req.Header = header
	resp, err := c.tr.pick(conn).RoundTrip(req)
	if err != nil {
		return nil, sent.done, err
	}
	c.noteConn(conn)
	c.NoteAnswer(resp)
	a, err := c.readAnswer(resp)
	return a, sent.done, err
}

// PutConfig is PUT /apisix/admin/configs of a body confshim wrote itself (a re-seed)
// with creds and digest, on the decide connection without a redial.
func (c *Client) PutConfig(ctx context.Context, creds Credentials, body []byte, digest string) (*Answer, error) {
	header := http.Header{"Content-Type": {"application/json"}, "X-Digest": {digest}}
	return c.roundTrip(NoRedial(ctx), Decide, call{method: http.MethodPut, path: ConfigsPath, creds: creds, header: header, body: body})
}

// Ping is HEAD /apisix/admin on the decide connection (the caller serialises it with
// the PUTs): no key but key's, no decode of the configuration on APISIX. It keeps that
// connection open between syncs and returns the Server header.
func (c *Client) Ping(ctx context.Context, key string) (string, error) {
	a, err := c.headAdmin(ctx, Decide, key, min(c.timeout, 5*time.Second))
	if err != nil {
		return "", err
	}
	return a.Header.Get("Server"), nil
}

// Alive is HEAD /apisix/admin on the shared connections, within d (readiness).
func (c *Client) Alive(ctx context.Context, key string, d time.Duration) bool {
	_, err := c.headAdmin(ctx, Shared, key, d)
	return err == nil
}

// headAdmin is HEAD /apisix/admin within d: APISIX needs no key and decodes nothing.
func (c *Client) headAdmin(ctx context.Context, conn Conn, key string, d time.Duration) (*Answer, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	// APISIX needs no key here; a stricter front may
	return c.roundTrip(ctx, conn, call{method: http.MethodHead, path: "/apisix/admin", creds: KeyCredentials(key)})
}

// sentBody is a request body that says when the transport closed it.
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
