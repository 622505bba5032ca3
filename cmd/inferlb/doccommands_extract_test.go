package main

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/inferlb/inferlb/cmd/internal/labcmd"
	"github.com/inferlb/inferlb/cmd/internal/opcmd"
)

// The two binaries' command trees, as the docs and --help texts show them:
// the operator's (inferlb) and the lab's (inferlb-lab, which has the
// operator's commands too).
var (
	operatorRoot = opcmd.NewRoot("")
	labRoot      = labcmd.NewRoot("")
)

// rootOf is the command tree of the binary a command line starts with
// (inferlb, bin/inferlb, ./bin/inferlb-lab ...), nil for another program.
func rootOf(program string) *cobra.Command {
	switch filepath.Base(program) {
	case "inferlb":
		return operatorRoot
	case "inferlb-lab":
		return labRoot
	}
	return nil
}

// findCommand is the command of that name of the operator's binary, else
// of the lab's; nil if neither has it.
func findCommand(name string) *cobra.Command {
	for _, root := range []*cobra.Command{operatorRoot, labRoot} {
		if cmd, _, err := root.Find([]string{name}); err == nil && cmd != root {
			return cmd
		}
	}
	return nil
}

// A documented command: the text of the command as a user would type it,
// and where it is shown.
type shownCommand struct {
	cmd   string
	where string // file:line, or "inferlb X --help"
}

// commandStarts are the programs whose invocations the docs show; a code
// line starting with anything else (output, YAML, a diagram) is not a
// command.
var commandStarts = []string{"inferlb", "bin/inferlb", "./bin/inferlb", "inferlb-lab", "bin/inferlb-lab", "./bin/inferlb-lab", "make", "curl"}

func isCommand(line string) bool {
	first, _, _ := strings.Cut(line, " ")
	for _, s := range commandStarts {
		if first == s {
			return true
		}
	}
	return false
}

// normalizeCommand joins a command's words with single spaces, drops a
// shell prompt, a trailing comment and a trailing "&" (the docs start
// servers in the background).
func normalizeCommand(s string) string {
	s = strings.TrimSpace(s)
	s = strings.TrimPrefix(s, "$ ")
	for i := strings.Index(s, " #"); i >= 0; {
		if before := s[:i]; strings.Count(before, `"`)%2 == 0 && strings.Count(before, `'`)%2 == 0 {
			s = s[:i]
			break
		}
		j := strings.Index(s[i+2:], " #")
		if j < 0 {
			break
		}
		i += 2 + j
	}
	s = strings.Join(strings.Fields(s), " ")
	return strings.TrimSuffix(strings.TrimSuffix(s, "&"), " ")
}

