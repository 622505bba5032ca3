package words

import (
	"slices"
	"strings"
	"testing"

	"github.com/inferlb/inferlb/internal/tokens"
)

func TestWordsAreOneTokenEach(t *testing.T) {
	for _, n := range []int{0, 1, 2, 5, 512, 1000} {
		s := Words(42, n)
		if got := tokens.Count(s); got != n {
			t.Fatalf("Words(42, %d) has %d tokens", n, got)
		}
		for _, w := range strings.Fields(s) {
			if len(w) < 2 || len(w) > 7 {
				t.Fatalf("word %q is not 2–7 letters", w)
			}
		}
	}
	if !strings.HasPrefix(Words(7, 100), Words(7, 60)) {
		t.Fatal("Words(s, 60) is not a prefix of Words(s, 100)")
	}
	if Words(7, 50) == Words(8, 50) {
		t.Fatal("different seeds gave equal text")
	}
}

// AppendIDs gives the ids the token rule gives Words' text.
func TestAppendIDs(t *testing.T) {
	for _, n := range []int{0, 1, 5, 6, 7, 100} {
		want := tokens.Append(nil, Words(42, n))
		got := AppendIDs(nil, 42, n)
		if !slices.Equal(got, want) {
			t.Fatalf("n=%d: ids differ", n)
		}
	}
}

// Words writes what the Writer writes (the fast path and the general one
// agree), for every small n and a few seeds.
func TestWordsFastPath(t *testing.T) {
	for seed := uint64(0); seed < 5; seed++ {
		for n := 0; n < 40; n++ {
			var w Writer
			w.Add(seed, n)
			if got := Words(seed, n); got != w.String() || w.Len() != n {
				t.Fatalf("seed %d n %d: %q vs %q (%d words)", seed, n, got, w.String(), w.Len())
			}
		}
	}
}

func BenchmarkWords(b *testing.B) {
	b.SetBytes(512 * 6)
	for i := 0; b.Loop(); i++ {
		Words(uint64(i), 512)
	}
}
