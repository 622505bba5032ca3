package hf

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// shipped are the tokenizers in testdata (see testdata/README.md).
var shipped = []string{"gpt2", "qwen3", "minilm"}

var loaded sync.Map // name → *Tokenizer

func load(t testing.TB, name string) *Tokenizer {
	t.Helper()
	if v, ok := loaded.Load(name); ok {
		return v.(*Tokenizer)
	}
	tk, err := Load(filepath.Join("testdata", name+".tokenizer.json.gz"))
	if err != nil {
		t.Fatal(err)
	}
	loaded.Store(name, tk)
	return tk
}

type goldenCase struct {
	Text   string         `json:"text"`
	Counts map[string]int `json:"counts"`
}

func golden(t testing.TB) []goldenCase {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cs []goldenCase
	if err := json.Unmarshal(b, &cs); err != nil {
		t.Fatal(err)
	}
	return cs
}

// TestGolden: the loader counts exactly what the Rust tokenizers library
// counts (testdata/golden.py) on every case of the corpus.
func TestGolden(t *testing.T) {
	cases := golden(t)
	for _, name := range shipped {
		t.Run(name, func(t *testing.T) {
			tk := load(t, name)
			bad := 0
			for i, c := range cases {
				want := c.Counts[name]
				if got := tk.Count(c.Text); got != want {
					bad++
					if bad <= 10 {
						t.Errorf("case %d %q: got %d tokens, want %d", i, trunc(c.Text), got, want)
					}
				}
			}
			if bad > 0 {
				t.Errorf("%d of %d cases differ", bad, len(cases))
			}
		})
	}
}

func trunc(s string) string {
	if len(s) > 60 {
		return s[:60] + "…"
	}
	return s
}

