package labcmd

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"

	"github.com/inferlb/inferlb/internal/envoytest"
)

// bench extproc runs end to end on a small cell: the protocol table and the
// three-way Envoy comparison, every setup answering without errors.
func TestBenchExtProcSmoke(t *testing.T) {
	if _, err := envoytest.Binary(); err != nil {
		t.Fatalf("Envoy needed (scripts/setup.sh): %v", err)
	}
	t.Cleanup(leaktest.AfterTest(t))
	t.Setenv(runAsMain, "1")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	cmd := NewRoot("")
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"bench", "extproc", "--duration", "300ms", "--concurrency", "4", "--sizes", "4096", "--envoy-workers", "1", "--settle", "500ms"})
	if err := cmd.ExecuteContext(ctx); err != nil {
		t.Fatalf("bench extproc: %v\n%s", err, out.String())
	}
	// Protocol row: decisions/s, then zero errors at the end.
	if !regexp.MustCompile(`(?m)^\s+4 KB\s+4\s+[1-9]\d*\s.*\s0$`).MatchString(out.String()) {
		t.Errorf("no error-free protocol row for 4 KB at concurrency 4:\n%s", out.String())
	}
	// Memory beside CPU: peak and post-run RSS, heap in use (MB), bytes
	// allocated per decision (KB), then the errors.
	if !strings.Contains(out.String(), "peak RSS MB  RSS after MB  heap MB  alloc KB/decision  errors") ||
		!regexp.MustCompile(`(?m)^\s+4 KB\s+4\s+.*\s[1-9]\d*\s+[1-9]\d*\s+\d+\s+\d+\.\d\s+0$`).MatchString(out.String()) {
		t.Errorf("no memory figures in the protocol row:\n%s", out.String())
	}
	// Both ext_proc setups are child processes whose CPU is reported.
	for _, setup := range []string{"+ null ext_proc", "+ inferlb ext_proc"} {
		re := regexp.MustCompile(`(?m)^\s+4 KB\s+4\s+` + regexp.QuoteMeta(setup) + `\s.*\s\d+\.\d{3}\s+\d+\.\d{3}\s+0$`)
		if !re.MatchString(out.String()) {
			t.Errorf("no Envoy and ext_proc CPU figures for %q:\n%s", setup, out.String())
		}
	}
	for _, setup := range []string{"Envoy alone", "+ null ext_proc", "+ inferlb ext_proc"} {
		re := regexp.MustCompile(`(?m)^\s+4 KB\s+4\s+` + regexp.QuoteMeta(setup) + `\s+[1-9]\d*\s.*\s0$`)
		if !re.MatchString(out.String()) {
			t.Errorf("no error-free row for %q:\n%s", setup, out.String())
		}
	}
	if strings.Count(out.String(), "4 KB") != 4 {
		t.Errorf("want 4 rows (1 protocol, 3 Envoy):\n%s", out.String())
	}
}
