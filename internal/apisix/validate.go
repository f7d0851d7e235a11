package apisix

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"

	"github.com/confshim/confshim/rewrite"
)

// maxValidateBody is APISIX 3.17's cap on a validate body (spec §4.4), less a margin
// for the envelope.
const maxValidateBody = 1572864 - 1024

// ValidateSection asks POST /apisix/admin/configs/validate, with the caller's
// credentials, which of a section's items APISIX rejects, in pieces under its 1.5 MiB
// cap (an item alone over the cap counts as rejected). ok is false when APISIX could
// not say (no answer, another status, an error that is not about an item).
func (c *Client) ValidateSection(ctx context.Context, creds Credentials, section string, items [][]byte) (found []rewrite.Rejection, ok bool) {
	limit := maxValidateBody - len(section) - 8
	for start := 0; start < len(items); {
		end, size := start, 0
		for end < len(items) && (end == start || size+len(items[end])+1 <= limit) {
			size += len(items[end]) + 1
			end++
		}
		if size > limit { // one item over the cap: rejected as it is
			found = append(found, rewrite.Rejection{Section: section, Index: start, Error: "the item alone is over APISIX's 1.5 MiB validate cap"})
			start = end
			continue
		}
		errs, ok := c.validateChunk(ctx, creds, section, items[start:end])
		if !ok {
			return nil, false
		}
		for _, e := range errs {
			e.Index += start
			found = append(found, e)
		}
		start = end
	}
	return found, true
}

// validateChunk is one POST /configs/validate of some items of one section.
func (c *Client) validateChunk(ctx context.Context, creds Credentials, section string, items [][]byte) ([]rewrite.Rejection, bool) {
	var b bytes.Buffer
	name, _ := json.Marshal(section)
	b.WriteByte('{')
	b.Write(name)
	b.WriteString(":[")
	for i, it := range items {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(it)
	}
	b.WriteString("]}")
	a, err := c.roundTrip(ctx, Shared, call{method: http.MethodPost, path: ConfigsPath + "/validate", creds: creds,
		header: http.Header{"Content-Type": {"application/json"}}, body: b.Bytes()})
	switch {
	case err != nil:
		return nil, false
	case a.Status == http.StatusOK:
		return nil, true
	case a.Status != http.StatusBadRequest:
		return nil, false
	}
	var v struct {
		Errors []struct {
			ResourceType string `json:"resource_type"`
			Index        *int   `json:"index"`
			Error        string `json:"error"`
		} `json:"errors"`
	}
	if json.Unmarshal(a.Body, &v) != nil || len(v.Errors) == 0 {
		return nil, false
	}
	out := make([]rewrite.Rejection, 0, len(v.Errors))
	for _, e := range v.Errors {
		if e.ResourceType != section || e.Index == nil || *e.Index < 0 || *e.Index >= len(items) {
			return nil, false // not about an item: nothing to hold back
		}
		out = append(out, rewrite.Rejection{Section: section, Index: *e.Index, Error: e.Error})
	}
	return out, true
}
