package dataplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/confshim/confshim/rewrite"
)

// stateFileName is the kept configuration's file in --state-dir.
const stateFileName = "confshim-state.json"

func writeStateFile(dir string, k *Kept) error {
	data, err := json.Marshal(k)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, stateFileName+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename this removes nothing
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, stateFileName)); err != nil {
		return err
	}
	if d, err := os.Open(dir); err == nil { // the rename itself survives a crash
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// maxStateString bounds the digest and X-Last-Modified a state file may carry.
const maxStateString = 1024

// readStateFile loads a kept configuration; a missing file is no error. The file is
// input like any other: only a regular file is read (a FIFO must not block start-up,
// /dev/zero must not fill memory), within limit bytes, and every value is checked.
func readStateFile(dir string, limit int64) (*Kept, error) {
	name := filepath.Join(dir, stateFileName)
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%s)", stateFileName, fi.Mode().Type())
	}
	if fi.Size() > limit {
		return nil, fmt.Errorf("%s is %d bytes, over the %d a kept configuration can take", stateFileName, fi.Size(), limit)
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", stateFileName, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s grew past %d bytes while read", stateFileName, limit)
	}
	var k Kept
	if err := json.Unmarshal(data, &k); err != nil {
		return nil, fmt.Errorf("%s: not a kept configuration: %v", stateFileName, clipError(err))
	}
	if err := k.check(); err != nil {
		return nil, fmt.Errorf("%s: %w", stateFileName, err)
	}
	return &k, nil
}

// check refuses a kept configuration APISIX could not take back as it was.
func (k *Kept) check() error {
	if len(k.Versions) == 0 {
		return errors.New("no versions")
	}
	if !printable(k.Digest) || !printable(k.LastModified) {
		// never sent as a header as it is: a re-seed then uses a digest of its own
		k.Digest, k.LastModified = "", ""
	}
	for s, v := range k.Versions {
		if s == "" || len(s) > 256 || !printable(s) || strings.HasSuffix(s, "_conf_version") {
			return fmt.Errorf("%q is not a section name", rewrite.Clip(s))
		}
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v >= 1<<53 {
			return fmt.Errorf("the version of %s is not one APISIX stores", rewrite.Clip(s))
		}
	}
	for s, ids := range k.Owned {
		if !printable(s) || len(ids) > 1<<20 {
			return fmt.Errorf("the ownership of %q is not usable", rewrite.Clip(s))
		}
	}
	for s, items := range k.Items {
		if _, ok := k.Versions[s]; !ok {
			return fmt.Errorf("items of %s without a version", rewrite.Clip(s))
		}
		trimmed := bytes.TrimSpace(items)
		if len(trimmed) == 0 || trimmed[0] != '[' || !json.Valid(trimmed) {
			return fmt.Errorf("the items of %s are not a JSON array", rewrite.Clip(s))
		}
	}
	return nil
}

func printable(s string) bool {
	if len(s) > maxStateString {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// clipError bounds a decoding error from a hostile file in the log.
func clipError(err error) string {
	msg := err.Error()
	if len(msg) > 256 {
		msg = msg[:256] + "…"
	}
	return msg
}

// stateWriter writes each kept configuration it is handed to the state dir, atomically
// (temporary file, fsync, rename) with mode 0600: it holds secrets such as a vault
// token. The newest configuration replaces one not yet taken.
type stateWriter struct {
	dir     string
	file    chan *Kept
	stopped chan struct{}
	started bool
	onWrite func(error)
}

func newStateWriter(dir string, onWrite func(error)) *stateWriter {
	if onWrite == nil {
		onWrite = func(error) {}
	}
	return &stateWriter{dir: dir, file: make(chan *Kept, 1), stopped: make(chan struct{}), onWrite: onWrite}
}

func (w *stateWriter) path() string { return filepath.Join(w.dir, stateFileName) }

func (w *stateWriter) hand(next *Kept) {
	select {
	case w.file <- next:
	default: // the writer is busy; replace what it has not taken yet
		select {
		case <-w.file:
		default:
		}
		w.file <- next
	}
}

// start runs the writer until ctx ends; then it writes the last configuration it was
// handed and returns.
func (w *stateWriter) start(ctx context.Context) {
	w.started = true
	go func() {
		defer close(w.stopped)
		write := func(c *Kept) { w.onWrite(writeStateFile(w.dir, c)) }
		for {
			select {
			case c := <-w.file:
				write(c)
			case <-ctx.Done():
				select {
				case c := <-w.file: // the last accepted configuration is on disk before exit
					write(c)
				default:
				}
				return
			}
		}
	}()
}

// wait returns when the writer has flushed and stopped (at once when never started).
func (w *stateWriter) wait() {
	if w.started {
		<-w.stopped
	}
}
