package main

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/confshim/confshim/internal/testsupport/apisixtest"
	"github.com/confshim/confshim/internal/testsupport/testcerts"
)

// startArgs runs confshim in front of a fresh emulator, with extra flags.
func startArgs(t *testing.T, extra ...string) (addrs, func() int) {
	t.Helper()
	dp := apisixtest.Start(t, apisixtest.Options{})
	return launch(t, append([]string{"--upstream", dp.URL}, extra...))
}

// startTLS runs confshim serving HTTPS with a pair issued for cn, in dir.
func startTLS(t *testing.T, ca *testcerts.CA, dir, cn string) (addrs, func() int) {
	t.Helper()
	pair := ca.Issue(t, cn)
	certFile := testcerts.Write(t, dir, "tls.crt", pair.CertPEM)
	keyFile := testcerts.Write(t, dir, "tls.key", pair.KeyPEM)
	return startArgs(t, "--tls-cert-file", certFile, "--tls-key-file", keyFile)
}

func TestServesHTTPSAndReloadsTheCertificate(t *testing.T) {
	ca := testcerts.NewCA(t, "test-ca")
	dir := t.TempDir()
	a, stop := startTLS(t, ca, dir, "first")
	defer stop()

	served := func() string { return servedCN(t, ca, a.proxy) }
	if cn := served(); cn != "first" {
		t.Fatalf("serving %q", cn)
	}
	// cert-manager rotates the mounted secret
	second := ca.Issue(t, "second")
	testcerts.Write(t, dir, "tls.key", second.KeyPEM)
	testcerts.Write(t, dir, "tls.crt", second.CertPEM)
	deadline := time.Now().Add(5 * time.Second)
	for served() != "second" {
		if time.Now().After(deadline) {
			t.Fatal("the rotated certificate was never served")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestHeaderSizeIsCapped(t *testing.T) {
	a, stop := startArgs(t)
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
	var stderr strings.Builder
	code := run(context.Background(), []string{"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
		"--tls-cert-file", "/nonexistent.crt", "--tls-key-file", "/nonexistent.key"}, noEnv, io.Discard, &stderr,
		func(string, string) { t.Fatal("must not listen") })
	if code == 0 || !strings.HasPrefix(stderr.String(), "--tls-cert-file") {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
}

func TestABrokenRotationKeepsThePreviousCertificate(t *testing.T) {
	defer func(i time.Duration) { certCheckInterval = i }(certCheckInterval)
	certCheckInterval = 0
	ca := testcerts.NewCA(t, "test-ca")
	dir := t.TempDir()
	a, stop := startTLS(t, ca, dir, "good")
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
