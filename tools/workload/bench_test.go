package workload

import (
	"path/filepath"
	"testing"
)

// BenchmarkMooncakeRequest builds full-size (512 tokens per hash id) prompts
// of the first rows of the Mooncake trace excerpt: the cost the load
// generator's producer pays per request, off the sending path.
func BenchmarkMooncakeRequest(b *testing.B) {
	rows, err := LoadMooncake(filepath.Join("testdata", "mooncake_head.jsonl"))
	if err != nil {
		b.Fatal(err)
	}
	m, _ := NewMooncake(rows, MooncakeOptions{})
	tokens := 0
	i := 0
	for b.Loop() {
		r := m.Request(i % len(rows))
		tokens += r.PromptTokens
		i++
	}
	b.ReportMetric(float64(tokens)/b.Elapsed().Seconds()/1e6, "Mtokens/s")
}
