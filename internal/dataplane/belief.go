// Package dataplane is what confshim believes about the APISIX behind it, in one place:
// the state it last read or wrote (versions, items when known, digest and
// X-Last-Modified), whether that belief is still proven, the record of its own last
// accepted write (§5.1's "unchanged"), the memory of merge ownership (§8.6), the
// versions an out-of-band write would be measured against (§7), the configuration
// kept for re-seeding (§8.4) with its state file, and the fallback's memory: the items
// held back in the last accepted sync and the correction made before its PUT (§8.5).
// It owns the PUT lock: every transition runs under it, one call per answer from the
// data plane. It does no network I/O; a lock-free snapshot feeds /debug/config.
package dataplane

import (
	"context"
	"maps"
	"slices"
	"sync/atomic"

	"github.com/confshim/confshim/rewrite"
)

// Options configure a Belief.
type Options struct {
	// Keep turns the kept configuration on (re-seeding, --reseed-interval > 0).
	Keep bool
	// StateDir, when set, also keeps it on disk; MaxFileBytes bounds the file read.
	StateDir     string
	MaxFileBytes int64
	// OnStateWrite is told of each write of the state file (nil: an error, if any).
	OnStateWrite func(error)
}

// Belief is confshim's belief about the data plane. What it holds is read and changed
// only through the Tx its lock returns; Snapshot, SawState, RefreshDue and the state
// file's writer need no lock.
type Belief struct {
	lock chan struct{}

	state              *rewrite.State
	digest, lastModify string
	record             *rewrite.Record
	owned              rewrite.Ownership
	unownedSaid        map[string]bool
	// believed are the versions the data plane holds as confshim last knew them: a read
	// that shows others is an out-of-band write
	believed map[string]float64
	// trustedConn is the decide connection the state was confirmed on (read, or
	// written by an accepted PUT), with no doubt since; 0: not trusted
	trustedConn uint64

	held       map[string]Held     // §8.5: the items held back in the last accepted sync
	correction *rewrite.Correction // and the correction made before that PUT
	oversized  []Oversized         // configurations APISIX could not store since a PUT last landed, newest last

	keep       bool
	kept       *Kept
	refreshDue atomic.Bool // the watch should read the data plane back
	writer     *stateWriter
	statePath  string // the state file's ("" without a state dir)

	snap atomic.Pointer[Snapshot]
	// the metadata of the last state known, for the snapshot (a forgotten state keeps
	// showing what the data plane last was)
	shownDigest, shownLastModified string
}

// Snapshot is the belief as /debug/config shows it; immutable.
type Snapshot struct {
	Digest, LastModified string
	Kept                 *Kept
	Keeps                bool        // re-seeding is on, so a configuration is kept
	StateFile            string      // the state file's path ("" without a state dir)
	Oversized            []Oversized // configurations APISIX could not store since a PUT last landed, newest last
}

// Move is a section's version as confshim believed it and as a read found it.
type Move struct {
	Section  string
	From, To float64
}

// New returns the belief; with a state dir it loads the kept configuration from it
// (loadErr: the file could not be used and was ignored).
func New(o Options) (b *Belief, loadErr error) {
	b = &Belief{lock: make(chan struct{}, 1), keep: o.Keep}
	if o.Keep && o.StateDir != "" {
		b.writer = newStateWriter(o.StateDir, o.OnStateWrite)
		b.statePath = b.writer.path()
		loaded, err := readStateFile(o.StateDir, o.MaxFileBytes)
		switch {
		case err != nil:
			loadErr = err
		case loaded != nil:
			b.kept = loaded
			b.owned = loaded.Owned       // the memory of ownership survives the restart,
			b.believed = loaded.Versions // and what the data plane held then
		}
	}
	b.publish()
	return b, loadErr
}

// Tx is the PUT lock held: the only way to read or change what the belief holds.
// Taking the lock returns one; every transition is a method of it, each publishes one
// snapshot for /debug/config, and Unlock ends it. A sync records APISIX's answer with
// one call, Answered.
type Tx struct{ b *Belief }

