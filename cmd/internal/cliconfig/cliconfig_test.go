package cliconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
)

// settings is a command's flag set of every kind of key.
type settings struct {
	interval  time.Duration
	headroom  float64
	history   int
	scale     uint32
	insecure  bool
	listen    string
	fleet     string
	tokenizer []string
	debug     string
}

func newCmd(s *settings) *cobra.Command {
	cmd := &cobra.Command{Use: "x", RunE: func(*cobra.Command, []string) error { return nil }}
	f := cmd.Flags()
	f.DurationVar(&s.interval, "interval", 5*time.Second, "control cycle period")
	f.Float64Var(&s.headroom, "headroom", 0.85, "utilization cap")
	f.IntVar(&s.history, "history", 1800, "cycles kept")
	f.Uint32Var(&s.scale, "weight-scale", 1000, "Envoy weight of a share of 1.0")
	f.BoolVar(&s.insecure, "insecure", false, "no authentication")
	f.StringVar(&s.listen, "listen", "127.0.0.1:1", "address")
	f.StringVar(&s.fleet, "fleet", "", "fleet spec")
	_ = cmd.MarkFlagFilename("fleet", "yaml")
	f.StringArrayVar(&s.tokenizer, "tokenizer", nil, "tokenizer files")
	_ = cmd.MarkFlagFilename("tokenizer", "json")
	f.StringVar(&s.debug, "debug-file", "", "hidden")
	_ = f.MarkHidden("debug-file")
	Add(cmd)
	return cmd
}

func writeFile(t *testing.T, dir, body string) string {
	t.Helper()
	p := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Each branch of reading a config file: what the command then holds, or
// the error, naming the file, the line and the key.
func TestApply(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name string
		file string // "" = no file at that path
		args []string
		want func(s settings) bool
		err  []string // fragments the error must contain (nil: no error)
	}{
		{name: "every kind", file: "interval: 2s\nheadroom: 0.5\nhistory: 10\nweight-scale: 100\ninsecure: true\nlisten: 127.0.0.1:9\n" +
			"fleet: f.yaml\ntokenizer: [a.json, /abs/b.json]\n",
			want: func(s settings) bool {
				return s.interval == 2*time.Second && s.headroom == 0.5 && s.history == 10 && s.scale == 100 && s.insecure &&
					s.listen == "127.0.0.1:9" && s.fleet == filepath.Join(dir, "f.yaml") &&
					len(s.tokenizer) == 2 && s.tokenizer[0] == filepath.Join(dir, "a.json") && s.tokenizer[1] == "/abs/b.json"
			}},
		{name: "an integer number", file: "headroom: 1\n", want: func(s settings) bool { return s.headroom == 1 }},
		{name: "omitted keys keep the defaults", file: "history: 3\n",
			want: func(s settings) bool { return s.history == 3 && s.interval == 5*time.Second && s.headroom == 0.85 }},
		{name: "a null value is omitted", file: "history: ~\n", want: func(s settings) bool { return s.history == 1800 }},
		{name: "flag overrides file", file: "interval: 2s\nhistory: 10\n", args: []string{"--interval", "7s"},
			want: func(s settings) bool { return s.interval == 7*time.Second && s.history == 10 }},
		{name: "flag overrides a bad value too", file: "interval: soon\n", args: []string{"--interval", "7s"},
			want: func(s settings) bool { return s.interval == 7*time.Second }},
		{name: "list flag overrides the file's list", file: "tokenizer: [a.json]\n", args: []string{"--tokenizer", "c.json"},
			want: func(s settings) bool { return len(s.tokenizer) == 1 && s.tokenizer[0] == "c.json" }},
		{name: "missing file", err: []string{"--config: open ", "missing.yaml: no such file"}},
		{name: "empty file", file: "", err: []string{"empty config file: no YAML document"}},
		{name: "bad YAML", file: "interval: 2s\nheadroom: [\n", err: []string{"c.yaml: line 2: invalid YAML"}},
		{name: "a key twice", file: "history: 1\nhistory: 2\n", err: []string{`c.yaml: line 2: invalid YAML: mapping key "history" already defined at line 1`}},
		{name: "two documents", file: "history: 1\n---\nhistory: 2\n", err: []string{"more than one YAML document"}},
		{name: "not a mapping", file: "- interval\n", err: []string{"c.yaml: line 1: config file: must be a mapping, got a list"}},
		{name: "unknown key", file: "interval: 2s\nintreval: 3s\n", err: []string{"c.yaml: line 2: intreval: unknown key"}},
		{name: "config is not a key", file: "config: other.yaml\n", err: []string{"line 1: config: unknown key"}},
		{name: "hidden flags are not keys", file: "debug-file: x\n", err: []string{"line 1: debug-file: unknown key"}},
		{name: "bad duration", file: "history: 2\ninterval: soon\n", err: []string{`c.yaml: line 2: interval: invalid duration "soon"`}},
		{name: "number of the wrong kind", file: "headroom: high\n", err: []string{`line 1: headroom: must be a number, got "high"`}},
		{name: "integer of the wrong kind", file: "history: 1.5\n", err: []string{`line 1: history: must be an integer, got "1.5"`}},
		{name: "integer out of the flag's range", file: "weight-scale: -1\n", err: []string{`line 1: weight-scale: invalid uint32 "-1"`}},
		{name: "bool of the wrong kind", file: "insecure: yes\n", err: []string{`line 1: insecure: must be true or false, got "yes"`}},
		{name: "a list for a single value", file: "listen: [a, b]\n", err: []string{"line 1: listen: must be a string, got a list"}},
		{name: "every problem, one a line", file: "intreval: 3s\nheadroom: high\ninterval: soon\n",
			err: []string{"line 1: intreval: unknown key\n", "line 2: headroom: must be a number", `line 3: interval: invalid duration`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, "missing.yaml")
			if c.name != "missing file" {
				path = writeFile(t, dir, c.file)
			}
			var s settings
			cmd := newCmd(&s)
			cmd.SetArgs(append([]string{"--config", path}, c.args...))
			cmd.SilenceErrors, cmd.SilenceUsage = true, true
			err := cmd.Execute()
			if c.err == nil {
				if err != nil {
					t.Fatal(err)
				}
				if !c.want(s) {
					t.Fatalf("settings %+v", s)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error; settings %+v", s)
			}
			for _, w := range c.err {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\nwant it to contain %q", err, w)
				}
			}
			if c.name != "missing file" {
				for _, l := range strings.Split(err.Error(), "\n") {
					if !strings.HasPrefix(l, "config "+path+": ") {
						t.Errorf("error line %q does not name the file", l)
					}
				}
			}
		})
	}
}

