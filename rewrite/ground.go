package rewrite

// The ground floor of the package: what every decision stands on — the header words and
// a section's change, the errors a body is refused or skipped with, versions as APISIX
// stores them, a bounded name for logs, and the end of a JSON value. It uses nothing
// else of the package.

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"strconv"

	"github.com/confshim/confshim/internal/sections"
)

const versionSuffix = "_conf_version"

// maxVersion keeps versions exact in APISIX's doubles.
const maxVersion = 1 << 53

// Action is the word reported for a changed section (X-Confshim-Actions, metrics).
type Action string

// The actions of contract §5.1, §5.3 and §8.1.
const (
	Raised    Action = "raised"    // set to the data plane's version: APISIX keeps its copy
	Bumped    Action = "bumped"    // set above the data plane's: APISIX applies the client's copy
	Preserved Action = "preserved" // an out-of-band section kept as the data plane holds it
	Settled   Action = "settled"   // re-stamped but unchanged: set back to the data plane's version
)

// Change is one section that the rewrite changed.
type Change struct {
	Section string
	Action  Action
	From    float64 // the request's version; meaningless when FromAbsent
	// FromAbsent: the request had no usable version for the section.
	FromAbsent bool
	To         float64
	Dropped    bool // the client's items were removed from the body
}

// RefuseError reports a body confshim must not forward (contract §4, §6): the client
// gets 400 and nothing reaches APISIX. The reason never quotes more than a clipped name.
type RefuseError struct{ Reason string }

func (e *RefuseError) Error() string { return e.Reason }

// refuseNotObject refuses a body that parses but is not an object: APISIX would take an
// array or a string as {} and empty every section.
var refuseNotObject = &RefuseError{Reason: "the configuration must be an object: APISIX would read this body as {} and delete every section"}

// ErrStateIncomplete asks the caller for a state with items (a full GET): a decision
// needs to compare the client's items with the data plane's.
var ErrStateIncomplete = errors.New("the decision needs the data plane's items")

// SkipError reports a body that is not rewritten; the caller forwards it untouched so
// that APISIX answers with its own error (it rejects every such body whole). The
// reason never quotes the body beyond a clipped name.
type SkipError struct{ Reason string }

func (e *SkipError) Error() string { return "not rewritten: " + e.Reason }

func unstorable(section string, vS float64) error {
	return &RefuseError{Reason: fmt.Sprintf("%s%s cannot go above the data plane's %s: APISIX keeps 14 significant digits and no higher version below 2^53 survives that", clip(section), versionSuffix, appendVersion(nil, vS))}
}

// storable is v as APISIX stores it: lua-cjson keeps 14 significant digits.
func storable(v float64) float64 {
	f, err := strconv.ParseFloat(strconv.FormatFloat(v, 'g', 14, 64), 64)
	if err != nil {
		return v
	}
	return f
}

// nextStorable is the smallest version above v that APISIX stores as a different
// number (§5.1): v+1 below 1e14, a step in the 14th significant digit above; false
// when none exists below 2^53.
func nextStorable(v float64) (float64, bool) {
	if c := v + 1; c > v && storable(c) == c {
		return c, c < maxVersion
	}
	if math.IsInf(v, 0) || math.IsNaN(v) || v >= maxVersion {
		return 0, false
	}
	// the smallest power-of-ten step that reaches the next 14-digit number
	for step := 10.0; step < maxVersion; step *= 10 {
		if c := storable(v + step); c > v && storable(c) == c {
			return c, c < maxVersion
		}
	}
	return 0, false
}

// appendVersion writes a version as JSON and YAML read it: integers without exponent
// or fraction.
func appendVersion(dst []byte, v float64) []byte { return strconv.AppendFloat(dst, v, 'f', -1, 64) }

// maxNameBytes bounds a name taken from a body in logs and messages (§5.7).
const maxNameBytes = 64

// clip cuts a request-supplied name for a log line or an error message.
func clip(name string) string {
	if len(name) <= maxNameBytes {
		return name
	}
	return name[:maxNameBytes] + "…"
}

// Clip is clip for the proxy's log lines.
func Clip(name string) string { return clip(name) }

// maxMessageBytes bounds an APISIX message kept for a log line or /debug/config (§7).
const maxMessageBytes = 256

// ClipMessage cuts a message at maxMessageBytes.
func ClipMessage(msg string) string {
	if len(msg) <= maxMessageBytes {
		return msg
	}
	return msg[:maxMessageBytes] + "…"
}

// valueEnd returns the end of the JSON value starting at i (strings and nesting aware).
func valueEnd(b []byte, i int) int {
	depth, inString, escaped := 0, false, false
	for j := i; j < len(b); j++ {
		c := b[j]
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
				if depth == 0 {
					return j + 1
				}
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '[', '{':
			depth++
		case ']', '}':
			depth--
			if depth == 0 {
				return j + 1
			}
			if depth < 0 {
				return j
			}
		case ',':
			if depth == 0 {
				return j
			}
		}
	}
	return len(b)
}

