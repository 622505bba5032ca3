package drills

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The drills run the control plane and ext_proc as processes of the real
// binary, so that "kill" means SIGKILL: no deferred cleanup, no graceful
// stop, the kernel closes the sockets.
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

// proc is one child process; it can be killed and started again with the
// same arguments (same ports).
type proc struct {
	t    *testing.T
	name string
	bin  string
	args []string
	dir  string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	logPath string
	runs    int
}

func startProc(t *testing.T, dir, name, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, bin: bin, args: args, dir: dir}
	if err := p.start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("%s log tail:\n%s", name, p.logTail(40))
		}
	})
	return p
}

// start runs the process (again, after kill or stop).
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("%s is running", p.name)
	}
	p.runs++
	p.logPath = filepath.Join(p.dir, fmt.Sprintf("%s.%d.log", p.name, p.runs))
	f, err := os.Create(p.logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); f.Close(); close(done) }()
	p.cmd, p.done = cmd, done
	return nil
}

// signal sends sig to the running process (SIGSTOP, SIGCONT: a hung
// process).
func (p *proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return fmt.Errorf("%s is not running", p.name)
	}
	return p.cmd.Process.Signal(sig)
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill() { p.end(syscall.SIGKILL) }

// stop sends SIGTERM (graceful) and waits, killing after 10 s.
func (p *proc) stop() { p.end(syscall.SIGTERM) }

func (p *proc) end(sig syscall.Signal) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// running reports whether the process is up (started and not ended).
func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// log returns the current run's log.
func (p *proc) log() string {
	p.mu.Lock()
	path := p.logPath
	p.mu.Unlock()
	b, _ := os.ReadFile(path)
	return string(b)
}

func (p *proc) logTail(n int) string {
	lines := strings.Split(strings.TrimRight(p.log(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
