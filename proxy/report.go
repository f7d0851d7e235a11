package proxy

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/internal/dataplane"
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

// noteMoves counts, logs and shows the out-of-band writes a read showed (moves from
// the belief's Read).
func (n notes) moves(moves []dataplane.Move, how string) {
	if len(moves) == 0 {
		return
	}
	arr := zerolog.Arr()
	shown := make([]DebugVersionMove, 0, min(len(moves), maxLoggedSections))
	for i, m := range moves {
		section := rewrite.Clip(m.Section)
		n.m.OutOfBandWrites.WithLabelValues(metrics.SectionLabel(m.Section)).Inc()
		if i < maxLoggedSections {
			arr = arr.Dict(zerolog.Dict().Str("section", section).Float64("from", m.From).Float64("to", m.To))
			shown = append(shown, DebugVersionMove{Section: section, From: m.From, To: m.To})
		}
	}
	n.log.Warn().Str("event", "out_of_band_write").Str("how", how).Array("sections", arr).
		Msg("the data plane was written behind confshim (straight on its Admin API)")
	n.debug.noteOutOfBand(DebugOutOfBand{At: time.Now(), How: how, Sections: shown})
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
func (n notes) count(res *rewrite.Result, out outgoingPut, ans *apisix.Answer) {
	if res == nil {
		return
	}
	for _, c := range res.Changes {
		n.m.SectionRewrites.WithLabelValues(metrics.SectionLabel(c.Section), string(c.Action)).Inc()
	}
	n.m.ThinnedBytes.Add(float64(res.ThinnedBytes))
	if out.noop && ans.Status == http.StatusNoContent {
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

// actionsHeader is X-Confshim-Actions when sections were rewritten (never on APISIX's
// refusal of the caller: that would tell a stranger the decision).
func actionsHeader(ans *apisix.Answer, res *rewrite.Result, held []dataplane.Held) string {
	switch {
	case ans.Status == http.StatusUnauthorized || ans.Status == http.StatusForbidden:
		return ""
	case len(held) > 0:
		return actionsWithBackfill(res, held)
	case res != nil && len(res.Changes) > 0:
		return res.Actions()
	}
	return ""
}

// backfilledSections are the sections with a held item, sorted.
func backfilledSections(held []dataplane.Held) []string {
	var out []string
	for _, h := range held {
		out = append(out, h.Section)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// actionsWithBackfill is X-Confshim-Actions with section=backfilled entries added.
func actionsWithBackfill(res *rewrite.Result, held []dataplane.Held) string {
	var entries []string
	if res != nil && len(res.Changes) > 0 {
		entries = strings.Split(res.Actions(), ", ")
	}
	for _, s := range backfilledSections(held) {
		entries = append(entries, rewrite.Clip(s)+"=backfilled")
	}
	slices.Sort(entries)
	return strings.Join(entries, ", ")
}

// maxRejectedItems bounds the items a held-back rejection lists (§5.7).
const maxRejectedItems = 20

// heldRejection is the client's answer when items were held back and
// --fallback-answer is rejection (§8.5): the rest of the sync is applied, but a 2xx
// would make a controller report the held items as programmed. So the client gets a
// rejection in APISIX's own shapes: 400, error_msg with APISIX's message for the first
// held item and its section and id, and errors[] as POST /configs/validate lists
// them (resource_type, resource_id, error), bounded. applied is APISIX's answer to
// what was forwarded; its headers stay but for the ones that describe a stored body.
func heldRejection(applied *apisix.Answer, held []dataplane.Held) *apisix.Answer {
	type itemError struct {
		Type  string `json:"resource_type"`
		ID    string `json:"resource_id"`
		Error string `json:"error"`
	}
	body := struct {
		ErrorMsg string      `json:"error_msg"`
		Errors   []itemError `json:"errors"`
	}{}
	for i, h := range held {
		if i == maxRejectedItems {
			break
		}
		body.Errors = append(body.Errors, itemError{Type: rewrite.Clip(h.Section), ID: rewrite.Clip(h.ID), Error: h.Error})
	}
	first := body.Errors[0]
	body.ErrorMsg = "invalid " + first.Type + " " + first.ID + ": " + first.Error
	raw, _ := json.Marshal(body)
	header := applied.Header.Clone()
	if header == nil {
		header = http.Header{}
	}
	for _, k := range []string{"X-Digest", "X-Last-Modified", "Content-Length"} {
		header.Del(k)
	}
	header.Set("Content-Type", "application/json")
	return &apisix.Answer{Status: http.StatusBadRequest, Header: header, Body: append(raw, '\n')}
}
