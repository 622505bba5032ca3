// Package cliconfig gives each long-running inferlb command one way to be
// configured: its flags. Every flag (but --config, --help and hidden
// debugging flags) is also a key of a YAML config file given with --config,
// under the flag's own name; a flag given on the command line overrides the
// file. The command's flag set is the one source of truth: the file's schema
// (Apply) and the documentation table (Keys, Markdown) are derived from it,
// so there is no second list of keys to keep in step.
//
// The file is decoded with the fleet spec's decoder (fleet.DecodeStrict):
// unknown keys and values of the wrong kind are refused, all of them, each
// with the file, the line and the key; a value of the right kind is then
// parsed by the flag itself, exactly as on the command line.
package cliconfig

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/inferlb/inferlb/api/fleet"
)

// FlagName is the flag that names the config file.
const FlagName = "config"

// MaxFileBytes bounds a config file (it holds a few dozen keys).
const MaxFileBytes = 1 << 20

// OriginAnnotation is the flag annotation Apply leaves on a flag it set
// from the file: where the value came from, for Name. (Tests that reuse a
// command's flags delete it with the values.)
const OriginAnnotation = "inferlb_config_origin"

// Add gives cmd a --config flag and makes the command apply the file, after
// the command line is parsed and before any other pre-run step and RunE.
func Add(cmd *cobra.Command) {
	cmd.Flags().String(FlagName, "", "YAML file of settings: each key is one of these flags' names (docs/configuration.md); a flag given here overrides the file")
	_ = cmd.MarkFlagFilename(FlagName, "yaml", "yml")
	next := cmd.PreRunE
	cmd.PreRunE = func(c *cobra.Command, args []string) error {
		if path, _ := c.Flags().GetString(FlagName); path != "" {
			if err := Apply(c.Flags(), path); err != nil {
				return err
			}
		}
		if next != nil {
			return next(c, args)
		}
		return nil
	}
}

// IsKey says whether a flag is a config key.
func IsKey(f *pflag.Flag) bool {
	return f.Name != FlagName && f.Name != "help" && !f.Hidden
}

// isPath: a flag marked as naming a file (cobra.MarkFlagFilename). A
// relative path in the file is relative to the file's directory, as the
// fleet spec's tokenizer paths are to the spec's.
func isPath(f *pflag.Flag) bool {
	_, ok := f.Annotations[cobra.BashCompFilenameExt]
	return ok
}

// Apply reads the config file at path and sets each key it holds on fs,
// except the flags already given on the command line. Errors name the file,
// and each problem its line and key, one a line.
func Apply(fs *pflag.FlagSet, path string) error {
	data, err := readFile(path)
	if err != nil {
		return fmt.Errorf("--%s: %w", FlagName, err)
	}
	var flags []*pflag.Flag
	var fields []reflect.StructField
	fs.VisitAll(func(f *pflag.Flag) {
		if !IsKey(f) {
			return
		}
		flags = append(flags, f)
		fields = append(fields, reflect.StructField{
			Name: "F" + strconv.Itoa(len(fields)), Type: docType(f),
			Tag: reflect.StructTag(`yaml:"` + f.Name + `"`),
		})
	})
	doc := reflect.New(reflect.StructOf(fields))
	lines, ferrs := fleet.DecodeStrict(data, doc.Interface(), "config file")
	var errs []string
	for _, fe := range ferrs {
		errs = append(errs, fe.WithLine())
	}
	bad := map[string]bool{}
	for _, fe := range ferrs {
		bad[fe.Path] = true
	}
	for i, f := range flags {
		v := doc.Elem().Field(i)
		if v.IsNil() || bad[f.Name] || f.Changed {
			continue
		}
		line := lines[f.Name]
		if err := set(f, v, filepath.Dir(path)); err != nil {
			fe := fleet.FieldError{Path: f.Name, Line: line, Msg: err.Error()}
			errs = append(errs, fe.WithLine())
			continue
		}
		f.Changed = true
		_ = fs.SetAnnotation(f.Name, OriginAnnotation, []string{fmt.Sprintf("config %s: line %d: %s", path, line, f.Name)})
	}
	if len(errs) > 0 {
		for i, e := range errs {
			errs[i] = "config " + path + ": " + e
		}
		return errors.New(strings.Join(errs, "\n"))
	}
	return nil
}

func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, MaxFileBytes)
	}
	return data, nil
}

// docType is the Go type a key decodes into: the YAML kind the walk checks
// (a number, an integer, true/false, a list), then the flag parses it.
// Durations, addresses and names are strings.
func docType(f *pflag.Flag) reflect.Type {
	if _, ok := f.Value.(pflag.SliceValue); ok {
		return reflect.TypeFor[[]string]()
	}
	switch f.Value.Type() {
	case "bool":
		return reflect.TypeFor[*bool]()
	case "int", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return reflect.TypeFor[*int]()
	case "float64", "float32":
		return reflect.TypeFor[*float64]()
	}
	return reflect.TypeFor[*string]()
}

// set gives f the decoded value v (a pointer or a []string).
func set(f *pflag.Flag, v reflect.Value, dir string) error {
	resolve := func(s string) string {
		if isPath(f) && s != "" && !filepath.IsAbs(s) {
			return filepath.Join(dir, s)
		}
		return s
	}
	if sv, ok := f.Value.(pflag.SliceValue); ok {
		list := v.Interface().([]string)
		for i := range list {
			list[i] = resolve(list[i])
		}
		return sv.Replace(list)
	}
	var s string
	switch x := v.Elem().Interface().(type) {
	case bool:
		s = strconv.FormatBool(x)
	case int:
		s = strconv.Itoa(x)
	case float64:
		s = strconv.FormatFloat(x, 'g', -1, 64)
	case string:
		s = resolve(x)
	}
	if err := f.Value.Set(s); err != nil {
		return fmt.Errorf("invalid %s %q: %v", f.Value.Type(), s, err)
	}
	return nil
}

// Name names the setting of flag name in an error: where its value came
// from, "config FILE: line N: name" for a key of the config file, else
// "--name".
func Name(fs *pflag.FlagSet, name string) string {
	if f := fs.Lookup(name); f != nil {
		if o := f.Annotations[OriginAnnotation]; len(o) == 1 {
			return o[0]
		}
	}
	return "--" + name
}
