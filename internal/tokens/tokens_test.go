package tokens

import "testing"

func TestCountMatchesAppend(t *testing.T) {
	cases := []struct {
		in   string
		want int
	}{
		{"", 0},
		{"   ", 0},
		{"hello", 1},
		{"hello world", 2},
		{" a  b\tc\nd\r", 4},
		{"abcdefgh", 1},
		{"abcdefghi", 2},
		{"abcdefghijklmnopq", 3},
	}
	for _, c := range cases {
		if got := Count(c.in); got != c.want {
			t.Errorf("Count(%q) = %d, want %d", c.in, got, c.want)
		}
		if got := len(Append(nil, c.in)); got != c.want {
			t.Errorf("len(Append(%q)) = %d, want %d", c.in, got, c.want)
		}
	}
}

func TestEqualPrefixEqualIDs(t *testing.T) {
	a := Append(nil, "the quick brown fox")
	b := Append(nil, "the quick brown dog jumps")
	for i := 0; i < 3; i++ {
		if a[i] != b[i] {
			t.Fatalf("token %d differs for equal prefix", i)
		}
	}
	if a[3] == b[3] {
		t.Fatalf("fox and dog hash equal")
	}
}

func TestChatPrefix(t *testing.T) {
	turn1 := []Message{{"system", "be brief"}, {"user", "hi there"}}
	turn2 := append(append([]Message{}, turn1...), Message{"assistant", "hello"}, Message{"user", "more"})
	a, b := AppendChat(nil, turn1), AppendChat(nil, turn2)
	if len(a) != CountChat(turn1) || len(b) != CountChat(turn2) {
		t.Fatalf("CountChat disagrees with AppendChat")
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("turn 1 is not a prefix of turn 2 at %d", i)
		}
	}
}

func FuzzCount(f *testing.F) {
	f.Add("hello world")
	f.Add("abcdefghijklmnop \t x")
	f.Fuzz(func(t *testing.T, s string) {
		if Count(s) != len(Append(nil, s)) {
			t.Fatalf("Count and Append disagree on %q", s)
		}
	})
}

func BenchmarkCount220KB(b *testing.B) {
	buf := make([]byte, 0, 220<<10)
	for len(buf) < 220<<10 {
		buf = append(buf, "lorem ipsum dolor sit amet "...)
	}
	s := string(buf)
	b.SetBytes(int64(len(s)))
	for b.Loop() {
		Count(s)
	}
}
