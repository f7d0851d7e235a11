package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/rs/zerolog"

	"github.com/confshim/confshim/rewrite"
)

// Re-seeding (contract §8.4): APISIX in API-driven standalone mode keeps its
// configuration in memory only, so a restarted APISIX comes back empty. confshim keeps
// the data plane's whole configuration as of the last write it saw accepted, watches
// the data plane with HEAD, and PUTs the configuration back when it finds it empty.
//
// The kept configuration is derived from the writes confshim forwards (a section APISIX
// took from the body has the body's items, one it kept has what it held before), so a
// sync costs no extra GET. Where it cannot be derived (the first write after a start
// with no state read, a YAML body, an out-of-band write seen by the watcher), the
// watcher reads the data plane once with GET.

// keptConfig is the data plane's configuration; immutable once built.
type keptConfig struct {
	Digest       string             `json:"digest"`
	LastModified string             `json:"last_modified"`
	Versions     map[string]float64 `json:"versions"`
	// Items are the raw JSON values of the sections that hold items.
	Items map[string]json.RawMessage `json:"items"`
}

// body is the PUT that restores the configuration: every version, every section's items.
func (k *keptConfig) body() []byte {
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
		b = strconv.AppendQuote(b, s+"_conf_version")
		b = append(b, ':')
		b = strconv.AppendFloat(b, k.Versions[s], 'f', -1, 64)
		if items := k.Items[s]; len(items) > 0 {
			b = append(b, ',')
			b = strconv.AppendQuote(b, s)
			b = append(b, ':')
			b = append(b, items...)
		}
	}
	return append(b, '}')
}

// keptFromState is the configuration a full state read shows.
func keptFromState(st *rewrite.State, digest, lastModified string) *keptConfig {
	k := &keptConfig{Digest: digest, LastModified: lastModified, Versions: map[string]float64{}, Items: map[string]json.RawMessage{}}
	for s, v := range st.Versions {
		k.Versions[s] = v
		if items := st.Items[s]; len(items) > 0 {
			k.Items[s] = bytes.Clone(items)
		}
	}
	return k
}

// keepAfterPut updates the kept configuration after APISIX answered a forwarded PUT.
// It runs under the PUT lock.
func (p *Proxy) keepAfterPut(resp *http.Response, res *rewrite.Result, prepared *rewrite.Prepared, creds credentials) {
	if p.cfg.ReseedInterval <= 0 || resp.StatusCode/100 != 2 {
		return
	}
	p.reseedCreds = creds // the last caller the data plane accepted; memory only
	st := p.dp.state
	switch {
	case resp.StatusCode == http.StatusNoContent:
		// nothing changed on the data plane; a full read during this PUT is all of it
		if p.kept == nil && st != nil && st.ItemsKnown {
			p.setKept(keptFromState(st, p.dp.digest, p.dp.lastModified))
		}
		return
	case res == nil || prepared == nil:
		p.setKept(nil) // an untouched body landed: the watcher reads it back
		return
	}
	prev := p.kept
	next := &keptConfig{Digest: resp.Header.Get("X-Digest"), LastModified: resp.Header.Get("X-Last-Modified"),
		Versions: map[string]float64{}, Items: map[string]json.RawMessage{}}
	for _, o := range res.Outcomes() {
		next.Versions[o.Section] = o.Version
		var items []byte
		switch {
		case o.FromBody:
			body, ok := prepared.JSONItems(o.Section)
			if !ok {
				p.setKept(nil) // YAML items: read back as JSON by the watcher
				return
			}
			items = bytes.Clone(body) // the body's buffer goes back to the pool
		case prev != nil && prev.Versions[o.Section] == o.Version:
			items = prev.Items[o.Section] // immutable: shared, not copied again
		case st != nil && st.ItemsKnown: // the state read (or revalidated) before this PUT
			items = bytes.Clone(st.Items[o.Section])
		default:
			p.setKept(nil)
			return
		}
		if len(items) > 0 && !bytes.Equal(bytes.TrimSpace(items), []byte("[]")) {
			next.Items[o.Section] = items
		}
	}
	p.setKept(next)
}

