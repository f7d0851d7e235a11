package proxy

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// TestHostileStateFiles: the state file is input like any other (issue 18). Whatever
// is at its path, confshim starts at once, reports it and ignores it.
func TestHostileStateFiles(t *testing.T) {
	valid := `{"digest":"d","last_modified":"1","versions":{"routes":3},"items":{"routes":[{"id":"r1"}]}}`
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, path string)
		want  string // in the log; "" means the file is loaded
	}{
		{"valid", write(valid), ""},
		{"a FIFO", func(t *testing.T, path string) {
			if err := syscall.Mkfifo(path, 0o600); err != nil {
				t.Skip("mkfifo:", err)
			}
		}, "not a regular file"},
		{"a symlink to /dev/zero", func(t *testing.T, path string) {
			if err := os.Symlink("/dev/zero", path); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file"},
		{"a directory", func(t *testing.T, path string) {
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file"},
		{"over the size bound", write(`{"versions":{"routes":1},"digest":"` + strings.Repeat("x", 5<<20) + `"}`), "over the"},
		{"not JSON", write("{not json"), "not a kept configuration"},
		{"no versions", write(`{"versions":{}}`), "no versions"},
		{"a version APISIX cannot store", write(`{"versions":{"routes":1e300}}`), "not one APISIX stores"},
		{"a negative version", write(`{"versions":{"routes":-1}}`), "not one APISIX stores"},
		{"items that are not an array", write(`{"versions":{"routes":1},"items":{"routes":{"r1":{}}}}`), "not a JSON array"},
		{"items without a version", write(`{"versions":{"routes":1},"items":{"ssls":[]}}`), "without a version"},
		{"a section name that is a version key", write(`{"versions":{"routes_conf_version":1}}`), "not a section name"},
		{"a section name with a line break", write(`{"versions":{"rou\ntes":1}}`), "not a section name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.setup(t, filepath.Join(dir, stateFileName))
			var logs strings.Builder
			done := make(chan *keeper, 1)
			go func() {
				done <- newKeeper(Config{ReseedInterval: time.Second, StateDir: dir, MaxBodyBytes: 1 << 20}, zerolog.New(&logs), &debugLog{})
			}()
			var k *keeper
			select {
			case k = <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("start-up blocked on the state file")
			}
			if tc.want == "" {
				if k.kept == nil || k.kept.Versions["routes"] != 3 {
					t.Fatalf("a valid state file was not loaded: %s", logs.String())
				}
				return
			}
			if k.kept != nil {
				t.Fatal("a hostile state file was loaded")
			}
			if !strings.Contains(logs.String(), tc.want) || !strings.Contains(logs.String(), "ignored") {
				t.Fatalf("log %q does not say %q", logs.String(), tc.want)
			}
			if len(logs.String()) > 2048 {
				t.Fatalf("the log line quotes the file: %d bytes", len(logs.String()))
			}
		})
	}
}

func write(content string) func(t *testing.T, path string) {
	return func(t *testing.T, path string) {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStateFileDigestNeverAHeader: a digest with a line break is dropped (the re-seed
// uses its own), the rest of the file is used.
func TestStateFileDigestNeverAHeader(t *testing.T) {
	dir := t.TempDir()
	write(`{"digest":"a\r\nX-Evil: 1","last_modified":"1","versions":{"routes":1}}`)(t, filepath.Join(dir, stateFileName))
	k, err := readStateFile(dir, 1<<20)
	if err != nil || k == nil || k.Digest != "" || k.LastModified != "" || k.Versions["routes"] != 1 {
		t.Fatalf("%+v %v", k, err)
	}
	body, err := k.body()
	if err != nil || strings.Contains(string(body), "Evil") {
		t.Fatalf("%s %v", body, err)
	}
}

// TestStateFileFlushedOnShutdown: the writer may be busy when the last accepted
// configuration is handed to it; when the background stops, that one is on disk.
func TestStateFileFlushedOnShutdown(t *testing.T) {
	dir := t.TempDir()
	k := newKeeper(Config{ReseedInterval: time.Second, StateDir: dir, MaxBodyBytes: 1 << 20}, zerolog.Nop(), &debugLog{})
	ctx, cancel := context.WithCancel(context.Background())
	k.started = true
	go k.runWriter(ctx)
	for i := 1; i <= 50; i++ {
		k.set(&keptConfig{Digest: "d", LastModified: "1", Versions: map[string]float64{"routes": float64(i)}})
	}
	cancel()
	k.wait()
	data, err := os.ReadFile(filepath.Join(dir, stateFileName))
	if err != nil {
		t.Fatal(err)
	}
	var got keptConfig
	if err := json.Unmarshal(data, &got); err != nil || got.Versions["routes"] != 50 {
		t.Fatalf("state file after shutdown: %s (%v), want version 50", data, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("the writer left %d files behind", len(entries))
	}
}

// TestReseedBodyIsJSON: section names from a state file are written by a JSON encoder
// (Go's quoting of a control character is not JSON).
func TestReseedBodyIsJSON(t *testing.T) {
	k := &keptConfig{Versions: map[string]float64{"ro\x7futes": 2, "routes": 1.5}, Items: map[string]json.RawMessage{"routes": json.RawMessage(`[{"id":"r1"}]`)}}
	body, err := k.body()
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatalf("re-seed body %s: %v", body, err)
	}
	if doc["routes_conf_version"] != 1.5 || doc["ro\x7futes_conf_version"] != float64(2) {
		t.Fatalf("re-seed body %s", body)
	}
}
