// Command etcd is the etcd server, built from go.etcd.io/etcd/server/v3 so the local
// control plane needs no prebuilt binary.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
