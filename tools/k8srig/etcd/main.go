// Command etcd is etcd v3.7.3's server built from the Go module proxy, so the
// Kubernetes tests run a real etcd without a prebuilt download. It exists only
// for the test rig (internal/k8stest); scripts/setup-k8s.sh builds and caches it.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
