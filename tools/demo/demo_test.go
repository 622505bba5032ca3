package demo

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The demo's end-to-end runs are the documented make demo commands, run by
// cmd/inferlb's TestDocumentedCommands with the checks of its demo_test.go
// (one run of the default flags until Ctrl-C, one bounded run): a demo
// occupies the fixed ports, so every run of it is one of those. That its
// children die with it even when it is killed is internal/childproc's
// TestChildrenDieWithTheParent: they are a childproc.Group.

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
