// Package peer is how fanout's nodes trust each other: mutual TLS with role identities, and Ed25519-signed dispatch envelopes.
package peer

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/url"
	"os"
)

// Role is what a node may be to its peers. A node's certificate names its role
// in its one URI SAN, spiffe://fanout/<role>; a chain to the CA alone
// authorizes nothing.
type Role string

// The roles.
const (
	// RoleOrchestrator dispatches tasks; a worker accepts connections only from it.
	RoleOrchestrator Role = "orchestrator"
	// RoleWorker runs subagents; an orchestrator dispatches only to it.
	RoleWorker Role = "worker"
)

// trustDomain is the SPIFFE trust domain of every fanout identity.
const trustDomain = "fanout"

// URI returns the URI SAN that identifies r: spiffe://fanout/<role>.
func (r Role) URI() *url.URL {
	return &url.URL{Scheme: "spiffe", Host: trustDomain, Path: "/" + string(r)}
}

func (r Role) check() error {
	if _, ok := roleByURI[r.URI().String()]; !ok {
		return fmt.Errorf("unknown role %q: want %q or %q", string(r), RoleOrchestrator, RoleWorker)
	}
	return nil
}

var roleByURI = map[string]Role{
	RoleOrchestrator.URI().String(): RoleOrchestrator,
	RoleWorker.URI().String():       RoleWorker,
}

// RoleOf returns the role cert names, and false if it names none. Like an
// X.509 SPIFFE identity, cert must carry exactly one URI SAN, and it must be a
// role's URI exactly: a certificate naming two roles names none.
//
// RoleOf does not verify cert. Call it on a certificate that a handshake with
// a ServerConfig or ClientConfig accepted, to log or check who the peer is.
func RoleOf(cert *x509.Certificate) (Role, bool) {
	if cert == nil || len(cert.URIs) != 1 {
		return "", false
	}
	r, ok := roleByURI[cert.URIs[0].String()]
	return r, ok
}

// roleError is why a verified certificate is still not the peer wanted.
type roleError struct {
	want Role
	uris []string
}

func (e *roleError) Error() string {
	return fmt.Sprintf("peer certificate is not a fanout %s: want exactly the URI SAN %s, have %q", e.want, e.want.URI(), e.uris)
}

// authorize returns a *roleError unless cert names role want.
func authorize(cert *x509.Certificate, want Role) error {
	if r, ok := RoleOf(cert); ok && r == want {
		return nil
	}
	return &roleError{want: want, uris: uriStrings(cert)}
}

func uriStrings(cert *x509.Certificate) []string {
	s := make([]string, len(cert.URIs))
	for i, u := range cert.URIs {
		s[i] = u.String()
	}
	return s
}

// readPEM returns the PEM blocks of the file at path, each of which must be of
// type want. Its errors name what was being loaded, the file and the block,
// never the file's contents.
func readPEM(what, path, want string) ([]*pem.Block, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", what, err)
	}
	var blocks []*pem.Block
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != want {
			return nil, fmt.Errorf("load %s %s: PEM block %d is %q, want %q", what, path, len(blocks)+1, b.Type, want)
		}
		blocks = append(blocks, b)
	}
	if len(blocks) == 0 {
		return nil, fmt.Errorf("load %s %s: no %q PEM block", what, path, want)
	}
	return blocks, nil
}
