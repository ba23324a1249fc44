package main

import (
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/fanout/fanout/node"
)

// callerFlags are how an orchestrator authenticates the services that call
// it: API keys (the default) or none, and the TLS of its caller-facing
// listener. Distinct from the peer TLS between orchestrators and workers.
type callerFlags struct {
	mode           string
	insecureNoAuth bool
	cert, key      string
}

func (c *callerFlags) register(f *flags) {
	f.StringVar(&c.mode, "auth", "keys", "how callers authenticate: keys (an API key fanout issued, `authorization: Bearer ...`) or none (loopback only)")
	f.BoolVar(&c.insecureNoAuth, "insecure-no-auth", false, "allow --auth none on an address beyond loopback (never in production)")
	f.StringVar(&c.cert, "tls-cert", "", "PEM file of the certificate callers see (caller-facing TLS; with --tls-key)")
	f.StringVar(&c.key, "tls-key", "", "PEM file of the private key of --tls-cert")
}

// config returns the node's CallerAuth.
func (c *callerFlags) config() (node.CallerAuth, error) {
	var a node.CallerAuth
	switch c.mode {
	case "keys":
	case "none":
		a.None = true
	default:
		return a, fmt.Errorf("--auth: must be keys or none, got %q", c.mode)
	}
	a.InsecureNoAuth = c.insecureNoAuth
	switch {
	case c.cert != "" && c.key != "":
		pair, err := tls.LoadX509KeyPair(c.cert, c.key)
		if err != nil {
			return a, fmt.Errorf("--tls-cert, --tls-key: %w", err)
		}
		a.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	case c.cert != "" || c.key != "":
		return a, errors.New("--tls-cert and --tls-key go together")
	}
	return a, nil
}
