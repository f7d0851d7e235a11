// Package apisixtest puts an emulated APISIX on loopback for tests, the one data plane
// every fixture puts confshim in front of: the emulator (or any handler) behind a real
// TCP listener that restarts the way a container does — the port closes, and every
// connection with it; the configuration is forgotten; the port answers again.
package apisixtest

import (
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/confshim/confshim/internal/testsupport/emulator"
)

// Options configure a Server.
type Options struct {
	// Emulator configures the emulator; its DictSize defaults to deployedDictSize.
	Emulator emulator.Options
	// Wrap puts something between the client and the emulator (faults, recorders).
	Wrap func(http.Handler) http.Handler
}

// Server is an emulated APISIX Admin API on a fixed loopback port.
type Server struct {
	Emulator *emulator.Emulator // nil when serving another handler (Serve)
	URL      string             // http://127.0.0.1:<port>
	Addr     string

	mu      sync.Mutex
	handler http.Handler
	srv     *http.Server
}

// deployedDictSize is the standalone-config dict of the APISIX the project deploys
// (deploy/compose/apisix/config.yaml, the controller's e2e: 50m), not APISIX's default
// 10m: the fixtures' 40,000 routes (≈ 11 MB) fit it, as they do in production.
const deployedDictSize = 50 << 20

// Start serves a new emulator; it stops when the test ends.
func Start(t testing.TB, o Options) *Server {
	t.Helper()
	if o.Emulator.DictSize == 0 {
		o.Emulator.DictSize = deployedDictSize
	}
	em, err := emulator.New(o.Emulator)
	if err != nil {
		t.Fatal(err)
	}
	var h http.Handler = em
	if o.Wrap != nil {
		h = o.Wrap(em)
	}
	s := Serve(t, h)
	s.Emulator = em
	return s
}

// Serve serves h on a fresh loopback port; it stops when the test ends.
func Serve(t testing.TB, h http.Handler) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: ln.Addr().String(), handler: h}
	s.URL = "http://" + s.Addr
	s.serve(ln)
	t.Cleanup(s.Close)
	return s
}

func (s *Server) serve(ln net.Listener) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.srv = &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second}
	go func(srv *http.Server) { _ = srv.Serve(ln) }(s.srv)
}

// Close closes the port and every connection on it.
func (s *Server) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.srv.Close()
}

// Restart is a container restart: the port closes for down, the emulator forgets its
// configuration, the port answers again on the same address.
func (s *Server) Restart(t testing.TB, down time.Duration) {
	t.Helper()
	s.Close()
	if s.Emulator != nil {
		s.Emulator.Restart()
	}
	time.Sleep(down) // the container is down this long
	var ln net.Listener
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if ln, err = net.Listen("tcp", s.Addr); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("the data plane's port did not open again: %v", err)
	}
	s.serve(ln)
}
