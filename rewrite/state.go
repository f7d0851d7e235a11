package rewrite

import (
	"fmt"
	"github.com/confshim/confshim/internal/sections"
	"math"
	"strconv"
	"strings"
)

// KnownSections is APISIX's resource key set, from the one table of sections
// (internal/sections). Sections are also discovered from any <name>_conf_version key, so
// a future section needs no code change to be repaired.
var KnownSections = sections.APISIX().Names()

// DefaultPreserve is the contract's default for --preserve: sections owned by
// out-of-band writers, which ADC never models.
var DefaultPreserve = []string{"plugins", "protos", "plugin_configs", "consumer_groups", "secrets"}

// ParseState reads the body of GET /apisix/admin/configs. The returned state keeps
// sub-slices of body.
func ParseState(body []byte) (*State, error) {
	obj, err := scanObject(body, make([]member, 0, 32))
	if err != nil {
		return nil, fmt.Errorf("data plane state: %w", err)
	}
	st := &State{Versions: map[string]float64{}, Items: map[string][]byte{}, ItemsKnown: true}
	for _, m := range obj.members {
		name := m.keyName()
		value := body[m.valueStart:m.valueEnd]
		if section, ok := strings.CutSuffix(name, versionSuffix); ok && section != "" {
			v, err := strconv.ParseFloat(string(value), 64)
			if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
				return nil, fmt.Errorf("data plane state: %s is not a number", name)
			}
			st.Versions[section] = v
			continue
		}
		st.Items[name] = value
	}
	return st, nil
}

// Version returns the data plane's version of section (0 when absent, as in APISIX).
func (s *State) Version(section string) float64 {
	if s == nil {
		return 0
	}
	return s.Versions[section]
}
