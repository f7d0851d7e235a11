package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/confshim/confshim/internal/testsupport/wait"
)

// syncBuffer is the emulator's log, written by its goroutines and read by the test.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var startLine = regexp.MustCompile(`emulator on (http://127\.0\.0\.1:\d+)`)

// start runs the emulator with args on a free loopback port and returns its URL, its
// log, and a stop that waits for it to end.
func start(t *testing.T, args ...string) (string, *syncBuffer, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncBuffer{}
	errc := make(chan error, 1)
	go func() { errc <- run(ctx, append([]string{"--listen", "127.0.0.1:0"}, args...), logs) }()
	stop := func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("run: %v", err)
		}
	}
	var m []string
	wait.For(t, "the emulator to log its address", func() bool {
		select {
		case err := <-errc:
			t.Fatalf("the emulator ended before it logged its address: %v: %q", err, logs.String())
		default:
		}
		m = startLine.FindStringSubmatch(logs.String())
		return m != nil
	})
	return m[1], logs, stop
}

func ping(t *testing.T, url string) {
	t.Helper()
	resp, err := http.Head(url + "/apisix/admin")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("HEAD /apisix/admin: %d", resp.StatusCode)
	}
}

// make run: confshim pings every second; the emulator says nothing about it unless asked.
func TestQuietUnlessVerbose(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		logsReq bool
	}{
		{"default", nil, false},
		{"-v", []string{"-v"}, true},
		{"--verbose", []string{"--verbose"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, logs, stop := start(t, tc.args...)
			ping(t, url)
			ping(t, url)
			stop()
			got := strings.Count(logs.String(), "HEAD /apisix/admin 200")
			if want := map[bool]int{false: 0, true: 2}[tc.logsReq]; got != want {
				t.Fatalf("%d request lines, want %d; log:\n%s", got, want, logs.String())
			}
			if strings.Count(logs.String(), "\n") != 1+got {
				t.Fatalf("only the start line and the request lines are logged:\n%s", logs.String())
			}
		})
	}
}

// The compose stand-in reads the key from the environment, as APISIX's config.yaml does.
func TestAdminKeyFromEnvironment(t *testing.T) {
	t.Setenv("APISIX_ADMIN_KEY", "env-key")
	url, _, stop := start(t)
	defer stop()
	for key, want := range map[string]int{"env-key": http.StatusOK, "other": http.StatusUnauthorized} {
		req, _ := http.NewRequest(http.MethodGet, url+"/apisix/admin/configs", nil)
		req.Header.Set("X-API-KEY", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("key %q: %d, want %d", key, resp.StatusCode, want)
		}
	}
}

// --standalone-config-size fills like APISIX's dict: a configuration larger than it is
// answered 500 "failed to save config to shared dict: no memory".
func TestStandaloneConfigSize(t *testing.T) {
	url, _, stop := start(t, "--standalone-config-size", "1k")
	defer stop()
	putConfig := func(body string) (int, string) {
		req, _ := http.NewRequest(http.MethodPut, url+"/apisix/admin/configs", strings.NewReader(body))
		req.Header.Set("X-Digest", body[:20]+strconv.Itoa(len(body)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if status, body := putConfig(`{"routes":[{"id":"r1","uri":"/a"}]}`); status != http.StatusAccepted {
		t.Fatalf("a small configuration: %d %s", status, body)
	}
	big := `{"routes":[{"id":"r1","uri":"/` + strings.Repeat("a", 2000) + `"}]}`
	if status, body := putConfig(big); status != http.StatusInternalServerError || body != "failed to save config to shared dict: no memory" {
		t.Fatalf("a configuration over 1k: %d %q", status, body)
	}
}

func TestNginxSize(t *testing.T) {
	for in, want := range map[string]int{"10m": 10 << 20, "512k": 512 << 10, "1G": 1 << 30, "2097152": 2097152} {
		if got, err := nginxSize(in); err != nil || got != want {
			t.Errorf("nginxSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "m", "-1m", "0", "10mb", "1.5m", "99999999999999999g"} {
		if _, err := nginxSize(bad); err == nil {
			t.Errorf("nginxSize(%q): no error", bad)
		}
	}
}
