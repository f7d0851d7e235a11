package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// What confshim believes about the data plane must be true and cheap to keep (issue
// 18). On APISIX every GET, HEAD or PUT of /apisix/admin/configs decodes the whole
// stored document (≈ 0.3 s of a worker at 40,000 routes), while HEAD /apisix/admin and
// an empty POST /configs/validate cost well under a millisecond. So:
//
//   - The watch pings HEAD /apisix/admin every --reseed-interval on the decide
//     connection, which stays open between syncs. A container restart closes it; the configs
//     HEAD that tells an empty data plane is asked on such evidence (the ping had to
//     open a new connection, failed, or saw another Server version), when confshim
//     could not derive the kept configuration, and otherwise as often as a cost budget
//     allows (lookInterval): between --reseed-interval and once a minute.
//   - Under the PUT lock, the state read and the PUT travel on that connection, and the
//     PUT may not open a new one: a data plane that restarted since the state was last
//     confirmed (read, or written by confshim's own accepted PUT) closed it, so the PUT
//     is never sent to it, and the decision is taken again on a fresh read.
//   - So no read is needed per sync (issue 27): while the connection that confirmed the
//     state is the one open, a sync is decided on confshim's belief, and APISIX's own
//     version check proves it still holds — an out-of-band write that changed a section
//     raised its version, and a PUT decided on the old one is answered 400 "… must be
//     greater than or equal to …", then decided again on a fresh read (§5.4). A version
//     check cannot see a writer that set a section to exactly the version a bump would
//     choose (to APISIX an equal version means "keep what you hold"), so a decision that
//     bumps is checked first (HEAD, as before). Trust ends with any sign of doubt: a
//     re-opened connection, a ping that failed or met another Server, a PUT whose answer
//     was not a 2xx.

// safetyCheckInterval bounds how long an unnoticed change can go unseen by the watch:
// at least one configs HEAD a minute, however large the configuration.
const safetyCheckInterval = time.Minute

// errRedial: the connection the data plane's state was read on is gone, so the PUT
// decided on that state is not sent (nothing was written).
var errRedial = errors.New("the connection the data plane's state was read on closed; deciding again")

type noRedialKey struct{}

// noRedial marks a request that must go on the connection the state was read on.
func noRedial(ctx context.Context) context.Context {
	return context.WithValue(ctx, noRedialKey{}, true)
}

// transports are the two ways confshim talks to APISIX.
type transports struct {
	shared http.RoundTripper // passthrough, probes, validate, the watch's configs HEAD
	// decide is one kept-alive connection used under the PUT lock only: the state read,
	// the PUT and the watch's ping travel on it. A restarted data plane closed it, so a
	// PUT that may not dial (noRedial) never reaches a data plane its decision did not
	// see.
	decide http.RoundTripper
	// dials counts the connections decide opened (nil when shared is not an
	// *http.Transport, in tests): confshim trusts what it believes of the data plane
	// only while it is the connection that confirmed it.
	dials *atomic.Uint64
}

// newTransports derives the decide transport from the shared one. A shared transport
// that is not an *http.Transport (tests) serves both, and nothing is trusted unread.
func newTransports(shared http.RoundTripper) transports {
	t := transports{shared: shared, decide: shared}
	base, ok := shared.(*http.Transport)
	if !ok {
		return t
	}
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	decide := base.Clone()
	decide.MaxConnsPerHost, decide.MaxIdleConnsPerHost = 1, 1
	dials := &atomic.Uint64{}
	decide.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if ctx.Value(noRedialKey{}) != nil {
			return nil, errRedial
		}
		dials.Add(1)
		return dialer.DialContext(ctx, network, addr)
	}
	t.decide, t.dials = &exclusive{rt: decide}, dials
	return t
}

// dialCount is how many connections decide opened; ok is false where they are not counted.
func (t transports) dialCount() (n uint64, ok bool) {
	if t.dials == nil {
		return 0, false
	}
	return t.dials.Load(), true
}

// errConnectionHeld: a request on the decide connection while an answer on it is still
// open. Its one connection may not be redialled, so the request would wait for it for
// ever; it fails at once instead. Every answer is read whole first (readAnswer), so
// this is a bug caught, never an expected path.
var errConnectionHeld = errors.New("the connection to the data plane is still held by an answer confshim has not read; nothing was sent")

// exclusive guards the decide transport: a request goes only while no answer it gave
// is still open (its body neither read to the end nor closed).
type exclusive struct {
	rt   http.RoundTripper
	open atomic.Int32
}

