package apisix

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Conn names the connection a request travels on.
type Conn int

const (
	// Shared are the pooled connections: passthrough, the probe, validate, the watch's
	// look at the configuration.
	Shared Conn = iota
	// Decide is one kept-alive connection, used under the PUT lock only: the state
	// read, the PUT and the watch's ping travel on it. A restarted data plane closed
	// it, so a PUT that may not dial (NoRedial) never reaches a data plane its
	// decision did not see.
	Decide
)

// ErrRedial: the connection the data plane's state was read on is gone, so the PUT
// decided on that state is not sent (nothing was written).
var ErrRedial = errors.New("the connection the data plane's state was read on closed; deciding again")

// ErrConnectionHeld: a request on the decide connection while an answer on it is still
// open. Its one connection may not be redialled, so the request would wait for it for
// ever; it fails at once instead. Every answer is read whole first, so this is a bug
// caught, never an expected path.
var ErrConnectionHeld = errors.New("the connection to the data plane is still held by an answer confshim has not read; nothing was sent")

type noRedialKey struct{}

// NoRedial marks a request that must go on the decide connection as it is.
func NoRedial(ctx context.Context) context.Context {
	return context.WithValue(ctx, noRedialKey{}, true)
}

// transports are the two ways confshim talks to APISIX.
type transports struct {
	shared http.RoundTripper
	decide http.RoundTripper
	// dials counts the connections decide opened (nil when shared is not an
	// *http.Transport, in tests): confshim trusts what it believes of the data plane
	// only while it is the connection that confirmed it.
	dials *atomic.Uint64
	// closing: the decide connection's last answer said it closes (Connection: close,
	// a keep-alive limit), so its next request may open a new one: that is APISIX's
	// word, not a restart. expected counts those dials.
	closing  *atomic.Bool
	expected *atomic.Uint64
}

// newTransports derives the decide transport from the shared one. A shared transport
// that is not an *http.Transport (tests) serves both, and its dials are not counted.
func newTransports(shared http.RoundTripper) transports {
	t := transports{shared: shared, decide: shared}
	base, ok := shared.(*http.Transport)
	if !ok {
		return t
	}
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	decide := base.Clone()
	decide.MaxConnsPerHost, decide.MaxIdleConnsPerHost = 1, 1
	dials, closing, expected := &atomic.Uint64{}, &atomic.Bool{}, &atomic.Uint64{}
	decide.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		announced := closing.Swap(false)
		if ctx.Value(noRedialKey{}) != nil && !announced {
			return nil, ErrRedial
		}
		dials.Add(1)
		if announced {
			expected.Add(1)
		}
		return dialer.DialContext(ctx, network, addr)
	}
	t.decide, t.dials, t.closing, t.expected = &exclusive{rt: decide, closing: closing}, dials, closing, expected
	return t
}

func (t transports) pick(c Conn) http.RoundTripper {
	if c == Decide {
		return t.decide
	}
	return t.shared
}

func (t transports) dialCount() (uint64, bool) {
	if t.dials == nil {
		return 0, false
	}
	return t.dials.Load(), true
}

// unexpectedDials counts the decide connection's dials that no answer announced: a
// restart, a reset, an idle connection dropped.
func (t transports) unexpectedDials() (uint64, bool) {
	if t.dials == nil {
		return 0, false
	}
	return t.dials.Load() - t.expected.Load(), true
}

// exclusive guards the decide transport: a request goes only while no answer it gave
// is still open (its body neither read to the end nor closed).
type exclusive struct {
	rt      http.RoundTripper
	open    atomic.Int32
	closing *atomic.Bool
}

func (x *exclusive) RoundTrip(req *http.Request) (*http.Response, error) {
	if x.open.Load() > 0 {
		if req.Body != nil {
			req.Body.Close() // a RoundTripper must close the body, also on error
		}
		return nil, ErrConnectionHeld
	}
	resp, err := x.rt.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if resp.Close {
		x.closing.Store(true) // APISIX closes this connection after the answer
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
