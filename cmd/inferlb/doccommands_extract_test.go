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
)

// A documented command: the text of the command as a user would type it,
// and where it is shown.
type shownCommand struct {
	cmd   string
	where string // file:line, or "inferlb X --help"
}

// commandStarts are the programs whose invocations the docs show; a code
// line starting with anything else (output, YAML, a diagram) is not a
// command.
var commandStarts = []string{"inferlb", "bin/inferlb", "./bin/inferlb", "make", "curl"}

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
	cmd := rootCmd
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
	all = append(all, helpCommands(rootCmd)...)
	sort.SliceStable(all, func(i, j int) bool { return all[i].cmd < all[j].cmd })
	return all
}

func itoa(n int) string { return strconv.Itoa(n) }