func (x *exclusive) RoundTrip(req *http.Request) (*http.Response, error) {
	if x.open.Load() > 0 {
		if req.Body != nil {
			req.Body.Close() // a RoundTripper must close the body, also on error
		}
		return nil, errConnectionHeld
	}
	resp, err := x.rt.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	x.open.Add(1)
	resp.Body = &openAnswer{ReadCloser: resp.Body, done: func() { x.open.Add(-1) }}
	return resp, nil
}

// openAnswer calls done once, when its body was read to the end or closed.
type openAnswer struct {
	io.ReadCloser
	done func()
	once sync.Once
}

func (a *openAnswer) Read(b []byte) (int, error) {
	n, err := a.ReadCloser.Read(b)
	if err == io.EOF {
		a.once.Do(a.done)
	}
	return n, err
}

func (a *openAnswer) Close() error {
	err := a.ReadCloser.Close()
	a.once.Do(a.done)
	return err
}

// noteServer learns APISIX's version from its Server header (APISIX/3.17.0): the probe
// uses the cheapest authenticated call that version offers.
func (p *Proxy) noteServer(h http.Header) {
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
	p.serverMinor.Store(int32(minor))
	if len(server) <= 64 {
		p.serverVersion.Store(&server)
	}
}

// hasValidate: the data plane is known to offer POST /apisix/admin/configs/validate.
func (p *Proxy) hasValidate() bool {
	return p.serverMinor.Load() >= 15 && !p.noValidate.Load()
}

// ping is HEAD /apisix/admin on the decide connection (the caller holds the PUT lock):
// no key, no decode of the configuration on APISIX. It keeps that connection open
// between syncs and returns the Server header.
func (p *Proxy) ping(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, min(p.cfg.UpstreamTimeout, 5*time.Second))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, p.upstreamURL("/apisix/admin", ""), nil)
	if err != nil {
		return "", err
	}
	if p.cfg.AdminKey != "" {
		req.Header.Set("X-API-KEY", p.cfg.AdminKey) // APISIX needs none here; a stricter front may
	}
	resp, err := p.tr.decide.RoundTrip(req)
	if err != nil {
		return "", err
	}
	resp.Body.Close()
	p.noteAnswer(resp)
	return resp.Header.Get("Server"), nil
}

// watchDataPlane pings the data plane every --reseed-interval and looks at its
// configuration (a configs HEAD) only when something suggests it changed. It returns
// when ctx ends.
func (p *Proxy) watchDataPlane(ctx context.Context) {
	t := time.NewTicker(p.cfg.ReseedInterval)
	defer t.Stop()
	suspect := true // nothing is known at start
	var lastServer string
	var lastCheck time.Time
	var lookCost time.Duration // what the last look cost (its latency)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		select {
		case p.putLock <- struct{}{}:
		default:
			continue // a PUT is in flight on the decide connection: it tells what a ping would
		}
		dials, _ := p.tr.dialCount()
		server, err := p.ping(ctx)
		redialed := false
		if n, ok := p.tr.dialCount(); ok && n != dials {
			redialed = true
		}
		if err != nil || redialed || server != lastServer {
			p.dp.trusted = false // down, a new connection, or another APISIX answering
		}
		p.unlockPut()
		if err != nil {
			suspect = true // unreachable or reset: it may come back empty
			p.log.Debug().Str("event", "watch").Str("error", safeError(err)).Msg("the data plane did not answer the ping")
			continue
		}
		if redialed || server != lastServer {
			suspect = true // a new connection, or another APISIX answering
		}
		lastServer = server
		if !suspect && !p.keep.refreshDue.Load() && time.Since(lastCheck) < p.lookInterval(lookCost) {
			continue
		}
		p.log.Debug().Str("event", "watch").Bool("suspect", suspect).Msg("looking at the data plane's configuration")
		looked, cost, ok := p.checkDataPlane(ctx)
		if !ok {
			return
		}
		if looked {
			suspect, lastCheck, lookCost = false, time.Now(), cost
		}
	}
}

// lookBudget is the share of an APISIX worker the watch's looks may take: a look (a
// configs HEAD) makes APISIX decode its whole stored document, ≈ 25 ms per MB, on the
// worker that also proxies traffic.
const lookBudget = 0.005

// lookInterval is how long the watch waits between looks with nothing suspicious seen:
// as often as the budget allows for what the last look cost (its latency stands for the
// decode), never more often than --reseed-interval, at least once per safety interval
// (a minute). A few hundred routes are looked at every second or two; 40,000 (≈ 0.3 s a
// decode) once a minute.
func (p *Proxy) lookInterval(cost time.Duration) time.Duration {
	d := time.Duration(float64(cost) / lookBudget)
	return min(max(d, p.cfg.ReseedInterval), p.cfg.WatchSafetyInterval)
}
