package opcmd

import (
	"errors"
	"strings"

	"github.com/spf13/pflag"

	"github.com/inferlb/inferlb/cmd/internal/cliconfig"
)

// keyFlags are the config keys of the control plane's validation
// (controlplane.NewRunner, its cycle and translation options) whose flags
// are not the key's words joined by dashes (see flagsOfKey).
var keyFlags = map[string][]string{
	"deadband_tv":   {"deadband"},
	"penalty.probe": {"probe-rps", "min-probe-share", "max-probe-share"},
	"outlier":       {"outlier-interval", "outlier-base-ejection-time", "outlier-max-ejection-percent"},
}

// flagsOfKey names the flags that set a validation key: "penalty.half_life"
// is --penalty-half-life; "health_check.interval/timeout" is
// --health-check-interval and --health-check-timeout. ok is false when a
// key has no flag.
func flagsOfKey(fs *pflag.FlagSet, key string) (flags []string, ok bool) {
	if fl, ok := keyFlags[key]; ok {
		return fl, true
	}
	parts := strings.Split(key, "/")
	prefix := ""
	if i := strings.LastIndexByte(parts[0], '.'); i >= 0 {
		prefix = parts[0][:i+1]
	}
	for i, p := range parts {
		if i > 0 && !strings.Contains(p, ".") {
			p = prefix + p
		}
		name := strings.NewReplacer("_", "-", ".", "-").Replace(p)
		if fs.Lookup(name) == nil {
			return nil, false
		}
		flags = append(flags, name)
	}
	return flags, true
}

// namingFlags rewrites the config errors of the control plane and ext_proc
// ("control plane: demand_window must be positive", "local_reserve: must
// be in [0, 1)", one per line when there are several) to name the settings
// instead of the config keys: the flag, or the config file's line and key
// (cliconfig.Name).
func namingFlags(fs *pflag.FlagSet, err error) error {
	lines := strings.Split(err.Error(), "\n")
	changed := false
	for i, l := range lines {
		prefix := ""
		for _, p := range []string{"control plane config: ", "control plane: ", ""} {
			if strings.HasPrefix(l, p) {
				prefix = p
				break
			}
		}
		rest := l[len(prefix):]
		end := strings.IndexAny(rest, ": ")
		if end < 0 {
			continue
		}
		flags, ok := flagsOfKey(fs, rest[:end])
		if !ok {
			continue
		}
		for j, f := range flags {
			flags[j] = cliconfig.Name(fs, f)
		}
		lines[i] = prefix + strings.Join(flags, " / ") + rest[end:]
		changed = true
	}
	if !changed {
		return err
	}
	return errors.New(strings.Join(lines, "\n"))
}
