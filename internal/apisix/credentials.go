package apisix

import (
	"net/http"
	"strings"
)

// Credentials are the caller's admin key in every form APISIX reads it (contract
// §5.4), carried exactly as sent: the query string, each header nginx's
// $http_x_api_key matches (any case, "_" for "-"), and the cookies. confshim never
// decides which one APISIX will take; it lets APISIX decide, as it will for the PUT.
type Credentials struct {
	header   http.Header
	rawQuery string
}

// CredentialsOf are the credentials r carries.
func CredentialsOf(r *http.Request) Credentials {
	c := Credentials{header: http.Header{}, rawQuery: r.URL.RawQuery}
	for name, values := range r.Header {
		if isAPIKeyHeader(name) || name == "Cookie" {
			c.header[name] = values
		}
	}
	return c
}

// isAPIKeyHeader: nginx matches $http_x_api_key case-insensitively with "_" for "-"
// (APISIX allows underscores in header names).
func isAPIKeyHeader(name string) bool {
	return len(name) == len("x-api-key") && strings.EqualFold(strings.ReplaceAll(name, "_", "-"), "x-api-key")
}

// KeyCredentials are credentials made of one admin key (confshim's own requests).
func KeyCredentials(key string) Credentials {
	c := Credentials{header: http.Header{}}
	if key != "" {
		c.header.Set("X-API-KEY", key)
	}
	return c
}

// Apply puts the credentials' headers on req (its query is the caller's to set).
func (c Credentials) Apply(req *http.Request) {
	for name, values := range c.header {
		req.Header[name] = append([]string(nil), values...)
	}
}

// RawQuery is the caller's query string, api_key included.
func (c Credentials) RawQuery() string { return c.rawQuery }

// with returns h plus the credentials' headers.
func (c Credentials) with(h http.Header) http.Header {
	for name, values := range c.header {
		h[name] = append([]string(nil), values...)
	}
	return h
}

// hop-by-hop headers (RFC 9110 §7.6.1), never forwarded.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// RemoveHopHeaders deletes the hop-by-hop headers and those Connection names.
func RemoveHopHeaders(h http.Header) {
	for _, f := range h.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

// IsZero: no credentials were ever taken (not even an empty set from a caller).
func (c Credentials) IsZero() bool { return c.header == nil }
