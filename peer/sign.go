package peer

import (
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Sentinel errors of KeySet.Verify; the errors it returns wrap them, so
// callers test with errors.Is.
var (
	// ErrUnknownKey: the key id is not in the set (never issued, or retired).
	ErrUnknownKey = errors.New("unknown signing key")
	// ErrBadSignature: the signature is missing, malformed or does not match
	// the message under the named key.
	ErrBadSignature = errors.New("bad signature")
)

// KeyID returns the id of an Ed25519 public key: "ed25519:" and the first 16
// hex digits of the SHA-256 of its raw bytes. Ids are derived, never
// configured, so rotating a key is adding a file.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return "ed25519:" + hex.EncodeToString(sum[:8])
}

// Signer signs dispatch envelopes with an orchestrator's Ed25519 private key.
// It prints as its key id, never its key.
type Signer struct {
	priv ed25519.PrivateKey
	id   string
}

// NewSigner returns a Signer for priv. It panics if priv is not an Ed25519
// private key, as crypto/ed25519 would on the first signature.
func NewSigner(priv ed25519.PrivateKey) *Signer {
	if len(priv) != ed25519.PrivateKeySize {
		panic(fmt.Sprintf("peer: ed25519 private key is %d bytes, want %d", len(priv), ed25519.PrivateKeySize))
	}
	return &Signer{priv: priv, id: KeyID(priv.Public().(ed25519.PublicKey))}
}

// LoadSigner reads the Ed25519 private key in the file at path: one PEM
// "PRIVATE KEY" block (PKCS#8), as written by GenerateDev or
// `openssl genpkey -algorithm ed25519`. Its errors name the file and what was
// wrong with it, never its contents.
func LoadSigner(path string) (*Signer, error) {
	blocks, err := readPEM("signing key", path, "PRIVATE KEY")
	if err != nil {
		return nil, err
	}
	if len(blocks) != 1 {
		return nil, fmt.Errorf("load signing key %s: %d PEM blocks, want 1", path, len(blocks))
	}
	key, err := x509.ParsePKCS8PrivateKey(blocks[0].Bytes)
	if err != nil {
		return nil, fmt.Errorf("load signing key %s: %w", path, err)
	}
	priv, ok := key.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("load signing key %s: it holds a %T, want an Ed25519 key", path, key)
	}
	return NewSigner(priv), nil
}

// KeyID returns the id of the signer's key, which a dispatch envelope carries
// so that its receiver knows which public key to verify it with.
func (s *Signer) KeyID() string { return s.id }

// Public returns the signer's public key, for wiring a KeySet in process.
func (s *Signer) Public() ed25519.PublicKey { return s.priv.Public().(ed25519.PublicKey) }

// Sign returns the Ed25519 signature of msg, the exact bytes to be verified.
func (s *Signer) Sign(msg []byte) []byte { return ed25519.Sign(s.priv, msg) }

// String returns the signer's key id, so that a logged Signer shows no key.
func (s *Signer) String() string { return "peer.Signer(" + s.id + ")" }

// GoString is String, for %#v.
func (s *Signer) GoString() string { return s.String() }

// KeySet is the Ed25519 public keys a worker accepts dispatches from. It
// accepts a signature by any key in it, so keys rotate without downtime: give
// workers the old and the new public key, switch the orchestrators to the new
// signing key, then remove the old public key.
type KeySet struct {
	keys map[string]ed25519.PublicKey
}

// NewKeySet returns the set of pubs, for tests and in-process wiring. It
// panics if a key is not an Ed25519 public key.
func NewKeySet(pubs ...ed25519.PublicKey) *KeySet {
	ks := &KeySet{keys: make(map[string]ed25519.PublicKey, len(pubs))}
	for _, pub := range pubs {
		if err := ks.add(pub); err != nil {
			panic("peer: " + err.Error())
		}
	}
	return ks
}

func (ks *KeySet) add(pub ed25519.PublicKey) error {
	if len(pub) != ed25519.PublicKeySize {
		return fmt.Errorf("ed25519 public key is %d bytes, want %d", len(pub), ed25519.PublicKeySize)
	}
	id := KeyID(pub)
	if old, ok := ks.keys[id]; ok && !old.Equal(pub) {
		return fmt.Errorf("two different keys share the id %s", id)
	}
	ks.keys[id] = slices.Clone(pub)
	return nil
}

