package proxy

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/internal/dataplane"
	"github.com/confshim/confshim/internal/syncmachine"
	"github.com/confshim/confshim/rewrite"
)

// /debug/config (contract §7) shows an operator why a sync did what it did. It holds
// names, ids, numbers, digests, times and APISIX's messages — never item content, so
// never a secret. Its size grows only with the sections and a ring of recent syncs.
// The PUT path records into it under a lock of its own, by copying small structs, so
// reading it never waits for a PUT in flight.

// maxDebugDigest and maxDebugMessage bound a digest and a message from a client or
// APISIX in the document.
const (
	maxDebugDigest  = 128
	maxDebugMessage = 256
	recentSyncs     = 32
	// maxDebugSections bounds the per-section lines (APISIX knows 13 sections).
	maxDebugSections = 256
)

// maxLoggedSections bounds a decision's log line (§5.7): a body may name thousands.
const maxLoggedSections = 32

// maxCorrelationBytes bounds a client's correlation header as kept (§5.7).
const maxCorrelationBytes = 128

// correlation joins a sync with the client's and APISIX's logs.
type correlation struct {
	SyncID      string `json:"sync_id"`
	Traceparent string `json:"traceparent,omitempty"`
	RequestID   string `json:"request_id,omitempty"`
}

func correlationOf(r *http.Request) correlation {
	var id [8]byte
	_, _ = rand.Read(id[:])
	return correlation{SyncID: hex.EncodeToString(id[:]),
		Traceparent: clipString(r.Header.Get("Traceparent"), maxCorrelationBytes),
		RequestID:   clipString(r.Header.Get("X-Request-Id"), maxCorrelationBytes)}
}

// debugConfig is the document; field names are stable (operators script against them).
type debugConfig struct {
	GeneratedAt  time.Time       `json:"generated_at"`
	DataPlane    debugDataPlane  `json:"data_plane"`
	LastAccepted *debugSync      `json:"last_accepted"`
	LastRejected *debugRejected  `json:"last_rejected"`
	Kept         *debugKept      `json:"kept"`
	RecentSyncs  []DebugSyncLine `json:"recent_syncs"`
	// Merge is the ownership of each --merge section as the last sync that merged it left
	// it (§8.6); absent without --merge.
	Merge []debugMerge `json:"merge,omitempty"`
	// HeldBack are the items held back in the last accepted sync (§8.5); absent without
	// --fallback backfill.
	HeldBack []debugHeld `json:"held_back,omitempty"`
	// OutOfBand are the last out-of-band writes confshim learnt, newest last.
	OutOfBand []debugOutOfBand `json:"out_of_band_writes"`
	// TooBig is the last configuration APISIX could not store (its standalone-config
	// dict is smaller), until a sync lands; absent otherwise.
	TooBig *debugTooBig `json:"config_too_big,omitempty"`
}

// debugTooBig is a configuration APISIX refused for its size: when, how big as sent,
// the setting to raise, and before when the same configuration is not sent again.
type debugTooBig struct {
	At             time.Time `json:"at"`
	Bytes          int       `json:"bytes"`
	Setting        string    `json:"setting"`
	RetryNotBefore time.Time `json:"retry_not_before"`
}

// debugHeld is one item held back: replaced by its accepted copy (backfilled) or left out.
type debugHeld struct {
	Section string    `json:"section"`
	ID      string    `json:"id"`
	Error   string    `json:"error"`
	Since   time.Time `json:"since"`
	Outcome string    `json:"outcome"`
}

// debugMerge is one merged section: how many ids the client owns, how many items were
// kept as the data plane held them, and whether confshim lacked the memory of ownership.
type debugMerge struct {
	Section     string    `json:"section"`
	ClientOwned int       `json:"client_owned"`
	Kept        int       `json:"kept"`
	Unowned     bool      `json:"no_memory_of_ownership,omitempty"`
	At          time.Time `json:"at"`
}

