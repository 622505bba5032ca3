// Package hf counts tokens with a Hugging Face tokenizer.json, in pure Go.
//
// It implements what counting needs of the tokenizers library's pipeline —
// added (special) tokens, normalizer, pre-tokenizer, model, and the special
// tokens the post-processor adds — for the families LLM servers use:
// byte-level BPE (GPT-2, Llama 3, Qwen, DeepSeek, Mistral's Tekken),
// SentencePiece-style BPE with byte fallback (Llama 2, Mistral v1),
// WordPiece (BERT) and WordLevel. A component it does not implement
// (Unigram models, the Precompiled normalizer, regexes with look-around other
// than the `\s+(?!\S)` idiom) is an error at load time naming the component,
// never a silent approximation: a context-limit decision built on a wrong
// count could undercount.
//
// Counts are exact against the Rust library on the test corpus of three
// shipped tokenizers (GPT-2, Qwen3, all-MiniLM-L6-v2; see testdata/README.md
// and TestGolden). A Tokenizer is immutable and safe for concurrent use.
package hf

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"unicode/utf8"
)

// MaxFileBytes bounds a tokenizer.json (the largest common ones, Qwen's and
// Llama 3's, are about 11 MB; Gemma's 33 MB).
const MaxFileBytes = 64 << 20

// Tokenizer counts tokens of text as the tokenizer.json it was loaded from.
type Tokenizer struct {
	sha    string
	added  *addedVocab
	norm   normalizer // nil: none
	pre    preTokenizer
	model  model
	suffix int // special tokens the post-processor adds to one sequence
	cache  *wordCache
}

// Load reads a tokenizer.json (or a gzip of one) from path.
func Load(path string) (*Tokenizer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// Digest returns the SHA256 a Tokenizer loaded from path would have,
// reading the file but not parsing it (the control plane publishes it;
// ext_proc matches it against the tokenizers it loaded).
func Digest(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	if data, err = gunzip(data); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:]), nil
}

// gunzip returns data, uncompressed if it is a gzip stream.
func gunzip(data []byte) ([]byte, error) {
	if len(data) >= 2 && data[0] == 0x1f && data[1] == 0x8b {
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			return nil, fmt.Errorf("tokenizer: gzip: %w", err)
		}
		data, err = io.ReadAll(io.LimitReader(zr, MaxFileBytes+1))
		if err != nil {
			return nil, fmt.Errorf("tokenizer: gzip: %w", err)
		}
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("tokenizer: larger than %d bytes", MaxFileBytes)
	}
	return data, nil
}

// Parse builds a Tokenizer from the bytes of a tokenizer.json, gzipped or
// not. SHA256 identifies the uncompressed JSON.
func Parse(data []byte) (*Tokenizer, error) {
	data, err := gunzip(data)
	if err != nil {
		return nil, err
	}
	var doc fileDoc
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("tokenizer: not a tokenizer.json: %w", err)
	}
	if len(doc.Model) == 0 || string(doc.Model) == "null" {
		return nil, errors.New("tokenizer: no model")
	}
	sum := sha256.Sum256(data)
	t := &Tokenizer{sha: hex.EncodeToString(sum[:]), cache: newWordCache()}
	if t.norm, err = parseNormalizer(doc.Normalizer, "normalizer"); err != nil {
		return nil, err
	}
	var byteLevel bool
	if t.pre, byteLevel, err = parsePreTokenizer(doc.PreTokenizer, "pre_tokenizer"); err != nil {
		return nil, err
	}
	if t.model, err = parseModel(doc.Model, byteLevel); err != nil {
		return nil, err
	}
	if t.suffix, err = parsePostProcessor(doc.PostProcessor, "post_processor"); err != nil {
		return nil, err
	}
	if t.added, err = newAddedVocab(doc.AddedTokens, t.norm); err != nil {
		return nil, err
	}
	return t, nil
}

// SHA256 is the hex SHA-256 of the tokenizer.json (uncompressed): two
// processes holding the same file agree on it.
func (t *Tokenizer) SHA256() string { return t.sha }

// SpecialTokens is how many special tokens the post-processor adds to a
// single sequence (BOS for Llama 2, [CLS] and [SEP] for BERT): what
// /v1/completions adds to a prompt; chat templates write their own.
func (t *Tokenizer) SpecialTokens() int { return t.suffix }

// Count returns the number of tokens of text, without the post-processor's
// special tokens, as the tokenizers library's
// encode(text, add_special_tokens=False) does. Added tokens written in the
// text (like "<|im_start|>") count as one token each, as they do for a
// server tokenizing a rendered chat template.
func (t *Tokenizer) Count(text string) int { return t.CountUpTo(text, math.MaxInt) }

// CountUpTo is Count when the count is at most limit; past limit it stops
// early and returns some number above limit (a caller deciding whether a
// prompt fits need not tokenize all of a long one).
func (t *Tokenizer) CountUpTo(text string, limit int) int {
	n, off := 0, 0
	t.added.split(text, false, func(seg string, special bool) {
		start := off == 0
		off += len(seg)
		if n > limit {
			return
		}
		if special {
			n++
			return
		}
		if t.norm != nil {
			seg = t.norm.normalize(seg)
		}
		first := true
		t.added.split(seg, true, func(seg string, special bool) {
			st := start && first
			first = false
			if n > limit {
				return
			}
			if special {
				n++
				return
			}
			n += t.countNormalized(seg, st, limit-n)
		})
	})
	return n
}

// countNormalized counts normalized text, stopping once past limit.
func (t *Tokenizer) countNormalized(s string, start bool, limit int) int {
	if s == "" {
		return 0
	}
	n := 0
	t.pre.split(s, start, func(piece string, _ bool) bool {
		if piece == "" {
			return true
		}
		c, ok := t.cache.get(piece)
		if !ok {
			c = t.model.count(piece)
			t.cache.put(piece, c)
		}
		n += c
		return n <= limit
	})
	return n
}

// fileDoc is the part of tokenizer.json this package reads.
type fileDoc struct {
	AddedTokens   []addedTokenDoc `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Model         json.RawMessage `json:"model"`
}

// typeOf reads the "type" of a component; "" for null.
func typeOf(raw json.RawMessage, where string) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var t struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(raw, &t); err != nil {
		return "", fmt.Errorf("tokenizer: %s: %w", where, err)
	}
	if t.Type == "" {
		return "", fmt.Errorf("tokenizer: %s: no type", where)
	}
	return t.Type, nil
}

func unsupported(where, what string) error {
	return fmt.Errorf("tokenizer: %s: %s is not supported (use the bytes bound: omit the model's tokenizer)", where, what)
}

// runeLen is the rune count of s.
func runeLen(s string) int { return utf8.RuneCountInString(s) }
