package workload

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func FuzzParseMooncake(f *testing.F) {
	b, err := os.ReadFile(filepath.Join("testdata", "mooncake_head.jsonl"))
	if err != nil {
		f.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	f.Add(strings.Join(lines[:3], ""))
	f.Add(`{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}`)
	f.Add(`{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}` + "\n{")
	f.Add("\n\n")
	f.Add(`{"timestamp": 1e3, "input_length": 10, "output_length": 2, "hash_ids": null}`)
	f.Fuzz(func(t *testing.T, in string) {
		rows, err := ParseMooncake(strings.NewReader(in))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "mooncake trace") {
				t.Fatalf("error without context: %v", err)
			}
			return
		}
		m, err := NewMooncake(rows, MooncakeOptions{BlockTokens: 4})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < len(rows) && i < 5; i++ {
			if rows[i].InputLength > 5000 {
				continue
			}
			if r := m.Request(i); r.PromptTokens != max(1, (rows[i].InputLength*4+256)/512) {
				t.Fatalf("row %d: %d tokens", i, r.PromptTokens)
			}
		}
		MooncakeIdeal(rows, 4)
	})
}

func FuzzParseAzure(f *testing.F) {
	b, err := os.ReadFile(filepath.Join("testdata", "azure_code_head.csv"))
	if err != nil {
		f.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	f.Add(strings.Join(lines[:4], ""))
	f.Add("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n")
	f.Add("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808\n")
	f.Add("ContextTokens,TIMESTAMP,GeneratedTokens\r\n1,2023-11-16 18:17:03,1\r\n")
	f.Add("")
	f.Fuzz(func(t *testing.T, in string) {
		rows, err := ParseAzure(strings.NewReader(in))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "azure trace") {
				t.Fatalf("error without context: %v", err)
			}
			return
		}
		for i := 1; i < len(rows); i++ {
			if rows[i].Time.Before(rows[i-1].Time) || rows[i].ContextTokens < 1 || rows[i].GeneratedTokens < 1 {
				t.Fatalf("row %d accepted out of order or empty: %+v", i, rows[i])
			}
		}
	})
}
