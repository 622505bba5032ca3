// Package envoytest starts a real Envoy (internal/envoyrun) for a test, on
// loopback, and stops it when the test ends. Tests that claim Envoy
// behaviour use it; nothing here fakes Envoy. Test-only: the binary runs
// Envoy through envoyrun, which does not import testing.
package envoytest

import (
	"context"
	"testing"
	"time"

	"github.com/inferlb/inferlb/internal/envoybin"
	"github.com/inferlb/inferlb/internal/envoyrun"
)

// ErrNoEnvoy is returned by Binary when no Envoy can be found.
var ErrNoEnvoy = envoybin.ErrNoEnvoy

// Binary returns the Envoy to run (see envoybin.Binary).
func Binary() (string, error) { return envoybin.Binary() }

// Venv returns the project's Python virtual environment directory.
func Venv() (string, error) { return envoybin.Venv(), nil }

// Envoy is a running Envoy process.
type Envoy = envoyrun.Envoy

// Options configure Start (see envoyrun.Options).
type Options = envoyrun.Options

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	p, err := envoyrun.FreePort()
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	return p
}

// Start runs Envoy with the bootstrap (envoyrun.Start, files in the test's
// temporary directory). It stops Envoy when the test ends and, if the test
// failed, prints the tail of Envoy's log.
//
// With `defer leaktest.AfterTest(t)()`, also `defer e.Stop()` after Start:
// deferred calls run before t.Cleanup, and the goroutine that waits for the
// Envoy process ends only when Envoy has exited.
func Start(t testing.TB, opt Options) *Envoy {
	t.Helper()
	e, err := envoyrun.Start(opt, t.TempDir())
	if err != nil {
		t.Fatalf("envoytest: %v", err)
	}
	t.Cleanup(func() {
		e.Stop()
		if t.Failed() {
			t.Logf("envoy log tail:\n%s", e.LogTail(60))
		}
	})
	return e
}

// Poll calls f until it returns nil or the deadline passes (envoyrun.Poll).
// Use it to wait for a condition instead of sleeping.
func Poll(ctx context.Context, timeout, every time.Duration, f func() error) error {
	return envoyrun.Poll(ctx, timeout, every, f)
}
