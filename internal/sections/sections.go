// Package sections is the one table of APISIX's resource sections (apisix/constants.lua)
// and what confshim knows of each: whether its item order matters (§8.1), the field by
// which other items refer to its items (§8.5), how its items are identified. Everything
// else derives from it — the sections confshim knows, the metrics' section labels, the
// order-free sections, the reference fields — so a section APISIX grows is one entry
// here. The table is a value: code that decides takes one (APISIX's by default), and a
// test builds its own instead of changing APISIX's. It imports nothing.
package sections

// Section is one resource section.
type Section struct {
	Name string
	// OrderFree: the order of its items changes nothing APISIX serves, so they are
	// compared as a set by id (§8.1). In routes, stream_routes, ssls and global_rules
	// order can decide which item matches first or in which order rules run.
	OrderFree bool
	// ReferencedBy is the field by which an item of another section refers to one of
	// these by id ("service_id"), "" when none (§8.5: what refers to an item left out is
	// held back with it).
	ReferencedBy string
	// ByUsername: an item without an id is identified by its username (consumers).
	ByUsername bool
}

// Table is a list of resource sections.
type Table []Section

// APISIX is APISIX's resource sections, in apisix/constants.lua's order. Appending to
// it makes a new table; APISIX's own is not changed.
func APISIX() Table { return apisix[:len(apisix):len(apisix)] }

var apisix = Table{
	{Name: "routes"},
	{Name: "services", OrderFree: true, ReferencedBy: "service_id"},
	{Name: "upstreams", OrderFree: true, ReferencedBy: "upstream_id"},
	{Name: "consumers", OrderFree: true, ByUsername: true},
	{Name: "consumer_groups", OrderFree: true, ReferencedBy: "group_id"},
	{Name: "ssls"},
	{Name: "global_rules"},
	{Name: "plugin_configs", OrderFree: true, ReferencedBy: "plugin_config_id"},
	{Name: "plugin_metadata", OrderFree: true},
	{Name: "protos", OrderFree: true},
	{Name: "secrets", OrderFree: true},
	{Name: "stream_routes"},
	{Name: "plugins"},
}

// Names are the table's sections' names, in its order.
func (t Table) Names() []string {
	out := make([]string, len(t))
	for i, s := range t {
		out[i] = s.Name
	}
	return out
}

// Lookup is the section name in the table (false for one it does not hold: it is
// handled as order-bound, referenced by nothing, identified by id).
func (t Table) Lookup(name string) (Section, bool) {
	for _, s := range t {
		if s.Name == name {
			return s, true
		}
	}
	return Section{}, false
}

// Known reports whether name is in the table.
func (t Table) Known(name string) bool {
	_, ok := t.Lookup(name)
	return ok
}

// Reference is a field that refers to an item of another section by id.
type Reference struct{ Field, Section string }

// References are the fields by which items refer to other sections' items.
func (t Table) References() []Reference {
	var out []Reference
	for _, s := range t {
		if s.ReferencedBy != "" {
			out = append(out, Reference{Field: s.ReferencedBy, Section: s.Name})
		}
	}
	return out
}
