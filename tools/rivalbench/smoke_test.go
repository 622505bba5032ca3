package rivalbench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"

	"github.com/inferlb/inferlb/internal/envoybin"
)

// TestSmokeInferlbBesideARealRival runs the bench small: inferlb (control
// plane, ext_proc, a real Envoy) and SGLang's real model gateway (smg,
// cache_aware) on identical engines, a few seconds of multi-turn traffic
// started at the same instant. Both must serve every request, and the
// table and files must have both rows. make test installs the rivals
// (scripts/setup.sh --rivals).
func TestSmokeInferlbBesideARealRival(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Envoy, the control plane, ext_proc and a rival router")
	}
	defer leaktest.AfterTest(t)()
	envoy, err := envoybin.Binary()
	if err != nil {
		t.Fatal(err)
	}
	rivals := RivalDir(envoybin.Venv())
	if _, err := SmgCacheAware.program(rivals); err != nil {
		t.Fatalf("%v: make test installs the rivals with scripts/setup.sh --rivals", err)
	}
	bin := filepath.Join(t.TempDir(), "inferlb-lab")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/inferlb/inferlb/cmd/inferlb-lab").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	o := DefaultOptions()
	o.Routers = []Router{Inferlb, SmgCacheAware}
	o.Workloads, _ = ParseWorkloads("multiturn")
	o.Runs, o.Duration, o.Load = 1, 4*time.Second, 0.5
	o.Self, o.Envoy, o.RivalDir, o.OutDir = bin, envoy, rivals, t.TempDir()
	var progress strings.Builder
	o.Progress = &progress
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	res, err := Run(ctx, o)
	if err != nil {
		t.Fatalf("%v\nprogress:\n%s", err, progress.String())
	}
	m := res.Workloads[0].Median
	for _, id := range []string{"inferlb", "smg-cache_aware"} {
		r, ok := m[id]
		if !ok {
			t.Fatalf("no result for %s", id)
		}
		if r.Sent == 0 || r.OK != r.Sent || r.Errors != 0 || r.Shed != 0 {
			t.Errorf("%s: sent %d, served %d, errors %d, shed %d: want every request served", id, r.Sent, r.OK, r.Errors, r.Shed)
		}
		if r.HitRate <= 0 || r.TTFTP50 <= 0 || r.CPUSeconds <= 0 {
			t.Errorf("%s: hit rate %v, TTFT p50 %v, CPU %v s: the engines' counters, the clients' TTFT and the processes' CPU must all be read", id, r.HitRate, r.TTFTP50, r.CPUSeconds)
		}
	}
	var table strings.Builder
	if err := res.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"inferlb", "smg-cache_aware"} {
		if !strings.Contains(table.String(), "  "+id+"  ") {
			t.Errorf("the table has no row for %s:\n%s", id, table.String())
		}
	}
	dir := t.TempDir()
	if err := res.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"results.json", "table.txt", "multiturn-ttft-cdf.png"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	if !strings.Contains(progress.String(), "every router is ready") {
		t.Errorf("no progress line for readiness:\n%s", progress.String())
	}
}
