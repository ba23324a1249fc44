package node

import (
	"crypto/tls"
	"fmt"

	"github.com/fanout/fanout/peer"
)

// WorkerTrust is what a worker holds of the peer trust: its server TLS,
// which admits only orchestrators, and the orchestrators' public dispatch
// keys. Workers hold no private key but their TLS one.
type WorkerTrust struct {
	TLS  *tls.Config
	Keys *peer.KeySet
}

// OrchestratorTrust is what an orchestrator holds of the peer trust: its
// client TLS, which admits only workers, and the key that signs every
// dispatch.
type OrchestratorTrust struct {
	TLS    *tls.Config
	Signer *peer.Signer
}

// LoadWorkerTrust loads a worker's TLS files and the orchestrators' public
// keys (PEM files or directories of them).
func LoadWorkerTrust(files peer.Files, verifyKeys ...string) (WorkerTrust, error) {
	cfg, err := peer.ServerConfig(files, peer.RoleOrchestrator)
	if err != nil {
		return WorkerTrust{}, fmt.Errorf("peer TLS: %w", err)
	}
	keys, err := peer.LoadKeySet(verifyKeys...)
	if err != nil {
		return WorkerTrust{}, err
	}
	return WorkerTrust{TLS: cfg, Keys: keys}, nil
}

// LoadOrchestratorTrust loads an orchestrator's TLS files and its signing key.
func LoadOrchestratorTrust(files peer.Files, signingKey string) (OrchestratorTrust, error) {
	cfg, err := peer.ClientConfig(files, peer.RoleWorker)
	if err != nil {
		return OrchestratorTrust{}, fmt.Errorf("peer TLS: %w", err)
	}
	signer, err := peer.LoadSigner(signingKey)
	if err != nil {
		return OrchestratorTrust{}, err
	}
	return OrchestratorTrust{TLS: cfg, Signer: signer}, nil
}

// DevTrust generates (or reuses) a throwaway CA, both roles' certificates
// and a signing key under dir (peer.GenerateDev), and loads both sides'
// trust from them: what `fanout dev` and the tests run with.
func DevTrust(dir string) (OrchestratorTrust, WorkerTrust, peer.DevFiles, error) {
	files, err := peer.GenerateDev(dir)
	if err != nil {
		return OrchestratorTrust{}, WorkerTrust{}, files, fmt.Errorf("generate dev peer credentials: %w", err)
	}
	orch, err := LoadOrchestratorTrust(files.Orchestrator, files.SigningKey)
	if err != nil {
		return orch, WorkerTrust{}, files, err
	}
	worker, err := LoadWorkerTrust(files.Worker, files.VerifyKey)
	return orch, worker, files, err
}
