package opcmd

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
		{[]string{"--body-limit", "1000", "--max-body-memory", "999"}, "--max-body-memory must be at least --body-limit (1000), got 999"},
		{[]string{"--max-messages", "0"}, "--max-messages must be positive, or -1 for no bound, got 0"},
		{[]string{"--max-messages", "-2"}, "--max-messages must be positive, or -1 for no bound, got -2"},
		{[]string{"--idle-memory", "-1"}, "--idle-memory must not be negative (0: never trim), got -1"},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			refused(t, c.want, append([]string{"extproc", "--log-level", "error", "--listen", "127.0.0.1:0", "--http-listen", ""}, c.args...)...)
		})
	}
}
