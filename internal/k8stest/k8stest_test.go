package k8stest

import (
	"os"
	"strings"
	"testing"
)

// The versions Binaries looks for are the ones scripts/setup-k8s.sh builds:
// the nested modules' pins.
func TestVersionsMatchModules(t *testing.T) {
	for _, c := range []struct{ file, module, version string }{
		{"../../tools/k8srig/etcd/go.mod", "go.etcd.io/etcd/server/v3", EtcdVersion},
		{"../../tools/k8srig/apiserver/go.mod", "k8s.io/kubernetes", KubeVersion},
	} {
		b, err := os.ReadFile(c.file)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), c.module+" "+c.version+"\n") {
			t.Errorf("%s does not require %s %s", c.file, c.module, c.version)
		}
	}
}
