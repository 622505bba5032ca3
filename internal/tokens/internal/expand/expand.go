// Package expand computes the code points whose UTF-8 form grows under the
// normalizations a tokenizer may apply before counting (NFC, NFKC,
// lowercasing). internal/tokens embeds the result as a table (genexpand);
// its test recomputes it, so the table follows golang.org/x/text.
package expand

import (
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Expansion is one code point and the most bytes its form grows by.
type Expansion struct {
	R     rune
	Extra int
}

// Compute returns every growing code point, in order.
func Compute() []Expansion {
	var out []Expansion
	for r := rune(0x80); r <= utf8.MaxRune; r++ {
		if r >= 0xD800 && r <= 0xDFFF {
			continue
		}
		s := string(r)
		extra := 0
		k := norm.NFKC.String(s)
		for _, f := range []string{norm.NFC.String(s), k, strings.ToLower(k), strings.ToLower(s)} {
			extra = max(extra, len(f)-len(s))
		}
		if r == 0x130 { // Rust lowercases İ to "i\u0307" (3 bytes), Go to "i"
			extra = max(extra, 1)
		}
		if extra > 0 {
			out = append(out, Expansion{r, extra})
		}
	}
	return out
}