// yamlDoc is what a YAML splice must keep consistent: anchors defined in a member that
// the rewrite drops must not be referred to from what stays.
type yamlDoc struct {
	anchors []yamlRef // definitions, with the member they are in (-1: outside any)
	aliases []yamlRef
}

type yamlRef struct {
	name   string
	member int
}

// State is what the data plane holds: each section's version and, when known, its items.
type State struct {
	// Versions holds every <section>_conf_version the data plane reported.
	Versions map[string]float64
	// Items holds each section's raw JSON items as the data plane returned them.
	// It is only meaningful when ItemsKnown; a state derived from confshim's own write
	// knows versions only.
	Items      map[string][]byte
	ItemsKnown bool
}

type semHasher struct {
	seed    maphash.Seed
	table   sections.Table // which sections are order-free
	b       []byte
	i       int
	scratch []byte
}

// member is one top-level "key": value pair of the body, as byte offsets.
type member struct {
	key        []byte // the key's raw bytes between the quotes (still escaped)
	name       string // the key unescaped (set by index)
	start      int    // offset of the key's opening quote (YAML: of its line)
	valueStart int
	valueEnd   int
	end        int // YAML: where the member's lines end (the next member's start)
}

// object is the top level of a JSON object body (or a YAML block mapping): its
// members, the offset of the closing brace (YAML: of the mapping's end), and an index
// by name.
type object struct {
	members []member
	close   int
	idx     map[string]slots // by section name (a version key counts under its section)
	yaml    *yamlDoc         // YAML only: what the splice must keep consistent
}

// slots are the members of one section: its items and its version (-1: absent).
type slots struct{ items, version int }

// Rewriter holds the configuration of the decision; it is safe for concurrent use.
type Rewriter struct {
	preserve map[string]bool
	merge    map[string]bool // --merge sections (§8.6)
	seed     maphash.Seed
	table    sections.Table // the sections it knows: APISIX's
}

// Input is one request to decide on.
type Input struct {
	Body []byte
	// Digest is the client's X-Digest; HasDigest is false when it sent none (APISIX 3.13).
	Digest    string
	HasDigest bool
	State     *State
	Record    *Record
	// Buf, if it has the capacity, holds the rewritten body: callers pool it so that a
	// sync of tens of megabytes does not allocate its copy each time.
	Buf []byte
	// Owned is the memory of which ids the client owns in --merge sections (§8.6).
	Owned Ownership
	// Now is the current Unix time in milliseconds: a bump goes to max(vS+1, Now)
	// (§5.1), a number no other writer picks. 0 (no clock) bumps to vS+1.
	Now float64
	// Unread: the state was not read for this decision (§5.4), so an out-of-band writer
	// may have set any section to any version since. A section the client changed is
	// then sent at Now when Now is above the client's version (stamped), so that it
	// cannot equal such a version; where the clock cannot choose (Now is not above the
	// versions involved), the result is Unsure and the caller looks first.
	Unread bool
	// AvoidTies: a --merge section must not go at vS+1 (the version a read-modify-write
	// of vS picks too) where it would be read back after the PUT (SentAtATie): the sync
	// is decided again and makes no second read-back. It goes at the clock's version,
	// or vS+2 when the clock is behind.
	AvoidTies bool
}

// Prepared is a body scanned once, before any state is known. The proxy prepares
// outside its PUT lock, so that concurrent clients scan in parallel and only the
// O(sections) decision and the forwarding are serialised.
type Prepared struct {
	body   []byte
	obj    object
	yaml   bool
	sums   []uint64       // per member: the hash of its value (the record's, for sections)
	layout *Layout        // JSON bodies: what the next PrepareLike may reuse
	table  sections.Table // the Rewriter's that prepared it
}

// decision is one Decide call: the prepared body and its edits, the input, the hasher
// and the result being built. Each section's decision is a method of it.
type decision struct {
	rw  *Rewriter
	p   *Prepared
	e   *edits
	in  Input
	h   *semHasher
	res *Result
	// stampTie: the section being decided is not read back after the PUT (a merged
	// section's YAML items), so a change goes above vS+1 (untied)
	stampTie bool
}

type sectionRef struct {
	name string
	slots
}

// Record is confshim's memory of its last accepted write: per managed section, a hash
// of the client's bytes, the semantic fingerprint of the content the data plane then
// held, and the version it took. A nil Record is an empty one. It is immutable;
// Result.Commit returns the next one.
type Record struct {
	entries map[string]recordEntry
}

type recordEntry struct {
	sum     uint64 // maphash of the client's raw items
	fp      uint64 // semantic fingerprint of the section's content (when fpKnown)
	fpKnown bool
	version float64
	kept    bool // a --merge section whose union kept items the client never sent
	// sent is the section's version as the client sent it (not as forwarded): a body
	// that leaves a merged section out says nothing while it echoes it (§8.6)
	sent sectionVersion
}

