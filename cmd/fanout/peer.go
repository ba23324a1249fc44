package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/fanout/fanout/node"
	"github.com/fanout/fanout/peer"
)

// peerFlags are how an orchestrator and its workers trust each other:
// mutual TLS with role identities, and the dispatch signing key (the
// orchestrator's private key, the workers' public keys). Distinct from any
// caller-facing TLS.
type peerFlags struct {
	ca, cert, key string
	signingKey    string // orchestrator
	verifyKeys    string // worker: comma-separated files or directories
}

func (p *peerFlags) register(f *flags, role peer.Role) {
	f.StringVar(&p.ca, "peer-tls-ca", "", "PEM file of the CA that issues orchestrator and worker certificates")
	f.StringVar(&p.cert, "peer-tls-cert", "", "PEM file of this node's certificate (URI SAN spiffe://fanout/"+string(role)+")")
	f.StringVar(&p.key, "peer-tls-key", "", "PEM file of this node's private key")
	switch role {
	case peer.RoleOrchestrator:
		f.StringVar(&p.signingKey, "peer-signing-key", "", "PEM file of the Ed25519 private key that signs every dispatch")
	case peer.RoleWorker:
		f.StringVar(&p.verifyKeys, "peer-verify-keys", "", "orchestrators' Ed25519 public keys: PEM files or directories, comma-separated (old and new during a rotation)")
	}
}

func (p *peerFlags) files() (peer.Files, error) {
	var missing []string
	for _, f := range []struct{ name, v string }{{"--peer-tls-ca", p.ca}, {"--peer-tls-cert", p.cert}, {"--peer-tls-key", p.key}} {
		if f.v == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return peer.Files{}, fmt.Errorf("%s required: orchestrators and workers talk over mutual TLS only (`fanout dev` generates a throwaway CA and certificates)",
			strings.Join(missing, ", "))
	}
	return peer.Files{CA: p.ca, Cert: p.cert, Key: p.key}, nil
}

// orchestratorTrust loads an orchestrator's client TLS and signing key.
func (p *peerFlags) orchestratorTrust() (node.OrchestratorTrust, error) {
	files, err := p.files()
	if err != nil {
		return node.OrchestratorTrust{}, err
	}
	if p.signingKey == "" {
		return node.OrchestratorTrust{}, errors.New("--peer-signing-key required: workers run only dispatches signed by an orchestrator")
	}
	return node.LoadOrchestratorTrust(files, p.signingKey)
}

// workerTrust loads a worker's server TLS and the orchestrators' keys.
func (p *peerFlags) workerTrust() (node.WorkerTrust, error) {
	files, err := p.files()
	if err != nil {
		return node.WorkerTrust{}, err
	}
	if p.verifyKeys == "" {
		return node.WorkerTrust{}, errors.New("--peer-verify-keys required: the orchestrators' public signing keys")
	}
	return node.LoadWorkerTrust(files, strings.Split(p.verifyKeys, ",")...)
}
