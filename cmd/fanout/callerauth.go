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
	// The HTTP listener: its address, the console, plaintext beyond loopback.
	httpListen   string
	console      bool
	httpInsecure bool
}

func (c *callerFlags) register(f *flags) {
	f.StringVar(&c.mode, "auth", "keys", "how callers authenticate: keys (an API key fanout issued, `authorization: Bearer ...`) or none (loopback only)")
	f.BoolVar(&c.insecureNoAuth, "insecure-no-auth", false, "allow --auth none on an address beyond loopback (never in production)")
	f.StringVar(&c.cert, "tls-cert", "", "PEM file of the certificate callers see (caller-facing TLS; with --tls-key)")
	f.StringVar(&c.key, "tls-key", "", "PEM file of the private key of --tls-cert")
	f.StringVar(&c.httpListen, "http-listen", "", "address to serve the API as HTTP/JSON on (Connect, gRPC-Web, REST; same keys and limits; TLS from --tls-cert, or loopback) (empty: off)")
	f.BoolVar(&c.console, "console", false, "serve the web console at /console/ on --http-listen")
	f.BoolVar(&c.httpInsecure, "http-insecure", false, "allow --http-listen beyond loopback without --tls-cert (a proxy on this host ends TLS)")
}

// http returns the node's HTTPConfig.
func (c *callerFlags) http() (node.HTTPConfig, error) {
	h := node.HTTPConfig{Listen: c.httpListen, InsecurePlaintext: c.httpInsecure}
	switch {
	case c.console && c.httpListen == "":
		return h, errors.New("--console: needs --http-listen (the console is served on the HTTP listener)")
	case c.console:
		h.Console = consoleHandler()
	}
	return h, nil
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
