package cliconfig

import (
	"fmt"
	"strings"

	"github.com/spf13/pflag"
)

// Key is one config key as documented: its name (also the flag's), YAML
// type, default and meaning, all read from the flag.
type Key struct {
	Name, Type, Default, Usage string
}

// Keys lists fs's config keys in name order.
func Keys(fs *pflag.FlagSet) []Key {
	var out []Key
	fs.VisitAll(func(f *pflag.Flag) { // VisitAll sorts by name
		if !IsKey(f) {
			return
		}
		k := Key{Name: f.Name, Type: typeName(f), Default: f.DefValue, Usage: f.Usage}
		if _, ok := f.Value.(pflag.SliceValue); ok && k.Default == "[]" {
			k.Default = ""
		}
		out = append(out, k)
	})
	return out
}

func typeName(f *pflag.Flag) string {
	if _, ok := f.Value.(pflag.SliceValue); ok {
		return "list of strings"
	}
	switch t := f.Value.Type(); t {
	case "int", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "integer"
	case "float64", "float32":
		return "number"
	case "duration":
		return "duration"
	case "bool":
		return "bool"
	case "string":
		if isPath(f) {
			return "file"
		}
		return "string"
	default:
		return t
	}
}

// Markdown renders fs's keys as a Markdown table: key, type, default,
// meaning.
func Markdown(fs *pflag.FlagSet) string {
	var b strings.Builder
	b.WriteString("| key | type | default | meaning |\n|---|---|---|---|\n")
	cell := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	for _, k := range Keys(fs) {
		def := "`" + k.Default + "`"
		if k.Default == "" {
			def = ""
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", k.Name, k.Type, cell(def), cell(k.Usage))
	}
	return b.String()
}
