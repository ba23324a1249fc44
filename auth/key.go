package auth

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"regexp"
	"strings"
)

// tokenPrefix starts every token fanout issues: "fanout_" + key id + "_" +
// the secret (256 random bits, base64url without padding).
const tokenPrefix = "fanout_"

// secretBytes is the secret's size: 256 bits.
const secretBytes = 32

var keyIDPattern = regexp.MustCompile(`^fk_[0-9a-f]{16}$`)

// ErrMalformedToken is returned for a credential that is not a fanout token. Its message
// never holds the token.
var ErrMalformedToken = errors.New("malformed API key: want fanout_fk_<16 hex>_<secret>")

// NewKey returns a new key id, the whole token (shown once, never stored)
// and the SHA-256 of its secret (what the database keeps).
func NewKey() (keyID, token string, secretSHA256 []byte, err error) {
	var id [8]byte
	secret := make([]byte, secretBytes)
	if _, err := rand.Read(id[:]); err != nil {
		return "", "", nil, err
	}
	if _, err := rand.Read(secret); err != nil {
		return "", "", nil, err
	}
	keyID = "fk_" + hex.EncodeToString(id[:])
	s := base64.RawURLEncoding.EncodeToString(secret)
	digest := sha256.Sum256([]byte(s))
	return keyID, tokenPrefix + keyID + "_" + s, digest[:], nil
}

// ParseToken splits a token into its key id and the SHA-256 of its secret
// (the secret's text as sent, so the digest is of what the caller holds).
func ParseToken(token string) (keyID string, secretSHA256 []byte, err error) {
	rest, ok := strings.CutPrefix(token, tokenPrefix)
	if !ok || len(rest) < 20 || rest[19] != '_' {
		return "", nil, ErrMalformedToken
	}
	keyID, secret := rest[:19], rest[20:]
	if !keyIDPattern.MatchString(keyID) {
		return "", nil, ErrMalformedToken
	}
	raw, err := base64.RawURLEncoding.DecodeString(secret)
	if err != nil || len(raw) != secretBytes {
		return "", nil, ErrMalformedToken
	}
	digest := sha256.Sum256([]byte(secret))
	return keyID, digest[:], nil
}

// secretOf is the secret part of a well-formed token (ParseToken's input).
func secretOf(token string) string {
	rest, _ := strings.CutPrefix(token, tokenPrefix)
	if len(rest) < 20 {
		return ""
	}
	return rest[20:]
}