// Name says where a setting came from: the file's line, or the flag.
func TestName(t *testing.T) {
	dir := t.TempDir()
	path := writeFile(t, dir, "history: 2\n\ninterval: 2s\n")
	var s settings
	cmd := newCmd(&s)
	cmd.SetArgs([]string{"--config", path, "--history", "4"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	f := cmd.Flags()
	for key, want := range map[string]string{
		"interval": "config " + path + ": line 3: interval",
		"history":  "--history",
		"headroom": "--headroom",
	} {
		if got := Name(f, key); got != want {
			t.Errorf("Name(%s) = %q, want %q", key, got, want)
		}
	}
}

// The keys are the flags, with their types and defaults; the table is
// one row a key.
func TestKeysAndMarkdown(t *testing.T) {
	var s settings
	cmd := newCmd(&s)
	keys := Keys(cmd.Flags())
	var names []string
	for _, k := range keys {
		names = append(names, k.Name+" "+k.Type+" "+k.Default)
	}
	want := []string{"fleet file ", "headroom number 0.85", "history integer 1800", "insecure bool false", "interval duration 5s",
		"listen string 127.0.0.1:1", "tokenizer list of strings ", "weight-scale integer 1000"}
	if strings.Join(names, "\n") != strings.Join(want, "\n") {
		t.Fatalf("keys:\n%s\nwant:\n%s", strings.Join(names, "\n"), strings.Join(want, "\n"))
	}
	md := Markdown(cmd.Flags())
	if n := strings.Count(md, "\n"); n != len(want)+2 {
		t.Errorf("table has %d lines, want %d:\n%s", n, len(want)+2, md)
	}
	if !strings.Contains(md, "| `interval` | duration | `5s` | control cycle period |") {
		t.Errorf("table:\n%s", md)
	}
}

// Whatever the file holds, Apply answers with a value or an error, never
// a panic.
func FuzzApply(f *testing.F) {
	for _, s := range []string{"interval: 2s\n", "tokenizer: [a]\n", "a: &x [*x]\n", "<<: {history: 1}\n", "- 1\n", "history: 99999999999999999999\n"} {
		f.Add(s)
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, body string) {
		p := filepath.Join(dir, "f.yaml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		var s settings
		_ = Apply(newCmd(&s).Flags(), p)
	})
}
