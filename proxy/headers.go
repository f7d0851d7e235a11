package proxy

import (
	"net/http"
	"strings"
)

// hop-by-hop headers (RFC 9110 §7.6.1), never forwarded.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func removeHopHeaders(h http.Header) {
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

// credentials are the caller's admin key in every form APISIX reads it (contract
// §5.4), carried exactly as sent: the query string, each header nginx's
// $http_x_api_key matches (any case, "_" for "-"), and the cookies. confshim never
// decides which one APISIX will take; it lets APISIX decide, as it will for the PUT.
type credentials struct {
	header   http.Header
	rawQuery string
}

func credentialsOf(r *http.Request) credentials {
	c := credentials{header: http.Header{}, rawQuery: r.URL.RawQuery}
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

// keyCredentials are credentials made of one admin key (confshim's own requests).
func keyCredentials(key string) credentials {
	c := credentials{header: http.Header{}}
	if key != "" {
		c.header.Set("X-API-KEY", key)
	}
	return c
}

func (c credentials) apply(req *http.Request) {
	for name, values := range c.header {
		req.Header[name] = append([]string(nil), values...)
	}
}