// setKept replaces the kept configuration and hands it to the state-file writer.
func (p *Proxy) setKept(k *keptConfig) {
	p.kept = k
	if k != nil && p.stateFile != nil {
		select {
		case p.stateFile <- k:
		default: // the writer is busy; replace what it has not taken yet
			select {
			case <-p.stateFile:
			default:
			}
			p.stateFile <- k
		}
	}
}

// watchDataPlane checks the data plane every --reseed-interval and re-seeds it when it
// holds nothing. It returns when ctx ends.
func (p *Proxy) watchDataPlane(ctx context.Context) {
	if p.cfg.ReseedInterval <= 0 {
		return
	}
	t := time.NewTicker(p.cfg.ReseedInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !p.checkDataPlane(ctx) {
			return
		}
	}
}

// checkDataPlane is one watch: it returns false when re-seeding cannot work here.
func (p *Proxy) checkDataPlane(ctx context.Context) bool {
	if p.noHead.Load() {
		p.log.Info().Str("event", "reseed_off").Msg("the data plane has no HEAD /apisix/admin/configs (APISIX 3.13): re-seeding is off")
		return false
	}
	creds, ok := p.watchCredentials()
	if !ok {
		return true // nobody's key yet: nothing kept either
	}
	head, status, err := p.head(ctx, creds)
	switch {
	case status == http.StatusNotFound:
		p.noHead.Store(true) // said once, at the next tick
	case err != nil || head == nil:
		// down, restarting or refusing the key: the next tick looks again
	case head.lastModified == "":
		p.reseed(ctx, time.Now())
	default:
		p.refreshKept(ctx, head.digest, head.lastModified)
	}
	return true
}

// watchCredentials are --admin-key, else the last accepted caller's.
func (p *Proxy) watchCredentials() (credentials, bool) {
	if p.cfg.AdminKey != "" {
		return keyCredentials(p.cfg.AdminKey), true
	}
	select {
	case p.putLock <- struct{}{}:
		defer func() { <-p.putLock }()
	default:
		return credentials{}, false // a PUT is in flight: look next time
	}
	return p.lockedWatchCredentials()
}

// refreshKept reads the data plane when it changed since the kept configuration (an
// out-of-band write) or when the kept one could not be derived.
func (p *Proxy) refreshKept(ctx context.Context, digest, lastModified string) {
	p.putLock <- struct{}{}
	defer func() { <-p.putLock }()
	if k := p.kept; k != nil && k.Digest == digest && k.LastModified == lastModified {
		return
	}
	creds, _ := p.lockedWatchCredentials()
	st, d, lm, err := p.readState(ctx, creds)
	if err != nil || lm == "" {
		return
	}
	p.setKept(keptFromState(st, d, lm))
	p.log.Debug().Str("event", "kept_refreshed").Msg("read the data plane's configuration back after a write confshim did not make")
}

func (p *Proxy) lockedWatchCredentials() (credentials, bool) {
	if p.cfg.AdminKey != "" {
		return keyCredentials(p.cfg.AdminKey), true
	}
	return p.reseedCreds, p.reseedCreds.header != nil
}

