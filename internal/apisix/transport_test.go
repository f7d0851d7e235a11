package apisix

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// chunkedAnswers answers like APISIX (spec §12): headers first, then a chunked body.
func chunkedAnswers(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusAccepted)
		_ = http.NewResponseController(w).Flush()
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestDecideConnectionRefusesWhileAnAnswerIsOpen: with a chunked answer still open, a
// second request on the decide connection fails at once with ErrConnectionHeld instead
// of waiting for ever; once the answer is read to its end the connection serves again,
// and once one is closed unread (net/http then drops the connection) the next request
// that may not dial fails at once too.
func TestDecideConnectionRefusesWhileAnAnswerIsOpen(t *testing.T) {
	srv := chunkedAnswers(t)
	tr := newTransports(http.DefaultTransport.(*http.Transport).Clone())
	calls := 0
	put := func() (*http.Response, error) {
		ctx := context.Background() // the first request dials, the others may not
		if calls++; calls > 1 {
			ctx = NoRedial(ctx)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, srv.URL, nil)
		return tr.decide.RoundTrip(req)
	}
	first, err := put()
	if err != nil {
		t.Fatal(err)
	}
	if first.ContentLength != -1 {
		t.Fatalf("the test server must answer chunked, got Content-Length %d", first.ContentLength)
	}
	start := time.Now()
	if _, err := put(); !errors.Is(err, ErrConnectionHeld) {
		t.Fatalf("second request with the first answer open: %v, want ErrConnectionHeld", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("refused after %s, want at once", took)
	}
	if _, err := io.ReadAll(first.Body); err != nil {
		t.Fatal(err)
	}
	second, err := put()
	if err != nil {
		t.Fatalf("after the first answer was read: %v", err)
	}
	_ = second.Body.Close() // unread: net/http drops the connection
	start = time.Now()
	if _, err := put(); !errors.Is(err, ErrRedial) || time.Since(start) > time.Second {
		t.Fatalf("after an answer was closed unread: %v after %s, want ErrRedial at once (the connection is gone)", err, time.Since(start))
	}
}

// TestReadAnswerFreesTheConnection: after readAnswer the next request finds the
// connection free although it may not dial (NoRedial): the sequence of a fallback.
func TestReadAnswerFreesTheConnection(t *testing.T) {
	t.Parallel()
	srv := chunkedAnswers(t)
	c := &Client{tr: newTransports(http.DefaultTransport.(*http.Transport).Clone())}
	for i := 0; i < 3; i++ {
		ctx := context.Background() // the first request dials
		if i > 0 {
			ctx = NoRedial(ctx)
		}
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, srv.URL, nil)
		resp, err := c.tr.decide.RoundTrip(req)
		if err != nil {
			cancel()
			t.Fatalf("request %d: %v", i, err)
		}
		a, err := c.readAnswer(resp)
		cancel()
		if err != nil || len(a.Body) != 0 || a.Status != http.StatusAccepted {
			t.Fatalf("request %d: %v %v", i, a, err)
		}
	}
}
