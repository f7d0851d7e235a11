package rewrite

// The fallback's policy (contract §8.5), pure: given a body, the items APISIX rejects
// and the copies the data plane last accepted, which items are held back — each
// replaced by its accepted copy (backfilled) or left out — and, to a fixed point, which
// items of the same body refer by id to one left out and must be held back too. Time,
// logging and the network stay with the caller.

// Plan is the fallback's correction of one body: each section of it split once, each
// item's references read once, the splice that builds the corrected body.
type Plan struct {
	body    *Prepared
	items   map[string][]Item
	refs    map[string][][]reference
	leftOut map[reference]bool
	Splice  itemSplice
}

// NewPlan starts a plan for body (the body APISIX was sent).
func NewPlan(body *Prepared) *Plan {
	return &Plan{body: body, items: map[string][]Item{}, refs: map[string][][]reference{}, leftOut: map[reference]bool{}}
}

// Items is section's items in the body, split once.
func (pl *Plan) Items(section string) []Item {
	if items, ok := pl.items[section]; ok {
		return items
	}
	raw, _ := pl.body.JSONItems(section)
	items, err := splitItems(section, raw)
	if err != nil {
		return nil // not kept: Apply splits it again and says why
	}
	pl.items[section] = items
	return items
}

// references is the references of each of section's items, read once.
func (pl *Plan) references(section string) [][]reference {
	if refs, ok := pl.refs[section]; ok {
		return refs
	}
	items := pl.Items(section)
	refs := make([][]reference, len(items))
	for i, it := range items {
		refs[i] = references(pl.body.table, it.Raw)
	}
	pl.refs[section] = refs
	return refs
}

// Hold holds back the rejected items, each replaced by its copy in accepted or left out
// (an index out of range or already held is passed over), then every item that refers
// by id to an item left out, to a fixed point. It returns what it newly held, in order.
func (pl *Plan) Hold(found []Rejection, accepted *Accepted) []Hold {
	var held []Hold
	strands := false
	for _, r := range found {
		strands = pl.holdOne(&held, accepted, Rejection{r.Section, r.Index, r.Error}) || strands
	}
	for strands { // only an item left out can strand another
		strands = pl.holdStranded(&held, accepted)
	}
	return held
}

// holdOne holds one rejected item: backfilled with its accepted copy, else left out.
// It reports whether it was left out (and so may strand what refers to it).
func (pl *Plan) holdOne(held *[]Hold, accepted *Accepted, r Rejection) bool {
	section, index := r.Section, r.Index
	items := pl.Items(section)
	if index < 0 || index >= len(items) {
		return false
	}
	it := items[index]
	h := Hold{Section: section, ID: it.ID, Error: r.Error, Raw: it.Raw}
	if pl.Splice.Held(section, index) {
		if with := pl.Splice.Items[section][index]; with == nil || it.ID == "" {
			return false // left out already
		}
		// rejected again: its accepted copy is refused too (a key another consumer
		// holds on 3.18), so it is left out now, and what refers to it with it
	} else if copyOf, ok := accepted.Lookup(section, it.ID); ok && it.ID != "" {
		pl.Splice.Hold(section, index, copyOf)
		h.Backfilled = true
		*held = append(*held, h)
		return false
	}
	pl.Splice.Hold(section, index, nil)
	pl.leftOut[reference{Section: section, ID: it.ID}] = true
	*held = append(*held, h)
	return true
}

// holdStranded leaves out, once, each item that refers to one left out; true when it
// left one out (which may strand others in turn).
func (pl *Plan) holdStranded(held *[]Hold, accepted *Accepted) bool {
	strands := false
	for _, section := range pl.body.ItemSections() {
		for i, refs := range pl.references(section) {
			if pl.Splice.Held(section, i) {
				continue
			}
			for _, ref := range refs {
				if pl.leftOut[ref] {
					why := "refers to " + ref.Section + " " + clip(ref.ID) + ", which is held back"
					strands = pl.holdOne(held, accepted, Rejection{section, i, why}) || strands
					break
				}
			}
		}
	}
	return strands
}

// OriginalIndex maps an index in the corrected body's array of section back to the
// body's, skipping the items left out (-1 when there is none).
func (pl *Plan) OriginalIndex(section string, corrected int) int {
	pos := -1
	for i := 0; i <= corrected+len(pl.Splice.Items[section]); i++ {
		if with, held := pl.Splice.Items[section][i]; held && with == nil {
			continue
		}
		if pos++; pos == corrected {
			return i
		}
	}
	return -1
}

// IndexOf is the index of the item with id in section (-1 when the body has none).
func (pl *Plan) IndexOf(section, id string) int {
	for i, it := range pl.Items(section) {
		if it.ID == id {
			return i
		}
	}
	return -1
}

// Apply is the corrected body: the body with the plan's splice applied, on the body's
// own scan and the plan's splits (no second scan or split of it).
func (pl *Plan) Apply() ([]byte, error) {
	pl.Splice.split = pl.items // each section split once per plan
	return pl.Splice.applyTo(pl.body.body, &pl.body.obj)
}

// NewAccepted takes each section's raw items (the kept configuration's, or the data
// plane's own).
func NewAccepted(items map[string][]byte) *Accepted {
	return &Accepted{items: items, sections: map[string]map[string][]byte{}}
}

// Refuse marks the accepted copy of section's item id as one the data plane refuses
// now: the item is left out instead of backfilled with it.
func (a *Accepted) Refuse(section, id string) {
	if a.refused == nil {
		a.refused = map[reference]bool{}
	}
	a.refused[reference{Section: section, ID: id}] = true
}

// Lookup is the accepted copy of section's item id.
func (a *Accepted) Lookup(section, id string) ([]byte, bool) {
	if a.refused[reference{Section: section, ID: id}] {
		return nil, false
	}
	byID, ok := a.sections[section]
	if !ok {
		byID = map[string][]byte{}
		list, _ := splitItems(section, a.items[section])
		for _, it := range list {
			if it.ID != "" {
				byID[it.ID] = it.Raw
			}
		}
		a.sections[section] = byID
	}
	raw, found := byID[id]
	return raw, found
}

// ItemSections are the body's sections that carry items.
func (pl *Plan) ItemSections() []string { return pl.body.ItemSections() }

// Fresh is a new plan for the same body, sharing its splits and references (a second
// step corrects the same body anew).
func (pl *Plan) Fresh() *Plan {
	return &Plan{body: pl.body, items: pl.items, refs: pl.refs, leftOut: map[reference]bool{}}
}

// Reapply is §8.5's steady state at its cheapest: when the body carries, for every
// section of corrections, the very client bytes the correction was made for, the body
// with those sections' items replaced by the corrected ones, on the body's own scan (no
// split, no validate); false when any of them changed.
func (p *Prepared) Reapply(corrections map[string]sectionCorrection) ([]byte, bool) {
	if p.yaml || len(corrections) == 0 {
		return nil, false
	}
	replace := make(map[string][]byte, len(corrections))
	for section, c := range corrections {
		if sum, ok := p.SectionSum(section); !ok || sum != c.ClientSum {
			return nil, false
		}
		replace[section] = c.Items
	}
	splice := itemSplice{Replace: replace}
	out, err := splice.applyTo(p.body, &p.obj)
	return out, err == nil
}
