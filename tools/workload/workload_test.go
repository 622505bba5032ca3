package workload

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/inferlb/inferlb/internal/tokens"
	"github.com/inferlb/inferlb/internal/words"
)

// sharedData is a full trace of the repository's data/traces.
func sharedData(t testing.TB, name string) string {
	p := filepath.Join("..", "..", "data", "traces", name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("full trace not available: %v", err)
	}
	return p
}

func TestMooncakePromptsSharePrefixesLikeTheirIDs(t *testing.T) {
	rows := []MooncakeRow{
		{Timestamp: 0, InputLength: 1000, OutputLength: 5, HashIDs: []int{1, 2}},
		{Timestamp: 10, InputLength: 1400, OutputLength: 5, HashIDs: []int{1, 2, 3}},
		{Timestamp: 20, InputLength: 900, OutputLength: 5, HashIDs: []int{1, 4}},
		{Timestamp: 30, InputLength: 600, OutputLength: 5, HashIDs: []int{9}}, // padded past its one block
	}
	for _, f := range []Format{Chat, Completion} {
		m, err := NewMooncake(rows, MooncakeOptions{Format: f})
		if err != nil {
			t.Fatal(err)
		}
		reqs := Slice(m, 10)
		if len(reqs) != 4 {
			t.Fatalf("%v: got %d requests", f, len(reqs))
		}
		ids := make([][]uint64, len(reqs))
		for i, r := range reqs {
			if r.PromptTokens != rows[i].InputLength {
				t.Errorf("%v row %d: %d prompt tokens, want %d", f, i, r.PromptTokens, rows[i].InputLength)
			}
			if r.MaxTokens != 5 || r.Offset != time.Duration(rows[i].Timestamp)*time.Millisecond {
				t.Errorf("%v row %d: max tokens %d offset %v", f, i, r.MaxTokens, r.Offset)
			}
			if f == Chat {
				ids[i] = tokens.AppendChat(nil, r.Messages)
			} else {
				ids[i] = tokens.Append(nil, r.Prompt)
			}
			if len(ids[i]) != r.PromptTokens {
				t.Fatalf("%v row %d: PromptTokens %d but %d token ids", f, i, r.PromptTokens, len(ids[i]))
			}
		}
		common := func(a, b []uint64) int {
			n := 0
			for n < len(a) && n < len(b) && a[n] == b[n] {
				n++
			}
			return n
		}
		marker := 0
		if f == Chat {
			marker = 1
		}
		// Rows 0 and 1 share ids 1,2: row 0 is wholly a prefix of row 1.
		if c := common(ids[0], ids[1]); c != 1000 {
			t.Errorf("%v: rows 0 and 1 share %d tokens, want 1000", f, c)
		}
		// Rows 0 and 2 share id 1 only: 512 words (+ role marker), a few more by chance at most.
		if c := common(ids[0], ids[2]); c < 512+marker || c > 512+marker+2 {
			t.Errorf("%v: rows 0 and 2 share %d tokens, want about %d", f, c, 512+marker)
		}
		if c := common(ids[3], ids[0]); c > marker+2 {
			t.Errorf("%v: unrelated rows share %d tokens", f, c)
		}
	}
}

