package demo

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/inferlb/inferlb/internal/envoytest"
)

// The demo's end-to-end runs are the documented make demo commands, run by
// cmd/inferlb's TestDocumentedCommands with the checks of its demo_test.go
// (one run of the default flags until Ctrl-C, one bounded run): a demo
// occupies the fixed ports, so every run of it is one of those.

// A surge in a region no frontend serves is refused before anything
// starts, not run as a demo without a surge.
func TestDemoRejectsUnknownSurgeRegion(t *testing.T) {
	dir := t.TempDir()
	_, err := Run(context.Background(), Options{FleetPath: "../../examples/fleet-3region.yaml", OutDir: filepath.Join(dir, "out"),
		Duration: time.Second, TimeScale: 1, Rate: 1, SurgeAfter: time.Second, SurgeRegion: "us-esat",
		ControlInterval: time.Second, ViewInterval: time.Second, BasePort: 30000})
	if err == nil || !strings.Contains(err.Error(), `surge region "us-esat" has no frontend`) {
		t.Fatalf("err = %v, want the unknown surge region named", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "out")); !os.IsNotExist(err) {
		t.Errorf("the refused demo created its output directory (stat: %v)", err)
	}
}

// A demo that dies without stopping its children (SIGKILL, a test's
// timeout) takes them with it: none outlives it holding the demo's ports.
func TestChildrenDieWithTheDemo(t *testing.T) {
	if os.Getenv("INFERLB_DEMO_HELPER") == "1" {
		// The helper plays the demo: it starts a child and waits to be
		// killed.
		sup := &supervisor{dir: os.Getenv("INFERLB_DEMO_DIR"), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		p, err := sup.startProc("child", "sleep", "300")
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("child %d\n", p.cmd.Process.Pid)
		select {}
	}
	helper := exec.Command(os.Args[0], "-test.run=^TestChildrenDieWithTheDemo$")
	helper.Env = append(os.Environ(), "INFERLB_DEMO_HELPER=1", "INFERLB_DEMO_DIR="+t.TempDir())
	out, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	var child int
	if _, err := fmt.Fscanf(bufio.NewReader(out), "child %d\n", &child); err != nil {
		helper.Process.Kill()
		helper.Wait()
		t.Fatalf("the helper did not start its child: %v", err)
	}
	helper.Process.Kill()
	helper.Wait()
	if err := envoytest.Poll(context.Background(), 10*time.Second, 20*time.Millisecond, func() error {
		// Signal 0 checks existence; a dead child not yet reaped by init
		// is a zombie (state Z).
		if err := syscall.Kill(child, 0); err != nil {
			return nil
		}
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", child)); err == nil && strings.Contains(string(st), ") Z ") {
			return nil
		}
		return fmt.Errorf("child %d still running", child)
	}); err != nil {
		syscall.Kill(child, syscall.SIGKILL)
		t.Fatal(err)
	}
}
