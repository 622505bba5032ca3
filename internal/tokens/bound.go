package tokens

import (
	"sort"
	"unicode/utf8"
)

//go:generate go run ./internal/genexpand

// MaxBoundFactor bounds Bound(b)/len(b): the longest expansion, U+FDFA
// (3 bytes, 33 under NFKC), is 11 bytes per byte; an escape (6 bytes for at
// most 33) is less. A caller can skip Bound when MaxBoundFactor·len(b)
// already decides.
const MaxBoundFactor = 11

// Bound returns an upper bound on the number of tokens any real tokenizer
// makes of the text in b (a request body, say), whatever its model:
// len(b), plus the bytes that the few code points growing under NFC, NFKC
// or lowercasing add (expansions; a JSON \uXXXX escape counts as the code
// point it stands for).
//
// Why it holds: a byte-level BPE tokenizer (GPT-2, Llama 3, Qwen, DeepSeek,
// Mistral's Tekken) emits at least one byte of its normalized input per
// token; a SentencePiece-style one (Llama 2, Mistral v1, Gemma) at least one
// character or, with byte fallback, one byte, plus the one "▁" it prepends;
// WordPiece at least one character per token. Normalization may lengthen
// text only through the code points of the table; JSON escapes only shorten
// it. What Bound does not cover: tokenizers with NFD or NFKD normalizers
// (they decompose Hangul and accented letters; use the model's
// tokenizer.json), and the tokens a chat template adds beyond the request's
// own bytes (the caller adds the model's chat_template_tokens). The
// TestBound* tests check it against real tokenizers; docs/engines.md gives
// the margin (how much it overcounts) by kind of text.
//
// Bound does not allocate; it reads b once, 8 bytes at a time where b is
// plain ASCII.
func Bound(b []byte) int {
	n := len(b)
	for i := 0; i < len(b); {
		// Skip 8 bytes at once while none is non-ASCII or a backslash.
		for i+8 <= len(b) {
			w := uint64(b[i]) | uint64(b[i+1])<<8 | uint64(b[i+2])<<16 | uint64(b[i+3])<<24 |
				uint64(b[i+4])<<32 | uint64(b[i+5])<<40 | uint64(b[i+6])<<48 | uint64(b[i+7])<<56
			if w&hiBits != 0 || hasZeroByte(w^backslashes) {
				break
			}
			i += 8
		}
		if i >= len(b) {
			break
		}
		c := b[i]
		switch {
		case c == '\\':
			if i+5 < len(b) && b[i+1] == 'u' {
				r, size := unescape(b[i:])
				n += extra(r)
				i += size
			} else {
				i += 2
			}
		case c >= utf8.RuneSelf:
			r, size := utf8.DecodeRune(b[i:])
			n += extra(r)
			i += size
		default:
			i++
		}
	}
	return n
}

const (
	hiBits      = 0x8080808080808080
	loBits      = 0x0101010101010101
	backslashes = 0x5c5c5c5c5c5c5c5c
)

func hasZeroByte(x uint64) bool { return (x-loBits)&^x&hiBits != 0 }

// unescape decodes a \uXXXX escape (and a following low surrogate) at b.
func unescape(b []byte) (rune, int) {
	r, ok := hex4(b[2:6])
	if !ok {
		return utf8.RuneError, 2
	}
	if r >= 0xD800 && r < 0xDC00 && len(b) >= 12 && b[6] == '\\' && b[7] == 'u' {
		if r2, ok := hex4(b[8:12]); ok && r2 >= 0xDC00 && r2 < 0xE000 {
			return (r-0xD800)<<10 + (r2 - 0xDC00) + 0x10000, 12
		}
	}
	return r, 6
}

func hex4(b []byte) (rune, bool) {
	var r rune
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

type expansion struct {
	r     rune
	extra uint8
}

// expandPages marks the 256-code-point pages holding some expansion, so
// that most text (CJK, Cyrillic, emoji) skips the search.
var expandPages = func() (p [(utf8.MaxRune + 1) / 256]bool) {
	for _, e := range expansions {
		p[e.r/256] = true
	}
	return p
}()

// extra is how many bytes r's form grows by under NFC, NFKC or lowercasing.
func extra(r rune) int {
	if r < 0 || r > utf8.MaxRune || !expandPages[r/256] {
		return 0
	}
	i := sort.Search(len(expansions), func(i int) bool { return expansions[i].r >= r })
	if i < len(expansions) && expansions[i].r == r {
		return int(expansions[i].extra)
	}
	return 0
}
