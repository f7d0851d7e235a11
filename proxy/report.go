package proxy

import (
	"encoding/json"
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