// debugDataPlane is what confshim knows of APISIX.
type debugDataPlane struct {
	URL          string     `json:"url"`
	Server       string     `json:"server,omitempty"`
	Digest       string     `json:"digest,omitempty"`
	LastModified string     `json:"last_modified,omitempty"`
	LastStatus   int        `json:"last_status,omitempty"`
	LastAnswerAt *time.Time `json:"last_answer_at,omitempty"`
	// Trust is --trust-connection and what it means here (§5.4): whether a sync may be
	// decided on the belief without a read, and why.
	Trust debugTrust `json:"trust"`
}

// debugTrust is when a sync may be decided without reading the data plane.
type debugTrust struct {
	Mode    string `json:"mode"`
	Trusted bool   `json:"trusted"`
	Why     string `json:"why"`
	// Intermediary is the first sign of something between confshim and APISIX an
	// answer showed (Via, a Server that is not APISIX's, X-Envoy-*)
	Intermediary string `json:"intermediary,omitempty"`
}

// debugSync is the last sync APISIX accepted through confshim.
type debugSync struct {
	At              time.Time      `json:"at"`
	Status          int            `json:"status"`
	ClientDigest    string         `json:"client_digest,omitempty"`
	ForwardedDigest string         `json:"forwarded_digest,omitempty"`
	DurationMS      float64        `json:"duration_ms"`
	BytesIn         int            `json:"bytes_in"`
	BytesOut        int            `json:"bytes_out"`
	ThinnedBytes    int            `json:"thinned_bytes"`
	Sections        []debugSection `json:"sections"`
}

// debugSection is one section as a sync left it.
type debugSection struct {
	Section string  `json:"section"`
	Version float64 `json:"version"`
	// Items is how many items the data plane holds for it, when confshim knows.
	Items *int `json:"items,omitempty"`
	// Action is the header word (raised, bumped, preserved, settled), empty when the
	// section went as the client sent it.
	Action  string `json:"action,omitempty"`
	Thinned bool   `json:"thinned,omitempty"`
}

// debugRejected is the last sync that did not land.
type debugRejected struct {
	At time.Time `json:"at"`
	// By is "apisix" when APISIX answered it, "confshim" when confshim refused it.
	By       string   `json:"by"`
	Status   int      `json:"status"`
	ErrorMsg string   `json:"error_msg"`
	Sections []string `json:"sections"`
}

// debugKept is the configuration kept for re-seeding (§8.4).
type debugKept struct {
	Digest       string          `json:"digest,omitempty"`
	LastModified string          `json:"last_modified,omitempty"`
	Bytes        int             `json:"bytes"`
	Sections     []debugKeptItem `json:"sections"`
	StateFile    *debugStateFile `json:"state_file,omitempty"`
	LastReseed   *debugReseed    `json:"last_reseed,omitempty"`
}

// debugKeptItem is one kept section.
type debugKeptItem struct {
	Section string  `json:"section"`
	Version float64 `json:"version"`
	Items   int     `json:"items"`
	Bytes   int     `json:"bytes"`
}

// debugStateFile is --state-dir's file.
type debugStateFile struct {
	Path      string     `json:"path"`
	LastWrite *time.Time `json:"last_write,omitempty"`
	LastError string     `json:"last_error,omitempty"`
}

// debugReseed is the last re-seed.
type debugReseed struct {
	At         time.Time `json:"at"`
	Result     string    `json:"result"`
	Status     int       `json:"status,omitempty"`
	DurationMS float64   `json:"duration_ms"`
}

// DebugSyncLine is one entry of the ring of recent syncs.
type DebugSyncLine struct {
	correlation
	At         time.Time `json:"at"`
	Status     int       `json:"status"`
	Actions    []string  `json:"actions,omitempty"`
	DurationMS float64   `json:"duration_ms"`
	BytesIn    int       `json:"bytes_in"`
	BytesOut   int       `json:"bytes_out"`
	// Items are the ids each section it changed added, changed, removed and held back
	// (at most 20 of each, with counts): never values.
	Items []rewrite.ItemChanges `json:"items,omitempty"`
}

