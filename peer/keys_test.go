package peer

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func newSigner(t *testing.T) *Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return NewSigner(priv)
}

func TestKeyID(t *testing.T) {
	t.Parallel()
	// Ids end up in configs and envelopes: this one must never change.
	priv := ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize))
	const want = "ed25519:" + "139e3940e64b5491" // sha256sum of the raw key, cut to 16
	if got := KeyID(priv.Public().(ed25519.PublicKey)); got != want {
		t.Errorf("KeyID = %s, want %s", got, want)
	}
	if got := NewSigner(priv).KeyID(); got != want {
		t.Errorf("Signer.KeyID = %s, want %s", got, want)
	}
}

func TestSignVerify(t *testing.T) {
	t.Parallel()
	signer, other := newSigner(t), newSigner(t)
	keys := NewKeySet(signer.Public())
	msg := []byte("execute task 7 of run 42, attempt 1")
	sig := signer.Sign(msg)
	if err := keys.Verify(signer.KeyID(), msg, sig); err != nil {
		t.Fatalf("verify: %v", err)
	}
	flip := func(b []byte, bit int) []byte {
		b = slices.Clone(b)
		b[bit/8] ^= 1 << (bit % 8)
		return b
	}
	tests := []struct {
		name     string
		keyID    string
		msg, sig []byte
		want     error
	}{
		{"bit flipped in msg", signer.KeyID(), flip(msg, 13), sig, ErrBadSignature},
		{"bit flipped in R", signer.KeyID(), msg, flip(sig, 5), ErrBadSignature},
		{"bit flipped in S", signer.KeyID(), msg, flip(sig, 8*63+1), ErrBadSignature},
		{"empty msg", signer.KeyID(), nil, sig, ErrBadSignature},
		{"empty sig", signer.KeyID(), msg, nil, ErrBadSignature},
		{"short sig", signer.KeyID(), msg, sig[:ed25519.SignatureSize-1], ErrBadSignature},
		{"long sig", signer.KeyID(), msg, append(slices.Clone(sig), 0), ErrBadSignature},
		{"another key's sig", signer.KeyID(), msg, other.Sign(msg), ErrBadSignature},
		{"unknown key", other.KeyID(), msg, other.Sign(msg), ErrUnknownKey},
		{"empty key id", "", msg, sig, ErrUnknownKey},
		{"long key id", strings.Repeat("x", 1<<16), msg, sig, ErrUnknownKey},
	}
	for _, tt := range tests {
		err := keys.Verify(tt.keyID, tt.msg, tt.sig)
		if !errors.Is(err, tt.want) {
			t.Errorf("%s: %v, want %v", tt.name, err, tt.want)
		}
		if errors.Is(err, ErrUnknownKey) && errors.Is(err, ErrBadSignature) {
			t.Errorf("%s: %v is both", tt.name, err)
		}
		if err != nil && len(err.Error()) > 200 {
			t.Errorf("%s: error is %d bytes long", tt.name, len(err.Error()))
		}
	}
}

func TestSignerPrintsNoKey(t *testing.T) {
	t.Parallel()
	signer := newSigner(t)
	want := "peer.Signer(" + signer.KeyID() + ")"
	for _, verb := range []string{"%v", "%+v", "%s", "%#v"} {
		if got := fmt.Sprintf(verb, signer); got != want {
			t.Errorf("Sprintf(%s) = %s, want %s", verb, got, want)
		}
	}
}

