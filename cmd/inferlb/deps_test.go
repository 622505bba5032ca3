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

// The production binary carries no test scaffolding: none of the project's
// packages it links imports testing (test helpers live in test-only
// packages: internal/envoytest, xds/xdstest), and no other package does
// but the known third-party ones.
func TestBinaryLinksNoTestScaffolding(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, ".").CombinedOutput()
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
			t.Errorf("cmd/inferlb links %s, which imports testing: move what the binary needs into a package without it", p)
		}
	}
	if len(got) == 0 {
		t.Log("no package of the binary imports testing: drop testingImporters")
	}
}
