package dataplane

import (
	"bytes"

	"github.com/confshim/confshim/rewrite"
)

// The fallback's memory (contract §8.5): the items held back in the last accepted sync,
// so that the same content is held back again before the PUT, and the last correction
// made before a PUT, so that the same client bytes are corrected again without splitting
// them. Both are part of what confshim believes; they change under the PUT lock. What
// they mean to the next sync is rewrite's choice (rewrite/held.go).

// Held is one item held back in the last accepted sync.
type Held = rewrite.HeldItem

// setHeld records the items held back in the accepted sync (their bytes copied out of
// the request's pooled buffer).
func (b *Belief) setHeld(held []Held) {
	b.held = make(map[string]Held, len(held))
	for _, h := range held {
		h.Raw = bytes.Clone(h.Raw)
		b.held[h.Key()] = h
	}
}
