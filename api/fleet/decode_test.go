package fleet

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestDecodeErrors(t *testing.T) {
	cases := []struct {
		name string
		src  string
		want []string
	}{
		{"empty", "", []string{"empty spec: no YAML document"}},
		{"only a comment", "# nothing\n", []string{"empty spec: no YAML document"}},
		{"two documents", base + "---\nname: x\n", []string{"more than one YAML document; a spec is one document"}},
		{"trailing empty document", base + "---\n# end\n", nil},
		{"syntax", "regions: [\n", []string{"invalid YAML: did not find expected node content"}},
		{"tab indentation", "regions:\n\t- name: r\n", []string{"invalid YAML: found character that cannot start any token"}},
		{"duplicate key", "name: a\nname: b\n", []string{`invalid YAML: mapping key "name" already defined at line 1`}},
		{"document is a list", "- a\n", []string{"spec: must be a mapping, got a list"}},
		{"document is a scalar", "hello\n", []string{`spec: must be a mapping, got "hello"`}},
		{"merge of a scalar", "regions:\n  - {<<: x}\n", []string{`regions[0]: merge key << must refer to a mapping, got "x"`}},
		{"non-string key", "regions:\n  - {[a]: b}\n", []string{"regions[0]: keys must be strings, got a list"}},
		// yaml.v3 panics decoding this (a list key beside <<): never reached.
		{"list key beside merge", "engines: [&a {},{<<, [0000]}]", []string{`engines[1]: merge key << must refer to a mapping, got ""`, "engines[1]: keys must be strings, got a list"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.src))
			if got := errorLines(err); !slices.Equal(got[:min(len(got), len(tc.want))], tc.want) || (tc.want == nil) != (err == nil) {
				t.Errorf("errors:\n got  %q\n want %q (first)", got, tc.want)
			}
		})
	}
}

func TestSizeLimit(t *testing.T) {
	big := []byte(base + "#" + strings.Repeat("x", MaxSpecBytes) + "\n")
	_, err := Parse(big)
	if got := errorLines(err); !slices.Equal(got, []string{fmt.Sprintf("spec larger than %d bytes", MaxSpecBytes)}) {
		t.Errorf("Parse(big): %q", got)
	}
	path := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(path, big, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "spec larger than") {
		t.Errorf("Load(big): %v", err)
	}
}

// TestAliasBomb: nested aliases that expand exponentially are refused
// quickly rather than walked.
func TestAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("a0: &a0 {name: x}\n")
	for i := 1; i < 30; i++ {
		fmt.Fprintf(&b, "a%d: &a%d [*a%d, *a%d, *a%d, *a%d]\n", i, i, i-1, i-1, i-1, i-1)
	}
	b.WriteString("regions: *a29\n")
	_, err := Parse([]byte(b.String()))
	if err == nil {
		t.Fatal("alias bomb accepted")
	}
	if !strings.Contains(err.Error(), "spec too complex") && !strings.Contains(err.Error(), "unknown key") {
		t.Errorf("error: %v", err)
	}
}

// TestAliasCycles: an anchor that contains an alias to itself is refused
// (the walk would not end), and a merge-key bomb is cut off by the budget.
func TestAliasCycles(t *testing.T) {
	cases := []struct{ src, want string }{
		{"regions: [&e {<<: *e}]\n", "regions[0]: alias *e refers to a value that contains it"},
		{"engines: [&e {<<: [*e, *e]}]\n", "engines[0]: alias *e refers to a value that contains it"},
	}
	for _, c := range cases {
		if _, err := Parse([]byte(c.src)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q) = %v, want %q", c.src, err, c.want)
		}
	}
	var b strings.Builder
	b.WriteString("engines:\n  - &a0 {id: e}\n")
	for i := 1; i < 14; i++ { // 4^13 merged mappings
		fmt.Fprintf(&b, "  - &a%d {<<: [*a%d, *a%d, *a%d, *a%d]}\n", i, i-1, i-1, i-1, i-1)
	}
	_, err := Parse([]byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "spec too complex") {
		t.Errorf("merge bomb: %.300v", err)
	}
}

