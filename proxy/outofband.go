package proxy

import (
	"slices"
	"time"

	"github.com/rs/zerolog"

	"github.com/confshim/confshim/internal/dataplane"
	"github.com/confshim/confshim/metrics"
	"github.com/confshim/confshim/rewrite"
)

// Out-of-band writes (contract §7): someone wrote to the data plane behind confshim —
// what deadlocked syncs in the first place. confshim believes the versions its own
// last accepted write (or re-seed, or read) left; a later read that shows other
// versions is such a write. It is counted per section, logged once and listed in
// /debug/config, so an operator sees the gateway being edited by hand.

// How confshim learnt of an out-of-band write.
const (
	learntByConflict = "version_conflict" // APISIX refused a PUT decided on the old versions
	learntByReread   = "re_read"          // the state read before a PUT found another digest
)

// maxOutOfBand is how many out-of-band writes /debug/config lists.
const maxOutOfBand = 8

// DebugOutOfBand is one out-of-band write confshim learnt.
type DebugOutOfBand struct {
	At       time.Time          `json:"at"`
	How      string             `json:"how"`
	Sections []DebugVersionMove `json:"sections"`
}

// DebugVersionMove is one section's version as confshim believed it and as it found it.
type DebugVersionMove struct {
	Section string  `json:"section"`
	From    float64 `json:"from"`
	To      float64 `json:"to"`
}

// noteMoves counts, logs and shows the out-of-band writes a read showed (moves from
// the belief's Read).
func (p *Proxy) noteMoves(moves []dataplane.Move, how string) {
	if len(moves) == 0 {
		return
	}
	arr := zerolog.Arr()
	shown := make([]DebugVersionMove, 0, min(len(moves), maxLoggedSections))
	for i, m := range moves {
		section := rewrite.Clip(m.Section)
		p.m.OutOfBandWrites.WithLabelValues(metrics.SectionLabel(m.Section)).Inc()
		if i < maxLoggedSections {
			arr = arr.Dict(zerolog.Dict().Str("section", section).Float64("from", m.From).Float64("to", m.To))
			shown = append(shown, DebugVersionMove{Section: section, From: m.From, To: m.To})
		}
	}
	p.log.Warn().Str("event", "out_of_band_write").Str("how", how).Array("sections", arr).
		Msg("the data plane was written behind confshim (straight on its Admin API)")
	p.debug.noteOutOfBand(DebugOutOfBand{At: time.Now(), How: how, Sections: shown})
}

// noteOutOfBand keeps the last few out-of-band writes, newest last.
func (d *debugLog) noteOutOfBand(w DebugOutOfBand) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.outOfBand = append(d.outOfBand, w)
	if len(d.outOfBand) > maxOutOfBand {
		d.outOfBand = slices.Delete(d.outOfBand, 0, len(d.outOfBand)-maxOutOfBand)
	}
}
