package dataplane

import (
	"bytes"
	"encoding/json"
	"slices"

	"github.com/confshim/confshim/rewrite"
)

// Kept is the data plane's whole configuration as of the last write confshim saw
// accepted (contract §8.4): what a re-seed puts back. Immutable once built.
//
// It is derived from the writes confshim forwards (a section APISIX took from the body
// has the body's items, one it kept has what it held before), so a sync costs no extra
// GET. Where it cannot be derived (a YAML body, a section whose earlier copy belongs to
// another state of the data plane), the watch reads the data plane once with GET.
type Kept struct {
	Digest       string             `json:"digest"`
	LastModified string             `json:"last_modified"`
	Versions     map[string]float64 `json:"versions"`
	// Items are the raw JSON values of the sections that hold items.
	Items map[string]json.RawMessage `json:"items"`
	// Owned is the memory of ownership of --merge sections (§8.6). A file without it
	// (an earlier release) reads as no memory; an earlier release ignores it.
	Owned rewrite.Ownership `json:"owned,omitempty"`
}

// keptFromState is the configuration a full state read shows, with the memory of
// ownership confshim has.
func keptFromState(st *rewrite.State, digest, lastModified string, owned rewrite.Ownership) *Kept {
	k := &Kept{Digest: digest, LastModified: lastModified, Versions: map[string]float64{}, Items: map[string]json.RawMessage{}, Owned: owned}
	for s, v := range st.Versions {
		k.Versions[s] = v
		if items := st.Items[s]; !noItems(items) {
			k.Items[s] = bytes.Clone(items)
		}
	}
	return k
}

// derive is the kept configuration after APISIX accepted (202) the PUT of o, decided on
// the state the belief holds, with the one kept before; nil when it cannot be derived
// (the watch then reads it back).
func (b *Belief) derive(o Outcome) *Kept {
	prev, st, digest, lastModified, owned := b.kept, b.state, b.digest, b.lastModify, b.owned
	res, prepared, newDigest, newLastModified, backfilled := o.Res, o.Prepared, o.Digest, o.LastModified, o.Backfilled
	// A version number is not content identity: the earlier kept copy of a section
	// stands for what the data plane holds only if it describes the very state this
	// PUT was decided on (after a restart, another writer may hold other content at
	// the same version).
	prevIsCurrent := prev != nil && lastModified != "" && prev.Digest == digest && prev.LastModified == lastModified
	next := &Kept{Digest: newDigest, LastModified: newLastModified,
		Versions: map[string]float64{}, Items: map[string]json.RawMessage{}, Owned: res.Ownership(owned)}
	for _, sec := range res.Outcomes() {
		next.Versions[sec.Section] = sec.Version
		var items []byte
		switch {
		case sec.FromBody && sec.Items != nil && !slices.Contains(backfilled, sec.Section):
			items = bytes.Clone(sec.Items) // a merged union: what was sent, not the client's items
		case sec.FromBody: // the body's items (a correction's, §8.5: what was sent, not what was decided)
			body, ok := prepared.JSONItems(sec.Section)
			if !ok {
				return nil // YAML items: read back as JSON by the watch
			}
			items = bytes.Clone(body) // the body's buffer goes back to the pool
		case prevIsCurrent && prev.Versions[sec.Section] == sec.Version:
			items = prev.Items[sec.Section] // immutable: shared, not copied again
		case st != nil && st.ItemsKnown: // the state read before this PUT
			items = bytes.Clone(st.Items[sec.Section])
		default:
			return nil
		}
		if !noItems(items) {
			next.Items[sec.Section] = items
		}
	}
	return next
}

// Bytes is the configuration's size as a stored document: its sections' items, which
// are what APISIX decodes at every look (the versions add a few bytes a section). The
// watch judges a look's cost by it before sending one (§8.4).
func (k *Kept) Bytes() int {
	n := 0
	for _, items := range k.Items {
		n += len(items)
	}
	return n
}

// noItems: a section without items — absent, [] or {} (how cjson writes an empty array
// back in a GET). A re-seed never sends such a section's items at all: after 3.18
// APISIX refuses a section that is not an array (spec §13), and the version alone
// leaves it empty just the same.
func noItems(items []byte) bool {
	t := bytes.TrimSpace(items)
	return len(t) == 0 || bytes.Equal(t, []byte("[]")) || bytes.Equal(t, []byte("{}"))
}

// Body is the PUT that restores the configuration: every version, every section's
// items, written as JSON (section names quoted by a JSON encoder, not by Go).
func (k *Kept) Body() ([]byte, error) {
	sections := make([]string, 0, len(k.Versions))
	size := 64
	for s := range k.Versions {
		sections = append(sections, s)
		size += len(s)*2 + 40 + len(k.Items[s])
	}
	slices.Sort(sections)
	b := make([]byte, 0, size)
	b = append(b, '{')
	for i, s := range sections {
		if i > 0 {
			b = append(b, ',')
		}
		name, err := json.Marshal(s + "_conf_version")
		if err != nil {
			return nil, err
		}
		b = append(b, name...)
		b = append(b, ':')
		b = appendNumber(b, k.Versions[s])
		if items := k.Items[s]; !noItems(items) {
			name, _ := json.Marshal(s)
			b = append(b, ',')
			b = append(b, name...)
			b = append(b, ':')
			b = append(b, items...)
		}
	}
	return append(b, '}'), nil
}

func appendNumber(b []byte, v float64) []byte {
	n, _ := json.Marshal(v) // finite: checked when the configuration was kept or read
	return append(b, n...)
}