// TestConcurrentCount: a Tokenizer is shared by ext_proc's streams.
func TestConcurrentCount(t *testing.T) {
	tk := load(t, "qwen3")
	cases := golden(t)
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, c := range cases[:100] {
				if got := tk.Count(c.Text); got != c.Counts["qwen3"] {
					t.Errorf("%q: %d, want %d", trunc(c.Text), got, c.Counts["qwen3"])
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestSpecialTokensAndDigest(t *testing.T) {
	for name, want := range map[string]int{"gpt2": 0, "qwen3": 0, "minilm": 2} {
		tk := load(t, name)
		if got := tk.SpecialTokens(); got != want {
			t.Errorf("%s: SpecialTokens() = %d, want %d", name, got, want)
		}
		if len(tk.SHA256()) != 64 {
			t.Errorf("%s: SHA256 %q", name, tk.SHA256())
		}
	}
	if load(t, "gpt2").SHA256() == load(t, "qwen3").SHA256() {
		t.Error("different files, same digest")
	}
}

// TestRefused: what the loader does not implement is an error naming the
// component, never a silent approximation.
func TestRefused(t *testing.T) {
	cases := []struct{ name, json, want string }{
		{"not json", `{`, "not a tokenizer.json"},
		{"no model", `{"model": null}`, "no model"},
		{"unigram", `{"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}`, "model type Unigram is not supported"},
		{"precompiled", `{"normalizer": {"type": "Precompiled", "precompiled_charsmap": ""}, "model": {"type": "WordLevel", "vocab": {}}}`, "normalizer Precompiled is not supported"},
		{"lookbehind", `{"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(?<=a)b"}, "behavior": "Isolated"}, "model": {"type": "WordLevel", "vocab": {}}}`, "look-around"},
		{"lookahead elsewhere", `{"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "a(?=b)"}, "behavior": "Isolated"}, "model": {"type": "WordLevel", "vocab": {}}}`, "look-around"},
		{"merge not in vocab", `{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}}`, "not in the vocabulary"},
		{"dropout", `{"model": {"type": "BPE", "vocab": {}, "merges": [], "dropout": 0.1}}`, "dropout"},
		{"unknown pre-tokenizer", `{"pre_tokenizer": {"type": "CharDelimiterSplit"}, "model": {"type": "WordLevel", "vocab": {}}}`, "pre-tokenizer CharDelimiterSplit is not supported"},
	}
	for _, c := range cases {
		_, err := Parse([]byte(c.json))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want it to contain %q", c.name, err, c.want)
		}
	}
}

func TestTranslateRegex(t *testing.T) {
	cases := []struct{ in, want string }{
		{`\s+`, `[\t\n\v\f\r \x{85}\p{Z}]+`},
		{`[^\s\p{L}]`, `[^\t\n\v\f\r \x{85}\p{Z}\p{L}]`},
		{`\d\w`, `\p{Nd}[\p{L}\p{M}\p{Nd}\p{Pc}]`},
		{`\u00e9`, `\x{00e9}`},
		{`a|\s+(?!\S)|\s+`, `a|(?P<inferlbws>[\t\n\v\f\r \x{85}\p{Z}]+)`},
	}
	for _, c := range cases {
		got, _, err := translateRegex(c.in)
		if err != nil || got != c.want {
			t.Errorf("translateRegex(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
}

// FuzzFastPatterns: the hand-written scanners split exactly as the
// translated regexes do.
func FuzzFastPatterns(f *testing.F) {
	for _, c := range golden(f) {
		f.Add(c.Text)
	}
	type pair struct {
		src string
		p   *pattern
	}
	var ps []pair
	for src := range fastPatterns {
		p, err := compilePattern(src, "test")
		if err != nil || p.fast == nil {
			f.Fatalf("%q: %v", src, err)
		}
		ps = append(ps, pair{src, p})
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, p := range ps {
			var a, b [][2]int
			p.p.fast.each(s, func(i, j int) bool { a = append(a, [2]int{i, j}); return true })
			p.p.eachRegex(s, func(i, j int) bool { b = append(b, [2]int{i, j}); return true })
			if !slices.Equal(a, b) {
				t.Fatalf("pattern %q on %q:\nfast  %v\nregex %v", p.src, s, a, b)
			}
		}
	})
}

func FuzzCount(f *testing.F) {
	for _, c := range []string{"hello world", "  \n\t x", "<|im_start|>hi", "a\u0301 你好 👍", "'s 'LL 123456"} {
		f.Add(c)
	}
	tks := make([]*Tokenizer, 0, len(shipped))
	for _, n := range shipped {
		tks = append(tks, load(f, n))
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, tk := range tks {
			if n := tk.Count(s); n < 0 || n > 4*len(s)+4 {
				t.Fatalf("Count(%q) = %d for %d bytes", s, n, len(s))
			}
		}
	})
}

func BenchmarkCount(b *testing.B) {
	text := strings.Repeat("The quick brown fox jumps over the lazy dog; it's 42 degrees. ", 256) // ~16 KB
	for _, name := range shipped {
		tk := load(b, name)
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				tk.Count(text)
			}
		})
		b.Run(name+"/uncached", func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				tk.cache = newWordCache()
				tk.Count(text)
			}
		})
	}
}

func BenchmarkLoad(b *testing.B) {
	for _, name := range shipped {
		data, err := os.ReadFile(filepath.Join("testdata", name+".tokenizer.json.gz"))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if _, err := Parse(data); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestCountUpTo: exact up to the limit; past it, above the limit.
func TestCountUpTo(t *testing.T) {
	tk := load(t, "qwen3")
	for _, c := range golden(t) {
		want := c.Counts["qwen3"]
		for _, limit := range []int{0, want / 2, want - 1, want, want + 10} {
			got := tk.CountUpTo(c.Text, limit)
			if want <= limit && got != want || want > limit && got <= limit {
				t.Fatalf("CountUpTo(%q, %d) = %d; Count is %d", trunc(c.Text), limit, got, want)
			}
		}
	}
}
