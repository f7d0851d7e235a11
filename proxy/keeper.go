package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/rewrite"
)

// Re-seeding (contract §8.4): APISIX in API-driven standalone mode keeps its
// configuration in memory only, so a restarted APISIX comes back empty. The keeper
// holds the data plane's whole configuration as of the last write confshim saw
// accepted, the credentials re-seeding may use, and the --state-dir writer.
//
// The kept configuration is derived from the writes confshim forwards (a section APISIX
// took from the body has the body's items, one it kept has what it held before), so a
// sync costs no extra GET. Where it cannot be derived (a YAML body, a section whose
// earlier copy belongs to another state of the data plane), the watch reads the data
// plane once with GET.

// keptConfig is the data plane's configuration; immutable once built.
type keptConfig struct {
	Digest       string             `json:"digest"`
	LastModified string             `json:"last_modified"`
	Versions     map[string]float64 `json:"versions"`
	// Items are the raw JSON values of the sections that hold items.
	Items map[string]json.RawMessage `json:"items"`
	// Owned is the memory of ownership of --merge sections (§8.6). A file without it
	// (an earlier release) reads as no memory; an earlier release ignores it.
	Owned rewrite.Ownership `json:"owned,omitempty"`
}

// keeper's fields are guarded by the proxy's PUT lock, except refreshDue and the
// writer's channel.
type keeper struct {
	enabled  bool
	adminKey string
	kept     *keptConfig
	creds    apisix.Credentials // the last accepted caller's; memory only

	// refreshDue asks the watch to read the data plane back (the kept configuration
	// could not be derived from the last write).
	refreshDue atomic.Bool

	dir          string
	maxFileBytes int64
	file         chan *keptConfig // to the writer; nil without --state-dir
	stopped      chan struct{}    // closed when the writer flushed and returned
	started      bool
	log          zerolog.Logger
	debug        *debugLog
}

func newKeeper(cfg Config, log zerolog.Logger, debug *debugLog) *keeper {
	k := &keeper{enabled: cfg.ReseedInterval > 0, adminKey: cfg.AdminKey, log: log, debug: debug,
		// the kept configuration is at most the data plane's state, which confshim reads
		// up to 4 × --max-body-bytes
		maxFileBytes: 4*cfg.MaxBodyBytes + 1<<20}
	if !k.enabled || cfg.StateDir == "" {
		return k
	}
	k.dir, k.file, k.stopped = cfg.StateDir, make(chan *keptConfig, 1), make(chan struct{})
	loaded, err := readStateFile(k.dir, k.maxFileBytes)
	switch {
	case err != nil:
		log.Warn().Str("event", "state_file").Str("error", err.Error()).Msg("the kept configuration in --state-dir cannot be read; ignored")
	case loaded != nil:
		k.kept = loaded
		debug.setKept(loaded)
		log.Info().Str("event", "state_file").Int("sections", len(loaded.Versions)).Msg("loaded the kept configuration from --state-dir")
	}
	return k
}

// credentials are --admin-key, else the last accepted caller's.
func (k *keeper) credentials() (apisix.Credentials, bool) {
	if k.adminKey != "" {
		return apisix.KeyCredentials(k.adminKey), true
	}
	return k.creds, !k.creds.IsZero()
}

// set replaces the kept configuration and hands it to the state-file writer.
func (k *keeper) set(next *keptConfig) {
	k.kept = next
	k.debug.setKept(next)
	if next == nil || k.file == nil {
		return
	}
	select {
	case k.file <- next:
	default: // the writer is busy; replace what it has not taken yet
		select {
		case <-k.file:
		default:
		}
		k.file <- next
	}
}

// forget drops the kept configuration and asks the watch to read it back.
func (k *keeper) forget() {
	k.kept = nil
	k.debug.setKept(nil)
	k.refreshDue.Store(true)
}