// writePub writes pubs as PEM public keys to path.
func writePub(t *testing.T, path string, pubs ...ed25519.PublicKey) {
	t.Helper()
	var buf bytes.Buffer
	for _, pub := range pubs {
		der, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			t.Fatal(err)
		}
		if err := pem.Encode(&buf, &pem.Block{Type: "PUBLIC KEY", Bytes: der}); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func loadKeySet(t *testing.T, paths ...string) *KeySet {
	t.Helper()
	ks, err := LoadKeySet(paths...)
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

func TestKeyRotation(t *testing.T) {
	t.Parallel()
	oldKey, newKey := newSigner(t), newSigner(t)
	msg := []byte("dispatch")
	verify := func(ks *KeySet, s *Signer) error { return ks.Verify(s.KeyID(), msg, s.Sign(msg)) }

	dir := t.TempDir()
	writePub(t, filepath.Join(dir, "old.pem"), oldKey.Public())
	writePub(t, filepath.Join(dir, "new.pem"), newKey.Public())
	for name, ks := range map[string]*KeySet{
		"in process": NewKeySet(oldKey.Public(), newKey.Public()),
		"from dir":   loadKeySet(t, dir),
	} {
		for _, s := range []*Signer{oldKey, newKey} {
			if err := verify(ks, s); err != nil {
				t.Errorf("%s, both keys: %v", name, err)
			}
		}
	}

	if err := os.Remove(filepath.Join(dir, "old.pem")); err != nil {
		t.Fatal(err)
	}
	for name, ks := range map[string]*KeySet{
		"in process": NewKeySet(newKey.Public()),
		"from dir":   loadKeySet(t, dir),
	} {
		if err := verify(ks, newKey); err != nil {
			t.Errorf("%s, new key only: new signer: %v", name, err)
		}
		if err := verify(ks, oldKey); !errors.Is(err, ErrUnknownKey) {
			t.Errorf("%s, new key only: old signer: %v, want %v", name, err, ErrUnknownKey)
		}
	}
}

func TestLoadKeySet(t *testing.T) {
	t.Parallel()
	s1, s2, s3 := newSigner(t), newSigner(t), newSigner(t)
	sorted := func(ids ...string) []string { return slices.Sorted(slices.Values(ids)) }

	t.Run("file with two keys", func(t *testing.T) {
		t.Parallel()
		f := filepath.Join(t.TempDir(), "keys.pem")
		writePub(t, f, s1.Public(), s2.Public())
		if got, want := loadKeySet(t, f).IDs(), sorted(s1.KeyID(), s2.KeyID()); !slices.Equal(got, want) {
			t.Errorf("IDs %v, want %v", got, want)
		}
	})

	t.Run("directory", func(t *testing.T) {
		t.Parallel()
		dir, elsewhere := t.TempDir(), t.TempDir()
		writePub(t, filepath.Join(dir, "a.pem"), s1.Public())
		writePub(t, filepath.Join(dir, "b.pem"), s2.Public(), s1.Public())
		// Not *.pem, or not a file: not read.
		if err := os.WriteFile(filepath.Join(dir, "README"), []byte("not a key"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(filepath.Join(dir, "retired.pem"), 0o755); err != nil {
			t.Fatal(err)
		}
		// A Kubernetes Secret volume's files are symbolic links.
		writePub(t, filepath.Join(elsewhere, "k"), s3.Public())
		if err := os.Symlink(filepath.Join(elsewhere, "k"), filepath.Join(dir, "c.pem")); err != nil {
			t.Fatal(err)
		}
		ks := loadKeySet(t, dir)
		if got, want := ks.IDs(), sorted(s1.KeyID(), s2.KeyID(), s3.KeyID()); !slices.Equal(got, want) {
			t.Errorf("IDs %v, want %v", got, want)
		}
		msg := []byte("m")
		for _, s := range []*Signer{s1, s2, s3} {
			if err := ks.Verify(s.KeyID(), msg, s.Sign(msg)); err != nil {
				t.Errorf("verify %s: %v", s.KeyID(), err)
			}
		}
	})

	t.Run("errors", func(t *testing.T) {
		t.Parallel()
		df := generateDev(t)
		dir := t.TempDir()
		empty := filepath.Join(dir, "empty")
		if err := os.Mkdir(empty, 0o755); err != nil {
			t.Fatal(err)
		}
		ecdsaKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		ecdsaPub := filepath.Join(dir, "ecdsa.pem")
		der, err := x509.MarshalPKIXPublicKey(ecdsaKey.Public())
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(ecdsaPub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644); err != nil {
			t.Fatal(err)
		}
		noPEM := filepath.Join(dir, "nopem.pem")
		if err := os.WriteFile(noPEM, []byte("MCowBQYDK2VwAyEA"), 0o644); err != nil {
			t.Fatal(err)
		}
		missing := filepath.Join(dir, "missing.pem")
		tests := []struct {
			name  string
			paths []string
			want  string // the error names it
		}{
			{"nothing", nil, "no public keys"},
			{"empty dir", []string{empty}, empty},
			{"missing", []string{missing}, missing},
			{"private key", []string{df.SigningKey}, df.SigningKey},
			{"certificate", []string{df.CA}, df.CA},
			{"ECDSA key", []string{ecdsaPub}, ecdsaPub},
			{"no PEM", []string{noPEM}, noPEM},
			{"dev dir: holds private keys", []string{filepath.Dir(df.CA)}, filepath.Dir(df.CA)},
		}
		for _, tt := range tests {
			ks, err := LoadKeySet(tt.paths...)
			if err == nil {
				t.Errorf("%s: %v, want an error", tt.name, ks.IDs())
				continue
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%s: error %q does not name %s", tt.name, err, tt.want)
			}
			assertNoPEM(t, err, append(tt.paths, noPEM)...)
		}
	})
}

func TestLoadSigner(t *testing.T) {
	t.Parallel()
	df := generateDev(t)
	signer, err := LoadSigner(df.SigningKey)
	if err != nil {
		t.Fatal(err)
	}
	if got := loadKeySet(t, df.VerifyKey).IDs(); !slices.Equal(got, []string{signer.KeyID()}) {
		t.Errorf("verify key ids %v, want [%s]", got, signer.KeyID())
	}
	twice := filepath.Join(t.TempDir(), "twice.pem")
	key, err := os.ReadFile(df.SigningKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(twice, append(key, key...), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{df.VerifyKey, df.Worker.Key, df.CA, twice, filepath.Join(t.TempDir(), "missing.pem")} {
		s, err := LoadSigner(path)
		if err == nil {
			t.Errorf("LoadSigner(%s) = %v, want an error", path, s)
			continue
		}
		if !strings.Contains(err.Error(), path) {
			t.Errorf("error %q does not name %s", err, path)
		}
		assertNoPEM(t, err, path)
	}
}

// TestDispatchSignatureIsDomainSeparated: a dispatch signature verifies only
// as a dispatch, and a plain signature over the same bytes does not pass as
// one.
func TestDispatchSignatureIsDomainSeparated(t *testing.T) {
	t.Parallel()
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	s := NewSigner(priv)
	ks := NewKeySet(s.Public())
	msg := []byte("dispatch bytes")
	if err := ks.VerifyDispatch(s.KeyID(), msg, s.SignDispatch(msg)); err != nil {
		t.Fatalf("verify a signed dispatch: %v", err)
	}
	if err := ks.VerifyDispatch(s.KeyID(), msg, s.Sign(msg)); !errors.Is(err, ErrBadSignature) {
		t.Errorf("a plain signature passed as a dispatch signature: %v", err)
	}
	if err := ks.Verify(s.KeyID(), msg, s.SignDispatch(msg)); !errors.Is(err, ErrBadSignature) {
		t.Errorf("a dispatch signature passed as a plain signature: %v", err)
	}
}
