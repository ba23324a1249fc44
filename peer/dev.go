package peer

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// DevFiles is the absolute paths of the material GenerateDev wrote.
type DevFiles struct {
	// CA is the dev CA's certificate, which both nodes' Files name.
	CA string
	// Orchestrator and Worker are each role's certificate and key.
	Orchestrator, Worker Files
	// SigningKey is the orchestrators' Ed25519 private key (LoadSigner);
	// VerifyKey is its public key, the workers' key set (LoadKeySet).
	SigningKey, VerifyKey string
}

// The files GenerateDev writes in its directory.
const (
	devCA         = "ca.pem"
	devCAKey      = "ca-key.pem"
	devOrch       = "orchestrator.pem"
	devOrchKey    = "orchestrator-key.pem"
	devWorker     = "worker.pem"
	devWorkerKey  = "worker-key.pem"
	devSigningKey = "signing-key.pem"
	devVerifyKey  = "signing-key.pub.pem"
)

const (
	devValidity    = 365 * 24 * time.Hour
	devMinValidity = time.Hour // reused material must stay valid at least this long
)

// GenerateDev makes the trust material of a dev deployment in dir, so that
// the embedded dev mode runs with mTLS and signed dispatches on, like
// production, with no setup: a throwaway CA (ECDSA P-256, valid a year), an
// orchestrator and a worker certificate from it (each naming its role, valid
// for client and server authentication, for localhost, 127.0.0.1 and ::1),
// and an Ed25519 signing key with its public key.
//
// It creates dir (0700) if needed. If dir already holds a complete, consistent
// set that stays valid for another hour, GenerateDev reuses it, so that
// restarts keep working; otherwise (a file missing, unreadable, expiring or
// from another set) it replaces all of them. Private keys are written 0600,
// each file through a rename, so none is ever seen half written. It is not
// meant for several processes generating in one dir at once: call it once
// before starting the nodes that share it.
func GenerateDev(dir string) (DevFiles, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return DevFiles{}, fmt.Errorf("generate dev trust material: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return DevFiles{}, fmt.Errorf("generate dev trust material: %w", err)
	}
	at := func(name string) string { return filepath.Join(dir, name) }
	df := DevFiles{
		CA:           at(devCA),
		Orchestrator: Files{CA: at(devCA), Cert: at(devOrch), Key: at(devOrchKey)},
		Worker:       Files{CA: at(devCA), Cert: at(devWorker), Key: at(devWorkerKey)},
		SigningKey:   at(devSigningKey),
		VerifyKey:    at(devVerifyKey),
	}
	if df.usable(at(devCAKey), time.Now().Add(devMinValidity)) == nil {
		return df, nil
	}
	if err := df.write(at(devCAKey)); err != nil {
		return DevFiles{}, fmt.Errorf("generate dev trust material in %s: %w", dir, err)
	}
	return df, nil
}

// usable returns nil if df is a complete set: every file loads, both
// certificates name their roles and chain to the CA, and will still at until,
// and the verify key is the signing key's.
func (df DevFiles) usable(caKey string, until time.Time) error {
	if _, err := os.Stat(caKey); err != nil {
		return err
	}
	for _, n := range []struct {
		files Files
		role  Role
	}{{df.Orchestrator, RoleOrchestrator}, {df.Worker, RoleWorker}} {
		ca, cert, err := n.files.load()
		if err != nil {
			return err
		}
		if r, _ := RoleOf(cert.Leaf); r != n.role {
			return fmt.Errorf("%s names role %q, want %q", n.files.Cert, r, n.role)
		}
		_, err = cert.Leaf.Verify(x509.VerifyOptions{
			Roots:       ca,
			CurrentTime: until,
			KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		})
		if err != nil {
			return err
		}
	}
	signer, err := LoadSigner(df.SigningKey)
	if err != nil {
		return err
	}
	keys, err := LoadKeySet(df.VerifyKey)
	if err != nil {
		return err
	}
	if ids := keys.IDs(); len(ids) != 1 || ids[0] != signer.KeyID() {
		return errors.New("verify key is not the signing key's")
	}
	return nil
}

// write generates a new set and writes it over df.
func (df DevFiles) write(caKeyPath string) error {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		Subject:               pkix.Name{Organization: []string{"fanout"}, CommonName: "fanout dev CA"},
		NotBefore:             now.Add(-time.Hour), // a peer's clock may be a little behind
		NotAfter:              now.Add(devValidity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := createCert(caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	caKeyDER, err := x509.MarshalPKCS8PrivateKey(caKey)
	if err != nil {
		return err
	}
	files := []pemFile{
		{df.CA, "CERTIFICATE", caDER, 0o644},
		{caKeyPath, "PRIVATE KEY", caKeyDER, 0o600},
	}
	for _, n := range []struct {
		files Files
		role  Role
	}{{df.Orchestrator, RoleOrchestrator}, {df.Worker, RoleWorker}} {
		certDER, keyDER, err := issueDev(ca, caKey, n.role)
		if err != nil {
			return err
		}
		files = append(files,
			pemFile{n.files.Cert, "CERTIFICATE", certDER, 0o644},
			pemFile{n.files.Key, "PRIVATE KEY", keyDER, 0o600})
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	privDER, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return err
	}
	files = append(files,
		pemFile{df.SigningKey, "PRIVATE KEY", privDER, 0o600},
		pemFile{df.VerifyKey, "PUBLIC KEY", pubDER, 0o644})
	for _, f := range files {
		if err := f.write(); err != nil {
			return err
		}
	}
	return nil
}

// issueDev returns a certificate from the dev CA naming role, and its key.
// Both roles may serve and dial: an orchestrator also serves its callers.
func issueDev(ca *x509.Certificate, caKey crypto.Signer, role Role) (certDER, keyDER []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{Organization: []string{"fanout"}, CommonName: "fanout dev " + string(role)},
		NotBefore:   ca.NotBefore,
		NotAfter:    ca.NotAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:        []*url.URL{role.URI()},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	if certDER, err = createCert(tmpl, ca, key.Public(), caKey); err != nil {
		return nil, nil, err
	}
	if keyDER, err = x509.MarshalPKCS8PrivateKey(key); err != nil {
		return nil, nil, err
	}
	return certDER, keyDER, nil
}

func createCert(tmpl, parent *x509.Certificate, pub crypto.PublicKey, signer crypto.Signer) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	return x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
}

// pemFile is one PEM block to write to path with mode.
type pemFile struct {
	path  string
	block string
	der   []byte
	mode  os.FileMode
}

// write writes f to a temporary file beside it, with f's mode from the start,
// and renames it over f.path.
func (f pemFile) write() error {
	tmp, err := os.CreateTemp(filepath.Dir(f.path), "."+filepath.Base(f.path)+".*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // a no-op once renamed
	err = errors.Join(
		tmp.Chmod(f.mode),
		pem.Encode(tmp, &pem.Block{Type: f.block, Bytes: f.der}),
		tmp.Close(),
	)
	if err != nil {
		return err
	}
	return os.Rename(tmp.Name(), f.path)
}
