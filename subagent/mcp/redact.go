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
// transport that added it. It holds back only a tail of what it read that
// could be the start of the secret (never an SSE event's blank line: a
// token does not start with a newline), so a stream's events are not
// delayed.
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
		// Once the secret's whole occurrences are replaced, everything but
		// a tail that starts the secret is final.
		b.buf = bytes.ReplaceAll(b.buf, b.secret, []byte(redacted))
		keep := 0
		if !b.eof {
			keep = partialSuffix(b.buf, b.secret)
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

// partialSuffix is the length of the longest end of buf that is a proper
// start of secret.
func partialSuffix(buf, secret []byte) int {
	for n := min(len(buf), len(secret)-1); n > 0; n-- {
		if bytes.HasSuffix(buf, secret[:n]) {
			return n
		}
	}
	return 0
}
