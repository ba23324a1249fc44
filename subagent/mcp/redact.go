package mcp

import (
	"bytes"
	"io"
)

// redacted is what a secret a server quoted back reads as.
const redacted = "[redacted]"

// redactingBody is an HTTP response body in which every occurrence of
// secret is replaced by redacted as it is read. A server that quotes the
// bearer token back (an error saying "token X is revoked", a tool that
// echoes its headers) cannot put it into the SDK's errors, the worker's
// logs, a task's summary or the model's context: the token stops at the
// transport that added it. It holds back len(secret)-1 bytes until it knows
// they do not start the secret.
type redactingBody struct {
	r      io.ReadCloser
	secret []byte
	buf    []byte // read from r, not yet returned
	eof    bool
	err    error
}

func newRedactingBody(r io.ReadCloser, secret string) io.ReadCloser {
	if secret == "" {
		return r
	}
	return &redactingBody{r: r, secret: []byte(secret)}
}

func (b *redactingBody) Read(p []byte) (int, error) {
	for {
		// Everything before the last len(secret)-1 bytes is final once
		// the secret's whole occurrences in it are replaced.
		b.buf = bytes.ReplaceAll(b.buf, b.secret, []byte(redacted))
		keep := len(b.secret) - 1
		if b.eof {
			keep = 0
		}
		if ready := len(b.buf) - keep; ready > 0 {
			n := copy(p, b.buf[:ready])
			b.buf = b.buf[n:]
			return n, nil
		}
		if b.eof {
			return 0, b.err
		}
		chunk := make([]byte, max(len(p), 4096))
		n, err := b.r.Read(chunk)
		b.buf = append(b.buf, chunk[:n]...)
		if err != nil {
			b.eof, b.err = true, err
		}
	}
}

func (b *redactingBody) Close() error { return b.r.Close() }
