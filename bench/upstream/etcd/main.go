// etcd v3.6 built from its Go modules: the same main as etcd's own (go.etcd.io/etcd/v3's
// main.go), at the version Kubernetes v1.34 ships (3.6.4). The scale benchmark runs it under
// upstream's control plane (bench/upstream-plane.sh).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
