package proxy

import (
	"net/http"
	"slices"
	"strings"

	"github.com/rs/zerolog"

	"github.com/confshim/confshim/internal/apisix"
	"github.com/confshim/confshim/internal/dataplane"
	"github.com/confshim/confshim/rewrite"
)

// What a configs PUT reports: its decision's log line and the X-Confshim-Actions header
// (contract §5.5), the fallback's backfilled sections included (§8.5).

// maxLoggedSections bounds a decision's log line (§5.7): a body may name thousands.
const maxLoggedSections = 32

func (p *Proxy) logDecision(res *rewrite.Result) {
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
	ev := p.log.Info().Str("event", "rewrite").Int("sections_changed", len(res.Changes)).Array("sections", arr)
	if len(res.Thinned) > 0 {
		ev = ev.Int("sections_thinned", len(res.Thinned)).Int("thinned_bytes", res.ThinnedBytes)
	}
	ev.Bool("noop", res.NoOp).Msg("configs PUT repaired")
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
