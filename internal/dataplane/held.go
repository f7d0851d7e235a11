package dataplane

import (
	"bytes"
	"time"

	"github.com/confshim/confshim/rewrite"
)

// The fallback's memory (contract §8.5): the items held back in the last accepted sync,
// so that the same content is held back again before the PUT, and the last correction
// made before a PUT, so that the same client bytes are corrected again without splitting
// them. Both are part of what confshim believes; they change under the PUT lock.

// Held is one item held back in the last accepted sync.
type Held struct {
	Section, ID string
	Error       string // APISIX's, cut for the log and /debug/config
	Since       time.Time
	Backfilled  bool   // replaced by its accepted copy; false: left out
	Sum         uint64 // the client's item's content (§8.1's identity): the same content is held again
	Raw         []byte // the client's item (state-dependent ones are validated again)
	Server      string // APISIX's version when it rejected the item
	// DependsOnState: rejected for what the data plane holds (a plugin another global
	// rule uses, a key another consumer holds), not for what the item is (as
	// apisix.StateDependent reads APISIX's message)
	DependsOnState bool
}

// Correction is the last correction made before a PUT: per held section, the hash of the
// client's bytes and the corrected items, on APISIX version Server.
type Correction struct {
	Server   string
	Sections map[string]rewrite.SectionCorrection
}

func heldKey(section, id string) string { return section + "\x00" + id }

// SetHeld records the items held back in the accepted sync (their bytes copied out of
// the request's pooled buffer).
func (b *Belief) setHeld(held []Held) {
	b.held = make(map[string]Held, len(held))
	for _, h := range held {
		h.Raw = bytes.Clone(h.Raw)
		b.held[heldKey(h.Section, h.ID)] = h
	}
}

// SetCorrection keeps (or, nil, drops) the correction of an accepted sync.
