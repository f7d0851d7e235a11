package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/confshim/confshim/internal/testsupport/apisixtest"
	"github.com/confshim/confshim/internal/testsupport/testcerts"
	"github.com/confshim/confshim/internal/testsupport/wait"
)

// startArgs runs confshim in front of a fresh emulator, with h and extra flags.
func startArgs(t *testing.T, h hooks, extra ...string) (addrs, func() int) {
	t.Helper()
	dp := apisixtest.Start(t, apisixtest.Options{})
	return launch(t, append([]string{"--upstream", dp.URL}, extra...), h)
}

// startTLS runs confshim with h serving HTTPS with a pair issued for cn, in dir.
func startTLS(t *testing.T, h hooks, ca *testcerts.CA, dir, cn string) (addrs, func() int) {
	t.Helper()
	pair := ca.Issue(t, cn)
	certFile := testcerts.Write(t, dir, "tls.crt", pair.CertPEM)
	keyFile := testcerts.Write(t, dir, "tls.key", pair.KeyPEM)
	return startArgs(t, h, "--tls-cert-file", certFile, "--tls-key-file", keyFile)
}

func TestServesHTTPSAndReloadsTheCertificate(t *testing.T) {
	t.Parallel()
	ca := testcerts.NewCA(t, "test-ca")
	dir := t.TempDir()
	h := defaultHooks()
	h.certCheckInterval = 10 * time.Millisecond // the interval is TestCertificateFilesAreCheckedOncePerInterval's
	a, stop := startTLS(t, h, ca, dir, "first")
	defer stop()

	served := func() string { return servedCN(t, ca, a.proxy) }
	if cn := served(); cn != "first" {
		t.Fatalf("serving %q", cn)
	}
	// cert-manager rotates the mounted secret
	second := ca.Issue(t, "second")
	testcerts.Write(t, dir, "tls.key", second.KeyPEM)
	testcerts.Write(t, dir, "tls.crt", second.CertPEM)
	wait.For(t, "the rotated certificate to be served", func() bool { return served() == "second" })
}

func TestHeaderSizeIsCapped(t *testing.T) {
	t.Parallel()
	a, stop := startArgs(t, defaultHooks())
	defer stop()
	req, _ := http.NewRequest("GET", "http://"+a.proxy+"/apisix/admin/configs", nil)
	req.Header.Set("X-Big", strings.Repeat("a", 200<<10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("got %d, want 431", resp.StatusCode)
	}
}

func TestBadTLSFilesAreReportedBeforeListening(t *testing.T) {
	t.Parallel()
	var stderr strings.Builder
	code := run(context.Background(), []string{"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
		"--tls-cert-file", "/nonexistent.crt", "--tls-key-file", "/nonexistent.key"}, noEnv, io.Discard, &stderr,
		mustNotListen(t))
	if code == 0 || !strings.HasPrefix(stderr.String(), "--tls-cert-file") {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
}

func TestABrokenRotationKeepsThePreviousCertificate(t *testing.T) {
	t.Parallel()
	h := defaultHooks()
	h.certCheckInterval = 0
	ca := testcerts.NewCA(t, "test-ca")
	dir := t.TempDir()
	a, stop := startTLS(t, h, ca, dir, "good")
	defer stop()
	testcerts.Write(t, dir, "tls.crt", []byte("not a certificate"))
	// the handshake below checks the files (interval 0) and finds the broken pair
	if cn := servedCN(t, ca, a.proxy); cn != "good" {
		t.Fatalf("a broken rotation must keep serving the previous pair, serving %q", cn)
	}
}

// servedCN makes a fresh HTTPS connection to confshim, checks that HEAD /apisix/admin
// reaches APISIX through it, and returns the common name of the certificate served.
func servedCN(t *testing.T, ca *testcerts.CA, addr string) string {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}, DisableKeepAlives: true}}
	resp, err := client.Head("https://" + addr + "/apisix/admin")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Server"), "APISIX/") {
		t.Fatalf("HEAD /apisix/admin over HTTPS: %d %v", resp.StatusCode, resp.Header)
	}
	return resp.TLS.PeerCertificates[0].Subject.CommonName
}

// TestABrokenRotationIsLoggedOnce: a pair that cannot be loaded is said once, not at
// every handshake, until the files change again.
func TestABrokenRotationIsLoggedOnce(t *testing.T) {
	t.Parallel()
	ca := testcerts.NewCA(t, "test-ca")
	dir := t.TempDir()
	pair := ca.Issue(t, "good")
	certFile := testcerts.Write(t, dir, "tls.crt", pair.CertPEM)
	keyFile := testcerts.Write(t, dir, "tls.key", pair.KeyPEM)
	var logs strings.Builder
	r, err := newCertReloader(certFile, keyFile, 0, zerolog.New(&logs))
	if err != nil {
		t.Fatal(err)
	}
	testcerts.Write(t, dir, "tls.crt", []byte("not a certificate"))
	touch(t, certFile, time.Now().Add(time.Second))
	for i := 0; i < 5; i++ {
		if c, _ := r.GetCertificate(nil); c == nil {
			t.Fatal("no certificate served")
		}
	}
	if n := strings.Count(logs.String(), "cannot be loaded"); n != 1 {
		t.Fatalf("the broken pair was reported %d times, want once:\n%s", n, logs.String())
	}
	fixed := ca.Issue(t, "fixed")
	testcerts.Write(t, dir, "tls.crt", fixed.CertPEM)
	testcerts.Write(t, dir, "tls.key", fixed.KeyPEM)
	touch(t, certFile, time.Now().Add(2*time.Second))
	if _, _ = r.GetCertificate(nil); !strings.Contains(logs.String(), "reloaded") {
		t.Fatalf("a fixed pair is loaded again: %s", logs.String())
	}
}

