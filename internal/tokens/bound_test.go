package tokens

import (
	"slices"
	"testing"

	"github.com/inferlb/inferlb/internal/tokens/internal/expand"
)

// TestExpansionTableFresh: the generated table is what x/text says today
// (run go generate ./internal/tokens after upgrading golang.org/x/text).
func TestExpansionTableFresh(t *testing.T) {
	want := expand.Compute()
	got := make([]expand.Expansion, len(expansions))
	for i, e := range expansions {
		got[i] = expand.Expansion{R: e.r, Extra: int(e.extra)}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("expand_table.go is stale (%d entries, want %d): run go generate ./internal/tokens", len(got), len(want))
	}
}

// TestMaxBoundFactor: no code point grows by more than MaxBoundFactor
// times its bytes, nor its escape by more than that times 6.
func TestMaxBoundFactor(t *testing.T) {
	for _, e := range expansions {
		n := len(string(e.r))
		if n+int(e.extra) > MaxBoundFactor*n || 6+int(e.extra) > MaxBoundFactor*6 {
			t.Errorf("U+%04X: %d bytes grow by %d", e.r, n, e.extra)
		}
	}
}

func TestBound(t *testing.T) {
	cases := []struct {
		in   string
		want int
	}{
		{"", 0},
		{"hello world", 11},
		{"0123456789abcdefghij", 20},
		{"½", 2 + 3},         // NFKC: "1⁄2"
		{`\u00bd`, 6 + 3},    // the escape counts as what it stands for
		{`\u00BD\n`, 8 + 3},  // upper-case hex; \n is two bytes, no growth
		{"ﷺ", 3 + 30},        // the longest NFKC expansion
		{`\ud83d\ude00`, 12}, // a surrogate pair: 😀 does not grow
		{`\uZZZZ`, 6},        // not an escape of a code point
		{"你好", 6},
		{"İ", 2 + 1}, // lowercases to i + combining dot
		{"plain ascii text that is longer than eight bytes ½", 51 + 3},
	}
	for _, c := range cases {
		if got := Bound([]byte(c.in)); got != c.want {
			t.Errorf("Bound(%q) = %d, want %d", c.in, got, c.want)
		}
	}
}

func FuzzBound(f *testing.F) {
	f.Add([]byte(`{"messages":[{"role":"user","content":"h\u00e9llo ½"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if n := Bound(b); n < len(b) || n > MaxBoundFactor*len(b) {
			t.Fatalf("Bound = %d for %d bytes", n, len(b))
		}
	})
}

func BenchmarkBound(b *testing.B) {
	for _, kind := range []struct {
		name string
		unit string
	}{{"ascii", "lorem ipsum dolor sit amet "}, {"escaped", `line\n\t\"quoted\" `}, {"cjk", "你好世界，今天天气很好。"}} {
		buf := make([]byte, 0, 220<<10)
		for len(buf) < 220<<10 {
			buf = append(buf, kind.unit...)
		}
		b.Run(kind.name+"/220KB", func(b *testing.B) {
			b.SetBytes(int64(len(buf)))
			for b.Loop() {
				Bound(buf)
			}
		})
	}
}
