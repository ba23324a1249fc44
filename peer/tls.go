package peer

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
)

// Files names a node's PEM files: the CA its peers' certificates must chain
// to, and the node's own certificate (leaf first, then any intermediates) and
// private key.
type Files struct {
	CA   string
	Cert string
	Key  string
}

// load reads the CA pool and the node's key pair, once. It refuses a node
// certificate that names no role, which its peers would refuse anyway, so the
// mistake shows at start-up and not as handshake failures in another node's
// log.
func (f Files) load() (*x509.CertPool, tls.Certificate, error) {
	ca, err := loadCA(f.CA)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	certPEM, err := os.ReadFile(f.Cert)
	if err != nil {
		return nil, tls.Certificate{}, fmt.Errorf("load certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(f.Key)
	if err != nil {
		return nil, tls.Certificate{}, fmt.Errorf("load key: %w", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, tls.Certificate{}, fmt.Errorf("load certificate %s with key %s: %w", f.Cert, f.Key, err)
	}
	if pair.Leaf == nil { // GODEBUG x509keypairleaf=0
		if pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, tls.Certificate{}, fmt.Errorf("load certificate %s: %w", f.Cert, err)
		}
	}
	if _, ok := RoleOf(pair.Leaf); !ok {
		return nil, tls.Certificate{}, fmt.Errorf("load certificate %s: it names no fanout role: want one URI SAN, %s or %s, have %q",
			f.Cert, RoleOrchestrator.URI(), RoleWorker.URI(), uriStrings(pair.Leaf))
	}
	return ca, pair, nil
}

// loadCA reads a pool of CA certificates. A certificate that is not a CA is
// refused: a leaf put there by mistake would trust itself.
func loadCA(path string) (*x509.CertPool, error) {
	blocks, err := readPEM("CA", path, "CERTIFICATE")
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	for i, b := range blocks {
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("load CA %s: certificate %d: %w", path, i+1, err)
		}
		if !c.IsCA {
			return nil, fmt.Errorf("load CA %s: certificate %d (%s) is not a CA", path, i+1, c.Subject)
		}
		pool.AddCert(c)
	}
	return pool, nil
}

// ServerConfig returns the TLS config of a listener that only peers of role
// accept may reach; a worker's listener accepts RoleOrchestrator.
//
// The listener presents files.Cert. A client must present a certificate that
// chains to files.CA, is valid for client authentication, and names role
// accept (see RoleOf); any other client fails the handshake with an error
// naming the role wanted and the URI SANs it had. The minimum version is TLS
// 1.3. The files are read once, here, not per connection.
//
// Callers serving gRPC wrap the config with credentials.NewTLS. ServerConfig
// returns an error if accept is not a role, or one naming the file that cannot
// be read or parsed.
func ServerConfig(files Files, accept Role) (*tls.Config, error) {
	if err := accept.check(); err != nil {
		return nil, err
	}
	ca, cert, err := files.load()
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    ca,
		// crypto/tls has verified the chain (with ClientAuth usage) by now;
		// what is left is whether the client is the role this listener serves.
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("peer presented no certificate")
			}
			return authorize(cs.PeerCertificates[0], accept)
		},
	}, nil
}

// ClientConfig returns the TLS config for dialing peers of role want; an
// orchestrator dials workers with RoleWorker.
//
// The client presents files.Cert. The server is authenticated by its role,
// not its host name: its certificate must chain to files.CA, be valid for
// server authentication and name role want (see RoleOf). So a worker reached
// through dns:/// (a headless Service), a static list or a bare IP needs no
// per-host name in its certificate, and a certificate valid for the dialed
// host name is still refused if it does not name the role. The minimum version
// is TLS 1.3. The files are read once, here, not per connection.
//
// crypto/tls can only verify a chain together with a host name, so the config
// sets InsecureSkipVerify and VerifyConnection does the whole verification
// itself, with the CA pool and server-auth usage, as go-spiffe does. Nothing is
// skipped: a server that fails it fails the handshake before the client sends
// a byte of application data. Do not clear VerifyConnection.
//
// Callers dialing over gRPC wrap the config with credentials.NewTLS.
// ClientConfig returns an error if want is not a role, or one naming the file
// that cannot be read or parsed.
func ClientConfig(files Files, want Role) (*tls.Config, error) {
	if err := want.check(); err != nil {
		return nil, err
	}
	ca, cert, err := files.load()
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		Certificates:       []tls.Certificate{cert},
		InsecureSkipVerify: true, // replaced by VerifyConnection: identity is the role, not the host name
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyServer(cs.PeerCertificates, ca, want)
		},
	}, nil
}

// verifyServer does what crypto/tls would, minus the host name, plus the role.
func verifyServer(certs []*x509.Certificate, ca *x509.CertPool, want Role) error {
	if len(certs) == 0 {
		return errors.New("peer presented no certificate")
	}
	opts := x509.VerifyOptions{
		Roots:         ca,
		Intermediates: x509.NewCertPool(),
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, c := range certs[1:] {
		opts.Intermediates.AddCert(c)
	}
	if _, err := certs[0].Verify(opts); err != nil {
		return fmt.Errorf("verify %s certificate: %w", want, err)
	}
	return authorize(certs[0], want)
}
