package proxy

import (
	"slices"
	"time"

	"github.com/rs/zerolog"

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
	learntByWatch    = "watch"            // the watch's look at the configuration
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

// believe records the versions the data plane holds after confshim's own write.
func (p *Proxy) believe(versions map[string]float64) {
	p.dp.believed = versions
}

// forgetBelief: an outcome confshim does not know (a PUT without an answer, a body it
// forwarded untouched); the next read is taken as it comes, nobody blamed.
func (p *Proxy) forgetBelief() { p.dp.believed = nil }

// learnFrom compares a state read with what confshim believed; the caller holds the
// PUT lock. A data plane that holds nothing (restarted) is no writer's doing.
func (p *Proxy) learnFrom(st *rewrite.State, lastModified, how string) {
	believed := p.dp.believed
	if st == nil || (lastModified == "" && !p.api.NoHead()) {
		p.dp.believed = nil
		return
	}
	p.dp.believed = st.Versions
	if believed == nil {
		return
	}
	var moved []DebugVersionMove
	for _, s := range sortedKeys(believed) {
		if to := st.Versions[s]; to != believed[s] {
			moved = append(moved, DebugVersionMove{Section: rewrite.Clip(s), From: believed[s], To: to})
		}
	}
	if len(moved) == 0 {
		return
	}
	arr := zerolog.Arr()
	for i, m := range moved {
		p.m.OutOfBandWrites.WithLabelValues(metrics.SectionLabel(m.Section)).Inc()
		if i < maxLoggedSections {
			arr = arr.Dict(zerolog.Dict().Str("section", m.Section).Float64("from", m.From).Float64("to", m.To))
		}
	}
	p.log.Warn().Str("event", "out_of_band_write").Str("how", how).Array("sections", arr).
		Msg("the data plane was written behind confshim (straight on its Admin API)")
	if len(moved) > maxLoggedSections {
		moved = moved[:maxLoggedSections]
	}
	p.debug.noteOutOfBand(DebugOutOfBand{At: time.Now(), How: how, Sections: moved})
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
