package peer_test

import (
	"fmt"
	"log"
	"os"

	"github.com/fanout/fanout/peer"
)

// The dev mode's wiring: one directory of generated material gives a worker
// its listener and its key set, and an orchestrator its dialer and its signer.
// Over gRPC, each *tls.Config goes into credentials.NewTLS.
func ExampleGenerateDev() {
	dir, err := os.MkdirTemp("", "fanout-dev")
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	dev, err := peer.GenerateDev(dir)
	if err != nil {
		log.Fatal(err)
	}

	// The worker: accepts orchestrators only, verifies their signatures.
	if _, err := peer.ServerConfig(dev.Worker, peer.RoleOrchestrator); err != nil {
		log.Fatal(err)
	}
	keys, err := peer.LoadKeySet(dev.VerifyKey)
	if err != nil {
		log.Fatal(err)
	}

	// The orchestrator: dials workers only, signs each dispatch.
	if _, err := peer.ClientConfig(dev.Orchestrator, peer.RoleWorker); err != nil {
		log.Fatal(err)
	}
	signer, err := peer.LoadSigner(dev.SigningKey)
	if err != nil {
		log.Fatal(err)
	}

	envelope := []byte("the exact bytes of an ExecuteRequest")
	sig := signer.Sign(envelope)
	fmt.Println("genuine:", keys.Verify(signer.KeyID(), envelope, sig))
	envelope[0] ^= 1
	fmt.Println("tampered:", keys.Verify(signer.KeyID(), envelope, sig) != nil)
	// Output:
	// genuine: <nil>
	// tampered: true
}
