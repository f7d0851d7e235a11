//go:build !race

// These tests run the confshim binary and read its peak RSS from /proc (the race
// detector multiplies memory, so they run in the plain pass of make test).

package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/confshim/confshim/internal/testsupport/adcclient"
	"github.com/confshim/confshim/internal/testsupport/apisixtest"
	"github.com/confshim/confshim/internal/testsupport/emulator"
	"github.com/confshim/confshim/internal/testsupport/fixture"
	"github.com/confshim/confshim/internal/testsupport/wait"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// confshimBinary builds ./cmd/confshim once per test run; CONFSHIM_TEST_BINARY names
// another binary to test instead (a release build, or an older one to compare).
func confshimBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("CONFSHIM_TEST_BINARY"); bin != "" {
		return bin
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "confshim-bin")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "confshim")
		out, err := exec.Command("go", "build", "-o", binPath, "../cmd/confshim").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// runningBinary is a confshim process.
type runningBinary struct {
	cmd        *exec.Cmd
	url        string
	metricsURL string
	logs       *syncBuffer
}

// startBinary runs confshim in front of upstream with extra flags and waits until it
// listens.
func startBinary(t *testing.T, upstream string, extra ...string) *runningBinary {
	t.Helper()
	args := append([]string{"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--upstream", upstream}, extra...)
	cmd := exec.Command(confshimBinary(t), args...)
	cmd.Env = append(os.Environ(), "GOMAXPROCS=2")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	b := &runningBinary{cmd: cmd, logs: &syncBuffer{}}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := make(chan [2]string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			_, _ = b.logs.Write([]byte(line + "\n"))
			var ev struct {
				Message       string `json:"message"`
				Listen        string `json:"listen"`
				MetricsListen string `json:"metrics_listen"`
			}
			if json.Unmarshal([]byte(line), &ev) == nil && ev.Message == "confshim started" {
				addr <- [2]string{ev.Listen, ev.MetricsListen}
			}
		}
	}()
	select {
	case a := <-addr:
		b.url, b.metricsURL = "http://"+a[0], "http://"+a[1]
	case <-time.After(30 * time.Second):
		t.Fatalf("confshim did not start:\n%s", b.logs.String())
	}
	return b
}

// peakRSS is the process's VmHWM in bytes.
func (b *runningBinary) peakRSS(t *testing.T) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", b.cmd.Process.Pid))
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// countingDataPlane wraps the emulator and counts what reaches it.
type countingDataPlane struct {
	em    http.Handler
	heads atomic.Int64
	puts  atomic.Int64
}

func (c *countingDataPlane) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodHead:
		c.heads.Add(1)
	case http.MethodPut:
		c.puts.Add(1)
	}
	c.em.ServeHTTP(w, r)
}

// TestMemoryDoesNotFollowAnnouncedLengths is contract §5.7 (issue: 16 connections
// announcing 16 MiB raised RSS by 260 MiB): 20 connections each announce 64 MiB and
// send one byte, half of them without a key (streamed to APISIX unbuffered), half
// with one (reserving budget, allocating nothing). Peak RSS grows by less than 64 MiB.
func TestMemoryDoesNotFollowAnnouncedLengths(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the binary")
	}
	var dp *countingDataPlane
	srv := apisixtest.Start(t, apisixtest.Options{Emulator: emulator.Options{AdminKey: adminKey}, Wrap: func(em http.Handler) http.Handler {
		dp = &countingDataPlane{em: em}
		return dp
	}})
	b := startBinary(t, srv.URL)
	before := b.peakRSS(t)
	host := strings.TrimPrefix(b.url, "http://")
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < 20; i++ {
		c, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		keyHeader := ""
		if i%2 == 0 {
			keyHeader = "X-API-KEY: " + adminKey + "\r\n"
		}
		fmt.Fprintf(c, "PUT /apisix/admin/configs HTTP/1.1\r\nHost: x\r\n%sX-Digest: d\r\nContent-Length: %d\r\n\r\n{", keyHeader, 64<<20)
	}
	// every connection was probed with its caller's credentials; the key-less ones were
	// refused and are streaming to APISIX
	wait.For(t, "20 probes", func() bool { return dp.heads.Load() >= 20 })
	wait.For(t, "10 refused PUTs streamed through", func() bool { return dp.puts.Load() >= 10 })
	growth := b.peakRSS(t) - before
	t.Logf("peak RSS grew by %.1f MiB for 20 × 64 MiB announced", float64(growth)/(1<<20))
	if growth >= 64<<20 {
		t.Fatalf("peak RSS grew by %d MiB, want < 64 MiB", growth>>20)
	}
}

// TestLargeBodiesCostASmallMultiple: a 6 MiB JSON body and a 6 MiB YAML body through the
// binary peak below 8x their size (the issue measured ~100x for YAML).
func TestLargeBodiesCostASmallMultiple(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the binary")
	}
	for _, tc := range []struct {
		name, contentType string
		body              []byte
	}{
		{"json", "application/json", bigJSON(6 << 20)},
		{"yaml", "application/yaml", bigYAML(6 << 20)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := apisixtest.Start(t, apisixtest.Options{Emulator: emulator.Options{AdminKey: adminKey}})
			b := startBinary(t, srv.URL)
			before := b.peakRSS(t)
			putAccepted(t, b.url, tc.body, tc.contentType)
			growth := b.peakRSS(t) - before
			ratio := float64(growth) / float64(len(tc.body))
			t.Logf("%s body %.1f MiB: peak RSS grew by %.1f MiB (%.2fx)", tc.name, float64(len(tc.body))/(1<<20), float64(growth)/(1<<20), ratio)
			if ratio > 8 {
				t.Fatalf("peak RSS grew %.2fx the body size, want <= 8x", ratio)
			}
		})
	}
}

