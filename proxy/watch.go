package proxy

import (
	"context"
	"time"

	"github.com/confshim/confshim/internal/apisix"
)

// What confshim believes about the data plane must be true and cheap to keep (issue
// 18). On APISIX every GET, HEAD or PUT of /apisix/admin/configs decodes the whole
// stored document (≈ 0.3 s of a worker at 40,000 routes), while HEAD /apisix/admin and
// an empty POST /configs/validate cost well under a millisecond. So:
//
//   - The watch pings HEAD /apisix/admin every --reseed-interval on the decide
//     connection, which stays open between syncs. A container restart closes it; the configs
//     HEAD that tells an empty data plane is asked on such evidence (the ping had to
//     open a new connection, failed, or saw another Server version), when confshim
//     could not derive the kept configuration, and otherwise as often as a cost budget
//     allows (lookInterval): between --reseed-interval and once a minute.
//   - Under the PUT lock, the state read and the PUT travel on that connection, and the
//     PUT may not open a new one: a data plane that restarted since the state was last
//     confirmed (read, or written by confshim's own accepted PUT) closed it, so the PUT
//     is never sent to it, and the decision is taken again on a fresh read.
//   - So no read is needed per sync (issue 27): while the connection that confirmed the
//     state is the one open, a sync is decided on confshim's belief, and APISIX's own
//     version check proves it still holds — an out-of-band write that changed a section
//     raised its version, and a PUT decided on the old one is answered 400 "… must be
//     greater than or equal to …", then decided again on a fresh read (§5.4). A version
//     check cannot see a writer that set a section to exactly the version a bump would
//     choose (to APISIX an equal version means "keep what you hold"), so a decision that
//     bumps is checked first (HEAD, as before). Trust ends with any sign of doubt: a
//     re-opened connection, a ping that failed or met another Server, a PUT whose answer
//     was not a 2xx.

// safetyCheckInterval bounds how long an unnoticed change can go unseen by the watch:
// at least one configs HEAD a minute, however large the configuration.
const safetyCheckInterval = time.Minute

// ping is HEAD /apisix/admin on the decide connection (the caller holds the PUT lock):
// no key, no decode of the configuration on APISIX. It keeps that connection open
// between syncs and returns the Server header.
func (p *Proxy) ping(ctx context.Context) (string, error) {
	return p.api.Ping(ctx, p.cfg.AdminKey)
}

// watchDataPlane pings the data plane every --reseed-interval and looks at its
// configuration (a configs HEAD) only when something suggests it changed. It returns
// when ctx ends.
func (p *Proxy) watchDataPlane(ctx context.Context) {
	t := time.NewTicker(p.cfg.ReseedInterval)
	defer t.Stop()
	suspect := true // nothing is known at start
	var lastServer string
	var lastCheck time.Time
	var lookCost time.Duration // what the last look cost (its latency)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !p.dp.TryLock() {
			continue // a PUT is in flight on the decide connection: it tells what a ping would
		}
		dials, _ := p.api.DialCount()
		server, err := p.ping(ctx)
		redialed := false
		if n, ok := p.api.DialCount(); ok && n != dials {
			redialed = true
		}
		if err != nil || redialed || server != lastServer {
			p.dp.Distrust() // down, a new connection, or another APISIX answering
		}
		p.dp.Unlock()
		if err != nil {
			suspect = true // unreachable or reset: it may come back empty
			p.log.Debug().Str("event", "watch").Str("error", apisix.SafeError(err)).Msg("the data plane did not answer the ping")
			continue
		}
		if redialed || server != lastServer {
			suspect = true // a new connection, or another APISIX answering
		}
		lastServer = server
		if !suspect && !p.dp.RefreshDue() && time.Since(lastCheck) < p.lookInterval(lookCost) {
			continue
		}
		p.log.Debug().Str("event", "watch").Bool("suspect", suspect).Msg("looking at the data plane's configuration")
		looked, cost, ok := p.checkDataPlane(ctx)
		if !ok {
			return
		}
		if looked {
			suspect, lastCheck, lookCost = false, time.Now(), cost
		}
	}
}

// lookBudget is the share of an APISIX worker the watch's looks may take: a look (a
// configs HEAD) makes APISIX decode its whole stored document, ≈ 25 ms per MB, on the
// worker that also proxies traffic.
const lookBudget = 0.005

// lookInterval is how long the watch waits between looks with nothing suspicious seen:
// as often as the budget allows for what the last look cost (its latency stands for the
// decode), never more often than --reseed-interval, at least once per safety interval
// (a minute). A few hundred routes are looked at every second or two; 40,000 (≈ 0.3 s a
// decode) once a minute.
func (p *Proxy) lookInterval(cost time.Duration) time.Duration {
	d := time.Duration(float64(cost) / lookBudget)
	return min(max(d, p.cfg.ReseedInterval), p.cfg.WatchSafetyInterval)
}