func touch(t *testing.T, file string, at time.Time) {
	t.Helper()
	if err := os.Chtimes(file, at, at); err != nil {
		t.Fatal(err)
	}
}

// reloaderClock is a certReloader's clock and stat, moved and counted by a test.
type reloaderClock struct {
	mu     sync.Mutex
	now    time.Time
	stats  int
	block  chan struct{} // when set, a stat waits for it (a check in progress)
	inside chan struct{} // told when a stat starts waiting on block
}

func (c *reloaderClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *reloaderClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func (c *reloaderClock) Stat(name string) (os.FileInfo, error) {
	c.mu.Lock()
	c.stats++
	block, inside := c.block, c.inside
	c.mu.Unlock()
	if block != nil {
		inside <- struct{}{}
		<-block
	}
	return os.Stat(name)
}

func (c *reloaderClock) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// newReloaderOnClock is a certReloader with a pair issued for cn, checking every
// second of the returned clock.
func newReloaderOnClock(t *testing.T, ca *testcerts.CA, dir, cn string) (*certReloader, *reloaderClock, string) {
	t.Helper()
	pair := ca.Issue(t, cn)
	certFile := testcerts.Write(t, dir, "tls.crt", pair.CertPEM)
	keyFile := testcerts.Write(t, dir, "tls.key", pair.KeyPEM)
	r, err := newCertReloader(certFile, keyFile, time.Second, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	clock := &reloaderClock{now: time.Now()}
	r.now, r.stat = clock.Now, clock.Stat
	r.nextCheck.Store(clock.Now().Add(time.Second).UnixNano())
	return r, clock, certFile
}

func servedName(t *testing.T, r *certReloader) string {
	t.Helper()
	c, err := r.GetCertificate(nil)
	if err != nil || c == nil {
		t.Fatalf("no certificate: %v", err)
	}
	if c.Leaf == nil {
		leaf, err := x509.ParseCertificate(c.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return leaf.Subject.CommonName
	}
	return c.Leaf.Subject.CommonName
}

// TestCertificateFilesAreCheckedOncePerInterval (issue 45): a thousand handshakes
// within one interval stat the files not at all; the first handshake after it checks
// them (two stats), and a rotation is served from that check on.
func TestCertificateFilesAreCheckedOncePerInterval(t *testing.T) {
	t.Parallel()
	ca := testcerts.NewCA(t, "test-ca")
	dir := t.TempDir()
	r, clock, certFile := newReloaderOnClock(t, ca, dir, "first")
	for i := 0; i < 1000; i++ {
		if cn := servedName(t, r); cn != "first" {
			t.Fatalf("serving %q", cn)
		}
	}
	if n := clock.count(); n != 0 {
		t.Fatalf("%d stats within the interval, want none", n)
	}
	second := ca.Issue(t, "second")
	testcerts.Write(t, dir, "tls.key", second.KeyPEM)
	testcerts.Write(t, dir, "tls.crt", second.CertPEM)
	touch(t, certFile, time.Now().Add(time.Hour)) // a modification time the check must see as new
	if cn := servedName(t, r); cn != "first" {
		t.Fatalf("rotated before the interval passed: %q", cn)
	}
	clock.advance(time.Second)
	for i := 0; i < 1000; i++ {
		if cn := servedName(t, r); cn != "second" {
			t.Fatalf("handshake %d after the interval: serving %q", i, cn)
		}
	}
	if n := clock.count(); n != 2 {
		t.Fatalf("%d stats for 1000 handshakes in one interval, want 2 (the two files, once)", n)
	}
}

// TestAHandshakeNeverWaitsForACheck: while one handshake looks at the files (its stat
// does not return), another is served the pair in hand at once.
func TestAHandshakeNeverWaitsForACheck(t *testing.T) {
	t.Parallel()
	ca := testcerts.NewCA(t, "test-ca")
	r, clock, _ := newReloaderOnClock(t, ca, t.TempDir(), "first")
	clock.mu.Lock()
	clock.block, clock.inside = make(chan struct{}), make(chan struct{})
	block, inside := clock.block, clock.inside
	clock.mu.Unlock()
	clock.advance(time.Second)
	checked := make(chan struct{})
	go func() {
		defer close(checked)
		_, _ = r.GetCertificate(nil) // the check: its stat waits
	}()
	<-inside
	for _, late := range []time.Duration{0, 5 * time.Second} { // due again, or not
		clock.advance(late)
		served := make(chan string, 1)
		go func() { served <- servedName(t, r) }()
		select {
		case cn := <-served:
			if cn != "first" {
				t.Fatalf("serving %q", cn)
			}
		case <-time.After(10 * time.Second): // a failure detector, not a wait: it passes at once
			t.Fatal("a handshake waited for the check in progress")
		}
	}
	close(block) // the check's two stats go on
	go func() {
		for range inside {
		}
	}()
	<-checked
	close(inside)
}