// LoadKeySet reads the public keys at paths. Each path is a PEM file of one or
// more "PUBLIC KEY" blocks (PKIX), each an Ed25519 key, or a directory whose
// *.pem files are read (not its subdirectories; symbolic links are followed,
// so a mounted Kubernetes Secret works). A key found twice counts once.
//
// It returns an error if the set would be empty, or one naming the file that
// cannot be read or holds anything but Ed25519 public keys; a private key is
// refused, since a worker must hold public keys only.
func LoadKeySet(paths ...string) (*KeySet, error) {
	ks := &KeySet{keys: make(map[string]ed25519.PublicKey)}
	for _, p := range paths {
		files, err := keyFiles(p)
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			if err := ks.load(f); err != nil {
				return nil, err
			}
		}
	}
	if len(ks.keys) == 0 {
		return nil, fmt.Errorf("load verify keys: no public keys in %s", strings.Join(paths, ", "))
	}
	return ks, nil
}

// keyFiles returns path if it is a file, or the *.pem files in it if it is a
// directory.
func keyFiles(path string) ([]string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("load verify keys: %w", err)
	}
	if !info.IsDir() {
		return []string{path}, nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, fmt.Errorf("load verify keys: %w", err)
	}
	var files []string
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".pem") {
			continue
		}
		f := filepath.Join(path, e.Name())
		info, err := os.Stat(f) // follows the symbolic links of a Secret volume
		if err != nil {
			return nil, fmt.Errorf("load verify keys: %w", err)
		}
		if info.Mode().IsRegular() {
			files = append(files, f)
		}
	}
	return files, nil
}

func (ks *KeySet) load(path string) error {
	blocks, err := readPEM("verify key", path, "PUBLIC KEY")
	if err != nil {
		return err
	}
	for i, b := range blocks {
		key, err := x509.ParsePKIXPublicKey(b.Bytes)
		if err != nil {
			return fmt.Errorf("load verify key %s: block %d: %w", path, i+1, err)
		}
		pub, ok := key.(ed25519.PublicKey)
		if !ok {
			return fmt.Errorf("load verify key %s: block %d is a %T, want an Ed25519 key", path, i+1, key)
		}
		if err := ks.add(pub); err != nil {
			return fmt.Errorf("load verify key %s: block %d: %w", path, i+1, err)
		}
	}
	return nil
}

// IDs returns the ids of the keys in the set, sorted.
func (ks *KeySet) IDs() []string { return slices.Sorted(maps.Keys(ks.keys)) }

// Verify checks that sig is the signature of msg by the key keyID names. It
// returns an error wrapping ErrUnknownKey if the key is not in the set, or
// ErrBadSignature if sig is missing, of the wrong length or does not match.
func (ks *KeySet) Verify(keyID string, msg, sig []byte) error {
	pub, ok := ks.keys[keyID]
	if !ok {
		return fmt.Errorf("verify signature by key %s: %w", printableID(keyID), ErrUnknownKey)
	}
	if len(sig) != ed25519.SignatureSize {
		return fmt.Errorf("verify signature by key %s: %w: %d bytes, want %d", keyID, ErrBadSignature, len(sig), ed25519.SignatureSize)
	}
	if !ed25519.Verify(pub, msg, sig) {
		return fmt.Errorf("verify signature by key %s: %w", keyID, ErrBadSignature)
	}
	return nil
}

// printableID quotes a key id that came off the wire, cut short, so that a
// forged one cannot flood or forge log lines.
func printableID(id string) string {
	const maxLen = 40
	if len(id) > maxLen {
		return fmt.Sprintf("%q...", id[:maxLen])
	}
	return fmt.Sprintf("%q", id)
}

// dispatchContext prefixes the bytes of every signed dispatch, so that a
// signature over a dispatch is valid for nothing else the key may sign.
const dispatchContext = "fanout.v1.Dispatch\x00"

// SignDispatch signs the serialized fanout.v1.Dispatch b for an
// ExecuteRequest envelope.
func (s *Signer) SignDispatch(b []byte) []byte {
	return s.Sign(append([]byte(dispatchContext), b...))
}

// VerifyDispatch checks an envelope's signature over the serialized
// dispatch b. It returns an error wrapping ErrUnknownKey or ErrBadSignature.
func (ks *KeySet) VerifyDispatch(keyID string, b, sig []byte) error {
	return ks.Verify(keyID, append([]byte(dispatchContext), b...), sig)
}
