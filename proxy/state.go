package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strings"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/internal/dataplane"
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

// How confshim learnt of an out-of-band write.
const (
	learntByConflict = "version_conflict" // APISIX refused a PUT decided on the old versions
	learntByReread   = "re_read"          // the state read before a PUT found another digest
)

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

// IsLoopback: upstream names this host's loopback (127.0.0.0/8, ::1, localhost), so
// nothing but the kernel can stand between confshim and APISIX.
func IsLoopback(upstream *url.URL) bool {
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
	loopback   bool      // --upstream is this host's loopback (IsLoopback)
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

// decidesUnread: the belief may decide this sync without a read — the connection is
// one confshim trusts, and the belief was confirmed on it, still open, with no doubt since.
func (sr *stateReader) decidesUnread(tx *dataplane.Tx) bool {
	if trusted, _ := sr.trustReason(); !trusted {
		return false
	}
	return tx.View().Trusts(sr.api.DecideConn())
}

// stateFor returns the data plane's state under the PUT lock, on the decide connection:
// the belief unread where decidesUnread (verified is then false: the PUT's checks prove
// it), the belief when a HEAD shows nobody wrote since, otherwise a GET.
func (sr *stateReader) stateFor(ctx context.Context, tx *dataplane.Tx, creds apisix.Credentials, fresh bool, how string) (st *rewrite.State, verified bool, err error) {
	if !fresh && tx.View().State != nil && !sr.api.NoHead() {
		if sr.decidesUnread(tx) {
			return tx.View().State, false, nil
		}
		if ok, err := sr.revalidate(ctx, tx, creds); err != nil || ok {
			return tx.View().State, ok, err
		}
	}
	st, digest, lastModified, err := sr.readState(ctx, creds)
	if err != nil {
		return nil, false, err
	}
	sr.notes.moves(tx.Read(st, digest, lastModified, sr.api.NoHead(), sr.api.DecideConn()), how)
	return st, true, nil
}

// revalidate is HEAD /apisix/admin/configs on the decide connection: whether the data
// plane still holds the state confshim has (anything but a match, a changed state or
// an odd status, is false: a GET decides).
func (sr *stateReader) revalidate(ctx context.Context, tx *dataplane.Tx, creds apisix.Credentials) (bool, error) {
	head, _, err := sr.api.Head(ctx, apisix.Decide, creds)
	if err != nil {
		return false, err
	}
	if head != nil && tx.View().Matches(head.Digest, head.LastModified) {
		tx.Confirm(sr.api.DecideConn())
		return true, nil
	}
	return false, nil
}

// stillHolds is checked before a PUT that continues a sync: the data plane is asked
// whether it still holds what the sync's last answer left (digest and X-Last-Modified)
// when that PUT goes on a new connection (an answer announced that the decide
// connection closes), or when it carries the data plane's own items at a version that
// beats APISIX's check (a merged union, §5.4: an out-of-band write during the
// fallback's validate calls would be overwritten). false means it does not (it
// restarted, or someone wrote), and the sync is decided again on a fresh read.
func (sr *stateReader) stillHolds(ctx context.Context, creds apisix.Credentials, digest, lastModified string, carriesUnion bool) (bool, error) {
	if !sr.api.Closing() && !carriesUnion {
		return true, nil
	}
	head, _, err := sr.api.Head(ctx, apisix.Decide, creds)
	if err != nil {
		return false, err
	}
	return head != nil && head.LastModified != "" && head.Digest == digest && head.LastModified == lastModified, nil
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
		return nil, "", "", BadStateError{err}
	case err != nil:
		return nil, "", "", err // refused, another status, or no usable answer
	}
	st, err := rewrite.ParseState(body)
	if err != nil {
		return nil, "", "", BadStateError{err}
	}
	return st, meta.Digest, meta.LastModified, nil
}
