package dataplane

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/confshim/confshim/rewrite"
)

// The belief's transitions, one per answer of the data plane, tested without a server:
// what confshim believes after a 202, a 204, a rejection, a fallback, a re-seed, and
// what an out-of-band write looks like when it is learnt.

const stored = `{"routes_conf_version":3,"routes":[{"id":"r1","uri":"/a"}],"secrets_conf_version":1,"secrets":[{"id":"vault/1","uri":"http://v"}]}`

func readState(t *testing.T, doc string) *rewrite.State {
	t.Helper()
	st, err := rewrite.ParseState([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// rw is one rewriter for every decision, as in the proxy: the record's hashes are seeded
// per rewriter.
var rw = rewrite.New([]string{"secrets"})

// decided is the rewrite of body against b's state, as the proxy runs it.
func decided(t *testing.T, b *Tx, body string) (*rewrite.Result, *rewrite.Prepared) {
	t.Helper()
	p, err := rw.Prepare([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	res, err := rw.Decide(p, rewrite.Input{Body: []byte(body), Digest: "c1", HasDigest: true, State: b.View().State, Record: b.View().Record, Owned: b.View().Owned})
	if err != nil {
		t.Fatal(err)
	}
	pa, err := rw.Prepare(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, pa
}

// newBelief is a belief with its lock taken: the Tx every transition is a method of.
func newBelief(t *testing.T) *Tx {
	t.Helper()
	b, err := New(Options{Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	tx, ok := b.Lock(context.Background())
	if !ok {
		t.Fatal("lock")
	}
	t.Cleanup(tx.Unlock)
	return tx
}

func TestAfterA202TheWriteIsBelievedAndTrusted(t *testing.T) {
	t.Parallel()
	b := newBelief(t)
	b.Read(readState(t, stored), "d0", "100", false, 1)
	res, prepared := decided(t, b, `{"routes_conf_version":5,"routes":[{"id":"r1","uri":"/b"}],"secrets_conf_version":0}`)
	b.Answered(Outcome{Status: 202, Digest: "c1+x", LastModified: "101", Res: res, Prepared: prepared, Conn: 1})
	if !b.View().Trusts(1) {
		t.Fatal("a 202 on the decide connection must leave the state trusted")
	}
	if b.View().Trusts(2) {
		t.Fatal("a re-opened connection (another dial) must end the trust")
	}
	if b.View().Trusts(0) {
		t.Fatal("a connection that cannot be vouched for (0) is never trusted")
	}
	if v := b.View().State.Version("routes"); v != 5 || b.View().Digest != "c1+x" || b.View().LastModified != "101" {
		t.Fatalf("state after the 202: routes %v, %q %q", v, b.View().Digest, b.View().LastModified)
	}
	k := b.View().Kept
	if k == nil || k.Versions["routes"] != 5 || string(k.Items["routes"]) != `[{"id":"r1","uri":"/b"}]` ||
		string(k.Items["secrets"]) != `[{"id":"vault/1","uri":"http://v"}]` {
		t.Fatalf("kept after the 202: %+v", k)
	}
	if s := b.b.Snapshot(); s.Digest != "c1+x" || s.Kept != k {
		t.Fatalf("snapshot %+v", s)
	}
	// the same client copy again is unchanged by the record: raised, nothing to read
	res, _ = decided(t, b, `{"routes_conf_version":5,"routes":[{"id":"r1","uri":"/b"}],"secrets_conf_version":0}`)
	if strings.Contains(res.Actions(), "bumped") {
		t.Fatalf("the record's own write decided as a bump: %s", res.Actions())
	}
}

func TestA204ChangesTheRecordOnlyForTheNoOpPut(t *testing.T) {
	t.Parallel()
	b := newBelief(t)
	b.Read(readState(t, stored), "d0", "100", false, 1)
	record := b.View().Record
	res, prepared := decided(t, b, `{"routes_conf_version":3,"routes":[{"id":"r1","uri":"/a"}],"secrets_conf_version":0}`)
	b.Answered(Outcome{Status: 204, Res: res, Prepared: prepared, Conn: 1}) // the client's own digest
	if b.View().Record != record {
		t.Fatal("a 204 to the client's digest proves nothing about the body: the record must not move")
	}
	b.Answered(Outcome{Status: 204, Res: res, Prepared: prepared, NoOp: true, Conn: 1})
	if b.View().Record == record {
		t.Fatal("a 204 to confshim's no-op PUT confirms the body: the record must follow it")
	}
	if b.View().State == nil || b.View().Digest != "d0" {
		t.Fatal("a 204 leaves the data plane as it was")
	}
}

func TestARejectionEndsTheTrustAndKeepsTheState(t *testing.T) {
	t.Parallel()
	b := newBelief(t)
	b.Read(readState(t, stored), "d0", "100", false, 1)
	res, prepared := decided(t, b, `{"routes_conf_version":5,"routes":[{"id":"r1","plugins":{"nope":{}}}],"secrets_conf_version":0}`)
	kept := b.View().Kept
	b.Answered(Outcome{Status: 400, Res: res, Prepared: prepared, Conn: 1})
	if b.View().Trusts(1) {
		t.Fatal("after a rejection the next sync must read first")
	}
	if b.View().State == nil || b.View().State.Version("routes") != 3 || b.View().Kept != kept {
		t.Fatal("nothing was stored: the state and the kept configuration stand")
	}
}

func TestAnUntouchedBodyThatLandedForgetsEverything(t *testing.T) {
	t.Parallel()
	b := newBelief(t)
	b.Read(readState(t, stored), "d0", "100", false, 1)
	b.Answered(Outcome{Status: 202, Digest: "x", LastModified: "101"})
	if b.View().State != nil || b.View().Record != nil || b.View().Kept != nil || !b.b.RefreshDue() {
		t.Fatal("a body confshim did not decide landed: it knows nothing and the watch reads back")
	}
	// and the next read blames nobody
	if moved := b.Read(readState(t, `{"routes_conf_version":9,"secrets_conf_version":1}`), "x", "101", false, 1); len(moved) != 0 {
		t.Fatalf("moves after an untouched write: %+v", moved)
	}
}

func TestABackfillForgetsTheCorrectedSections(t *testing.T) {
	t.Parallel()
	b := newBelief(t)
	b.Read(readState(t, stored), "d0", "100", false, 1)
	res, prepared := decided(t, b, `{"routes_conf_version":5,"routes":[{"id":"r1","uri":"/b"}],"secrets_conf_version":0}`)
	b.Answered(Outcome{Status: 202, Digest: "c1+b", LastModified: "101", Res: res, Prepared: prepared, Conn: 1})
	body := `{"routes_conf_version":5,"routes":[{"id":"r1","uri":"/b"}],"secrets_conf_version":0}`
	if _, err := rw.Decide(mustPrepare(t, body), rewrite.Input{Body: []byte(body), State: b.View().State, Record: b.View().Record}); err != nil {
		t.Fatalf("before the backfill the record vouches for routes: %v", err)
	}
	b.Answered(Outcome{Status: 202, Digest: "c1+b", LastModified: "101", Res: res, Prepared: prepared, Conn: 1, Backfilled: []string{"routes"}})
	if _, err := rw.Decide(mustPrepare(t, body), rewrite.Input{Body: []byte(body), State: b.View().State, Record: b.View().Record}); !errors.Is(err, rewrite.ErrStateIncomplete) {
		t.Fatalf("routes' content is a correction, not the client's copy: deciding must read the items, got %v", err)
	}
	// a second step moved versions: the state is read again, the kept one read back, and
	// the versions believed follow the second PUT
	b.Answered(Outcome{Status: 202, Digest: "c1+b", LastModified: "101", Res: res, Prepared: prepared, Conn: 1, Backfilled: []string{"routes"}, Versions: map[string]float64{"routes": 6}})
	if b.View().State != nil || b.View().Kept != nil || !b.b.RefreshDue() {
		t.Fatal("after a second step the state and the kept configuration are read again")
	}
	moved := b.Read(readState(t, `{"routes_conf_version":6,"secrets_conf_version":1}`), "c1+b+2", "102", false, 1)
	if len(moved) != 0 {
		t.Fatalf("the second step's own versions counted as an out-of-band write: %+v", moved)
	}
}

func mustPrepare(t *testing.T, body string) *rewrite.Prepared {
	t.Helper()
	p, err := rw.Prepare([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAReseedIsBelievedAsTheKeptConfiguration(t *testing.T) {
	t.Parallel()
	b := newBelief(t)
	k := keptFromState(readState(t, stored), "d0", "100", nil)
	b.Read(readState(t, `{"routes_conf_version":0,"secrets_conf_version":0}`), "", "", false, 2) // restarted empty
	if !b.View().Empty(false) {
		t.Fatal("a state without X-Last-Modified is an empty data plane")
	}
	b.Reseeded(k, "d0", "200", 2)
	if b.View().Empty(false) || !b.View().Trusts(2) || b.View().State.Version("secrets") != 1 || b.View().Kept.LastModified != "200" {
		t.Fatalf("after the re-seed: %+v %+v", b.View().State, b.View().Kept)
	}
	if moved := b.Read(readState(t, stored), "d0", "200", false, 2); len(moved) != 0 {
		t.Fatalf("the re-seed's versions counted as an out-of-band write: %+v", moved)
	}
}

func TestAnOutOfBandWriteIsLearntOnce(t *testing.T) {
	t.Parallel()
	b := newBelief(t)
	b.Read(readState(t, stored), "d0", "100", false, 1)
	oob := `{"routes_conf_version":3,"routes":[{"id":"r1","uri":"/a"}],"secrets_conf_version":2,"secrets":[{"id":"vault/2","uri":"http://v"}]}`
	moved := b.Read(readState(t, oob), "oob", "150", false, 1)
	if !slices.Equal(moved, []Move{{Section: "secrets", From: 1, To: 2}}) {
		t.Fatalf("moves %+v, want secrets 1 -> 2", moved)
	}
	if again := b.Read(readState(t, oob), "oob", "150", false, 1); len(again) != 0 {
		t.Fatalf("the same write learnt twice: %+v", again)
	}
	// a restarted, empty data plane is nobody's write, and neither is the first read
	if moved := b.Read(readState(t, `{"routes_conf_version":0,"secrets_conf_version":0}`), "", "", false, 2); len(moved) != 0 {
		t.Fatalf("a restart counted as a write: %+v", moved)
	}
	fresh := newBelief(t)
	if moved := fresh.Read(readState(t, oob), "oob", "150", false, 1); len(moved) != 0 {
		t.Fatalf("the first read counted as a write: %+v", moved)
	}
	// a conflict doubts the state but keeps what was believed, to tell what moved
	b.Read(readState(t, oob), "oob", "150", false, 1)
	b.Doubt()
	moved = b.Read(readState(t, `{"routes_conf_version":4,"secrets_conf_version":2}`), "oob2", "160", false, 1)
	if !slices.Equal(moved, []Move{{Section: "routes", From: 3, To: 4}}) {
		t.Fatalf("after a conflict: %+v, want routes 3 -> 4", moved)
	}
}

func TestTheLockIsOneAtATime(t *testing.T) {
	t.Parallel()
	b, _ := New(Options{})
	tx, ok := b.TryLock()
	if _, again := b.TryLock(); !ok || again {
		t.Fatal("TryLock must take a free lock and refuse a held one")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, ok := b.Lock(ctx); ok {
		t.Fatal("Lock must give up when its context ended")
	}
	tx.Unlock()
	tx, ok = b.Lock(context.Background())
	if !ok {
		t.Fatal("Lock must take a free lock")
	}
	tx.Unlock()
}

// Issue 36: a read keeps the kept configuration current (a re-seed never puts back
// less than confshim saw), except a read of an empty data plane; an answer that passed
// through confshim with other metadata than the kept configuration's asks the watch to
// read it back, one with the kept metadata does not.
func TestAReadKeepsTheKeptConfigurationCurrent(t *testing.T) {
	t.Parallel()
	tx := newBelief(t)
	tx.Read(readState(t, stored), "d0", "100", false, 1)
	if k := tx.View().Kept; k == nil || k.Digest != "d0" || k.LastModified != "100" || k.Versions["secrets"] != 1 {
		t.Fatalf("kept after a read: %+v", k)
	}
	tx.Read(readState(t, `{"routes_conf_version":0,"secrets_conf_version":0}`), "", "", false, 2) // restarted empty
	if k := tx.View().Kept; k == nil || k.Digest != "d0" {
		t.Fatalf("an empty read replaced the kept configuration: %+v", k)
	}
	b := tx.b
	b.refreshDue.Store(false)
	b.SawState("d0", "100")
	if b.RefreshDue() {
		t.Fatal("an answer with the kept metadata asked for a read-back")
	}
	b.SawState("oob", "101")
	if !b.RefreshDue() {
		t.Fatal("an answer with other metadata did not ask for a read-back")
	}
}

// Issue 37: a Tx cannot be used once its lock is given back.
func TestATxIsDoneOnceUnlocked(t *testing.T) {
	t.Parallel()
	b, _ := New(Options{})
	tx, _ := b.Lock(context.Background())
	tx.Unlock()
	for name, use := range map[string]func(){"View": func() { tx.View() }, "Doubt": func() { tx.Doubt() }, "Unlock": func() { tx.Unlock() }} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s after Unlock did not panic", name)
				}
			}()
			use()
		}()
	}
	if next, ok := b.TryLock(); !ok { // the second Unlock did not give back someone else's lock
		t.Fatal("the lock is held after Unlock")
	} else {
		next.Unlock()
	}
}
