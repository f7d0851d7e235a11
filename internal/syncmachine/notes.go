package syncmachine

import (
	"sync/atomic"

	"github.com/confshim/confshim/internal/dataplane"
	"github.com/confshim/confshim/metrics"
	"github.com/confshim/confshim/rewrite"
)

// Note is something that happened in a sync that the driver says (log, metrics,
// /debug/config); the machine says nothing itself.
type Note struct {
	Kind NoteKind

	Moves   []dataplane.Move       // NoteMoves: a read showed out-of-band writes, learnt How
	How     string                 //
	Res     *rewrite.Result        // NoteDecision
	Why     string                 // NoteUntouched's reason; NoteFallback's message
	Err     error                  // NoteRedial, NoteFallback
	Result  metrics.FallbackResult // NoteFallback
	Status  int                    // NoteFallback: APISIX's status, when it rejected
	Message string                 // NoteFallback: APISIX's error_msg
	Held    HeldItem               // NoteHeldBack
	Merge   rewrite.MergeReport    // NoteUnowned
}

// NoteKind is what a Note is about.
type NoteKind int

const (
	NoteMoves         NoteKind = iota + 1 // out-of-band writes a read showed
	NoteDecided                           // rewrite decided (the driver times the step)
	NoteDecision                          // a decision that changed sections
	NoteUntouched                         // rewrite will not touch the body: it goes as it came
	NoteRedial                            // the decide connection closed: decided again on a fresh read
	NoteConflictRetry                     // the data plane moved: decided again on a fresh read
	NoteFallback                          // a corrected PUT's fate (§8.5)
	NoteHeldBack                          // an item newly held back
	NoteSecondStep                        // held items pass now: the sync is decided again for the second PUT
	NoteUnowned                           // a merged section without a memory of ownership
)

// LayoutMemory keeps the last corrected body's shape, for PrepareLike: the steady
// state corrects the same client bytes the same way sync after sync.
type LayoutMemory struct {
	p atomic.Pointer[rewrite.Layout]
}

func (m *LayoutMemory) load() *rewrite.Layout {
	if m == nil {
		return nil
	}
	return m.p.Load()
}

func (m *LayoutMemory) store(l *rewrite.Layout) {
	if m != nil && l != nil {
		m.p.Store(l)
	}
}
