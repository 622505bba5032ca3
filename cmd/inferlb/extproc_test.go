package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// ext_proc's admission keys are checked before anything listens, and the
// error names the setting: the flag, or the config file's line and key.
func TestExtprocAdmissionSettings(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ep.yaml")
	if err := os.WriteFile(path, []byte("node-id: n\n\nretry-burst: 0.5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--local-reserve", "1"}, "--local-reserve: must be in [0, 1), got 1"},
		{[]string{"--retry-burst", "0"}, "--retry-burst: must be ≥ 1 and finite, got 0"},
		{[]string{"--config", path}, "config " + path + ": line 3: retry-burst: must be ≥ 1 and finite, got 0.5"},
		{[]string{"--config", path, "--retry-burst", "-1"}, "--retry-burst: must be ≥ 1"},
		{[]string{"--config", path, "--body-limit", "0"}, "--body-limit must be positive, got 0"},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			refused(t, c.want, append([]string{"extproc", "--log-level", "error", "--listen", "127.0.0.1:0", "--http-listen", ""}, c.args...)...)
		})
	}
}
