package rewrite

import (
	"errors"
	"fmt"
	"github.com/confshim/confshim/internal/sections"
	"slices"
	"strings"
)

// Backfill (contract §8.5): an item APISIX rejects is replaced by the copy of the same id
// the data plane last accepted, or left out; every other byte goes to APISIX as the
// client sent it. The splice works inside a section, item by item.

// Hold records that the item at index of section is replaced by with (nil: left out).
func (s *itemSplice) Hold(section string, index int, with []byte) {
	if s.Items == nil {
		s.Items = map[string]map[int][]byte{}
	}
	if s.Items[section] == nil {
		s.Items[section] = map[int][]byte{}
	}
	s.Items[section][index] = with
}

// Held reports whether section's item at index is held back.
func (s *itemSplice) Held(section string, index int) bool {
	_, ok := s.Items[section][index]
	return ok
}

// Apply writes body with the splice applied: only the held items and the set versions
// differ from body's bytes. body must be a JSON object (YAML is never backfilled).
func (s *itemSplice) Apply(body []byte) ([]byte, error) {
	obj, err := scanObject(body, make([]member, 0, 32))
	if err != nil {
		return nil, fmt.Errorf("backfill: %w", err)
	}
	if err := obj.index(); err != nil {
		return nil, err
	}
	return s.applyTo(body, &obj)
}

// applyTo is Apply on a body already scanned and indexed as obj (obj is only read).
func (s *itemSplice) applyTo(body []byte, obj *object) ([]byte, error) {
	e := edits{newValue: make([][]byte, len(obj.members)), drop: make([]bool, len(obj.members))}
	sections := make([]string, 0, len(s.Items))
	for section := range s.Items {
		sections = append(sections, section)
	}
	slices.Sort(sections)
	for _, section := range sections {
		sl := obj.slot(section)
		if sl.items < 0 {
			return nil, errors.New("backfill: " + clip(section) + " has no items in the body")
		}
		m := obj.members[sl.items]
		items, ok := s.split[section]
		if !ok {
			var err error
			if items, err = splitItems(section, body[m.valueStart:m.valueEnd]); err != nil {
				return nil, err
			}
		}
		out := make([]byte, 0, m.valueEnd-m.valueStart)
		out = append(out, '[')
		for i, it := range items {
			raw := it.Raw
			if with, held := s.Items[section][i]; held {
				if with == nil {
					continue
				}
				raw = with
			}
			if len(out) > 1 {
				out = append(out, ',')
			}
			out = append(out, raw...)
		}
		e.newValue[sl.items] = append(out, ']')
	}
	for section, items := range s.Replace {
		sl := obj.slot(section)
		if sl.items < 0 {
			return nil, errors.New("backfill: " + clip(section) + " has no items in the body")
		}
		e.newValue[sl.items] = items
	}
	for section, v := range s.Versions {
		e.setVersion(obj, obj.slot(section).version, section, v)
	}
	slices.SortFunc(e.inserts, func(a, b insert) int { return strings.Compare(string(a.name), string(b.name)) })
	return e.apply(nil, body, obj), nil
}

// references lists an item's references by id, by a scan of its top-level members (no
// decode: a fallback looks at every item of the PUT). A field given twice counts as
// lua-cjson reads it: the last one.
func references(table sections.Table, item []byte) []reference {
	// the reference fields APISIX resolves by id (not checked on a PUT), from the table
	// of sections
	found := make([][]byte, len(table))
	eachMember(item, func(name string, value []byte) {
		for i, s := range table {
			if s.ReferencedBy != "" && name == s.ReferencedBy {
				found[i] = value
			}
		}
	})
	var out []reference
	for i, s := range table {
		if id := idText(found[i]); id != "" {
			out = append(out, reference{Section: s.Name, ID: id})
		}
	}
	return out
}

// ItemFingerprint identifies an item's content as §5.1 compares it (key order,
// whitespace, escapes and its top-level modifiedIndex do not count).
func (rw *Rewriter) ItemFingerprint(item []byte) uint64 {
	h := rw.hasher()
	wrapped := make([]byte, 0, len(item)+2)
	wrapped = append(append(append(wrapped, '['), item...), ']')
	return h.sectionFingerprint("", wrapped)
}

// SectionSum is the hash the scan keeps of a section's items value (false: no items).
func (p *Prepared) SectionSum(section string) (uint64, bool) {
	sl := p.obj.slot(section)
	if sl.items < 0 {
		return 0, false
	}
	return p.sums[sl.items], true
}
