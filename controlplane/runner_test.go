package controlplane

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lni/goutils/leaktest"
)

// A state file that cannot be used stops the control plane at start with
// an error naming the file, instead of a cycle that fails forever.
func TestRunnerRefusesCorruptStateFile(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{
		"negative share": `{"version": 3, "weights": {"fe-east": {"chat": {"e-east-1": -1}}}}`,
		"not JSON":       `{"version": 3, "weights": `,
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".json")
			if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg := DefaultRunConfig()
			cfg.Fleet, cfg.StateFile = testFleet(t), path
			cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
			if _, err := NewRunner(cfg); err == nil || !strings.Contains(err.Error(), path) {
				t.Fatalf("err = %v, want an error naming %s", err, path)
			}
		})
	}
}

// A Runner runs once: a second Run is an error, not a panic. A cancelled
// Run leaves no goroutine behind.
func TestRunnerRunsOnce(t *testing.T) {
	defer leaktest.AfterTest(t)()
	cfg := DefaultRunConfig()
	cfg.Fleet, cfg.XDSListen, cfg.AdminListen = testFleet(t), "127.0.0.1:0", "127.0.0.1:0"
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	r, err := NewRunner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the first Run binds, then stops at once
	if err := r.Run(ctx); err != nil {
		t.Fatalf("first run: %v", err)
	}
	if err := r.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "Run called twice") {
		t.Fatalf("second run: err = %v", err)
	}
}
