package hf

import (
	"unicode"
	"unicode/utf8"
)

// gptScanner matches the split patterns of the GPT-2 and Llama 3 / Qwen
// families by hand, about ten times faster than Go's regexp on the same
// pattern. It implements the regex's alternation exactly (leftmost
// alternative first, greedy runs, the look-ahead of `\s+(?!\S)`); a fuzz
// test checks it against the translated regex.
//
//	GPT-2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//	Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//	Qwen:    the same with \p{N} (one digit)
type gptScanner struct {
	// llama selects the Llama 3 form: case-insensitive contractions, any
	// non-letter-non-digit (not CR/LF) before a letter run, digit runs
	// without a space, others followed by newlines, and the newline
	// alternative.
	llama bool
	// maxDigits bounds a digit run in the Llama form (3 or 1).
	maxDigits int
}

var fastPatterns = map[string]gptScanner{
	gpt2Pattern: {},
	`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`: {llama: true, maxDigits: 3},
	`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`:      {llama: true, maxDigits: 1},
}

// character classes of the patterns
const (
	clOther  = iota // [^\s\p{L}\p{N}]
	clLetter        // \p{L}
	clNumber        // \p{N}
	clSpace         // \s (Oniguruma's, Unicode)
)

var asciiClass = func() (t [128]uint8) {
	for c := 0; c < 128; c++ {
		switch {
		case c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			t[c] = clLetter
		case c >= '0' && c <= '9':
			t[c] = clNumber
		case c == ' ' || c >= '\t' && c <= '\r':
			t[c] = clSpace
		default:
			t[c] = clOther
		}
	}
	return t
}()

func isUniSpace(r rune) bool {
	return r == ' ' || r >= '\t' && r <= '\r' || r == 0x85 || unicode.Is(unicode.Z, r)
}

// at returns the class and width of the character at s[i] (i < len(s)).
func at(s string, i int) (uint8, int, rune) {
	if c := s[i]; c < utf8.RuneSelf {
		return asciiClass[c], 1, rune(c)
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	switch {
	case unicode.IsLetter(r):
		return clLetter, n, r
	case unicode.IsNumber(r):
		return clNumber, n, r
	case isUniSpace(r):
		return clSpace, n, r
	}
	return clOther, n, r
}

// run returns the end of the run of class cl starting at i.
func run(s string, i int, cl uint8) int {
	for i < len(s) {
		c, n, _ := at(s, i)
		if c != cl {
			break
		}
		i += n
	}
	return i
}

func (g gptScanner) each(s string, fn func(start, end int) bool) bool {
	for i := 0; i < len(s); {
		end := g.match(s, i)
		if !fn(i, end) {
			return false
		}
		i = end
	}
	return true
}

// match returns the end of the match starting at i; every character is
// matched by some alternative, so matches tile the text.
func (g gptScanner) match(s string, i int) int {
	c, n, r := at(s, i)
	if r == '\'' && i+1 < len(s) {
		if end := g.contraction(s, i+1); end > 0 {
			return end
		}
	}
	// next is the class of the character after the first.
	next := func() uint8 {
		if i+n >= len(s) {
			return 255
		}
		c2, _, _ := at(s, i+n)
		return c2
	}
	if g.llama {
		// [^\r\n\p{L}\p{N}]?\p{L}+
		if c == clLetter {
			return run(s, i, clLetter)
		}
		if c != clNumber && r != '\r' && r != '\n' {
			if next() == clLetter {
				return run(s, i+n, clLetter)
			}
		}
		// \p{N}{1,k}
		if c == clNumber {
			end, k := i, 0
			for end < len(s) && k < g.maxDigits {
				c2, n2, _ := at(s, end)
				if c2 != clNumber {
					break
				}
				end += n2
				k++
			}
			return end
		}
		// ` ?[^\s\p{L}\p{N}]+[\r\n]*`
		if start := g.otherStart(s, i, c, r); start >= 0 {
			end := run(s, start, clOther)
			for end < len(s) && (s[end] == '\r' || s[end] == '\n') {
				end++
			}
			return end
		}
		// \s*[\r\n]+: up to the last CR/LF of the space run
		if c == clSpace {
			end := run(s, i, clSpace)
			for j := end - 1; j >= i; j-- {
				if s[j] == '\r' || s[j] == '\n' {
					return j + 1
				}
			}
			return spaceRun(s, i, end)
		}
		return i + n // not reached: every class is handled above
	}
	// GPT-2: ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`
	if c == clLetter || c == clNumber {
		return run(s, i, c)
	}
	if r == ' ' {
		if c2 := next(); c2 == clLetter || c2 == clNumber || c2 == clOther {
			return run(s, i+1, c2)
		}
	}
	if c == clOther {
		return run(s, i, clOther)
	}
	return spaceRun(s, i, run(s, i, clSpace))
}

// otherStart: where the run of others of ` ?[^\s\p{L}\p{N}]+` starts, or -1.
func (g gptScanner) otherStart(s string, i int, c uint8, r rune) int {
	if c == clOther {
		return i
	}
	if r == ' ' && i+1 < len(s) {
		if c2, _, _ := at(s, i+1); c2 == clOther {
			return i + 1
		}
	}
	return -1
}

// spaceRun is `\s+(?!\S)|\s+` on the space run [i, end): the run, less its
// last character when text follows and the run has more than one.
func spaceRun(s string, i, end int) int {
	if end < len(s) {
		if _, n := utf8.DecodeLastRuneInString(s[i:end]); end-n > i {
			return end - n
		}
	}
	return end
}

// contraction matches 's|'t|'re|'ve|'m|'ll|'d after the apostrophe at
// j-1 (case-insensitive in the Llama form, where ſ folds to s), returning
// the match end or 0.
func (g gptScanner) contraction(s string, j int) int {
	r, n := utf8.DecodeRuneInString(s[j:])
	low := r
	if g.llama {
		switch {
		case r == 'ſ':
			low = 's'
		case r >= 'A' && r <= 'Z':
			low = r + 'a' - 'A'
		}
	}
	switch low {
	case 's', 't', 'm', 'd':
		return j + n
	case 'r', 'v', 'l':
		if j+n < len(s) {
			r2, n2 := utf8.DecodeRuneInString(s[j+n:])
			if g.llama && r2 >= 'A' && r2 <= 'Z' {
				r2 += 'a' - 'A'
			}
			if (low == 'r' && r2 == 'e') || (low == 'v' && r2 == 'e') || (low == 'l' && r2 == 'l') {
				return j + n + n2
			}
		}
	}
	return 0
}
