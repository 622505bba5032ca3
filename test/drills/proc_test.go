package drills

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/inferlb/inferlb/internal/childproc"
)

// The drills run the control plane and ext_proc as processes of the real
// binary (internal/childproc's), so that "kill" means SIGKILL: no deferred
// cleanup, no graceful stop, the kernel closes the sockets.
var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// inferlbBinary builds cmd/inferlb once per test binary.
func inferlbBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "inferlb-drills-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "inferlb")
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/inferlb/inferlb/cmd/inferlb").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// startProc starts one of the stack's processes in its group: its log in
// the stack's directory (a restart appends to it), stopped when the test
// ends.
func (s *stack) startProc(name, bin string, args ...string) *childproc.Proc {
	s.t.Helper()
	p, err := s.procs.Start(name, bin, args...)
	if err != nil {
		s.t.Fatalf("%s: %v", name, err)
	}
	return p
}

// logOf returns everything p has written, every run of it.
func logOf(p *childproc.Proc) string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}
