// Command etcd is the upstream etcd server, built from its Go module.
//
// The etcd repository's own main package (go.etcd.io/etcd/v3) is not meant to
// be required as a module; its server module exports the same entry point.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
