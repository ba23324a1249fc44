package node_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/fanout/fanout/node"
)

// A process serving one orchestrator and two workers on free loopback
// ports, as `fanout dev` does: the orchestrator dispatches to the
// process's own workers, over peer mTLS with signed dispatches.
func ExampleMain() {
	ctx := context.Background()
	orchTrust, workerTrust, _, err := node.DevTrust(os.TempDir() + "/fanout-example-peer")
	if err != nil {
		log.Fatal(err)
	}
	m := node.NewMain(node.Config{
		Backend:      node.BackendConfig{DatabaseURL: os.Getenv("DATABASE_URL"), GroupCommit: true},
		Workers:      []node.WorkerConfig{{Trust: workerTrust}, {Trust: workerTrust}},
		Orchestrator: &node.OrchestratorConfig{Trust: orchTrust, Auth: node.CallerAuth{None: true}},
	})
	if err := m.Open(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("orchestrator on", m.Orchestrator().Addr())
	closeCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := m.Close(closeCtx); err != nil {
		log.Print(err)
	}
}