// touches reports whether the sync listed id in any section.
func (l *DebugSyncLine) touches(id string) bool {
	for i := range l.Items {
		if l.Items[i].Touches(id) {
			return true
		}
	}
	return false
}

// debugLog is what /debug/config is built from; its own lock, never the PUT lock.
type debugLog struct {
	mu           sync.Mutex
	lastAccepted *debugSync
	lastRejected *debugRejected
	ring         [recentSyncs]DebugSyncLine
	ringLen      int
	ringNext     int
	merges       map[string]debugMerge
	held         []debugHeld
	outOfBand    []debugOutOfBand
	stateFile    debugStateFile
	lastReseed   *debugReseed
	lastStatus   int
}

func clipString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// noteStatus records the status of APISIX's last HTTP answer.
func (d *debugLog) noteStatus(status int) {
	d.mu.Lock()
	d.lastStatus = status
	d.mu.Unlock()
}

// syncRecord is one configs PUT as it ended, for /debug/config.
type syncRecord struct {
	start    time.Time
	status   int
	by       string // "apisix" or "confshim"
	errorMsg []byte
	bytesIn  int
	// clientDigest is the X-Digest the client sent (the forwarded may be a correction's)
	clientDigest string
	prepared     *rewrite.Prepared
	res          *rewrite.Result
	forwarded    string
	bytesOut     int
	corr         correlation
	items        []rewrite.ItemChanges
}

// lines are what /debug/config and the sync's log line show of a PUT that ended at
// now: its line in the ring, and the last accepted or rejected sync it becomes.
func (r syncRecord) lines(now time.Time) (line DebugSyncLine, accepted *debugSync, rejected *debugRejected) {
	line = DebugSyncLine{correlation: r.corr, At: now, Status: r.status, DurationMS: ms(now.Sub(r.start)), BytesOut: r.bytesOut, BytesIn: r.bytesIn, Items: r.items}
	if r.res != nil {
		for i, c := range r.res.Changes {
			if i == maxLoggedSections {
				break
			}
			line.Actions = append(line.Actions, rewrite.Clip(c.Section)+"="+string(c.Action))
		}
	}
	switch {
	case r.status/100 == 2:
		accepted = &debugSync{At: now, Status: r.status, DurationMS: line.DurationMS, BytesIn: line.BytesIn, BytesOut: r.bytesOut,
			ForwardedDigest: clipString(r.forwarded, maxDebugDigest), ClientDigest: clipString(r.clientDigest, maxDebugDigest)}
		if r.res != nil {
			accepted.ThinnedBytes = r.res.ThinnedBytes
			accepted.Sections = debugSections(r.res)
		}
	case r.status != statusClientGone:
		rejected = &debugRejected{At: now, By: r.by, Status: r.status, ErrorMsg: errorMessage(r.errorMsg)}
		if r.prepared != nil {
			rejected.Sections = r.prepared.Sections(maxLoggedSections)
		}
	}
	return line, accepted, rejected
}

// add keeps one configs PUT: its line in the ring, and the last accepted (with its
// merged sections) or rejected sync. It runs once per PUT, copying small values only.
func (d *debugLog) add(r syncRecord, now time.Time) DebugSyncLine {
	line, accepted, rejected := r.lines(now)
	d.mu.Lock()
	defer d.mu.Unlock()
	if accepted != nil {
		d.lastAccepted = accepted
		for _, m := range resMerges(r.res) {
			if d.merges == nil {
				d.merges = map[string]debugMerge{}
			}
			if len(d.merges) < maxDebugSections {
				d.merges[m.Section] = debugMerge{Section: rewrite.Clip(m.Section), ClientOwned: m.ClientOwned, Kept: m.Kept, Unowned: m.Unowned, At: now}
			}
		}
	}
	if rejected != nil {
		d.lastRejected = rejected
	}
	d.ring[d.ringNext] = line
	d.ringNext = (d.ringNext + 1) % recentSyncs
	d.ringLen = min(d.ringLen+1, recentSyncs)
	return line
}

