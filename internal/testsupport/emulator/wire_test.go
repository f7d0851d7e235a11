package emulator

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The exchanges of testdata/apisix-wire (copied from shared/testdata/apisix-wire: a
// real APISIX, byte for byte), in the order they were captured on one connection.
var wireExchanges = []string{
	"put-202", "put-204-same-digest", "put-400-stale-version", "put-400-unknown-plugin",
	"put-401-wrong-key", "get-200", "head-200", "head-admin-200", "validate-200-empty",
	"validate-400-item", "get-404-nginx",
}

// wireAnswer is an HTTP/1.1 answer as it crossed the wire: headers in order, and the
// body exactly as framed.
type wireAnswer struct {
	status  string
	headers [][2]string
	framing string // "chunked", "length" or "none"
	raw     []byte // the body bytes as sent (chunk sizes included)
	body    []byte // the body the framing carries
}

func (a wireAnswer) header(name string) (string, bool) {
	for _, h := range a.headers {
		if strings.EqualFold(h[0], name) {
			return h[1], true
		}
	}
	return "", false
}

// readWireAnswer reads one answer off the connection without net/http, which would
// hide the framing.
func readWireAnswer(r *bufio.Reader, head bool) (wireAnswer, error) {
	var a wireAnswer
	line, err := r.ReadString('\n')
	if err != nil {
		return a, fmt.Errorf("status line: %w", err)
	}
	a.status = strings.TrimRight(line, "\r\n")
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return a, fmt.Errorf("headers: %w", err)
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			break
		}
		name, value, _ := strings.Cut(line, ": ")
		a.headers = append(a.headers, [2]string{name, value})
	}
	te, chunked := a.header("Transfer-Encoding")
	cl, length := a.header("Content-Length")
	var raw bytes.Buffer
	switch {
	case head || strings.HasPrefix(a.status, "HTTP/1.1 204"):
		a.framing = "none"
	case chunked && te == "chunked":
		a.framing = "chunked"
		for {
			size, err := r.ReadString('\n')
			if err != nil {
				return a, fmt.Errorf("chunk size: %w", err)
			}
			raw.WriteString(size)
			n, err := strconv.ParseInt(strings.TrimRight(size, "\r\n"), 16, 64)
			if err != nil {
				return a, fmt.Errorf("chunk size %q: %w", size, err)
			}
			chunk := make([]byte, n+2)
			if _, err := io.ReadFull(r, chunk); err != nil {
				return a, fmt.Errorf("chunk: %w", err)
			}
			raw.Write(chunk)
			a.body = append(a.body, chunk[:n]...)
			if n == 0 {
				break
			}
		}
	case length:
		a.framing = "length"
		n, _ := strconv.Atoi(cl)
		a.body = make([]byte, n)
		if _, err := io.ReadFull(r, a.body); err != nil {
			return a, fmt.Errorf("body: %w", err)
		}
		raw.Write(a.body)
	default:
		a.framing = "none"
	}
	a.raw = raw.Bytes()
	return a, nil
}

// loadWireExchange splits a capture into the request bytes and the recorded answer.
func loadWireExchange(t *testing.T, path string) (request []byte, answer wireAnswer, method string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	req, resp, ok := bytes.Cut(b, []byte("\n# response (bytes as received; Date varies)\n"))
	if !ok {
		t.Fatalf("%s: no response part", path)
	}
	req = bytes.TrimPrefix(req, []byte("# request\n"))
	headEnd := bytes.Index(req, []byte("\r\n\r\n")) + 4
	method, _, _ = strings.Cut(string(req), " ")
	if i := bytes.Index(req[:headEnd], []byte("Content-Length: ")); i >= 0 {
		n, _ := strconv.Atoi(string(req[i+16 : i+16+bytes.IndexByte(req[i+16:], '\r')]))
		req = req[:headEnd+n]
	} else {
		req = req[:headEnd]
	}
	answer, err = readWireAnswer(bufio.NewReader(bytes.NewReader(resp)), method == "HEAD")
	if err != nil {
		t.Fatalf("%s: recorded answer: %v", path, err)
	}
	return req, answer, method
}

// sameBody: byte for byte, except that a JSON object's key order is Lua's pairs().
func sameBody(want, got []byte) bool {
	if bytes.Equal(want, got) {
		return true
	}
	var w, g map[string]any
	if json.Unmarshal(want, &w) != nil || json.Unmarshal(got, &g) != nil {
		return false
	}
	if _, ok := w["X-Last-Modified"]; ok { // varies, like the header
		w["X-Last-Modified"], g["X-Last-Modified"] = "*", "*"
	}
	return reflect.DeepEqual(w, g) && !bytes.Contains(got, []byte(`\/`)) == !bytes.Contains(want, []byte(`\/`))
}

// TestWireMatchesRealAPISIX replays the captured requests on one kept-alive connection
// and holds every answer against the real one: status line, the header set (Date and
// X-Last-Modified vary), the framing (chunked, Content-Length or none) and the body.
func TestWireMatchesRealAPISIX(t *testing.T) {
	t.Parallel()
	for _, version := range []string{"3.17.0", "3.18.0"} {
		t.Run(version, func(t *testing.T) {
			em, err := New(Options{Version: version, AdminKey: "wire-key"})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(em)
			defer srv.Close()
			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
			r := bufio.NewReader(conn)
			for _, name := range wireExchanges {
				req, want, method := loadWireExchange(t, filepath.Join("testdata", "apisix-wire", version, name+".http"))
				if _, err := conn.Write(req); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				got, err := readWireAnswer(r, method == "HEAD")
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if got.status != want.status {
					t.Errorf("%s: status %q, want %q", name, got.status, want.status)
				}
				if g, w := headerSet(got), headerSet(want); !slices.Equal(g, w) {
					t.Errorf("%s: headers\n got %q\nwant %q", name, g, w)
				}
				if got.framing != want.framing {
					t.Errorf("%s: framed %s, want %s (%q)", name, got.framing, want.framing, got.raw)
				}
				if !sameBody(want.body, got.body) {
					t.Errorf("%s: body %q, want %q", name, got.body, want.body)
				}
				if got.framing == "chunked" && len(got.body) == 0 && string(got.raw) != "0\r\n\r\n" {
					t.Errorf("%s: an empty chunked body is the last chunk alone, got %q", name, got.raw)
				}
			}
		})
	}
}

// headerSet is the answer's headers, sorted, with the values that vary blanked.
func headerSet(a wireAnswer) []string {
	var out []string
	for _, h := range a.headers {
		v := h[1]
		switch strings.ToLower(h[0]) {
		case "date", "x-last-modified":
			v = "*"
		case "content-length":
			if a.framing == "chunked" {
				v = "?!" // never both
			}
		}
		out = append(out, strings.ToLower(h[0])+": "+v)
	}
	slices.Sort(out)
	return out
}
