package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strings"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/rewrite"
)

// The data plane's state, and when a sync may be decided without reading it (contract
// §5.4). Every GET, HEAD or PUT of /apisix/admin/configs costs APISIX a decode of its
// whole stored document, so confshim decides most syncs on what it already believes —
// its own last accepted write, read or re-seed — and lets APISIX's own checks prove it:
//
//   - An out-of-band write raised a section's version, so a PUT decided on an older
//     belief is refused (400 "… must be greater than or equal to …"), on the decided
//     PUT or a fallback's corrected one alike: the state is read and the whole sync
//     decided again, once.
//   - A writer can set a section to exactly the version confshim sends, which APISIX
//     takes as "keep what you hold" and no check refuses. So a decision taken unread
//     sends every section it changes at a version the clock chose (rewrite.Input.Now,
//     .Unread): above anything written before and unlike the last version plus one a
//     hand-made PUT picks; where the clock cannot choose, the state is looked at first.
//   - A data plane that lost its state takes any version, and a thin PUT would empty
//     every unchanged section. The belief therefore holds only while the connection it
//     was confirmed on (the decide connection) is the one still open — a restart closes
//     it, and a PUT decided unread may not open another (apisix.ErrRedial) — and only
//     where that connection ends at APISIX itself: a proxy or a mesh sidecar in between
//     keeps confshim's connection open while APISIX restarts behind it. That is
//     --trust-connection: auto trusts a loopback --upstream whose answers never showed
//     an intermediary, always is the operator's word for a plain TCP path, never reads
//     before every decision.
//   - Trust ends at any sign of doubt: a re-opened connection, an answer that announced
//     its connection closes, a ping that failed or met another Server, an answer other
//     than a 2xx, an idle spell the transport may have dropped the connection in.

// TrustMode is --trust-connection.
type TrustMode string

const (
	TrustAuto   TrustMode = "auto"
	TrustAlways TrustMode = "always"
	TrustNever  TrustMode = "never"
)

// ParseTrustMode reads --trust-connection.
func ParseTrustMode(s string) (TrustMode, error) {
	switch m := TrustMode(s); m {
	case TrustAuto, TrustAlways, TrustNever:
		return m, nil
	}
	return "", fmt.Errorf("want auto, always or never, got %q", s)
}

// isLoopback: upstream names this host's loopback (127.0.0.0/8, ::1, localhost), so
// nothing but the kernel can stand between confshim and APISIX.
func isLoopback(upstream *url.URL) bool {
	host := strings.TrimSuffix(upstream.Hostname(), ".")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// stateReader reads the state a sync is decided on, under the PUT lock, on the decide
// connection, and says when it decides without reading (§5.4).
type stateReader struct {
	api        *apisix.Client
	trust      TrustMode // --trust-connection
	loopback   bool      // --upstream is this host's loopback (isLoopback)
	stateLimit int64     // the largest configuration read (4 × --max-body-bytes)
	notes      notes     // where a read's out-of-band writes are said
}

// trustReason says why the connection is or is not trusted, for the start line and
// /debug/config.
func (sr *stateReader) trustReason() (trusted bool, why string) {
	switch sr.trust {
	case TrustAlways:
		return true, "--trust-connection always: the operator vouches for a plain TCP path"
	case TrustNever:
		return false, "--trust-connection never: the state is read before every decision"
	}
	if !sr.loopback {
		return false, "--upstream is not a loopback address: something may stand between confshim and APISIX"
	}
	if sign := sr.api.Intermediary(); sign != "" {
		return false, "an answer showed an intermediary (" + sign + ")"
	}
	return true, "loopback --upstream, no sign of an intermediary"
}

// probe asks APISIX, with exactly the credentials the PUT carries, whether the caller
// may use the configuration (apisix.Client.Probe).
func (sr *stateReader) probe(ctx context.Context, creds apisix.Credentials) error {
	return sr.api.Probe(ctx, creds, sr.stateLimit)
}

// readState is GET /apisix/admin/configs with the caller's credentials, on the decide
// connection, parsed.
func (sr *stateReader) readState(ctx context.Context, creds apisix.Credentials) (*rewrite.State, string, string, error) {
	body, meta, err := sr.api.Get(ctx, apisix.Decide, creds, sr.stateLimit)
	var tooBig apisix.TooBigError
	switch {
	case errors.As(err, &tooBig):
		return nil, "", "", badStateError{err}
	case err != nil:
		return nil, "", "", err // refused, another status, or no usable answer
	}
	st, err := rewrite.ParseState(body)
	if err != nil {
		return nil, "", "", badStateError{err}
	}
	return st, meta.Digest, meta.LastModified, nil
}