// Lock takes the PUT lock; false when ctx ended first (a client that went away).
func (b *Belief) Lock(ctx context.Context) (*Tx, bool) {
	select {
	case b.lock <- struct{}{}:
		return &Tx{b: b}, true
	case <-ctx.Done():
		return nil, false
	}
}

// TryLock takes the PUT lock if it is free.
func (b *Belief) TryLock() (*Tx, bool) {
	select {
	case b.lock <- struct{}{}:
		return &Tx{b: b}, true
	default:
		return nil, false
	}
}

// Unlock gives the PUT lock back; the Tx is done: any later use of it, a second Unlock
// included, panics instead of reading or changing a belief another holder may be
// changing.
func (t *Tx) Unlock() {
	b := t.b
	t.b = nil
	<-b.lock
}

func (b *Belief) publish() {
	if b.state != nil {
		b.shownDigest, b.shownLastModified = b.digest, b.lastModify
	}
	b.snap.Store(&Snapshot{Digest: b.shownDigest, LastModified: b.shownLastModified, Kept: b.kept, Keeps: b.keep, StateFile: b.statePath, Oversized: b.oversized})
}

// Snapshot is the belief as last published, read without the lock.
func (b *Belief) Snapshot() *Snapshot { return b.snap.Load() }

// View is what the belief holds, as a transaction reads it: a value, taken under the
// PUT lock, that no transition changes (take a new one after a transition).
type View struct {
	State                *rewrite.State // the data plane's state as confshim has it (nil: read it)
	Digest, LastModified string         // the state's metadata
	Record               *rewrite.Record
	Owned                rewrite.Ownership
	Kept                 *Kept               // the kept configuration (nil: none)
	Held                 map[string]Held     // the items held back in the last accepted sync (do not change)
	Correction           *rewrite.Correction // the correction made before that PUT (nil: none)
	Oversized            []Oversized         // configurations APISIX could not store since a PUT last landed, newest last
	trustedConn          uint64
}

// View is what the belief holds now.
func (t *Tx) View() View {
	b := t.b
	return View{State: b.state, Digest: b.digest, LastModified: b.lastModify, Record: b.record, Owned: b.owned,
		Kept: b.kept, Held: b.held, Correction: b.correction, Oversized: b.oversized, trustedConn: b.trustedConn}
}

// KeptState is the state believed with its items taken from the kept configuration,
// when that describes exactly this state (nil otherwise): a decision that needs the
// data plane's items then needs no read.
func (v View) KeptState() *rewrite.State {
	k := v.Kept
	if k == nil || v.State == nil || v.Digest == "" || k.Digest != v.Digest || k.LastModified != v.LastModified {
		return nil
	}
	items := make(map[string][]byte, len(k.Items))
	for s, raw := range k.Items {
		items[s] = raw
	}
	return &rewrite.State{Versions: k.Versions, Items: items, ItemsKnown: true}
}

// Empty: the last look found nothing stored since the data plane started (no
// X-Last-Modified; APISIX 3.13, which never sends one, excluded).
func (v View) Empty(noHead bool) bool {
	return !noHead && v.State != nil && v.LastModified == ""
}

// Matches: the data plane answered with the metadata of the state confshim has.
func (v View) Matches(digest, lastModified string) bool {
	return v.State != nil && digest == v.Digest && lastModified == v.LastModified
}

// Trusts: the state was confirmed on conn, the decide connection still open (as
// apisix.Client.DecideConn names it; 0 is never trusted), with no doubt since, so a
// sync may be decided on it unread — APISIX's version check proves it.
func (v View) Trusts(conn uint64) bool {
	return conn != 0 && conn == v.trustedConn && v.State != nil && v.LastModified != ""
}

// HeldItem is section's item id as it was held back in the last accepted sync.
func (v View) HeldItem(section, id string) (Held, bool) {
	h, ok := v.Held[rewrite.HeldKey(section, id)]
	return h, ok
}

