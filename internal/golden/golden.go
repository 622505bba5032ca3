// Package golden compares a test's output with a golden file, or rewrites
// the file when the test runs with its package's -update flag. It is for
// tests only (it imports testing); the binary never links it.
package golden

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// Check fails t when got differs from the file at path. With update it
// writes got to path instead (creating its folder). regen is the command
// that regenerates the file, named in the failure messages.
func Check(t testing.TB, path string, got []byte, update bool, regen string) {
	t.Helper()
	if update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run %s to create it)", err, regen)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (run %s if the change is intended)\n--- got\n%s", path, regen, got)
	}
}
