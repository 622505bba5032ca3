package hf

import (
	"container/heap"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"
)

// model counts the tokens of one pre-tokenized piece.
type model interface {
	count(piece string) int
}

func parseModel(raw json.RawMessage, byteLevel bool) (model, error) {
	// One pass over the model (most of the file): its type, vocabulary
	// and merges are read from this one decode.
	var d struct {
		Type                    string          `json:"type"`
		Vocab                   json.RawMessage `json:"vocab"`
		Merges                  json.RawMessage `json:"merges"`
		UnkToken                *string         `json:"unk_token"`
		ContinuingSubwordPrefix *string         `json:"continuing_subword_prefix"`
		EndOfWordSuffix         *string         `json:"end_of_word_suffix"`
		FuseUnk                 bool            `json:"fuse_unk"`
		ByteFallback            bool            `json:"byte_fallback"`
		IgnoreMerges            bool            `json:"ignore_merges"`
		Dropout                 *float64        `json:"dropout"`
		MaxInputCharsPerWord    *int            `json:"max_input_chars_per_word"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, fmt.Errorf("tokenizer: model: %w", err)
	}
	typ := d.Type
	if typ == "" {
		typ = "BPE" // older files omit it for BPE
	}
	var vocab map[string]int32
	if typ != "Unigram" {
		if err := json.Unmarshal(d.Vocab, &vocab); err != nil {
			return nil, fmt.Errorf("tokenizer: model.vocab: %w", err)
		}
	}
	str := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	switch typ {
	case "BPE":
		if d.Dropout != nil && *d.Dropout > 0 {
			return nil, unsupported("model", "BPE dropout")
		}
		return newBPE(vocab, d.Merges, bpeOptions{
			unk: str(d.UnkToken), prefix: str(d.ContinuingSubwordPrefix), suffix: str(d.EndOfWordSuffix),
			fuseUnk: d.FuseUnk, byteFallback: d.ByteFallback, ignoreMerges: d.IgnoreMerges, byteLevel: byteLevel,
		})
	case "WordPiece":
		max := 100
		if d.MaxInputCharsPerWord != nil {
			max = *d.MaxInputCharsPerWord
		}
		prefix := "##"
		if d.ContinuingSubwordPrefix != nil {
			prefix = *d.ContinuingSubwordPrefix
		}
		return &wordPiece{vocab: vocab, prefix: prefix, maxChars: max}, nil
	case "WordLevel":
		return wordLevel{}, nil
	}
	return nil, unsupported("model", "model type "+typ)
}

// wordLevel: every piece is one token (a vocabulary entry or the unknown
// token).
type wordLevel struct{}

func (wordLevel) count(string) int { return 1 }

// wordPiece is BERT's greedy longest-match-first subword model.
type wordPiece struct {
	vocab    map[string]int32
	prefix   string
	maxChars int
}

func (w *wordPiece) count(piece string) int {
	if runeLen(piece) > w.maxChars {
		return 1 // the unknown token
	}
	n := 0
	for start := 0; start < len(piece); {
		end := len(piece)
		found := false
		for end > start {
			sub := piece[start:end]
			if start > 0 {
				sub = w.prefix + sub
			}
			if _, ok := w.vocab[sub]; ok {
				found = true
				break
			}
			_, sz := utf8.DecodeLastRuneInString(piece[start:end])
			end -= sz
		}
		if !found {
			return 1 // the whole word is the unknown token
		}
		n++
		start = end
	}
	return n
}

type bpeOptions struct {
	unk, prefix, suffix                 string
	fuseUnk, byteFallback, ignoreMerges bool
	byteLevel                           bool
}

// bpe is a byte-pair-encoding model: symbols start as characters (or, for
// byte-level vocabularies, bytes) and the pair of lowest merge rank is merged
// until none is left.
type bpe struct {
	opt    bpeOptions
	vocab  map[string]int32
	merges map[uint64]mergeTo // pair of ids → rank and result
	unkID  int32              // -1: none
	// byteID maps a byte to its symbol (byte-level models), or the
	// <0xXX> fallback token (byte_fallback); -1 where the vocabulary has none.
	byteID [256]int32
	// charLevel maps a byte-level vocabulary entry back to bytes, for
	// ignore_merges lookups of a whole piece.
	bytesVocab map[string]int32
}

type mergeTo struct{ rank, id int32 }

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// parseMerges reads merges written as "a b" strings or as [a, b] pairs.
func parseMerges(raw json.RawMessage) ([][2]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var strs []string
	if err := json.Unmarshal(raw, &strs); err == nil {
		out := make([][2]string, len(strs))
		for i, s := range strs {
			a, b, ok := strings.Cut(s, " ")
			if !ok {
				return nil, fmt.Errorf("tokenizer: model.merges[%d]: %q is not two symbols", i, s)
			}
			out[i] = [2]string{a, b}
		}
		return out, nil
	}
	var pairs [][]string
	if err := json.Unmarshal(raw, &pairs); err != nil {
		return nil, fmt.Errorf("tokenizer: model.merges: neither \"a b\" strings nor [a, b] pairs: %w", err)
	}
	out := make([][2]string, len(pairs))
	for i, p := range pairs {
		if len(p) != 2 {
			return nil, fmt.Errorf("tokenizer: model.merges[%d]: want 2 parts, got %d", i, len(p))
		}
		out[i] = [2]string{p[0], p[1]}
	}
	return out, nil
}

func newBPE(vocab map[string]int32, mergesRaw json.RawMessage, opt bpeOptions) (*bpe, error) {
	merges, err := parseMerges(mergesRaw)
	if err != nil {
		return nil, err
	}
	m := &bpe{opt: opt, vocab: vocab, merges: make(map[uint64]mergeTo, len(merges)), unkID: -1}
	if opt.unk != "" {
		if id, ok := vocab[opt.unk]; ok {
			m.unkID = id
		}
	}
	for i := range m.byteID {
		m.byteID[i] = -1
	}
	if opt.byteLevel {
		alpha := byteAlphabet()
		for b := 0; b < 256; b++ {
			if id, ok := vocab[string(alpha[b])]; ok {
				m.byteID[b] = id
			}
		}
		m.bytesVocab = make(map[string]int32, len(vocab))
		for s, id := range vocab {
			if raw, ok := fromAlphabet(s); ok {
				m.bytesVocab[raw] = id
			}
		}
	} else if opt.byteFallback {
		for b := 0; b < 256; b++ {
			if id, ok := vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
				m.byteID[b] = id
			}
		}
	}
	for i, mg := range merges {
		a, b := mg[0], mg[1]
		ia, oka := vocab[a]
		ib, okb := vocab[b]
		if !oka || !okb {
			return nil, fmt.Errorf("tokenizer: model.merges[%d]: %q %q: symbol not in the vocabulary", i, a, b)
		}
		pre := ""
		if opt.prefix != "" && strings.HasPrefix(b, opt.prefix) {
			pre = opt.prefix // a+b drops the continuing prefix of b
		}
		id, ok := vocab[a+strings.TrimPrefix(b, pre)]
		if !ok {
			return nil, fmt.Errorf("tokenizer: model.merges[%d]: %q: merged symbol not in the vocabulary", i, a+b)
		}
		// A repeated pair takes its last rank, as the Rust library's map does.
		m.merges[pairKey(ia, ib)] = mergeTo{rank: int32(i), id: id}
	}
	return m, nil
}

// symbols is the BPE work buffer for one piece.
type symbols struct {
	id         []int32
	prev, next []int32
	h          mergeHeap
}

var symPool = sync.Pool{New: func() any { return new(symbols) }}

func (m *bpe) count(piece string) int {
	if m.opt.ignoreMerges {
		if m.opt.byteLevel {
			if _, ok := m.bytesVocab[piece]; ok {
				return 1
			}
		} else if _, ok := m.vocab[piece]; ok {
			return 1
		}
	}
	w := symPool.Get().(*symbols)
	defer symPool.Put(w)
	w.id = w.id[:0]
	if m.opt.byteLevel {
		for i := 0; i < len(piece); i++ {
			if id := m.byteID[piece[i]]; id >= 0 {
				w.id = append(w.id, id)
			} else if m.unkID >= 0 {
				w.id = append(w.id, m.unkID)
			}
		}
	} else {
		lastUnk := false
		for i, r := range piece {
			s := string(r)
			if i > 0 && m.opt.prefix != "" {
				s = m.opt.prefix + s
			}
			if i+utf8.RuneLen(r) == len(piece) && m.opt.suffix != "" {
				s += m.opt.suffix
			}
			if id, ok := m.vocab[s]; ok {
				w.id = append(w.id, id)
				lastUnk = false
				continue
			}
			if m.opt.byteFallback {
				var buf [4]byte
				n := utf8.EncodeRune(buf[:], r)
				all := true
				for _, b := range buf[:n] {
					all = all && m.byteID[b] >= 0
				}
				if all {
					for _, b := range buf[:n] {
						w.id = append(w.id, m.byteID[b])
					}
					lastUnk = false
					continue
				}
			}
			if m.unkID >= 0 && !(m.opt.fuseUnk && lastUnk) {
				w.id = append(w.id, m.unkID)
			}
			lastUnk = m.unkID >= 0
		}
	}
	return m.merge(w)
}

// merge applies the merges, lowest rank first (leftmost on a tie), and
// returns the number of symbols left. O(n log n) in the piece's length.
func (m *bpe) merge(w *symbols) int {
	n := len(w.id)
	if n < 2 {
		return n
	}
	w.prev, w.next = w.prev[:0], w.next[:0]
	for i := 0; i < n; i++ {
		w.prev = append(w.prev, int32(i-1))
		w.next = append(w.next, int32(i+1))
	}
	w.next[n-1] = -1
	w.h = w.h[:0]
	for i := 0; i+1 < n; i++ {
		if mt, ok := m.merges[pairKey(w.id[i], w.id[i+1])]; ok {
			w.h = append(w.h, cand{rank: mt.rank, pos: int32(i), left: w.id[i], right: w.id[i+1]})
		}
	}
	heap.Init(&w.h)
	left := n
	for w.h.Len() > 0 {
		c := heap.Pop(&w.h).(cand)
		i := c.pos
		j := w.next[i]
		// Stale candidate: a side was merged away or changed.
		if w.id[i] != c.left || j < 0 || w.id[j] != c.right {
			continue
		}
		mt := m.merges[pairKey(c.left, c.right)]
		w.id[i] = mt.id
		w.id[j] = -1 // removed
		nj := w.next[j]
		w.next[i] = nj
		if nj >= 0 {
			w.prev[nj] = i
		}
		left--
		if p := w.prev[i]; p >= 0 {
			if mt2, ok := m.merges[pairKey(w.id[p], w.id[i])]; ok {
				heap.Push(&w.h, cand{rank: mt2.rank, pos: p, left: w.id[p], right: w.id[i]})
			}
		}
		if nj >= 0 {
			if mt2, ok := m.merges[pairKey(w.id[i], w.id[nj])]; ok {
				heap.Push(&w.h, cand{rank: mt2.rank, pos: i, left: w.id[i], right: w.id[nj]})
			}
		}
	}
	return left
}

type cand struct {
	rank, pos   int32
	left, right int32
}

type mergeHeap []cand

func (h mergeHeap) Len() int { return len(h) }
func (h mergeHeap) Less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].pos < h[j].pos
}
func (h mergeHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *mergeHeap) Push(x any)   { *h = append(*h, x.(cand)) }
func (h *mergeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// byteAlphabet is GPT-2's byte → printable character table.
func byteAlphabet() [256]rune {
	var t [256]rune
	n := 0
	for b := 0; b < 256; b++ {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF {
			t[b] = rune(b)
		} else {
			t[b] = rune(256 + n)
			n++
		}
	}
	return t
}

var alphaInverse = sync.OnceValue(func() map[rune]byte {
	inv := make(map[rune]byte, 256)
	for b, r := range byteAlphabet() {
		inv[r] = byte(b)
	}
	return inv
})

// fromAlphabet maps a byte-level vocabulary entry back to its bytes.
func fromAlphabet(s string) (string, bool) {
	inv := alphaInverse()
	out := make([]byte, 0, len(s))
	for _, r := range s {
		b, ok := inv[r]
		if !ok {
			return "", false
		}
		out = append(out, b)
	}
	return string(out), true
}
