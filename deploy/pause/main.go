// Command pause is the pod sandbox image of the chart's node test
// (cluster_node_test.go): it holds the pod's namespaces and waits for SIGTERM
// or SIGINT, as registry.k8s.io/pause does, which cannot be pulled here.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}
