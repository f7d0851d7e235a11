package rewrite

func (e *edits) setVersion(obj *object, vi int, section string, v float64) {
	text := appendVersion(nil, v)
	if vi >= 0 {
		e.newValue[vi] = text
		return
	}
	e.inserts = append(e.inserts, insert{[]byte(section + versionSuffix), text})
}

// apply builds the output: the input with only the edited bytes changed.
func (e *edits) apply(out, body []byte, obj *object) []byte {
	if need := len(body) + 64*len(e.inserts); cap(out) < need {
		out = make([]byte, 0, need)
	}
	if obj.yaml != nil {
		return e.applyYAML(out, body, obj)
	}
	if len(obj.members) == 0 {
		out = append(out, body[:obj.close]...)
	} else {
		out = append(out, body[:obj.members[0].start]...)
	}
	// A dropped member takes the separator before it along (or after it, when first).
	wrote := false
	for i, m := range obj.members {
		if e.drop[i] {
			continue
		}
		if wrote {
			out = append(out, body[obj.members[i-1].valueEnd:m.start]...)
		}
		out = e.appendMember(out, body, i, m, m.valueEnd)
		wrote = true
	}
	for _, ins := range e.inserts {
		if wrote {
			out = append(out, ',')
		}
		out = append(out, '"')
		out = append(out, ins.name...)
		out = append(out, '"', ':')
		out = append(out, ins.value...)
		wrote = true
	}
	if len(obj.members) == 0 {
		return append(out, body[obj.close:]...)
	}
	return append(out, body[obj.members[len(obj.members)-1].valueEnd:]...)
}

// applyYAML splices a block mapping: every member is whole lines, so a dropped one
// takes its lines along, and an added one is a line of its own before the first member
// (at the end it could change a last block scalar that has no final line break).
func (e *edits) applyYAML(out, body []byte, obj *object) []byte {
	first := obj.close
	if len(obj.members) > 0 {
		first = obj.members[0].start
	}
	out = append(out, body[:first]...)
	for _, ins := range e.inserts {
		out = append(out, ins.name...)
		out = append(out, ':', ' ')
		out = append(out, ins.value...)
		out = append(out, '\n')
	}
	for i, m := range obj.members {
		if !e.drop[i] {
			out = e.appendMember(out, body, i, m, m.end)
		}
	}
	return append(out, body[obj.close:]...)
}

// appendMember writes member i up to end, with its new value if it has one.
func (e *edits) appendMember(out, body []byte, i int, m member, end int) []byte {
	if v := e.newValue[i]; v != nil {
		out = append(out, body[m.start:m.valueStart]...)
		out = append(out, v...)
		return append(out, body[m.valueEnd:end]...)
	}
	return append(out, body[m.start:end]...)
}
