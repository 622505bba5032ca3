package hf

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/inferlb/inferlb/internal/tokens"
)

// TestBoundNeverUndercounts: internal/tokens.Bound, the bytes bound used
// without a tokenizer, is at least the real count of the three shipped
// tokenizers on every golden case, raw and as a JSON string (escapes), and
// on adversarial text: the code points that grow most under normalization,
// single bytes of every value, digits, punctuation and emoji runs.
func TestBoundNeverUndercounts(t *testing.T) {
	texts := []string{}
	for _, c := range golden(t) {
		texts = append(texts, c.Text)
	}
	texts = append(texts, adversarial()...)
	for _, name := range shipped {
		tk := load(t, name)
		for _, s := range texts {
			n := tk.Count(s)
			js, _ := json.Marshal(s)
			if b := tokens.Bound([]byte(s)); b < n {
				t.Errorf("%s: Bound(%q) = %d < %d tokens", name, trunc(s), b, n)
			}
			if b := tokens.Bound(js); b-2 < n { // less the quotes
				t.Errorf("%s: Bound(json %q) = %d < %d tokens", name, trunc(s), b-2, n)
			}
		}
	}
}

func adversarial() []string {
	var out []string
	var b strings.Builder
	for r := rune(0x80); r < 0x30000; r++ { // every code point that grows, many times
		if r >= 0xD800 && r <= 0xDFFF || !utf8.ValidRune(r) {
			continue
		}
		if tokens.Bound([]byte(string(r))) > len(string(r)) {
			b.WriteString(strings.Repeat(string(r), 3))
		}
		if b.Len() > 3000 {
			out = append(out, b.String())
			b.Reset()
		}
	}
	out = append(out, b.String())
	bytes := make([]byte, 0, 256)
	for c := 1; c < 128; c++ {
		bytes = append(bytes, byte(c))
	}
	out = append(out, string(bytes), strings.Repeat("1 2 3 ", 200), strings.Repeat("!?", 300), strings.Repeat("👍🏽", 100),
		strings.Repeat("\u0301", 200), strings.Repeat("a\u0301", 200), strings.Repeat("\t \n", 100))
	return out
}

// FuzzBoundNeverUndercounts extends the check to any text.
func FuzzBoundNeverUndercounts(f *testing.F) {
	for _, c := range golden(f) {
		f.Add(c.Text)
	}
	tks := make([]*Tokenizer, 0, len(shipped))
	for _, n := range shipped {
		tks = append(tks, load(f, n))
	}
	f.Fuzz(func(t *testing.T, s string) {
		b := tokens.Bound([]byte(s))
		for i, tk := range tks {
			if n := tk.Count(s); b < n {
				t.Fatalf("%s: Bound(%q) = %d < %d tokens", shipped[i], s, b, n)
			}
		}
	})
}

// TestBoundMargin reports how far the bytes bound overcounts, by kind of
// text (docs/engines.md quotes these ratios): Bound / real tokens, median
// over generated samples of 2–8 KB.
func TestBoundMargin(t *testing.T) {
	rng := rand.New(rand.NewPCG(14, 14))
	words := strings.Fields("the model serves tokens quickly while cache blocks stay warm and requests keep arriving from every region of the fleet")
	kinds := map[string]func() string{
		"english": func() string {
			var b strings.Builder
			for b.Len() < 4000 {
				b.WriteString(words[rng.IntN(len(words))])
				if rng.IntN(12) == 0 {
					b.WriteString(". ")
				} else {
					b.WriteByte(' ')
				}
			}
			return b.String()
		},
		"code": func() string {
			var b strings.Builder
			for i := 0; b.Len() < 4000; i++ {
				fmt.Fprintf(&b, "func f%d(x int) int {\n\tif x > %d {\n\t\treturn x * %d\n\t}\n\treturn g(x)\n}\n\n", i, rng.IntN(1000), rng.IntN(9))
			}
			return b.String()
		},
		"json": func() string {
			var b strings.Builder
			for b.Len() < 4000 {
				fmt.Fprintf(&b, `{"id": %d, "name": "item-%d", "tags": ["a", "b"], "price": %d.%02d}, `, rng.IntN(1e6), rng.IntN(100), rng.IntN(100), rng.IntN(100))
			}
			return b.String()
		},
		"chinese": func() string {
			cjk := []rune("的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可你年生自会那后能对着事其里所去行过家十用发天如然作方成者多日都三小军二无同么经法当起与好看学进种将还分此心前面又定见只主没公从知")
			var b strings.Builder
			for b.Len() < 4000 {
				b.WriteRune(cjk[rng.IntN(len(cjk))])
				if rng.IntN(15) == 0 {
					b.WriteString("，")
				}
			}
			return b.String()
		},
	}
	names := make([]string, 0, len(kinds))
	for k := range kinds {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, kind := range names {
		gen := kinds[kind]
		samples := make([]string, 9)
		for i := range samples {
			samples[i] = gen()
		}
		line := kind + ":"
		for _, name := range shipped {
			tk := load(t, name)
			ratios := make([]float64, len(samples))
			for i, s := range samples {
				ratios[i] = float64(tokens.Bound([]byte(s))) / float64(tk.Count(s))
			}
			sort.Float64s(ratios)
			if ratios[0] < 1 {
				t.Errorf("%s on %s: Bound below the count (ratio %.2f)", name, kind, ratios[0])
			}
			line += fmt.Sprintf(" %s %.2f×", name, ratios[len(ratios)/2])
		}
		t.Log(line)
	}
}
