// Package sections is the one table of APISIX's resource sections (apisix/constants.lua)
// and what confshim knows of each: whether its item order matters (§8.1), the field by
// which other items refer to its items (§8.5), how its items are identified. Everything
// else derives from it — the sections confshim knows, the metrics' section labels, the
// order-free sections, the reference fields — so a section APISIX grows is one entry
// here. It imports nothing.
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

// Table is APISIX's resource sections, in apisix/constants.lua's order.
var Table = []Section{
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

// Names are the known sections' names, in the table's order.
func Names() []string {
	out := make([]string, len(Table))
	for i, s := range Table {
		out[i] = s.Name
	}
	return out
}

// Lookup is the known section name (false for one confshim does not know: it is
// handled as order-bound, referenced by nothing, identified by id).
func Lookup(name string) (Section, bool) {
	for _, s := range Table {
		if s.Name == name {
			return s, true
		}
	}
	return Section{}, false
}

// Known reports whether name is a known section.
func Known(name string) bool {
	_, ok := Lookup(name)
	return ok
}

// Reference is a field that refers to an item of another section by id.
type Reference struct{ Field, Section string }

// References are the fields by which items refer to other sections' items.
func References() []Reference {
	var out []Reference
	for _, s := range Table {
		if s.ReferencedBy != "" {
			out = append(out, Reference{Field: s.ReferencedBy, Section: s.Name})
		}
	}
	return out
}
