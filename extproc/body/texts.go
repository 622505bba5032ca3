package body

// Texts calls fn with every text a prompt is made of, decoded, and the
// length of its raw JSON form (escapes included, quotes not): the "content"
// strings and "text" parts of chat messages, or the prompt strings of a
// completion. b must be a body Parse accepted; ext_proc calls Texts only
// when a request's bytes bound comes near a class's context limit, to count
// the texts with the model's tokenizer.
func Texts(b []byte, kind Kind, fn func(text string, rawLen int)) {
	p := parser{b: b}
	p.ws()
	if p.peek() != '{' {
		return
	}
	p.i++
	p.eachMember(func(key string) bool {
		switch {
		case key == "messages" && kind == Chat && p.peek() == '[':
			p.eachElement(func() {
				if p.peek() != '{' {
					_ = p.skip(1)
					return
				}
				p.i++
				p.eachMember(func(key string) bool {
					if key != "content" {
						return false
					}
					switch p.peek() {
					case '"':
						p.text(fn)
						return true
					case '[':
						p.eachElement(func() { p.textParts(fn) })
						return true
					}
					return false
				})
			})
			return true
		case key == "prompt" && kind == Completion:
			switch p.peek() {
			case '"':
				p.text(fn)
				return true
			case '[':
				p.eachElement(func() {
					if p.peek() == '"' {
						p.text(fn)
					} else {
						_ = p.skip(1)
					}
				})
				return true
			}
		}
		return false
	})
}

// text reads a string at p.i and hands it to fn.
func (p *parser) text(fn func(string, int)) {
	span, esc, err := p.stringSpan()
	if err != nil {
		return
	}
	raw := p.b[span[0]:span[1]]
	if esc {
		fn(decodeString(raw), len(raw))
	} else {
		fn(string(raw), len(raw))
	}
}

// textParts reads one content part, handing its "text" to fn.
func (p *parser) textParts(fn func(string, int)) {
	if p.peek() != '{' {
		_ = p.skip(2)
		return
	}
	p.i++
	p.eachMember(func(key string) bool {
		if key == "text" && p.peek() == '"' {
			p.text(fn)
			return true
		}
		return false
	})
}

// eachMember walks the members of an object whose '{' was consumed, with
// p.i at each value when it calls f; f reads the value and returns true,
// or returns false to have it skipped.
func (p *parser) eachMember(f func(key string) bool) {
	p.ws()
	if p.peek() == '}' {
		p.i++
		return
	}
	for p.err == nil {
		p.ws()
		span, esc, err := p.stringSpan()
		if err != nil {
			return
		}
		key := string(p.b[span[0]:span[1]])
		if esc {
			key = decodeString(p.b[span[0]:span[1]])
		}
		p.ws()
		if p.peek() != ':' {
			return
		}
		p.i++
		p.ws()
		if !f(key) {
			if p.skip(1) != nil {
				return
			}
		}
		if more, _ := p.sep('}'); more {
			continue
		}
		return
	}
}

// eachElement walks the elements of the array at p.i, calling f with p.i
// at each; f must consume the element.
func (p *parser) eachElement(f func()) {
	p.i++ // '['
	p.ws()
	if p.peek() == ']' {
		p.i++
		return
	}
	for {
		p.ws()
		start := p.i
		f()
		if p.i == start { // f read nothing: do not loop forever
			return
		}
		if more, _ := p.sep(']'); more {
			continue
		}
		return
	}
}