func TestMooncakeBlockScaleKeepsStructure(t *testing.T) {
	rows, err := LoadMooncake(filepath.Join("testdata", "mooncake_head.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMooncake(rows, MooncakeOptions{BlockTokens: 16, Format: Completion})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range Slice(m, len(rows)) {
		want := max(1, (rows[i].InputLength*16+256)/512)
		if r.PromptTokens != want {
			t.Fatalf("row %d: %d tokens, want %d", i, r.PromptTokens, want)
		}
	}
	capped, _ := NewMooncake(rows, MooncakeOptions{MaxOutputTokens: 2})
	for _, r := range Slice(capped, len(rows)) {
		if r.MaxTokens > 2 {
			t.Fatalf("max output tokens 2, request asks %d", r.MaxTokens)
		}
	}
	if _, err := NewMooncake(rows, MooncakeOptions{BlockTokens: 513}); err == nil {
		t.Fatal("block tokens 513 accepted")
	}
}

func TestMooncakeIdealOfTheSyntheticTrace(t *testing.T) {
	rows, err := LoadMooncake(sharedData(t, "mooncake_synthetic_trace.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3993 {
		t.Fatalf("%d rows, want 3993", len(rows))
	}
	p := MooncakeIdeal(rows, 0)
	// The trace's README: with an unbounded cache, 64% of blocks are prefix hits.
	if s := p.BlockShare(); math.Abs(s-0.64) > 0.005 {
		t.Fatalf("ideal block share %.4f, want 0.64", s)
	}
	ps := MooncakeIdeal(rows, 16)
	if ps.HitBlocks != p.HitBlocks || math.Abs(ps.TokenShare()-p.TokenShare()) > 0.01 {
		t.Fatalf("block scale 16 changed the ideal: %+v vs %+v", ps, p)
	}
	t.Logf("ideal: %d/%d blocks (%.4f), token share %.4f", p.HitBlocks, p.Blocks, p.BlockShare(), p.TokenShare())
}

func TestParseMooncakeErrorsNameTheLine(t *testing.T) {
	good := `{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}`
	cases := []struct{ in, want string }{
		{good + "\n\n{\"timestamp\": 1}", "line 3: missing \"input_length\""},
		{good + "\n" + `{"timestamp": 5, "input_length": 0, "output_length": 2, "hash_ids": []}`, "line 2: input_length 0 out of range"},
		{good + "\n" + `{"timestamp": -1, "input_length": 3, "output_length": 2, "hash_ids": []}`, "line 2: timestamp -1 is negative"},
		{`{"timestamp": 5, "input_length": 3, "output_length": 2, "hash_ids": []}` + "\n" + good, "line 2: timestamp 0 is before"},
		{good + "\nnot json", "line 2: invalid character"},
		{good + "\n" + `{"timestamp": 5, "input_length": 3, "output_length": 2, "hash_ids": [1], "x": 1}`, "line 2: json: unknown field \"x\""},
		{good + "\n" + `{"timestamp": 5, "input_length": 3, "output_length": 2, "hash_ids": [-4]}`, "line 2: hash_ids[0] = -4 is negative"},
		{"", "no rows"},
	}
	for _, c := range cases {
		_, err := ParseMooncake(strings.NewReader(c.in))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseMooncake(%q) error %v, want one containing %q", c.in, err, c.want)
		}
	}
}

func TestAzureReplaysTheTrace(t *testing.T) {
	rows, err := LoadAzure(filepath.Join("testdata", "azure_code_head.csv"))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 100 {
		t.Fatalf("%d rows", len(rows))
	}
	// Row 2: 2023-11-16 18:17:04.0319600 — 52 ms after the first.
	a, err := NewAzure(rows, AzureOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reqs := Slice(a, 1000)
	if len(reqs) != 100 {
		t.Fatalf("%d requests", len(reqs))
	}
	if reqs[1].Offset != 52*time.Millisecond || reqs[1].PromptTokens != 3180 || reqs[1].MaxTokens != 8 {
		t.Fatalf("row 2 became %v offset, %d prompt tokens, %d max tokens", reqs[1].Offset, reqs[1].PromptTokens, reqs[1].MaxTokens)
	}
	for i, r := range reqs {
		if r.PromptTokens != rows[i].ContextTokens || tokens.CountChat(r.Messages) != rows[i].ContextTokens || r.MaxTokens != rows[i].GeneratedTokens {
			t.Fatalf("row %d: %d tokens / %d max, trace says %d / %d", i, r.PromptTokens, r.MaxTokens, rows[i].ContextTokens, rows[i].GeneratedTokens)
		}
	}
}

// A trace has no priorities: a mix is drawn per row, the same for the same
// seed, in the given shares; Mooncake likewise.
func TestTracePriorityMix(t *testing.T) {
	rows, err := LoadAzure(filepath.Join("testdata", "azure_code_head.csv"))
	if err != nil {
		t.Fatal(err)
	}
	many := slices.Repeat(rows, 40) // 4,000 rows
	mix := []Share{{"critical", 1}, {"batch", 3}}
	a, err := NewAzure(many, AzureOptions{Seed: 5, Priorities: mix})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewAzure(many, AzureOptions{Seed: 5, Priorities: mix})
	crit := 0.0
	for i := range many {
		r := a.Request(i)
		if r.Priority != b.Request(i).Priority {
			t.Fatalf("row %d: priority differs between two replays of one seed", i)
		}
		switch r.Priority {
		case "critical":
			crit++
		case "batch":
		default:
			t.Fatalf("row %d: priority %q", i, r.Priority)
		}
	}
	if share := crit / float64(len(many)); math.Abs(share-0.25) > 0.03 {
		t.Fatalf("critical share %.3f, want 0.25", share)
	}
	if none, _ := NewAzure(rows, AzureOptions{}); none.Request(0).Priority != "" {
		t.Fatalf("no mix: priority %q", none.Request(0).Priority)
	}
	mrows, err := LoadMooncake(filepath.Join("testdata", "mooncake_head.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMooncake(mrows, MooncakeOptions{Seed: 5, Priorities: mix})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i := range mrows {
		seen[m.Request(i).Priority] = true
	}
	if !seen["critical"] || !seen["batch"] || len(seen) != 2 {
		t.Fatalf("mooncake priorities %v", seen)
	}
	for _, bad := range [][]Share{{{"x", -1}}, {{"x", 0}}} {
		if _, err := NewAzure(rows, AzureOptions{Priorities: bad}); err == nil || !strings.Contains(err.Error(), "azure: priorities") {
			t.Errorf("azure %v: %v", bad, err)
		}
		if _, err := NewMooncake(mrows, MooncakeOptions{Priorities: bad}); err == nil || !strings.Contains(err.Error(), "mooncake: priorities") {
			t.Errorf("mooncake %v: %v", bad, err)
		}
	}
}

func TestAzureFullTraces(t *testing.T) {
	for name, n := range map[string]int{"AzureLLMInferenceTrace_code.csv": 8819, "AzureLLMInferenceTrace_conv.csv": 19366} {
		rows, err := LoadAzure(sharedData(t, name))
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != n {
			t.Fatalf("%s: %d rows, want %d", name, len(rows), n)
		}
	}
}

func TestParseAzureErrorsNameTheLine(t *testing.T) {
	h := "TIMESTAMP,ContextTokens,GeneratedTokens\n"
	r1 := "2023-11-16 18:17:03.9799600,4808,10\n"
	cases := []struct{ in, want string }{
		{h + r1 + "2023-11-16 18:17:04,abc,3\n", "line 3: ContextTokens: \"abc\" is not an integer"},
		{h + r1 + "2023-11-16 18:17:04,5,0\n", "line 3: GeneratedTokens: 0 out of range"},
		{h + r1 + "16/11/2023 18:17,5,2\n", "line 3: TIMESTAMP \"16/11/2023 18:17\""},
		{h + r1 + "2023-11-16 18:17:04,5\n", "line 3: 2 fields, want 3"},
		{h + r1 + "2023-11-16 18:17:01,5,2\n", "line 3: TIMESTAMP 2023-11-16 18:17:01 is before"},
		{"TIMESTAMP,Context,GeneratedTokens\n" + r1, "line 1: unexpected column \"Context\""},
		{h, "no rows after the header"},
		{"", "empty"},
	}
	for _, c := range cases {
		_, err := ParseAzure(strings.NewReader(c.in))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseAzure(%q) error %v, want one containing %q", c.in, err, c.want)
		}
	}
	// Columns in another order, CRLF line ends.
	rows, err := ParseAzure(strings.NewReader("GeneratedTokens,TIMESTAMP,ContextTokens\r\n7,2023-11-16 18:17:03.5,100\r\n"))
	if err != nil || len(rows) != 1 || rows[0].ContextTokens != 100 || rows[0].GeneratedTokens != 7 || rows[0].Time.Nanosecond() != 500_000_000 {
		t.Fatalf("reordered columns: %+v, %v", rows, err)
	}
}

func TestMultiTurnPromptsGrowTurnByTurn(t *testing.T) {
	m, err := NewMultiTurn(MultiTurnOptions{
		SystemPrompts: 3, SystemPromptTokens: 50, Turns: Range{4, 4},
		UserTokens: Range{5, 10}, OutputTokens: Range{3, 8}, ThinkTime: time.Second, SessionIDs: true, Seed: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	systems := map[string]int{}
	for s := 0; s < 30; s++ {
		r, ok := m.Next(0)
		if !ok || r.Turn != 1 || r.Turns != 4 || r.SessionID == "" || len(r.Messages) != 2 {
			t.Fatalf("first turn: %+v", r)
		}
		systems[r.Messages[0].Content]++
		prevIDs := tokens.AppendChat(nil, r.Messages)
		for turn := 2; ; turn++ {
			answer := words.Words(uint64(turn), r.MaxTokens)
			next, ok := m.FollowUp(r, answer)
			if !ok {
				if turn != 5 {
					t.Fatalf("session ended after %d turns, want 4", turn-1)
				}
				break
			}
			ids := tokens.AppendChat(nil, next.Messages)
			if next.Turn != turn || next.SessionID != r.SessionID || next.PromptTokens != len(ids) {
				t.Fatalf("turn %d: %+v", turn, next)
			}
			// The previous prompt, then the answer as an assistant message, then a user message.
			for i := range prevIDs {
				if ids[i] != prevIDs[i] {
					t.Fatalf("turn %d does not extend turn %d's prompt (token %d)", turn, turn-1, i)
				}
			}
			if next.PromptTokens <= r.PromptTokens+r.MaxTokens || next.Messages[len(next.Messages)-2].Content != answer {
				t.Fatalf("turn %d did not append the answer", turn)
			}
			r, prevIDs = next, ids
		}
	}
	if len(systems) != 3 {
		t.Fatalf("%d distinct system prompts, want 3", len(systems))
	}
}

func TestMultiTurnRegionSurgeAndPriorityMix(t *testing.T) {
	m, err := NewMultiTurn(MultiTurnOptions{
		Priorities: []Share{{"high", 1}, {"low", 3}},
		Regions: []RegionPhase{
			{At: 0, Shares: []Share{{"us-east", 0.5}, {"eu-west", 0.5}}},
			{At: time.Minute, Shares: []Share{{"us-east", 0.1}, {"eu-west", 0.9}}},
		},
		Seed: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	count := func(at time.Duration) (eu, high float64) {
		const n = 4000
		for i := 0; i < n; i++ {
			r, _ := m.Next(at)
			if r.Region == "eu-west" {
				eu++
			}
			if r.Priority == "high" {
				high++
			}
		}
		return eu / n, high / n
	}
	eu0, high0 := count(30 * time.Second)
	eu1, _ := count(90 * time.Second)
	if math.Abs(eu0-0.5) > 0.04 || math.Abs(eu1-0.9) > 0.03 || math.Abs(high0-0.25) > 0.03 {
		t.Fatalf("eu-west share %.3f before the surge, %.3f during; high priority %.3f", eu0, eu1, high0)
	}
}

func TestMultiTurnRejectsBadOptions(t *testing.T) {
	bad := []MultiTurnOptions{
		{Turns: Range{3, 2}},
		{ThinkTime: -time.Second},
		{Priorities: []Share{{"a", 0}}},
		{Regions: []RegionPhase{{At: time.Second, Shares: []Share{{"a", 1}}}}},
		{Format: Completion},
	}
	for _, o := range bad {
		if _, err := NewMultiTurn(o); err == nil {
			t.Errorf("NewMultiTurn(%+v) accepted", o)
		}
	}
	if _, err := ParseShares("a=1,a=2"); err == nil {
		t.Error("duplicate share accepted")
	}
	if _, err := ParseShares("a=-1"); err == nil {
		t.Error("negative share accepted")
	}
	ph, err := ParseRegionPhase("90s:eu=0.8,us=0.2")
	if err != nil || ph.At != 90*time.Second || len(ph.Shares) != 2 {
		t.Fatalf("ParseRegionPhase: %+v %v", ph, err)
	}
	if r, err := ParseRange("3-7"); err != nil || r != (Range{3, 7}) {
		t.Fatalf("ParseRange: %v %v", r, err)
	}
	var fe *FormatError
	if _, err := ParseFormat("xml"); !errors.As(err, &fe) {
		t.Fatalf("ParseFormat(xml): %v", err)
	}
}
