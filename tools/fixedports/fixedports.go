// Package fixedports serializes the tests that listen on the project's
// fixed, documented ports (the demo's 17000.., the example fleet's engines
// on 18001.., the docs' 18100 and 10000): they run in different packages,
// which `go test -p 2` runs at the same time, and in different checkouts of
// the same machine. Every such test holds the lock while it listens.
package fixedports

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// Lock blocks until this test holds the machine-wide lock of the fixed
// ports, and releases it when the test ends. The lock is a flock on a file
// in the temporary directory: the kernel releases it if the process dies.
func Lock(t testing.TB) {
	t.Helper()
	path := filepath.Join(os.TempDir(), "inferlb-fixed-ports.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatalf("fixed ports lock: %v", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		t.Fatalf("fixed ports lock %s: %v", path, err)
	}
	t.Cleanup(func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	})
}
