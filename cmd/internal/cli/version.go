package cli

import (
	"runtime/debug"
	"strings"
)

// readBuildInfo is the build info Go stamped into the running binary (nil
// if none).
func readBuildInfo() *debug.BuildInfo {
	bi, _ := debug.ReadBuildInfo()
	return bi
}

// buildVersion is the linked version if any, else the module version and
// the VCS revision Go stamped into the binary (go build in a checkout), with
// the Go version: e.g. "(devel) 86beff1c3a2b (modified) go1.26.0".
func buildVersion(linked string, bi *debug.BuildInfo) string {
	var parts []string
	if linked != "" {
		parts = append(parts, linked)
	} else if bi != nil && bi.Main.Version != "" {
		parts = append(parts, bi.Main.Version)
	} else {
		parts = append(parts, "(unknown)")
	}
	if bi != nil {
		var rev, modified, at string
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value
			case "vcs.time":
				at = s.Value
			}
		}
		if linked == "" && rev != "" {
			if len(rev) > 12 {
				rev = rev[:12]
			}
			parts = append(parts, rev)
			if modified == "true" {
				parts = append(parts, "(modified)")
			}
			if at != "" {
				parts = append(parts, at)
			}
		}
		parts = append(parts, bi.GoVersion)
	}
	return strings.Join(parts, " ")
}