// codeLines returns the commands in a block of code lines (continuations
// ending in "\" joined), with the index of each command's first line.
func codeLines(lines []string) (cmds []string, at []int) {
	for i := 0; i < len(lines); i++ {
		start := i
		line := strings.TrimSpace(lines[i])
		for strings.HasSuffix(line, `\`) && i+1 < len(lines) {
			i++
			line = strings.TrimSuffix(line, `\`) + " " + strings.TrimSpace(lines[i])
		}
		if c := normalizeCommand(line); isCommand(c) {
			cmds = append(cmds, c)
			at = append(at, start)
		}
	}
	return cmds, at
}

var inlineCode = regexp.MustCompile("`([^`\n]+)`")

// markdownCommands extracts the commands a Markdown file shows: every
// command line of its fenced and indented code blocks, and every inline code
// span that invokes a command (more than a bare command name, which names
// the command in prose: "`inferlb demo` starts ...").
func markdownCommands(t *testing.T, path string) []shownCommand {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	var out []shownCommand
	add := func(block []string, first int) {
		cmds, at := codeLines(block)
		for k, c := range cmds {
			out = append(out, shownCommand{c, path + ":" + itoa(first+at[k]+1)})
		}
	}
	inFence, prevBlank := false, true
	var block []string
	blockStart := 0
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "```"):
			if inFence {
				add(block, blockStart)
				block = nil
			} else {
				blockStart = i + 1
			}
			inFence = !inFence
		case inFence:
			block = append(block, line)
		case strings.HasPrefix(line, "    ") && prevBlank:
			// An indented code block runs until a non-indented, non-blank
			// line.
			start := i
			for ; i < len(lines) && (strings.HasPrefix(lines[i], "    ") || strings.TrimSpace(lines[i]) == ""); i++ {
				block = append(block, lines[i])
			}
			add(block, start)
			block = nil
			i--
		case trimmed == "":
		default:
			// Inline code may run over lines: look at the paragraph's
			// lines joined (up to a blank line or a code fence).
			start := i
			para := line
			for i+1 < len(lines) && strings.TrimSpace(lines[i+1]) != "" && !strings.HasPrefix(strings.TrimSpace(lines[i+1]), "```") {
				i++
				para += " " + strings.TrimSpace(lines[i])
			}
			for _, m := range inlineCode.FindAllStringSubmatch(para, -1) {
				if c := normalizeCommand(m[1]); isCommand(c) && invokes(c) {
					out = append(out, shownCommand{c, path + ":" + itoa(start+1)})
				}
			}
			trimmed = strings.TrimSpace(lines[i])
		}
		prevBlank = trimmed == "" || (!inFence && strings.HasPrefix(trimmed, "```"))
	}
	return out
}

// invokes tells an invocation from a command's name: it has words beyond
// the (sub)command path, or it is a make target.
func invokes(c string) bool {
	words := strings.Fields(c)
	if words[0] == "make" || words[0] == "curl" {
		return true
	}
	cmd := rootOf(words[0])
	rest := words[1:]
	for len(rest) > 0 {
		var next *cobra.Command
		for _, sub := range cmd.Commands() {
			if sub.Name() == rest[0] {
				next = sub
			}
		}
		if next == nil {
			break
		}
		cmd, rest = next, rest[1:]
	}
	return len(rest) > 0
}

// helpCommands extracts the commands every --help shows: the Example field,
// and the indented command lines of the Long text.
func helpCommands(cmd *cobra.Command) []shownCommand {
	var out []shownCommand
	for _, text := range []string{cmd.Example, indentedOnly(cmd.Long)} {
		cmds, _ := codeLines(strings.Split(text, "\n"))
		for _, c := range cmds {
			out = append(out, shownCommand{c, cmd.CommandPath() + " --help"})
		}
	}
	for _, sub := range cmd.Commands() {
		out = append(out, helpCommands(sub)...)
	}
	return out
}

// indentedOnly keeps a Long text's indented lines (its examples) and blanks
// the prose, which may begin with a command's name ("inferlb balances ...").
func indentedOnly(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if !strings.HasPrefix(l, "  ") {
			lines[i] = ""
		}
	}
	return strings.Join(lines, "\n")
}

// shownCommands is every command shown in README.md, docs/*.md and any
// --help.
func shownCommands(t *testing.T, root string) []shownCommand {
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append([]string{filepath.Join(root, "README.md")}, files...)
	var all []shownCommand
	for _, f := range files {
		for _, c := range markdownCommands(t, f) {
			rel, _ := filepath.Rel(root, c.where)
			c.where = rel
			all = append(all, c)
		}
	}
	all = append(all, helpCommands(operatorRoot)...)
	all = append(all, helpCommands(labRoot)...)
	sort.SliceStable(all, func(i, j int) bool { return all[i].cmd < all[j].cmd })
	return all
}

func itoa(n int) string { return strconv.Itoa(n) }

// wrongBinary says why a shown command names the wrong binary ("" if it
// names the right one): what the operator's binary runs (its commands, with
// their flags) is shown as inferlb, and only that; the rest of the lab's as
// inferlb-lab. A binary's bare root (its --help, --version) is its own.
func wrongBinary(c string) string {
	words := strings.Fields(c)
	root := rootOf(words[0])
	if root == nil || len(words) < 2 || strings.HasPrefix(words[1], "-") {
		return ""
	}
	operatorRuns := runs(operatorRoot, words[1:])
	switch {
	case root == operatorRoot && !operatorRuns:
		return "the operator's binary has no such command or flag: show it as inferlb-lab"
	case root == labRoot && operatorRuns:
		return "the operator's binary runs it: show it as inferlb"
	}
	return ""
}

// runs says whether root has the (sub)command args name and every --flag
// the command line gives it (up to a shell operator: a redirection, a pipe).
func runs(root *cobra.Command, args []string) bool {
	cmd := root
	i := 0
	for ; i < len(args); i++ {
		var next *cobra.Command
		for _, sub := range cmd.Commands() {
			if sub.Name() == args[i] {
				next = sub
			}
		}
		if next == nil {
			break
		}
		cmd = next
	}
	if cmd == root {
		return false
	}
	for _, w := range args[i:] {
		if strings.ContainsAny(w[:1], "|><;&") {
			break
		}
		name, ok := strings.CutPrefix(w, "--")
		if !ok || name == "help" {
			continue
		}
		name, _, _ = strings.Cut(name, "=")
		if cmd.Flags().Lookup(name) == nil && cmd.InheritedFlags().Lookup(name) == nil {
			return false
		}
	}
	return true
}

// wrongBinary is not vacuous: it tells each binary's commands apart, flags
// included.
func TestWrongBinaryIsCaught(t *testing.T) {
	for c, wrong := range map[string]bool{
		"inferlb engine-sim --fleet examples/fleet-3region.yaml":     true,
		"inferlb-lab engine-sim --fleet examples/fleet-3region.yaml": false,
		"inferlb-lab extproc --config examples/config/extproc.yaml":  true,
		"inferlb profile --engine-sim":                               true,
		"inferlb-lab profile --engine-sim":                           false,
		"inferlb token > xds-token":                                  false,
		"bin/inferlb-lab --help":                                     false,
		"./bin/inferlb demo --help":                                  true,
	} {
		if got := wrongBinary(c) != ""; got != wrong {
			t.Errorf("wrongBinary(%q) = %q, want wrong: %v", c, wrongBinary(c), wrong)
		}
	}
}
