package proxy

import (
	"net/http"
	"slices"
	"time"

	"github.com/rs/zerolog"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/internal/dataplane"
	"github.com/confshim/confshim/internal/syncmachine"
	"github.com/confshim/confshim/metrics"
	"github.com/confshim/confshim/rewrite"
)

// What a configs PUT reports: its decision's log line and the X-Confshim-Actions header
// (contract §5.5), the fallback's backfilled sections included (§8.5).

// notes is where the PUT path says what happened: the log, the metrics and
// /debug/config, each fed from one value.
type notes struct {
	log   zerolog.Logger
	m     *metrics.Metrics
	debug *debugLog
}

// decision logs a repaired PUT's decision.
func (n notes) decision(res *rewrite.Result) {
	arr := zerolog.Arr()
	for i, c := range res.Changes {
		if i == maxLoggedSections {
			break
		}
		d := zerolog.Dict().Str("section", rewrite.Clip(c.Section)).Str("action", string(c.Action)).Float64("to", c.To)
		if !c.FromAbsent {
			d = d.Float64("from", c.From)
		}
		if c.Dropped {
			d = d.Bool("items_dropped", true)
		}
		arr = arr.Dict(d)
	}
	ev := n.log.Info().Str("event", "rewrite").Int("sections_changed", len(res.Changes)).Array("sections", arr)
	if len(res.Thinned) > 0 {
		ev = ev.Int("sections_thinned", len(res.Thinned)).Int("thinned_bytes", res.ThinnedBytes)
	}
	ev.Bool("noop", res.NoOp).Msg("configs PUT repaired")
}

// moves counts, logs and shows the out-of-band writes a read showed (moves from
// the belief's Read).
func (n notes) moves(moves []dataplane.Move, how string) {
	if len(moves) == 0 {
		return
	}
	arr := zerolog.Arr()
	shown := make([]debugVersionMove, 0, min(len(moves), maxLoggedSections))
	for i, m := range moves {
		section := rewrite.Clip(m.Section)
		n.m.OutOfBandWrites.WithLabelValues(metrics.SectionLabel(m.Section)).Inc()
		if i < maxLoggedSections {
			arr = arr.Dict(zerolog.Dict().Str("section", section).Float64("from", m.From).Float64("to", m.To))
			shown = append(shown, debugVersionMove{Section: section, From: m.From, To: m.To})
		}
	}
	n.log.Warn().Str("event", "out_of_band_write").Str("how", how).Array("sections", arr).
		Msg("the data plane was written behind confshim (straight on its Admin API)")
	n.debug.noteOutOfBand(debugOutOfBand{At: time.Now(), How: how, Sections: shown})
}

// synced files one configs PUT as it ended: /debug/config, then its log line (outside
// the debug lock).
func (n notes) synced(r syncRecord) {
	n.logSync(n.debug.add(r, time.Now()))
}

// logSync is the sync's one log line: its correlation, status, header words and the
// ids it touched, bounded as /debug/config bounds them.
func (n notes) logSync(line DebugSyncLine) {
	ev := n.log.Info().Str("event", "sync").Str("sync_id", line.SyncID).Int("status", line.Status).Float64("duration_ms", line.DurationMS)
	if line.Traceparent != "" {
		ev = ev.Str("traceparent", line.Traceparent)
	}
	if line.RequestID != "" {
		ev = ev.Str("request_id", line.RequestID)
	}
	if len(line.Actions) > 0 {
		ev = ev.Strs("actions", line.Actions)
	}
	if len(line.Items) > 0 {
		arr := zerolog.Arr()
		for _, c := range line.Items {
			d := zerolog.Dict().Str("section", c.Section)
			for _, l := range []struct {
				name string
				list rewrite.IDList
			}{{"added", c.Added}, {"changed", c.Changed}, {"removed", c.Removed}, {"held_back", c.Held}} {
				if l.list.Count > 0 {
					d = d.Strs(l.name, l.list.IDs).Int(l.name+"_count", l.list.Count)
				}
			}
			if c.Unknown {
				d = d.Bool("unknown", true)
			}
			arr = arr.Dict(d)
		}
		ev = ev.Array("items", arr)
	}
	ev.Msg("configs PUT done")
}

// lastHeld shows the items held back in the last accepted sync: metrics, /debug/config
// (the belief recorded them with the answer).
func (n notes) lastHeld(held []dataplane.Held) {
	counts := map[string]int{}
	for _, h := range held {
		counts[metrics.SectionLabel(h.Section)]++
		n.m.SectionRewrites.WithLabelValues(metrics.SectionLabel(h.Section), string(rewrite.Backfilled)).Inc()
	}
	for _, s := range append(slices.Clone(rewrite.KnownSections), "other") {
		n.m.HeldBackItems.WithLabelValues(s).Set(float64(counts[s]))
	}
	n.debug.setHeld(held)
}

// count feeds the decision's metrics once APISIX answered.
func (n notes) count(res *rewrite.Result, out syncmachine.Outgoing, ans *apisix.Answer) {
	if res == nil {
		return
	}
	for _, c := range res.Changes {
		n.m.SectionRewrites.WithLabelValues(metrics.SectionLabel(c.Section), string(c.Action)).Inc()
	}
	n.m.ThinnedBytes.Add(float64(res.ThinnedBytes))
	if out.NoOp && ans.Status == http.StatusNoContent {
		n.m.NoopPuts.Inc()
	}
}

// unowned says once that confshim had no memory of which items the client owns in a
// merged section.
func (n notes) unowned(m rewrite.MergeReport) {
	n.log.Warn().Str("event", "merge_unowned").Str("section", rewrite.Clip(m.Section)).Int("kept", m.Kept).
		Strs("kept_ids", m.KeptIDs).Int("kept_ids_not_named", m.Kept-len(m.KeptIDs)).
		Msg("no memory of which items the client owns in this merged section (a restart without --state-dir): items missing from its copy are kept, not deleted")
}

// fallback counts a corrected PUT's fate (§8.5) and says why the fallback stopped.
func (n notes) fallback(note syncmachine.Note) {
	n.m.FallbackPut(note.Result)
	if note.Why == "" {
		return
	}
	ev := n.log.Info().Str("event", "fallback").Str("result", string(note.Result))
	if note.Status != 0 {
		ev = ev.Int("status", note.Status).Str("error", rewrite.ClipMessage(note.Message))
	}
	if note.Err != nil {
		ev = ev.Str("error", apisix.SafeError(note.Err))
	}
	ev.Msg(note.Why)
}

// heldBack says once that an item is held back (§8.5: section, id, APISIX's error).
func (n notes) heldBack(h dataplane.Held) {
	outcome := "left_out"
	if h.Backfilled {
		outcome = "backfilled"
	}
	n.log.Warn().Str("event", "held_back").Str("section", rewrite.Clip(h.Section)).Str("id", rewrite.Clip(h.ID)).
		Str("outcome", outcome).Str("error", h.Error).Msg("APISIX rejects this item; the rest of the sync goes on without it")
}
