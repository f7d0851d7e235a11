package main

import (
	"crypto/tls"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// certReloader serves the listener's certificate and reloads it when either file
// changes, as cert-manager rotates mounted secrets. A broken rotation keeps the old pair.
type certReloader struct {
	certFile, keyFile string
	interval          time.Duration // the files are checked at most this often
	log               zerolog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	modTime time.Time
	checked time.Time
	// failed is the modification time of a pair that could not be loaded: it is said
	// once, not at every handshake, until the files change again.
	failed time.Time
}

func newCertReloader(certFile, keyFile string, interval time.Duration, log zerolog.Logger) (*certReloader, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile, interval: interval, log: log}
	if err := r.load(); err != nil {
		return nil, fmt.Errorf("--tls-cert-file/--tls-key-file: %v", err)
	}
	return r, nil
}

func (r *certReloader) latestModTime() (time.Time, error) {
	var latest time.Time
	for _, f := range []string{r.certFile, r.keyFile} {
		st, err := os.Stat(f)
		if err != nil {
			return time.Time{}, err
		}
		if st.ModTime().After(latest) {
			latest = st.ModTime()
		}
	}
	return latest, nil
}

func (r *certReloader) load() error {
	mod, err := r.latestModTime()
	if err != nil {
		return err
	}
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return err
	}
	r.cert, r.modTime = &cert, mod
	return nil
}

// GetCertificate checks the files at most once an interval.
func (r *certReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.checked) >= r.interval {
		r.checked = time.Now()
		if mod, err := r.latestModTime(); err == nil && !mod.Equal(r.modTime) && !mod.Equal(r.failed) {
			if err := r.load(); err != nil {
				r.failed = mod
				r.log.Error().Err(err).Msg("TLS certificate changed but cannot be loaded; keeping the previous one")
			} else {
				r.log.Info().Msg("TLS certificate reloaded")
			}
		}
	}
	return r.cert, nil
}
