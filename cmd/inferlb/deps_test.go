package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// testingImporters are the third-party packages in the binary that import
// testing themselves, outside their _test files; the binary links testing
// through them alone. go-control-plane's pkg/log (test.go: a logger over
// testing.TB) comes with every cache, in v0.14.0, the newest release.
// (go-abnf, which prometheus/common/expfmt pulls in, imported testing from
// its *_fuzz.go files up to v0.5.3; go.mod requires v0.5.5, which does not.)
var testingImporters = []string{
	"github.com/envoyproxy/go-control-plane/pkg/log",
}

// The binaries carry no test scaffolding: none of the project's packages
// they link imports testing (test helpers live in test-only packages:
// internal/envoytest, xds/xdstest, cmd/internal/clitest), and no other
// package does but the known third-party ones.
func TestBinaryLinksNoTestScaffolding(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	for _, bin := range []string{".", "../inferlb-lab"} {
		t.Run(bin, func(t *testing.T) { linksNoTestScaffolding(t, bin) })
	}
}

func linksNoTestScaffolding(t *testing.T, pkg string) {
	out, err := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && slices.Contains(f[1:], "testing") {
			got = append(got, f[0])
		}
	}
	for _, p := range got {
		if !slices.Contains(testingImporters, p) {
			t.Errorf("%s links %s, which imports testing: move what the binary needs into a package without it", pkg, p)
		}
	}
	if len(got) == 0 {
		t.Log("no package of the binary imports testing: drop testingImporters")
	}
}

// The lab is what builds and measures inferlb: the simulators, the load
// generator, the demo, the benches (tools/) and the plotting library of
// their charts.
var labPrefixes = []string{"github.com/inferlb/inferlb/tools/", "gonum.org/v1/plot"}

// What an operator deploys carries none of the lab: the operator's binary
// links no package of tools/ and no plotting library. The lab's binary,
// which links them, shows the check is not vacuous.
func TestOperatorBinaryLinksNoLab(t *testing.T) {
	lab := func(pkg string) []string {
		out, err := exec.Command("go", "list", "-deps", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list: %v\n%s", err, out)
		}
		var got []string
		for _, p := range strings.Fields(string(out)) {
			for _, prefix := range labPrefixes {
				if strings.HasPrefix(p, prefix) {
					got = append(got, p)
				}
			}
		}
		return got
	}
	for _, p := range lab(".") {
		t.Errorf("cmd/inferlb links %s: the operator's binary must not carry the lab (move what it needs out of tools/, or the command into cmd/internal/labcmd)", p)
	}
	got := lab("../inferlb-lab")
	for _, want := range []string{"github.com/inferlb/inferlb/tools/enginesim", "gonum.org/v1/plot"} {
		if !slices.Contains(got, want) {
			t.Errorf("cmd/inferlb-lab does not link %s: the check above no longer sees the lab", want)
		}
	}
}