// setHeld records the items held back in the last accepted sync.
func (d *debugLog) setHeld(held []dataplane.Held) {
	list := make([]debugHeld, 0, min(len(held), maxDebugSections))
	for i, h := range held {
		if i == maxDebugSections {
			break
		}
		outcome := "left_out"
		if h.Backfilled {
			outcome = "backfilled"
		}
		list = append(list, debugHeld{Section: rewrite.Clip(h.Section), ID: rewrite.Clip(h.ID), Error: h.Error, Since: h.Since, Outcome: outcome})
	}
	d.mu.Lock()
	d.held = list
	d.mu.Unlock()
}

func resMerges(res *rewrite.Result) []rewrite.MergeReport {
	if res == nil {
		return nil
	}
	return res.Merges
}

func debugSections(res *rewrite.Result) []debugSection {
	words := map[string]string{}
	for _, c := range res.Changes {
		words[c.Section] = string(c.Action)
	}
	out := []debugSection{}
	for _, o := range res.Outcomes() {
		if len(out) == maxDebugSections {
			break
		}
		out = append(out, debugSection{Section: rewrite.Clip(o.Section), Version: o.Version, Action: words[o.Section],
			Thinned: slices.Contains(res.Thinned, o.Section)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Section < out[j].Section })
	return out
}

// errorMessage is APISIX's error_msg (or the whole answer when it is not that JSON),
// cut at 256 bytes.
func errorMessage(body []byte) string {
	if msg := apisix.ErrorMessage(body); msg != "" {
		return clipString(msg, maxDebugMessage)
	}
	return clipString(string(body), maxDebugMessage)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// noteStateWrite and noteReseed keep the re-seeding part of the document.
func (d *debugLog) noteStateWrite(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		d.stateFile.LastError = clipString(err.Error(), maxDebugMessage)
		return
	}
	now := time.Now()
	d.stateFile.LastWrite, d.stateFile.LastError = &now, ""
}

func (d *debugLog) noteReseed(result string, status int, took time.Duration) {
	d.mu.Lock()
	d.lastReseed = &debugReseed{At: time.Now(), Result: result, Status: status, DurationMS: ms(took)}
	d.mu.Unlock()
}

// debugFacts are what /debug/config shows that the debug log does not keep: the
// belief's snapshot and the data plane as the client sees it, gathered by the proxy.
type debugFacts struct {
	url          string              // --upstream, without user information
	belief       *dataplane.Snapshot // immutable, read without the PUT lock
	server       string              // APISIX's Server header
	trust        debugTrust
	lastAnswerAt time.Time // zero: none yet
}

// document builds the /debug/config document.
func (d *debugLog) document(f debugFacts) *debugConfig {
	belief := f.belief
	d.mu.Lock()
	doc := &debugConfig{
		GeneratedAt: time.Now(),
		DataPlane: debugDataPlane{URL: f.url, Digest: clipString(belief.Digest, maxDebugDigest),
			LastModified: clipString(belief.LastModified, maxDebugDigest), LastStatus: d.lastStatus},
		LastAccepted: d.lastAccepted,
		LastRejected: d.lastRejected,
		RecentSyncs:  make([]DebugSyncLine, 0, d.ringLen),
	}
	for i := 0; i < d.ringLen; i++ {
		doc.RecentSyncs = append(doc.RecentSyncs, d.ring[(d.ringNext-d.ringLen+i+recentSyncs)%recentSyncs])
	}
	kept, stateFile, reseed := belief.Kept, d.stateFile, d.lastReseed
	for _, m := range d.merges {
		doc.Merge = append(doc.Merge, m)
	}
	doc.HeldBack = slices.Clone(d.held)
	doc.OutOfBand = append([]debugOutOfBand{}, d.outOfBand...)
	d.mu.Unlock()
	sort.Slice(doc.Merge, func(i, j int) bool { return doc.Merge[i].Section < doc.Merge[j].Section })

	if n := len(belief.Oversized); n > 0 { // the newest
		o := belief.Oversized[n-1]
		doc.TooBig = &debugTooBig{At: o.At, Bytes: o.Bytes, Setting: dictSetting, RetryNotBefore: o.At.Add(syncmachine.OversizedPatience)}
	}
	doc.DataPlane.Server, doc.DataPlane.Trust = f.server, f.trust
	if !f.lastAnswerAt.IsZero() {
		t := f.lastAnswerAt
		doc.DataPlane.LastAnswerAt = &t
	}
	if belief.Keeps {
		doc.Kept = &debugKept{Sections: []debugKeptItem{}, LastReseed: reseed}
		if path := belief.StateFile; path != "" {
			stateFile.Path = path
			doc.Kept.StateFile = &stateFile
		}
		if kept != nil { // immutable: counted outside any lock
			doc.Kept.Digest, doc.Kept.LastModified = clipString(kept.Digest, maxDebugDigest), clipString(kept.LastModified, maxDebugDigest)
			for i, s := range slices.Sorted(maps.Keys(kept.Versions)) {
				if i == maxDebugSections {
					break
				}
				items := kept.Items[s]
				doc.Kept.Sections = append(doc.Kept.Sections, debugKeptItem{Section: rewrite.Clip(s), Version: kept.Versions[s], Items: rewrite.CountItems(items), Bytes: len(items)})
				doc.Kept.Bytes += len(items)
			}
		}
	}
	// the item counts of the last accepted sync are what the kept configuration holds
	if doc.LastAccepted != nil && kept != nil {
		acc := *doc.LastAccepted
		acc.Sections = slices.Clone(acc.Sections)
		for i, s := range acc.Sections {
			if _, ok := kept.Versions[s.Section]; ok && kept.Versions[s.Section] == s.Version {
				n := rewrite.CountItems(kept.Items[s.Section])
				acc.Sections[i].Items = &n
			}
		}
		doc.LastAccepted = &acc
	}
	return doc
}

// debugHandler serves /debug/config; ?id=<id> answers only the recent syncs that
// touched that id (added, changed, removed or held back, in any section).
func debugHandler(document func() *debugConfig) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		doc := document()
		if r.URL.Query().Has("id") {
			id := rewrite.Clip(r.URL.Query().Get("id"))
			_ = enc.Encode(struct {
				ID    string          `json:"id"`
				Syncs []DebugSyncLine `json:"syncs"`
			}{id, doc.SyncsTouching(id)})
			return
		}
		_ = enc.Encode(doc)
	})
}

