package proxy

import (
	"bytes"
	"context"
	"net/http"
	"slices"
	"time"

	"github.com/rs/zerolog"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/metrics"
	"github.com/confshim/confshim/rewrite"
)

// checkDataPlane is the watch's look at the configuration (a configs HEAD, which costs
// APISIX a decode of its stored document): an empty data plane is re-seeded, one that
// changed without confshim is read back. looked says whether the data plane answered,
// cost how long the HEAD took; ok is false when re-seeding cannot work here (3.13).
func (p *Proxy) checkDataPlane(ctx context.Context) (looked bool, cost time.Duration, ok bool) {
	if p.api.NoHead() {
		p.log.Info().Str("event", "reseed_off").Msg("the data plane has no HEAD /apisix/admin/configs (APISIX 3.13): re-seeding is off")
		return false, 0, false
	}
	creds, have := p.watchCredentials()
	if !have {
		return false, 0, true // nobody's key yet: nothing kept either
	}
	start := time.Now()
	head, status, err := p.api.Head(ctx, apisix.Shared, creds)
	cost = time.Since(start)
	switch {
	case status == http.StatusNotFound:
		return false, 0, true // APISIX 3.13: said at the next tick
	case err != nil || head == nil:
		return false, 0, true // down, restarting or refusing the key: the next tick looks again
	case head.LastModified == "":
		p.dp.Lock(context.Background())
		defer p.dp.Unlock()
		p.reseedLocked(ctx, time.Now(), nil)
	default:
		p.refreshKept(ctx, head.Digest, head.LastModified)
	}
	return true, cost, true
}

// watchCredentials are re-seeding's, read without waiting for a PUT in flight.
func (p *Proxy) watchCredentials() (apisix.Credentials, bool) {
	if p.cfg.AdminKey != "" {
		return apisix.KeyCredentials(p.cfg.AdminKey), true
	}
	if !p.dp.TryLock() {
		return apisix.Credentials{}, false // a PUT is in flight: look next time
	}
	defer p.dp.Unlock()
	return p.credentials()
}

// credentials are --admin-key, else the last accepted caller's; under the PUT lock.
func (p *Proxy) credentials() (apisix.Credentials, bool) {
	if p.cfg.AdminKey != "" {
		return apisix.KeyCredentials(p.cfg.AdminKey), true
	}
	return p.watchCreds, !p.watchCreds.IsZero()
}

// refreshKept reads the data plane when it changed since the kept configuration (an
// out-of-band write) or when the kept one could not be derived.
func (p *Proxy) refreshKept(ctx context.Context, digest, lastModified string) {
	p.dp.Lock(context.Background())
	defer p.dp.Unlock()
	if p.dp.KeptIsCurrent(digest, lastModified) {
		return
	}
	creds, _ := p.credentials()
	st, d, lm, err := p.readState(ctx, creds)
	if err != nil || lm == "" {
		return
	}
	dials, counted := p.api.DialCount()
	p.noteMoves(p.dp.Refreshed(st, d, lm, p.api.NoHead(), dials, counted), learntByWatch)
	p.log.Debug().Str("event", "kept_refreshed").Msg("read the data plane's configuration back after a write confshim did not make")
}

// reseedLocked PUTs the kept configuration back into an empty data plane; the caller
// holds the PUT lock. A HEAD on the decide connection first checks that the data
// plane still holds nothing, and the PUT goes on that connection: a data plane that
// holds anything is never overwritten. creds are the caller's for a re-seed before a
// client's sync, nil for the watch's own. It reports whether the data plane now holds
// the kept configuration.
func (p *Proxy) reseedLocked(ctx context.Context, foundEmpty time.Time, caller *apisix.Credentials) bool {
	k := p.dp.Kept()
	if k == nil {
		return false
	}
	creds, _ := p.credentials()
	if caller != nil {
		creds = *caller
	}
	if head, _, err := p.api.Head(ctx, apisix.Decide, creds); err != nil || head == nil || head.LastModified != "" {
		p.m.Reseed(metrics.ReseedSkipped)
		return false // someone wrote meanwhile (or it went away again)
	}
	body, err := k.Body()
	if err != nil {
		p.m.Reseed(metrics.ReseedFailed)
		return false
	}
	digest := k.Digest
	if digest == "" {
		digest = "confshim-reseed"
	}
	ans, err := p.api.PutConfig(ctx, creds, body, digest) // on the decide connection, as it is
	if err != nil || ans.Status != http.StatusAccepted {
		p.dp.Doubt() // whatever it holds now is read again
	}
	if err != nil {
		p.m.Reseed(metrics.ReseedFailed)
		p.noteReseed(string(metrics.ReseedFailed), 0, time.Since(foundEmpty))
		p.log.Warn().Str("event", "reseed").Str("result", "failed").Str("error", apisix.SafeError(err)).Msg("re-seeding the data plane failed; retrying at the next check")
		p.dp.AskRefresh() // look again at the next tick
		return false
	}
	took := time.Since(foundEmpty)
	if ans.Status != http.StatusAccepted {
		p.m.Reseed(metrics.ReseedFailed)
		p.noteReseed(string(metrics.ReseedFailed), ans.Status, took)
		p.log.Warn().Str("event", "reseed").Str("result", "failed").Int("status", ans.Status).Str("answer", clipAnswer(ans.Body)).Msg("the data plane refused the kept configuration")
		return false
	}
	p.m.Reseed(metrics.ReseedRestored)
	p.m.ReseedDuration.Observe(took.Seconds())
	p.noteReseed(string(metrics.ReseedRestored), ans.Status, took)
	versions := zerolog.Dict()
	for i, s := range sortedKeys(k.Versions) {
		if i == maxLoggedSections {
			break
		}
		versions = versions.Float64(rewrite.Clip(s), k.Versions[s])
	}
	p.log.Info().Str("event", "reseed").Str("result", "restored").Dict("versions", versions).
		Dur("after", took).Msg("the data plane had lost its configuration; restored the kept one")
	dials, counted := p.api.DialCount()
	// the record still holds: the data plane has the same versions and content again
	p.dp.Reseeded(k, ans.Header.Get("X-Digest"), ans.Header.Get("X-Last-Modified"), dials, counted)
	return true
}

// clipAnswer bounds an APISIX answer quoted in a log line.
func clipAnswer(msg []byte) string {
	msg = bytes.TrimSpace(msg)
	if len(msg) > 256 {
		return string(msg[:256]) + "…"
	}
	return string(msg)
}

func sortedKeys(m map[string]float64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// StartBackground starts the data-plane watch and the state-file writer; they stop
// when ctx ends. Wait returns once they have (the writer after flushing).
func (p *Proxy) StartBackground(ctx context.Context) {
	if p.cfg.ReseedInterval <= 0 {
		return
	}
	p.dp.StartWriter(ctx)
	p.bg.Add(1)
	go func() {
		defer p.bg.Done()
		p.watchDataPlane(ctx)
	}()
}

// Wait returns when the background work started by StartBackground has stopped, the
// last accepted configuration written to --state-dir.
func (p *Proxy) Wait() {
	p.bg.Wait()
	p.dp.Wait()
}
