// Command kube-apiserver is Kubernetes v1.37.2's API server built from the Go
// module proxy (k8s.io/kubernetes with its staging modules replaced by their
// published v0.37.2), so the Kubernetes tests run a real apiserver without a
// prebuilt download. It exists only for the test rig (internal/k8stest);
// scripts/setup-k8s.sh builds and caches it.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() { os.Exit(cli.Run(app.NewAPIServerCommand())) }
