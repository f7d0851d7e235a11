package apisix

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"syscall"

	"github.com/confshim/confshim/metrics"
)

// ClientGone is Classify's kind for a client that went away: never an upstream error.
const ClientGone metrics.UpstreamErrorKind = "client_gone"

// Classify maps a request's failure to a metrics kind and the status confshim answers
// with (504 for a timeout, 502 otherwise; 0 when the client itself went away).
func Classify(ctx context.Context, err error) (metrics.UpstreamErrorKind, int) {
	if ctx.Err() == context.Canceled || errors.Is(err, context.Canceled) {
		return ClientGone, 0
	}
	if errors.Is(err, ErrConnectionHeld) {
		return metrics.OtherError, http.StatusBadGateway
	}
	var netErr net.Error
	var tlsRecord tls.RecordHeaderError
	var unknownAuthority x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	var verify *tls.CertificateVerificationError
	var opErr *net.OpError
	switch {
	case errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &netErr) && netErr.Timeout()):
		return metrics.Timeout, http.StatusGatewayTimeout
	case errors.As(err, &tlsRecord), errors.As(err, &unknownAuthority), errors.As(err, &hostname),
		errors.As(err, &invalid), errors.As(err, &verify):
		return metrics.TLS, http.StatusBadGateway
	case errors.As(err, &opErr) && opErr.Op == "dial":
		return metrics.Unreachable, http.StatusBadGateway
	case isReset(err):
		return metrics.Reset, http.StatusBadGateway
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return metrics.Unreachable, http.StatusBadGateway
	}
	return metrics.OtherError, http.StatusBadGateway
}

// isReset: the connection broke after it was made (APISIX restarted, a worker died).
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// ConnectionBroke: a request got no answer because the data plane's connection broke
// (reset, closed while idle, or another transport failure), not because the client
// left or time ran out.
func ConnectionBroke(ctx context.Context, err error) bool {
	if err == nil || errors.Is(err, ErrConnectionHeld) {
		return false
	}
	kind, _ := Classify(ctx, err)
	return kind == metrics.Reset || kind == metrics.OtherError
}

// SafeError keeps transport errors out of the log when they could quote a URL with an
// api_key query argument.
func SafeError(err error) string {
	var uerr *url.Error
	if errors.As(err, &uerr) {
		return uerr.Op + ": " + uerr.Err.Error()
	}
	return err.Error()
}