// bigJSON is a configuration of about n bytes: routes with an id and a uri.
func bigJSON(n int) []byte {
	var sb strings.Builder
	sb.WriteString(`{"routes_conf_version":1,"routes":[`)
	for i := 0; sb.Len() < n; i++ {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"id":"r%d","uri":"/route/%d","desc":"a route of the large configuration"}`, i, i)
	}
	sb.WriteString(`],"secrets_conf_version":0}`)
	return []byte(sb.String())
}

// bigYAML is the same in block style.
func bigYAML(n int) []byte {
	var sb strings.Builder
	sb.WriteString("routes_conf_version: 1\nsecrets_conf_version: 0\nroutes:\n")
	for i := 0; sb.Len() < n; i++ {
		fmt.Fprintf(&sb, "  - id: r%d\n    uri: /route/%d\n    desc: a route of the large configuration\n", i, i)
	}
	return []byte(sb.String())
}

// TestMonitoringUsesOnlyMetricsThatExist scrapes a fresh binary once: every metric that
// deploy/monitoring's alerts and dashboard name is there from the first scrape.
func TestMonitoringUsesOnlyMetricsThatExist(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the binary")
	}
	srv := apisixtest.Start(t, apisixtest.Options{Emulator: emulator.Options{AdminKey: adminKey}})
	b := startBinary(t, srv.URL)
	resp, err := testHTTP.Get(b.metricsURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	scrape, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	exposed := map[string]bool{}
	for _, line := range strings.Split(string(scrape), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name := line[:strings.IndexAny(line, "{ ")]
		exposed[name] = true
	}
	var queries []string
	rules, _ := os.ReadFile("../deploy/monitoring/rules.yaml")
	for _, line := range strings.Split(string(rules), "\n") {
		if strings.Contains(line, "expr:") || strings.HasPrefix(strings.TrimSpace(line), "sum ") || strings.HasPrefix(strings.TrimSpace(line), "and") {
			queries = append(queries, line)
		}
	}
	var dash struct {
		Panels []struct {
			Targets []struct{ Expr string } `json:"targets"`
		} `json:"panels"`
	}
	data, _ := os.ReadFile("../deploy/monitoring/dashboard.json")
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	for _, p := range dash.Panels {
		for _, q := range p.Targets {
			queries = append(queries, q.Expr)
		}
	}
	names := regexp.MustCompile(`\b(confshim|go|process)_[a-z0-9_]+`)
	checked := 0
	for _, q := range queries {
		for _, name := range names.FindAllString(q, -1) {
			checked++
			if !exposed[name] {
				t.Errorf("%s is used by deploy/monitoring but not exposed at the first scrape", name)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d metric references found: the parsing is broken", checked)
	}
}

// TestBinaryFlushesStateFileOnSIGTERM: SIGTERM right after an accepted sync; the state
// file holds that sync when the process has exited (issue 18: it could be one write
// behind), and the process exits 0.
func TestBinaryFlushesStateFileOnSIGTERM(t *testing.T) {
	dp := apisixtest.Start(t, apisixtest.Options{Emulator: emulator.Options{AdminKey: adminKey}})
	dir := t.TempDir()
	b := startBinary(t, dp.URL, "--state-dir", dir, "--admin-key", adminKey)
	c := adcclient.New(b.url, adminKey)
	for i := 0; i < 5; i++ {
		mustLand(t, sync1(t, c, config(fmt.Sprintf("v%d", i))))
	}
	if err := b.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := b.cmd.Wait(); err != nil {
		t.Fatalf("exit after SIGINT: %v\n%s", err, b.logs.String())
	}
	data, err := os.ReadFile(filepath.Join(dir, "confshim-state.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"/v4"`) {
		t.Fatalf("the state file does not hold the last accepted sync:\n%.400s", data)
	}
}

// TestMemoryOfA40kSyncStaysBelowThreeBodies is issue 38's memory bound: a sync of the 40k-route
// fixture (≈ 45 MB), scanned as it arrives, raises the binary's peak RSS by at most 3×
// its body — the body read, the body forwarded, and the scan beside them.
func TestMemoryOfA40kSyncStaysBelowThreeBodies(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the binary")
	}
	body := fixture.Stale(40000).Request
	srv := apisixtest.Start(t, apisixtest.Options{Emulator: emulator.Options{AdminKey: adminKey}})
	b := startBinary(t, srv.URL, "--max-body-bytes", strconv.Itoa(len(body)+1<<20))
	before := b.peakRSS(t)
	putAccepted(t, b.url, body, "application/json")
	ratio := float64(b.peakRSS(t)-before) / float64(len(body))
	t.Logf("40k body %.1f MB: peak RSS grew %.2fx the body", float64(len(body))/1e6, ratio)
	if ratio > 3 {
		t.Fatalf("peak RSS grew %.2fx the body, want <= 3x", ratio)
	}
}

// putAccepted PUTs body to confshim at url with the admin key and wants APISIX's 202.
func putAccepted(t *testing.T, url string, body []byte, contentType string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPut, url+"/apisix/admin/configs", bytes.NewReader(body))
	req.Header.Set("X-API-KEY", adminKey)
	req.Header.Set("X-Digest", "big")
	req.Header.Set("Content-Type", contentType)
	resp, err := testHTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("%d", resp.StatusCode)
	}
}
