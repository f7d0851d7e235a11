package main

import (
	"crypto/tls"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// certReloader serves the listener's certificate and reloads it when either file
// changes, as cert-manager rotates mounted secrets. A broken rotation keeps the old pair.
//
// A handshake costs it two atomic loads: the pair served is an atomic pointer, and the
// files are looked at (two stats) by at most one handshake an interval, which takes
// the check without waiting for anyone; the others, meanwhile, are served the pair in
// hand and never wait for a check (or a reload) in progress.
type certReloader struct {
	certFile, keyFile string
	interval          time.Duration // the files are checked at most this often
	log               zerolog.Logger
	now               func() time.Time                  // the clock (tests move it)
	stat              func(string) (os.FileInfo, error) // os.Stat (tests count it)

	cert      atomic.Pointer[tls.Certificate] // the pair handshakes are served
	nextCheck atomic.Int64                    // unix nanos before which the files are not looked at

	checking sync.Mutex // one check at a time, taken only with TryLock
	modTime  time.Time  // the served pair's (under checking)
	// failed is the modification time of a pair that could not be loaded: it is said
	// once, not at every check, until the files change again (under checking).
	failed time.Time
}

func newCertReloader(certFile, keyFile string, interval time.Duration, log zerolog.Logger) (*certReloader, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile, interval: interval, log: log, now: time.Now, stat: os.Stat}
	mod, err := r.latestModTime()
	if err == nil {
		err = r.load(mod)
	}
	if err != nil {
		return nil, fmt.Errorf("--tls-cert-file/--tls-key-file: %v", err)
	}
	r.nextCheck.Store(r.now().Add(interval).UnixNano())
	return r, nil
}

func (r *certReloader) latestModTime() (time.Time, error) {
	var latest time.Time
	for _, f := range []string{r.certFile, r.keyFile} {
		st, err := r.stat(f)
		if err != nil {
			return time.Time{}, err
		}
		if st.ModTime().After(latest) {
			latest = st.ModTime()
		}
	}
	return latest, nil
}

// load reads the pair, whose files were last modified at mod; the caller holds
// checking (or is the constructor).
func (r *certReloader) load(mod time.Time) error {
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return err
	}
	r.cert.Store(&cert)
	r.modTime = mod
	return nil
}

// GetCertificate serves the pair in hand; once an interval, the first handshake to see
// the check due also looks at the files (others do not wait for it).
func (r *certReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if now := r.now().UnixNano(); now >= r.nextCheck.Load() && r.checking.TryLock() {
		if now >= r.nextCheck.Load() { // not checked meanwhile by the one that held it
			r.nextCheck.Store(now + int64(r.interval))
			r.check()
		}
		r.checking.Unlock()
	}
	return r.cert.Load(), nil
}

// check reloads the pair when the files changed; the caller holds checking.
func (r *certReloader) check() {
	mod, err := r.latestModTime()
	if err != nil || mod.Equal(r.modTime) || mod.Equal(r.failed) {
		return
	}
	if err := r.load(mod); err != nil {
		r.failed = mod
		r.log.Error().Err(err).Msg("TLS certificate changed but cannot be loaded; keeping the previous one")
		return
	}
	r.log.Info().Msg("TLS certificate reloaded")
}
