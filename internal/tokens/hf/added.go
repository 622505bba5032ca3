package hf

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

type addedTokenDoc struct {
	ID         int    `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type addedToken struct {
	content                    string
	singleWord, lstrip, rstrip bool
}

// addedVocab finds added tokens in text, leftmost-longest, as the
// tokenizers library does: tokens that are not "normalized" in the raw
// text, the others (by their normalized form) in the normalized text.
type addedVocab struct {
	raw, normalized matcher
}

// matcher holds tokens by first byte, longest first.
type matcher struct {
	byFirst [256][]addedToken
	any     bool
}

func (m *matcher) add(t addedToken) {
	if t.content == "" {
		return
	}
	b := t.content[0]
	m.byFirst[b] = append(m.byFirst[b], t)
	m.any = true
}

func (m *matcher) sort() {
	for i := range m.byFirst {
		l := m.byFirst[i]
		sort.SliceStable(l, func(a, b int) bool { return len(l[a].content) > len(l[b].content) })
	}
}

func newAddedVocab(docs []addedTokenDoc, n normalizer) (*addedVocab, error) {
	v := &addedVocab{}
	for i, d := range docs {
		if d.Content == "" {
			return nil, fmt.Errorf("tokenizer: added_tokens[%d]: empty content", i)
		}
		t := addedToken{content: d.Content, singleWord: d.SingleWord, lstrip: d.LStrip, rstrip: d.RStrip}
		if d.Normalized {
			if n != nil {
				t.content = n.normalize(t.content)
			}
			v.normalized.add(t)
		} else {
			v.raw.add(t)
		}
	}
	v.raw.sort()
	v.normalized.sort()
	return v, nil
}

// split calls fn with the parts of s in order: added tokens (special true)
// and the text between them.
func (v *addedVocab) split(s string, normalized bool, fn func(seg string, special bool)) {
	m := &v.raw
	if normalized {
		m = &v.normalized
	}
	if !m.any {
		fn(s, false)
		return
	}
	last := 0
	for i := 0; i < len(s); i++ {
		cands := m.byFirst[s[i]]
		if len(cands) == 0 {
			continue
		}
		for _, t := range cands {
			if !strings.HasPrefix(s[i:], t.content) {
				continue
			}
			start, stop := i, i+len(t.content)
			if t.singleWord && (endsWithWord(s[:start]) || startsWithWord(s[stop:])) {
				continue
			}
			if t.lstrip {
				start = max(len(strings.TrimRightFunc(s[:start], unicode.IsSpace)), last)
			}
			if t.rstrip {
				stop = len(s) - len(strings.TrimLeftFunc(s[stop:], unicode.IsSpace))
			}
			if start > last {
				fn(s[last:start], false)
			}
			fn(s[start:stop], true)
			last = stop
			i = stop - 1
			break
		}
	}
	if last < len(s) {
		fn(s[last:], false)
	}
}

func isWordChar(r rune) bool { return unicode.IsLetter(r) || unicode.IsNumber(r) || r == '_' }

func endsWithWord(s string) bool {
	r, n := utf8.DecodeLastRuneInString(s)
	return n > 0 && isWordChar(r)
}

func startsWithWord(s string) bool {
	r, n := utf8.DecodeRuneInString(s)
	return n > 0 && isWordChar(r)
}

// parsePostProcessor returns how many special tokens the post-processor
// adds to a single sequence.
func parsePostProcessor(raw json.RawMessage, where string) (int, error) {
	typ, err := typeOf(raw, where)
	if err != nil || typ == "" {
		return 0, err
	}
	var d struct {
		Processors []json.RawMessage `json:"processors"`
		Single     []struct {
			SpecialToken *struct {
				ID string `json:"id"`
			} `json:"SpecialToken"`
		} `json:"single"`
		SpecialTokens map[string]struct {
			IDs []int `json:"ids"`
		} `json:"special_tokens"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return 0, fmt.Errorf("tokenizer: %s: %w", where, err)
	}
	switch typ {
	case "ByteLevel":
		return 0, nil
	case "BertProcessing", "RobertaProcessing":
		return 2, nil
	case "TemplateProcessing":
		n := 0
		for _, p := range d.Single {
			if p.SpecialToken != nil {
				st, ok := d.SpecialTokens[p.SpecialToken.ID]
				if !ok {
					return 0, fmt.Errorf("tokenizer: %s: special token %q not defined", where, p.SpecialToken.ID)
				}
				n += len(st.IDs)
			}
		}
		return n, nil
	case "Sequence":
		n := 0
		for i, p := range d.Processors {
			k, err := parsePostProcessor(p, fmt.Sprintf("%s.processors[%d]", where, i))
			if err != nil {
				return 0, err
			}
			n += k
		}
		return n, nil
	}
	return 0, unsupported(where, "post-processor "+typ)
}

// wordCache remembers the token count of recent pieces (words repeat:
// a conversation's every turn resends the earlier ones). Sharded, each
// shard cleared when full.
type wordCache struct {
	shards [64]cacheShard
}

type cacheShard struct {
	mu sync.Mutex
	m  map[string]int32 // guarded by mu
}

const (
	cacheShardEntries = 2048
	cacheMaxPiece     = 64 // longer pieces are rare and not cached
)

func newWordCache() *wordCache { return &wordCache{} }

func (c *wordCache) shard(s string) *cacheShard {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint32(s[i])) * 16777619
	}
	return &c.shards[h%uint32(len(c.shards))]
}

func (c *wordCache) get(s string) (int, bool) {
	if len(s) > cacheMaxPiece {
		return 0, false
	}
	sh := c.shard(s)
	sh.mu.Lock()
	v, ok := sh.m[s]
	sh.mu.Unlock()
	return int(v), ok
}

func (c *wordCache) put(s string, n int) {
	if len(s) > cacheMaxPiece {
		return
	}
	sh := c.shard(s)
	sh.mu.Lock()
	if sh.m == nil || len(sh.m) >= cacheShardEntries {
		sh.m = make(map[string]int32, cacheShardEntries)
	}
	sh.m[strings.Clone(s)] = int32(n)
	sh.mu.Unlock()
}