// Anchors, aliases and merge keys work and are checked like plain YAML.
func TestAnchorsAndMerge(t *testing.T) {
	src := edit(t,
		"  - {id: e1, address: \"127.0.0.1:9001\", region: r1, gpu: H100, model: m}\n",
		"  - &e1 {id: e1, address: \"127.0.0.1:9001\", region: r1, gpu: H100, model: m}\n  - {<<: *e1, id: e5, address: \"127.0.0.1:9005\"}\n")
	s := mustParse(t, src)
	if e, ok := s.EngineByID("e5"); !ok || e.Region != "r1" || e.GPU != "H100" {
		t.Errorf("merged engine: %+v %v", e, ok)
	}
	bad := strings.Replace(src, "{id: e1,", "{colour: red, id: e1,", 1)
	_, err := Parse([]byte(bad))
	if got := errorLines(err); !slices.Equal(got, []string{"engines[0].colour: unknown key", "engines[1].colour: unknown key"}) {
		t.Errorf("unknown key through a merge: %q", got)
	}
}

// TestLines: errors carry the input line of their field.
func TestLines(t *testing.T) {
	src := edit(t, "replicas: 2", "replicas: 0", "{name: f2, region: r2}", "{name: f2, region: eu-wst}")
	_, err := Parse([]byte(src))
	var got []string
	for _, fe := range Errors(err) {
		got = append(got, fe.WithLine())
	}
	want := []string{
		`line 10: frontends[1].region: unknown region "eu-wst" (known: "r1", "r2")`,
		"line 27: engines[3].replicas: must be positive, got 0",
	}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestLoadTokenizer: a relative tokenizer path is relative to the spec
// file, Load computes its digest (of the uncompressed JSON), and a file it
// cannot read is an error on the field, with its line.
func TestLoadTokenizer(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "tok"), 0o755); err != nil {
		t.Fatal(err)
	}
	json := []byte(`{"model": {"type": "WordLevel", "vocab": {"a": 0}}}`)
	if err := os.WriteFile(filepath.Join(dir, "tok", "tokenizer.json"), json, 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "fleet.yaml")
	if err := os.WriteFile(path, []byte(edit(t, "max_context_tokens: 131072}", "max_context_tokens: 131072, tokenizer: tok/tokenizer.json}")), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	m := s.Models[0]
	sum := sha256.Sum256(json)
	if m.Tokenizer != filepath.Join(dir, "tok", "tokenizer.json") || m.TokenizerSHA256 != hex.EncodeToString(sum[:]) || m.ChatTemplateTokens != DefaultChatTemplateTokens {
		t.Errorf("model = %+v", m)
	}
	if err := os.WriteFile(path, []byte(edit(t, "max_context_tokens: 131072}", "max_context_tokens: 131072, tokenizer: nope.json}")), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Load(path)
	fes := Errors(err)
	if len(fes) != 1 || fes[0].Path != "models[0].tokenizer" || fes[0].Line != 12 || !strings.Contains(fes[0].Msg, "no such file") {
		t.Errorf("Load(missing tokenizer) = %v (%+v)", err, fes)
	}
}

// TestCheckTokenizer: Check parses the tokenizer as ext_proc would and
// reports a file it refuses on the field, with its line.
func TestCheckTokenizer(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "fleet.yaml")
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("fleet.yaml", edit(t, "max_context_tokens: 131072}", "max_context_tokens: 131072, tokenizer: tok.json}"))
	write("tok.json", `{"model": {"type": "WordLevel", "vocab": {"a": 0}}}`)
	if _, err := Check(path); err != nil {
		t.Fatalf("Check(good tokenizer): %v", err)
	}
	write("tok.json", `{"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}`)
	_, err := Check(path)
	fes := Errors(err)
	if len(fes) != 1 || fes[0].Path != "models[0].tokenizer" || fes[0].Line != 12 || !strings.Contains(fes[0].Msg, "Unigram is not supported") {
		t.Fatalf("Check(Unigram tokenizer) = %v", err)
	}
}

func TestLoadErrors(t *testing.T) {
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing) = %v", err)
	}
	path := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(path, []byte(edit(t, "replicas: 2", "replicas: 0")), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if err == nil || !strings.HasPrefix(err.Error(), "fleet "+path+": engines[3].replicas") {
		t.Errorf("Load(bad) = %v", err)
	}
	if fes := Errors(err); len(fes) != 1 || fes[0].Path != "engines[3].replicas" {
		t.Errorf("Errors(Load(bad)) = %v", fes)
	}
}