// reseed PUTs the kept configuration back into an empty data plane, under the PUT lock
// and only after a HEAD under the lock still finds it empty.
func (p *Proxy) reseed(ctx context.Context, foundEmpty time.Time) {
	p.putLock <- struct{}{}
	defer func() { <-p.putLock }()
	k := p.kept
	if k == nil {
		return
	}
	creds, _ := p.lockedWatchCredentials()
	if head, _, err := p.head(ctx, creds); err != nil || head == nil || head.lastModified != "" {
		p.m.Reseeds.WithLabelValues("skipped").Inc()
		return // someone wrote meanwhile: never overwrite a data plane that holds anything
	}
	digest := k.Digest
	if digest == "" {
		digest = "confshim-reseed"
	}
	body := k.body()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, p.upstreamURL(ConfigsPath, creds.rawQuery), bytes.NewReader(body))
	if err != nil {
		return
	}
	creds.apply(req)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Digest", digest)
	ctx2, cancel := context.WithTimeout(ctx, p.cfg.UpstreamTimeout)
	defer cancel()
	resp, err := p.transport.RoundTrip(req.WithContext(ctx2))
	p.writes.Add(1)
	if err != nil {
		p.m.Reseeds.WithLabelValues("failed").Inc()
		p.log.Warn().Str("event", "reseed").Str("result", "failed").Str("error", safeError(err)).Msg("re-seeding the data plane failed; retrying at the next check")
		return
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	resp.Body.Close()
	p.sawUpstream()
	if resp.StatusCode != http.StatusAccepted {
		p.m.Reseeds.WithLabelValues("failed").Inc()
		p.log.Warn().Str("event", "reseed").Str("result", "failed").Int("status", resp.StatusCode).Str("answer", string(bytes.TrimSpace(msg))).Msg("the data plane refused the kept configuration")
		return
	}
	p.m.Reseeds.WithLabelValues("restored").Inc()
	p.m.ReseedDuration.Observe(time.Since(foundEmpty).Seconds())
	versions := zerolog.Dict()
	for _, s := range sortedKeys(k.Versions) {
		versions = versions.Float64(rewrite.Clip(s), k.Versions[s])
	}
	p.log.Info().Str("event", "reseed").Str("result", "restored").Dict("versions", versions).
		Dur("after", time.Since(foundEmpty)).Msg("the data plane had lost its configuration; restored the kept one")
	lm := resp.Header.Get("X-Last-Modified")
	p.setKept(&keptConfig{Digest: resp.Header.Get("X-Digest"), LastModified: lm, Versions: k.Versions, Items: k.Items})
	// the record still holds: the data plane has the same versions and content again
	p.dp.state = nil
	if d := resp.Header.Get("X-Digest"); d != "" && lm != "" {
		st := &rewrite.State{Versions: k.Versions}
		p.setState(st, d, lm)
	}
}

func sortedKeys(m map[string]float64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

const stateFileName = "confshim-state.json"

// writeStateFiles writes each kept configuration it is handed to dir, atomically
// (temporary file, fsync, rename) with mode 0600: it holds secrets such as a vault
// token. It returns when ctx ends.
func (p *Proxy) writeStateFiles(ctx context.Context, dir string) {
	for {
		select {
		case <-ctx.Done():
			return
		case k := <-p.stateFile:
			if err := writeStateFile(dir, k); err != nil {
				p.log.Warn().Str("event", "state_file").Str("error", err.Error()).Msg("cannot write the kept configuration to --state-dir")
			}
		}
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

// readStateFile loads a kept configuration; a missing file is no error.
func readStateFile(dir string) (*keptConfig, error) {
	data, err := os.ReadFile(filepath.Join(dir, stateFileName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var k keptConfig
	if err := json.Unmarshal(data, &k); err != nil {
		return nil, fmt.Errorf("%s: %w", stateFileName, err)
	}
	if len(k.Versions) == 0 {
		return nil, fmt.Errorf("%s: no versions", stateFileName)
	}
	for s, items := range k.Items {
		if !json.Valid(items) {
			return nil, fmt.Errorf("%s: the items of %s are not JSON", stateFileName, rewrite.Clip(s))
		}
	}
	return &k, nil
}

// StartBackground starts the data-plane watch and the state-file writer; they stop
// when ctx ends.
func (p *Proxy) StartBackground(ctx context.Context) {
	if p.cfg.ReseedInterval <= 0 {
		return
	}
	if p.cfg.StateDir != "" {
		go p.writeStateFiles(ctx, p.cfg.StateDir)
	}
	go p.watchDataPlane(ctx)
}
