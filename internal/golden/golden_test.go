package golden

import (
	"os"
	"path/filepath"
	"testing"
)

// recorder is a testing.TB that records failures instead of stopping.
type recorder struct {
	testing.TB
	failed bool
}

func (r *recorder) Helper()               {}
func (r *recorder) Errorf(string, ...any) { r.failed = true }
func (r *recorder) Fatalf(string, ...any) { r.failed = true }
func (r *recorder) Fatal(...any)          { r.failed = true }

func TestCheck(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "x.golden")
	r := &recorder{TB: t}
	Check(r, path, []byte("a"), false, "regen")
	if !r.failed {
		t.Fatal("a missing golden file passed")
	}
	r = &recorder{TB: t}
	Check(r, path, []byte("a"), true, "regen")
	if b, err := os.ReadFile(path); err != nil || string(b) != "a" || r.failed {
		t.Fatalf("update wrote %q, %v (failed %v)", b, err, r.failed)
	}
	Check(r, path, []byte("a"), false, "regen")
	if r.failed {
		t.Fatal("equal output failed")
	}
	Check(r, path, []byte("b"), false, "regen")
	if !r.failed {
		t.Fatal("different output passed")
	}
}