// afterPut updates the kept configuration after APISIX accepted a forwarded PUT. dp is
// the state the PUT was decided on. It runs under the PUT lock.
func (k *keeper) afterPut(ans *apisix.Answer, res *rewrite.Result, prepared *rewrite.Prepared, creds apisix.Credentials, dp *dataPlane) {
	if !k.enabled || ans.Status/100 != 2 {
		return
	}
	k.creds = creds
	st := dp.state
	switch {
	case ans.Status == http.StatusNoContent:
		// nothing changed on the data plane: the kept configuration is right if it
		// describes the state the PUT was decided on, else a full read of it is
		if c := k.kept; c != nil && c.Digest == dp.digest && c.LastModified == dp.lastModified {
			return
		}
		switch {
		case st != nil && st.ItemsKnown && dp.lastModified != "":
			k.set(keptFromState(st, dp.digest, dp.lastModified, dp.owned))
		default:
			k.forget() // someone else wrote: the watch reads it back
		}
		return
	case res == nil || prepared == nil:
		k.forget() // an untouched body landed: the watch reads it back
		return
	}
	prev := k.kept
	// A version number is not content identity: the earlier kept copy of a section
	// stands for what the data plane holds only if it describes the very state this
	// PUT was decided on (after a restart, another writer may hold other content at
	// the same version).
	prevIsCurrent := prev != nil && dp.lastModified != "" && prev.Digest == dp.digest && prev.LastModified == dp.lastModified
	next := &keptConfig{Digest: ans.Header.Get("X-Digest"), LastModified: ans.Header.Get("X-Last-Modified"),
		Versions: map[string]float64{}, Items: map[string]json.RawMessage{}, Owned: res.Ownership(dp.owned)}
	for _, o := range res.Outcomes() {
		next.Versions[o.Section] = o.Version
		var items []byte
		switch {
		case o.FromBody:
			body, ok := prepared.JSONItems(o.Section)
			if !ok {
				k.forget() // YAML items: read back as JSON by the watch
				return
			}
			items = bytes.Clone(body) // the body's buffer goes back to the pool
		case prevIsCurrent && prev.Versions[o.Section] == o.Version:
			items = prev.Items[o.Section] // immutable: shared, not copied again
		case st != nil && st.ItemsKnown: // the state read before this PUT
			items = bytes.Clone(st.Items[o.Section])
		default:
			k.forget()
			return
		}
		if len(items) > 0 && !bytes.Equal(bytes.TrimSpace(items), []byte("[]")) {
			next.Items[o.Section] = items
		}
	}
	k.set(next)
}

// keptFromState is the configuration a full state read shows, with the memory of
// ownership confshim has.
func keptFromState(st *rewrite.State, digest, lastModified string, owned rewrite.Ownership) *keptConfig {
	k := &keptConfig{Digest: digest, LastModified: lastModified, Versions: map[string]float64{}, Items: map[string]json.RawMessage{}, Owned: owned}
	for s, v := range st.Versions {
		k.Versions[s] = v
		if items := st.Items[s]; len(items) > 0 {
			k.Items[s] = bytes.Clone(items)
		}
	}
	return k
}

// body is the PUT that restores the configuration: every version, every section's
// items, written as JSON (section names quoted by a JSON encoder, not by Go).
func (k *keptConfig) body() ([]byte, error) {
	sections := make([]string, 0, len(k.Versions))
	size := 64
	for s := range k.Versions {
		sections = append(sections, s)
		size += len(s)*2 + 40 + len(k.Items[s])
	}
	slices.Sort(sections)
	b := make([]byte, 0, size)
	b = append(b, '{')
	for i, s := range sections {
		if i > 0 {
			b = append(b, ',')
		}
		name, err := json.Marshal(s + "_conf_version")
		if err != nil {
			return nil, err
		}
		b = append(b, name...)
		b = append(b, ':')
		b = appendNumber(b, k.Versions[s])
		if items := k.Items[s]; len(items) > 0 {
			name, _ := json.Marshal(s)
			b = append(b, ',')
			b = append(b, name...)
			b = append(b, ':')
			b = append(b, items...)
		}
	}
	return append(b, '}'), nil
}

func appendNumber(b []byte, v float64) []byte {
	n, _ := json.Marshal(v) // finite: checked when the configuration was kept or read
	return append(b, n...)
}

const stateFileName = "confshim-state.json"

// runWriter writes each kept configuration it is handed to the state dir, atomically
// (temporary file, fsync, rename) with mode 0600: it holds secrets such as a vault
// token. When ctx ends it writes the last one it was handed, then returns.
func (k *keeper) runWriter(ctx context.Context) {
	defer close(k.stopped)
	write := func(c *keptConfig) {
		err := writeStateFile(k.dir, c)
		if err != nil {
			k.log.Warn().Str("event", "state_file").Str("error", err.Error()).Msg("cannot write the kept configuration to --state-dir")
		}
		k.debug.noteStateWrite(err)
	}
	for {
		select {
		case c := <-k.file:
			write(c)
		case <-ctx.Done():
			select {
			case c := <-k.file: // the last accepted configuration is on disk before exit
				write(c)
			default:
			}
			return
		}
	}
}

// wait returns when the state-file writer has flushed and stopped (at once without one).
func (k *keeper) wait() {
	if k.started {
		<-k.stopped
	}
}

func writeStateFile(dir string, k *keptConfig) error {
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
func readStateFile(dir string, limit int64) (*keptConfig, error) {
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
	var k keptConfig
	if err := json.Unmarshal(data, &k); err != nil {
		return nil, fmt.Errorf("%s: not a kept configuration: %v", stateFileName, clipError(err))
	}
	if err := k.check(); err != nil {
		return nil, fmt.Errorf("%s: %w", stateFileName, err)
	}
	return &k, nil
}

// check refuses a kept configuration APISIX could not take back as it was.
func (k *keptConfig) check() error {
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