// SyncsTouching are the recent syncs that listed id, oldest first.
func (d *debugConfig) SyncsTouching(id string) []DebugSyncLine {
	out := []DebugSyncLine{}
	for i := range d.RecentSyncs {
		if d.RecentSyncs[i].touches(id) {
			out = append(out, d.RecentSyncs[i])
		}
	}
	return out
}

// credentialFreeURL is the upstream URL without user information.
func credentialFreeURL(u *url.URL) string {
	c := *u
	c.User = nil
	return c.String()
}

// Out-of-band writes (contract §7): someone wrote to the data plane behind confshim —
// what deadlocked syncs in the first place. confshim believes the versions its own
// last accepted write (or re-seed, or read) left; a later read that shows other
// versions is such a write. It is counted per section, logged once and listed in
// /debug/config, so an operator sees the gateway being edited by hand.

// maxOutOfBand is how many out-of-band writes /debug/config lists.
const maxOutOfBand = 8

// debugOutOfBand is one out-of-band write confshim learnt.
type debugOutOfBand struct {
	At       time.Time          `json:"at"`
	How      string             `json:"how"`
	Sections []debugVersionMove `json:"sections"`
}

// debugVersionMove is one section's version as confshim believed it and as it found it.
type debugVersionMove struct {
	Section string  `json:"section"`
	From    float64 `json:"from"`
	To      float64 `json:"to"`
}

// noteOutOfBand keeps the last few out-of-band writes, newest last.
func (d *debugLog) noteOutOfBand(w debugOutOfBand) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.outOfBand = append(d.outOfBand, w)
	if len(d.outOfBand) > maxOutOfBand {
		d.outOfBand = slices.Delete(d.outOfBand, 0, len(d.outOfBand)-maxOutOfBand)
	}
}