// Confirm: the state was just confirmed on conn.
func (t *Tx) Confirm(conn uint64) { b := t.b; b.trustedConn = conn }

// Distrust: the watch saw a sign of doubt (a failed ping, a re-opened connection,
// another Server): the next sync reads first. (An answer that is not an accepted PUT
// ends the trust in Answered.)
func (t *Tx) Distrust() { b := t.b; b.trustedConn = 0 }

// setState changes the state; like every unexported mutator it publishes nothing: each
// exported transition publishes one snapshot when it is done, so /debug/config never
// shows half of one (a kept configuration from one PUT beside the digest of another).
func (b *Belief) setState(st *rewrite.State, digest, lastModified string) {
	b.state, b.digest, b.lastModify, b.trustedConn = st, digest, lastModified, 0
}

// Doubt drops the cached state: something wrote in between (a version conflict). The
// versions believed stay, to tell what the writer changed.
func (t *Tx) Doubt() {
	b := t.b
	defer b.publish()
	b.setState(nil, "", "")
}

// Forget drops the cached state and the versions believed: an outcome confshim does
// not know (a PUT without an answer, a body forwarded untouched), whose effect the next
// read shows without blaming anyone.
func (t *Tx) Forget() {
	b := t.b
	defer b.publish()
	b.setState(nil, "", "")
	b.believed = nil
}

// Read records a state read on the decide connection: the state, confirmed, and the
// out-of-band writes it shows against what confshim believed. A data plane that holds
// nothing (restarted; noHead: APISIX 3.13 tells no metadata) is no writer's doing.
func (t *Tx) Read(st *rewrite.State, digest, lastModified string, noHead bool, conn uint64) []Move {
	b := t.b
	defer b.publish()
	moved := b.read(st, digest, lastModified, noHead, conn)
	if b.keep && st.ItemsKnown && lastModified != "" && !b.keptDescribes(digest, lastModified) {
		// a read shows the data plane as it is: a re-seed must never put back less
		// than confshim has seen (§8.4), whatever the sync that read it does next
		b.setKept(keptFromState(st, digest, lastModified, b.owned))
	}
	return moved
}

// TieLost: a read after an accepted PUT (Read first) shows sections the PUT sent at the
// data plane's version plus one holding a writer's copy at that very version — APISIX
// took the equal version as "keep what you hold". The record no longer vouches for the
// client's copy there, and the kept configuration is what was read. st nil: it could
// not be read, so what the data plane holds is not known — the kept configuration (the
// PUT's, whose digest the data plane shows either way) is forgotten and the watch reads
// it back, so that a re-seed never restores the client's copy over a writer's.
func (t *Tx) TieLost(sections []string, st *rewrite.State, digest, lastModified string) {
	b := t.b
	defer b.publish()
	b.record = b.record.Without(sections)
	switch {
	case st == nil:
		b.forgetKept()
	case b.keep && st.ItemsKnown && lastModified != "":
		b.setKept(keptFromState(st, digest, lastModified, b.owned))
	}
}

// keptDescribes: the kept configuration is the data plane's state of that metadata.
func (b *Belief) keptDescribes(digest, lastModified string) bool {
	return b.kept != nil && b.kept.Digest == digest && b.kept.LastModified == lastModified
}

// SawState is told the metadata of a configuration answer that passed through confshim
// (a client's GET or HEAD of /apisix/admin/configs), without the lock: one that is not
// the kept configuration's shows a write confshim has not kept, and the watch reads it
// back at its next tick rather than at its next scheduled look.
func (b *Belief) SawState(digest, lastModified string) {
	if !b.keep || lastModified == "" {
		return
	}
	if snap := b.snap.Load(); snap != nil && snap.Kept != nil && snap.Kept.Digest == digest && snap.Kept.LastModified == lastModified {
		return
	}
	b.refreshDue.Store(true)
}