// Result is the decision for one body.
type Result struct {
	// Body is what to forward: the input bytes themselves when nothing changed.
	Body []byte
	// Changed is false when Body is the input, untouched.
	Changed bool
	// Changes lists the reported sections (§5.5), sorted by section.
	Changes []Change
	// Digest is the X-Digest to forward (the client's when nothing changed).
	Digest string
	// NoOp: the forwarded body leaves every section as the data plane holds it (§8.2).
	NoOp bool
	// Thinned lists the sections sent at the data plane's version without their items
	// (§8.3); ThinnedBytes is what that left out.
	Thinned      []string
	ThinnedBytes int
	// Merges reports each --merge section whose union was computed (§8.6).
	Merges []MergeReport

	sections []outcome
	owned    Ownership // the client's ids in each merged section after this PUT
	// stamped are the changed sections a decision taken unread sent at Now instead of
	// the client's version (Input.Unread); unsure: a version was chosen that the clock
	// did not, so a decision taken unread must be checked first
	stamped []Change
	unsure  bool
	// unread: the decision was taken on the belief without a read (Input.Unread)
	unread bool
}

// outcome is what the data plane will hold for one section after the forwarded PUT.
type outcome struct {
	section  string
	recorded bool           // a managed section whose client copy the record keeps
	sum      uint64         // hash of the client's items
	fp       uint64         // fingerprint of the content after the PUT (when fpKnown)
	fpKnown  bool           //
	applied  float64        // the version after a 202, as APISIX stores it
	current  float64        // the data plane's version before the PUT (kept on a 204)
	dpKnows  bool           // the data plane reported this section
	kept     bool           // a merged section that keeps items the client never sent (§8.6)
	union    []byte         // a merged section's items as sent, when not the client's own
	shared   bool           // a --merge section (§8.6)
	sent     sectionVersion // the client's version of the section, as it sent it
}

// Rejection is one item APISIX rejects: its section, its index in the body's array,
// and APISIX's error.
type Rejection struct {
	Section string
	Index   int
	Error   string
}

// Hold is one item a plan holds back.
type Hold struct {
	Section, ID string
	Error       string
	Raw         []byte // the client's item
	Backfilled  bool   // replaced by its accepted copy; false: left out
}

// Accepted are the copies of items the data plane last accepted, by section and id; a
// section is split only when an item of it is looked up.
type Accepted struct {
	items    map[string][]byte
	sections map[string]map[string][]byte
	refused  map[reference]bool
}

// sectionCorrection is a section's correction made before a PUT: the hash the body's
// scan kept of the client's items then, and the corrected items.
type sectionCorrection struct {
	ClientSum uint64
	Items     []byte
}

// Ownership is, per merged section, the ids the client owns. A section missing from it
// has no memory of ownership (a restart without --state-dir): nothing is deleted there.
type Ownership map[string][]string

// MergeReport is what merging did to one section.
type MergeReport struct {
	Section     string
	ClientOwned int  // ids the client owns (every id it has sent)
	Kept        int  // items kept as the data plane holds them
	Unowned     bool // no memory of ownership: items missing from the client's copy were kept
	// KeptIDs names the first maxKeptIDs items kept, each cut at 64 bytes (for the log).
	KeptIDs []string
}

// A Layout is the top-level shape of the last JSON body Prepare scanned — its members'
// offsets and a hash of every part between them — without the bytes. ADC re-sends the
// same configuration on every sync, re-stamping a few versions and modifiedIndex values
// with numbers of the same length: such a body has the same length and differs only
// inside a few values. PrepareLike then validates just those values instead of scanning
// the whole body again; the hashing it does instead is needed for the record anyway.
// The hashes are seeded per process, so no client can aim a collision at them.
type Layout struct {
	size     int
	obj      object   // members (named; their raw keys dropped), the closing brace, the index: read-only
	headSum  uint64   // body[:first member]
	keySums  []uint64 // per member: "key": up to its value
	tailSums []uint64 // per member: after its value, up to the next member (or the end)
	valSums  []uint64 // per member: its value
}

// edits collects the byte changes to the top-level object: new version values,
// members removed, version members added.
type edits struct {
	newValue [][]byte // per member: the replacement value, or nil
	drop     []bool   // per member: remove it
	inserts  []insert // version members to add
}

type insert struct{ name, value []byte }

// Item is one element of a section's JSON array.
type Item struct {
	Raw []byte
	ID  string // tostring(id), or a consumer's username; "" when it has none
}

// itemSplice is one corrected body: per section, what happens to the item at an index of
// the body's array (a replacement, or nil to leave it out), and sections whose version
// is to be set.
type itemSplice struct {
	Items    map[string]map[int][]byte
	Versions map[string]float64
	// Replace gives sections' whole items values (a correction computed before, for the
	// same client bytes).
	Replace map[string][]byte
	// split are sections of the body already split (a plan's), so as not to split them
	// again
	split map[string][]Item
}

// reference is an item's reference by id to an item of another section.
type reference struct{ Section, ID string }
