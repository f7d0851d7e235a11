package dataplane

import (
	"context"
	"encoding/json"
	"github.com/confshim/confshim/rewrite"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestHostileStateFiles: the state file is input like any other (issue 18). Whatever
// is at its path, confshim starts at once, reports it and ignores it.
func TestHostileStateFiles(t *testing.T) {
	t.Parallel()
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
			type loaded struct {
				b   *Belief
				err error
			}
			done := make(chan loaded, 1)
			go func() {
				b, err := New(Options{Keep: true, StateDir: dir, MaxFileBytes: 4<<20 + 1<<20})
				done <- loaded{b, err}
			}()
			var got loaded
			select {
			case got = <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("start-up blocked on the state file")
			}
			if tc.want == "" {
				if got.err != nil || got.b.Snapshot().Kept == nil || got.b.Snapshot().Kept.Versions["routes"] != 3 {
					t.Fatalf("a valid state file was not loaded: %v", got.err)
				}
				return
			}
			if got.b.Snapshot().Kept != nil {
				t.Fatal("a hostile state file was loaded")
			}
			if got.err == nil || !strings.Contains(got.err.Error(), tc.want) {
				t.Fatalf("error %v does not say %q", got.err, tc.want)
			}
			if len(got.err.Error()) > 2048 {
				t.Fatalf("the error quotes the file: %d bytes", len(got.err.Error()))
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
	t.Parallel()
	dir := t.TempDir()
	write(`{"digest":"a\r\nX-Evil: 1","last_modified":"1","versions":{"routes":1}}`)(t, filepath.Join(dir, stateFileName))
	k, err := readStateFile(dir, 1<<20)
	if err != nil || k == nil || k.Digest != "" || k.LastModified != "" || k.Versions["routes"] != 1 {
		t.Fatalf("%+v %v", k, err)
	}
	body, err := k.Body()
	if err != nil || strings.Contains(string(body), "Evil") {
		t.Fatalf("%s %v", body, err)
	}
}

// TestStateFileFlushedOnShutdown: the writer may be busy when the last accepted
// configuration is handed to it; when the background stops, that one is on disk.
func TestStateFileFlushedOnShutdown(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	b, err := New(Options{Keep: true, StateDir: dir, MaxFileBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.StartWriter(ctx)
	for i := 1; i <= 50; i++ {
		b.setKept(&Kept{Digest: "d", LastModified: "1", Versions: map[string]float64{"routes": float64(i)}})
	}
	cancel()
	b.Wait()
	data, err := os.ReadFile(filepath.Join(dir, stateFileName))
	if err != nil {
		t.Fatal(err)
	}
	var got Kept
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
	t.Parallel()
	k := &Kept{Versions: map[string]float64{"ro\x7futes": 2, "routes": 1.5}, Items: map[string]json.RawMessage{"routes": json.RawMessage(`[{"id":"r1"}]`)}}
	body, err := k.Body()
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

// TestKeptNeverSendsAnEmptySectionAsAnObject: a GET answers an empty section as {}
// (cjson); the re-seed built from it sends that section's version alone, never {}:
// APISIX after 3.18 refuses a section that is not an array (spec §13).
func TestKeptNeverSendsAnEmptySectionAsAnObject(t *testing.T) {
	t.Parallel()
	st, err := rewrite.ParseState([]byte(`{"routes_conf_version":3,"routes":{},"upstreams_conf_version":2,"upstreams":[],"secrets_conf_version":1,"secrets":[{"id":"vault/1","uri":"http://v","prefix":"kv","token":"t"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, err := keptFromState(st, "d", "1", nil).Body()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"routes_conf_version":3,"secrets_conf_version":1,"secrets":[{"id":"vault/1","uri":"http://v","prefix":"kv","token":"t"}],"upstreams_conf_version":2}`
	if string(body) != want {
		t.Fatalf("re-seed body %s, want %s", body, want)
	}
}