func (b *Belief) read(st *rewrite.State, digest, lastModified string, noHead bool, conn uint64) []Move {
	b.setState(st, digest, lastModified)
	b.trustedConn = conn
	believed := b.believed
	if lastModified == "" && !noHead {
		b.believed = nil
		return nil
	}
	b.believed = st.Versions
	if believed == nil {
		return nil
	}
	var moved []Move
	for _, s := range slices.Sorted(maps.Keys(believed)) {
		if to := st.Versions[s]; to != believed[s] {
			moved = append(moved, Move{Section: s, From: believed[s], To: to})
		}
	}
	return moved
}

// Outcome is APISIX's answer to a PUT confshim forwarded, and what it was decided as.
type Outcome struct {
	Status               int
	Digest, LastModified string            // the answer's X-Digest and X-Last-Modified
	Res                  *rewrite.Result   // the decision; nil: the body went untouched
	Prepared             *rewrite.Prepared // what APISIX took (after a fallback, the corrected body)
	NoOp                 bool              // sent with the data plane's own digest (§8.2)
	Conn                 uint64            // the decide connection the answer came on (DecideConn)

	// An accepted answer's fallback (§8.5) and caller:
	Fallback   bool                // --fallback backfill: Held and Correction are recorded
	Backfilled []string            // sections whose content is a correction, not the client's decided copy
	Versions   map[string]float64  // a second step's versions, above the corrected PUT's (nil: none)
	Held       []Held              // every item held back in this sync
	Correction *rewrite.Correction // the correction made before this PUT, for the same client bytes next time
}

// Answered is the one transition per answer to a forwarded PUT: the kept
// configuration (derived from the state the PUT was decided on), then the record and
// the state. It returns the merged sections newly found without a memory of
// ownership, to be said once.
func (t *Tx) Answered(o Outcome) (unowned []rewrite.MergeReport) {
	b := t.b
	defer b.publish()
	if o.Status/100 == 2 {
		defer b.accepted(o) // after the record and the state: a fallback's part amends them
		b.oversized = nil   // a configuration that fits landed
	}
	if o.Status/100 == 2 && b.keep {
		b.keepAfter(o)
	}
	switch {
	case o.Status < 200 || o.Status > 299:
		b.trustedConn = 0 // nothing was stored, most likely; the next sync looks first
	case o.Res == nil:
		b.record = nil // an untouched body landed: know nothing
		b.setState(nil, "", "")
		b.believed = nil
	case o.Status == 204:
		// APISIX answers 204 to a digest it already holds whatever the body, so only a
		// 204 to the no-op PUT of §8.2 confirms the body's content
		if o.NoOp {
			b.record = o.Res.Commit(true)
			unowned = b.noteMerges(o.Res)
		}
	default:
		b.record = o.Res.Commit(false)
		unowned = b.noteMerges(o.Res)
		applied := o.Res.AppliedState()
		b.believed = applied.Versions
		b.setState(nil, "", "")
		if o.Digest != "" && o.LastModified != "" {
			b.setState(applied, o.Digest, o.LastModified)
			b.trustedConn = o.Conn // APISIX's 202 on the decide connection
		}
	}
	return unowned
}

// accepted records what an accepted answer's fallback changed.
func (b *Belief) accepted(o Outcome) {
	if len(o.Backfilled) > 0 || o.Versions != nil {
		b.backfilled(o.Backfilled, o.Versions)
	}
	if o.Fallback {
		b.setHeld(o.Held)
		b.correction = o.Correction
	}
}

// keepAfter updates the kept configuration after APISIX accepted a forwarded PUT; the
// cached state is still the one the PUT was decided on.
func (b *Belief) keepAfter(o Outcome) {
	switch {
	case o.Status == 204:
		// nothing changed on the data plane: the kept configuration is right if it
		// describes the state the PUT was decided on, else a full read of it is
		if c := b.kept; c != nil && c.Digest == b.digest && c.LastModified == b.lastModify {
			return
		}
		if b.state != nil && b.state.ItemsKnown && b.lastModify != "" {
			b.setKept(keptFromState(b.state, b.digest, b.lastModify, b.owned))
		} else {
			b.forgetKept() // someone else wrote: the watch reads it back
		}
	case o.Res == nil || o.Prepared == nil:
		b.forgetKept() // an untouched body landed: the watch reads it back
	default:
		next := b.derive(o)
		if next == nil {
			b.forgetKept()
			return
		}
		b.setKept(next)
	}
}

