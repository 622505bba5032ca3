package hf

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites text before pre-tokenization. Counting needs no
// offsets, so a normalizer is a plain string function.
type normalizer interface {
	normalize(s string) string
}

type normFunc func(string) string

func (f normFunc) normalize(s string) string { return f(s) }

type normSeq []normalizer

func (q normSeq) normalize(s string) string {
	for _, n := range q {
		s = n.normalize(s)
	}
	return s
}

type patternDoc struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

func parseNormalizer(raw json.RawMessage, where string) (normalizer, error) {
	typ, err := typeOf(raw, where)
	if err != nil || typ == "" {
		return nil, err
	}
	var d struct {
		Normalizers        []json.RawMessage `json:"normalizers"`
		Pattern            patternDoc        `json:"pattern"`
		Content            string            `json:"content"`
		Prepend            string            `json:"prepend"`
		StripLeft          bool              `json:"strip_left"`
		StripRight         bool              `json:"strip_right"`
		CleanText          bool              `json:"clean_text"`
		HandleChineseChars bool              `json:"handle_chinese_chars"`
		StripAccents       *bool             `json:"strip_accents"`
		Lowercase          bool              `json:"lowercase"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", where, err)
	}
	switch typ {
	case "Sequence":
		var q normSeq
		for i, r := range d.Normalizers {
			n, err := parseNormalizer(r, fmt.Sprintf("%s.normalizers[%d]", where, i))
			if err != nil {
				return nil, err
			}
			if n != nil {
				q = append(q, n)
			}
		}
		return q, nil
	case "NFC":
		return normFunc(norm.NFC.String), nil
	case "NFD":
		return normFunc(norm.NFD.String), nil
	case "NFKC":
		return normFunc(norm.NFKC.String), nil
	case "NFKD":
		return normFunc(norm.NFKD.String), nil
	case "Lowercase":
		return normFunc(lower), nil
	case "StripAccents":
		return normFunc(stripMarks), nil
	case "Strip":
		left, right := d.StripLeft, d.StripRight
		return normFunc(func(s string) string {
			if left {
				s = strings.TrimLeftFunc(s, unicode.IsSpace)
			}
			if right {
				s = strings.TrimRightFunc(s, unicode.IsSpace)
			}
			return s
		}), nil
	case "Prepend":
		p := d.Prepend
		return normFunc(func(s string) string {
			if s == "" {
				return s
			}
			return p + s
		}), nil
	case "Replace":
		content := d.Content
		switch {
		case d.Pattern.String != nil:
			old := *d.Pattern.String
			if old == "" {
				return normFunc(func(s string) string { return s }), nil
			}
			return normFunc(func(s string) string { return strings.ReplaceAll(s, old, content) }), nil
		case d.Pattern.Regex != nil:
			re, err := compilePattern(*d.Pattern.Regex, where+".pattern")
			if err != nil {
				return nil, err
			}
			return normFunc(func(s string) string {
				var b strings.Builder
				last := 0
				re.each(s, func(start, end int) bool {
					b.WriteString(s[last:start])
					b.WriteString(content)
					last = end
					return true
				})
				b.WriteString(s[last:])
				return b.String()
			}), nil
		}
		return nil, fmt.Errorf("tokenizer: %s: Replace without a pattern", where)
	case "BertNormalizer":
		strip := d.Lowercase
		if d.StripAccents != nil {
			strip = *d.StripAccents
		}
		clean, chinese, low := d.CleanText, d.HandleChineseChars, d.Lowercase
		return normFunc(func(s string) string {
			if clean {
				s = bertClean(s)
			}
			if chinese {
				s = padChinese(s)
			}
			if strip {
				s = stripMarks(s)
			}
			if low {
				s = lower(s)
			}
			return s
		}), nil
	}
	return nil, unsupported(where, "normalizer "+typ)
}

// lower is Unicode lowercase with Rust's full mappings where they differ
// from Go's per-rune simple mapping (U+0130 lowercases to "i̇").
func lower(s string) string {
	if strings.ContainsRune(s, '\u0130') {
		s = strings.ReplaceAll(s, "\u0130", "i\u0307")
	}
	return strings.ToLower(s)
}

// stripMarks decomposes (NFD) and drops nonspacing marks, as the tokenizers
// library's StripAccents does.
func stripMarks(s string) string {
	s = norm.NFD.String(s)
	return strings.Map(func(r rune) rune {
		if unicode.Is(unicode.Mn, r) {
			return -1
		}
		return r
	}, s)
}

// bertClean drops NUL, U+FFFD and control characters and turns whitespace
// into plain spaces.
func bertClean(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r == 0 || r == 0xFFFD || isBertControl(r):
			return -1
		case isBertWhitespace(r):
			return ' '
		}
		return r
	}, s)
}

func isBertWhitespace(r rune) bool {
	switch r {
	case ' ', '\t', '\n', '\r':
		return true
	}
	return unicode.Is(unicode.Zs, r)
}

func isBertControl(r rune) bool {
	switch r {
	case '\t', '\n', '\r':
		return false
	}
	return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Co, unicode.Cs)
}

// isChinese is BERT's CJK ideograph test.
func isChinese(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FFF) || (r >= 0x3400 && r <= 0x4DBF) || (r >= 0x20000 && r <= 0x2A6DF) ||
		(r >= 0x2A700 && r <= 0x2B73F) || (r >= 0x2B740 && r <= 0x2B81F) || (r >= 0x2B920 && r <= 0x2CEAF) ||
		(r >= 0xF900 && r <= 0xFAFF) || (r >= 0x2F800 && r <= 0x2FA1F)
}

func padChinese(s string) string {
	if !strings.ContainsFunc(s, isChinese) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if isChinese(r) {
			b.WriteByte(' ')
			b.WriteRune(r)
			b.WriteByte(' ')
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}
