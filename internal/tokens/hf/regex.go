package hf

import (
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"
)

// pattern is a tokenizer.json regex (Oniguruma syntax) run by Go's regexp.
//
// The translation keeps Oniguruma's Unicode meaning of the classes Go reads
// as ASCII (\s, \S, \d, \w), turns \uXXXX into \x{XXXX}, and supports the one
// look-around every GPT-style pattern uses, the trailing `\s+(?!\S)|\s+`:
// it becomes `(\s+)`, and a match of that group followed by more text gives
// back its last character (which then starts the next match), as the
// look-ahead would have. Any other look-around, atomic group or possessive
// quantifier is refused.
type pattern struct {
	re *regexp.Regexp
	// ws is the submatch index of the look-ahead group's start (0: none).
	ws int
	// fast, when set, matches instead of re (a well-known pattern).
	fast *gptScanner
}

const (
	uniSpace    = `\t\n\v\f\r \x{85}\p{Z}`
	uniWord     = `\p{L}\p{M}\p{Nd}\p{Pc}`
	lookIdiom   = `\s+(?!\S)|\s+`
	lookGroupRE = `(?P<inferlbws>[` + uniSpace + `]+)`
)

func compilePattern(src, where string) (*pattern, error) {
	tr, idiom, err := translateRegex(src)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: regex %q: %w", where, src, err)
	}
	re, err := regexp.Compile(tr)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: regex %q: %w", where, src, err)
	}
	p := &pattern{re: re}
	if idiom {
		p.ws = 2 * re.SubexpIndex("inferlbws")
	}
	if g, ok := fastPatterns[src]; ok {
		p.fast = &g
	}
	return p, nil
}

func literalPattern(s string) *pattern {
	return &pattern{re: regexp.MustCompile(regexp.QuoteMeta(s))}
}

// translateRegex rewrites an Oniguruma pattern for Go's regexp.
func translateRegex(src string) (string, bool, error) {
	idiom := false
	if i := strings.Index(src, lookIdiom); i >= 0 {
		if !topLevel(src, i) || strings.Contains(src[i+len(lookIdiom):], "(?!") {
			return "", false, fmt.Errorf("look-ahead inside a group is not supported")
		}
		idiom = true
	}
	var b strings.Builder
	inClass := false
	classStart := -1
	for i := 0; i < len(src); i++ {
		if idiom && !inClass && strings.HasPrefix(src[i:], lookIdiom) {
			b.WriteString(lookGroupRE)
			i += len(lookIdiom) - 1
			continue
		}
		c := src[i]
		switch {
		case c == '\\':
			if i+1 >= len(src) {
				return "", false, fmt.Errorf("trailing backslash")
			}
			i++
			e := src[i]
			switch e {
			case 's':
				if inClass {
					b.WriteString(uniSpace)
				} else {
					b.WriteString("[" + uniSpace + "]")
				}
			case 'S':
				if inClass {
					return "", false, fmt.Errorf(`\S inside a character class is not supported`)
				}
				b.WriteString("[^" + uniSpace + "]")
			case 'w':
				if inClass {
					b.WriteString(uniWord)
				} else {
					b.WriteString("[" + uniWord + "]")
				}
			case 'W':
				if inClass {
					return "", false, fmt.Errorf(`\W inside a character class is not supported`)
				}
				b.WriteString("[^" + uniWord + "]")
			case 'd':
				b.WriteString(`\p{Nd}`)
			case 'D':
				b.WriteString(`\P{Nd}`)
			case 'u':
				if i+4 >= len(src) {
					return "", false, fmt.Errorf(`short \u escape`)
				}
				b.WriteString(`\x{` + src[i+1:i+5] + `}`)
				i += 4
			case 'p', 'P':
				// \pL or \p{Name}: copied whole, so its '}' is not read
				// as the end of a repetition.
				end := i + 1
				if end < len(src) && src[end] == '{' {
					if k := strings.IndexByte(src[end:], '}'); k >= 0 {
						end += k
					}
				}
				if end >= len(src) {
					return "", false, fmt.Errorf(`unterminated \%c`, e)
				}
				b.WriteString(src[i-1 : end+1])
				i = end
			case 'h', 'H', 'R', 'X', 'K', 'G', 'k', 'g':
				return "", false, fmt.Errorf(`\%c is not supported`, e)
			default:
				b.WriteByte('\\')
				b.WriteByte(e)
			}
		case c == '[' && !inClass:
			inClass, classStart = true, i
			b.WriteByte(c)
			if i+1 < len(src) && src[i+1] == '^' {
				b.WriteByte('^')
				i++
			}
			// A ']' right after '[' or '[^' is a literal.
			if i+1 < len(src) && src[i+1] == ']' {
				b.WriteString(`\]`)
				i++
			}
		case c == '[' && inClass:
			if i+1 < len(src) && src[i+1] == ':' {
				return "", false, fmt.Errorf("POSIX bracket classes are not supported")
			}
			b.WriteString(`\[`)
		case c == ']' && inClass:
			inClass = false
			b.WriteByte(c)
		case c == '(' && !inClass && strings.HasPrefix(src[i:], "(?"):
			rest := src[i+2:]
			for _, bad := range []string{"=", "!", "<=", "<!", ">"} {
				if strings.HasPrefix(rest, bad) {
					return "", false, fmt.Errorf("look-around and atomic groups are not supported")
				}
			}
			b.WriteByte(c)
		case (c == '+' || c == '?' || c == '*' || c == '}') && !inClass && i+1 < len(src) && src[i+1] == '+':
			return "", false, fmt.Errorf("possessive quantifiers are not supported")
		default:
			b.WriteByte(c)
		}
	}
	if inClass {
		return "", false, fmt.Errorf("unterminated character class at byte %d", classStart)
	}
	return b.String(), idiom, nil
}

// topLevel reports whether byte i of src is outside every group and class.
func topLevel(src string, i int) bool {
	depth, inClass := 0, false
	for j := 0; j < i; j++ {
		switch c := src[j]; {
		case c == '\\':
			j++
		case inClass:
			if c == ']' {
				inClass = false
			}
		case c == '[':
			inClass = true
		case c == '(':
			depth++
		case c == ')':
			depth--
		}
	}
	return depth == 0 && !inClass
}

// each calls fn with every match of the pattern in s, left to right,
// until fn returns false (then each returns false).
func (p *pattern) each(s string, fn func(start, end int) bool) bool {
	if p.fast != nil {
		return p.fast.each(s, fn)
	}
	return p.eachRegex(s, fn)
}

// eachRegex is each by the regexp.
func (p *pattern) eachRegex(s string, fn func(start, end int) bool) bool {
	if p.ws == 0 {
		for _, m := range p.re.FindAllStringIndex(s, -1) {
			if !fn(m[0], m[1]) {
				return false
			}
		}
		return true
	}
	pos := 0
	for pos < len(s) {
		m := p.re.FindStringSubmatchIndex(s[pos:])
		if m == nil {
			return true
		}
		start, end := pos+m[0], pos+m[1]
		if m[p.ws] >= 0 && end < len(s) {
			// \s+(?!\S): leave the last space for the next match.
			if _, n := utf8.DecodeLastRuneInString(s[start:end]); end-n > start {
				end -= n
			}
		}
		if end == start { // an empty match: step over one character
			_, n := utf8.DecodeRuneInString(s[start:])
			pos = start + max(n, 1)
			continue
		}
		if !fn(start, end) {
			return false
		}
		pos = end
	}
	return true
}