// noteMerges commits the memory of ownership of an accepted PUT and returns the merged
// sections that kept items for lack of it, each once.
func (b *Belief) noteMerges(res *rewrite.Result) []rewrite.MergeReport {
	b.owned = res.Ownership(b.owned)
	var out []rewrite.MergeReport
	for _, m := range res.Merges {
		if !m.Unowned || b.unownedSaid[m.Section] {
			continue
		}
		if b.unownedSaid == nil {
			b.unownedSaid = map[string]bool{}
		}
		b.unownedSaid[m.Section] = true
		out = append(out, m)
	}
	return out
}

// backfilled records what a fallback (§8.5) changed after an accepted PUT: the record
// forgets the sections whose content is a correction, not the client's decided copy;
// a second step that moved versions past the decision's leaves the state to be read
// again and the kept configuration to be read back.
func (b *Belief) backfilled(sections []string, versions map[string]float64) {
	b.record = b.record.Without(sections)
	if versions == nil {
		return
	}
	b.setState(nil, "", "")
	b.forgetKept()
	if b.believed != nil {
		believed := maps.Clone(b.believed)
		maps.Copy(believed, versions)
		b.believed = believed
	}
}

// Reseeded records a re-seed APISIX accepted: the kept configuration is what the data
// plane holds again, versions included, and the record still holds.
func (t *Tx) Reseeded(k *Kept, digest, lastModified string, conn uint64) {
	b := t.b
	defer b.publish()
	b.setKept(&Kept{Digest: digest, LastModified: lastModified, Versions: k.Versions, Items: k.Items, Owned: k.Owned})
	b.believed = k.Versions
	b.setState(nil, "", "")
	if digest != "" && lastModified != "" {
		b.setState(&rewrite.State{Versions: k.Versions}, digest, lastModified)
		b.trustedConn = conn
	}
}

// Refreshed records the watch's read of a data plane that changed without confshim:
// the state and the kept configuration both follow it.
func (t *Tx) Refreshed(st *rewrite.State, digest, lastModified string, noHead bool, conn uint64) []Move {
	b := t.b
	defer b.publish()
	moved := b.read(st, digest, lastModified, noHead, conn)
	b.setKept(keptFromState(st, digest, lastModified, b.owned))
	b.refreshDue.Store(false)
	return moved
}

// KeptIsCurrent: the kept configuration describes the data plane the watch sees; then
// nothing needs reading back.
func (t *Tx) KeptIsCurrent(digest, lastModified string) bool {
	b := t.b
	if k := b.kept; k != nil && k.Digest == digest && k.LastModified == lastModified {
		b.refreshDue.Store(false)
		return true
	}
	return false
}

// RefreshDue: the kept configuration could not be derived; the watch should read the
// data plane back. Read without the lock.
func (b *Belief) RefreshDue() bool { return b.refreshDue.Load() }

// AskRefresh asks the watch to look again at its next tick.
func (t *Tx) AskRefresh() { t.b.refreshDue.Store(true) }

func (b *Belief) forgetKept() {
	b.kept = nil
	b.refreshDue.Store(true)
}

func (b *Belief) setKept(next *Kept) {
	b.kept = next
	if b.writer != nil && next != nil {
		b.writer.hand(next)
	}
}

// StartWriter starts the state file's writer (with a state dir); it stops when ctx
// ends, after writing the last configuration it was handed.
func (b *Belief) StartWriter(ctx context.Context) {
	if b.writer != nil {
		b.writer.start(ctx)
	}
}

// Wait returns when the state file's writer has flushed and stopped.
func (b *Belief) Wait() {
	if b.writer != nil {
		b.writer.wait()
	}
}
