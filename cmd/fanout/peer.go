package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strings"

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

// nodeTrust is what one node holds of the peer trust.
type nodeTrust struct {
	TLS    *tls.Config  // server side on a worker, client side on an orchestrator
	Signer *peer.Signer // orchestrator
	Keys   *peer.KeySet // worker
}

// orchestratorTrust loads an orchestrator's client TLS and signing key.
func (p *peerFlags) orchestratorTrust() (nodeTrust, error) {
	files, err := p.files()
	if err != nil {
		return nodeTrust{}, err
	}
	if p.signingKey == "" {
		return nodeTrust{}, errors.New("--peer-signing-key required: workers run only dispatches signed by an orchestrator")
	}
	cfg, err := peer.ClientConfig(files, peer.RoleWorker)
	if err != nil {
		return nodeTrust{}, fmt.Errorf("peer TLS: %w", err)
	}
	s, err := peer.LoadSigner(p.signingKey)
	if err != nil {
		return nodeTrust{}, fmt.Errorf("--peer-signing-key: %w", err)
	}
	return nodeTrust{TLS: cfg, Signer: s}, nil
}

// workerTrust loads a worker's server TLS and the orchestrators' keys.
func (p *peerFlags) workerTrust() (nodeTrust, error) {
	files, err := p.files()
	if err != nil {
		return nodeTrust{}, err
	}
	if p.verifyKeys == "" {
		return nodeTrust{}, errors.New("--peer-verify-keys required: the orchestrators' public signing keys")
	}
	cfg, err := peer.ServerConfig(files, peer.RoleOrchestrator)
	if err != nil {
		return nodeTrust{}, fmt.Errorf("peer TLS: %w", err)
	}
	ks, err := peer.LoadKeySet(strings.Split(p.verifyKeys, ",")...)
	if err != nil {
		return nodeTrust{}, fmt.Errorf("--peer-verify-keys: %w", err)
	}
	return nodeTrust{TLS: cfg, Keys: ks}, nil
}

// devTrust generates (or reuses) the dev CA, certificates and signing key
// under dir and returns both sides' trust.
func devTrust(dir string) (orch, worker nodeTrust, files peer.DevFiles, err error) {
	files, err = peer.GenerateDev(dir)
	if err != nil {
		return orch, worker, files, fmt.Errorf("generate dev peer credentials: %w", err)
	}
	op := peerFlags{ca: files.CA, cert: files.Orchestrator.Cert, key: files.Orchestrator.Key, signingKey: files.SigningKey}
	wp := peerFlags{ca: files.CA, cert: files.Worker.Cert, key: files.Worker.Key, verifyKeys: files.VerifyKey}
	if orch, err = op.orchestratorTrust(); err != nil {
		return orch, worker, files, err
	}
	worker, err = wp.workerTrust()
	return orch, worker, files, err
}
