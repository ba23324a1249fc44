package mcp

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/fanout/fanout/internal/redact"
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

// secrets are a server's current secrets (its bearer token), kept to redact
// their decoded form too: the body redactor sees bytes, and a server may
// escape a token in JSON ("\/" for "/", "\u002f") so that it is whole only
// once the SDK decoded it. Every error a tool call or a connect returns,
// every result's text and every log record of the server pass through it.
type secrets struct {
	mu  sync.Mutex
	all []string
}

func (s *secrets) add(v string) {
	if v == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !slices.Contains(s.all, v) {
		s.all = append(s.all, v)
	}
}

func (s *secrets) text(t string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range s.all {
		t = strings.ReplaceAll(t, v, redacted)
	}
	return t
}

// err is e with its text redacted; errors.Is and As still see e's chain.
func (s *secrets) err(e error) error { return redact.ErrWith(e, s.text) }

// redactingHandler is a log handler that redacts a server's secrets from
// each record's message and attributes.
type redactingHandler struct {
	slog.Handler
	s *secrets
}

func (h redactingHandler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, h.s.text(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.attr(a))
		return true
	})
	return h.Handler.Handle(ctx, out)
}

func (h redactingHandler) attr(a slog.Attr) slog.Attr {
	switch v := a.Value.Resolve(); v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, h.s.text(v.String()))
	case slog.KindAny:
		if e, ok := v.Any().(error); ok {
			return slog.Any(a.Key, h.s.err(e))
		}
		return slog.String(a.Key, h.s.text(fmt.Sprint(v.Any())))
	case slog.KindGroup:
		as := v.Group()
		out := make([]any, len(as))
		for i, g := range as {
			out[i] = h.attr(g)
		}
		return slog.Group(a.Key, out...)
	}
	return a
}

func (h redactingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	out := make([]slog.Attr, len(as))
	for i, a := range as {
		out[i] = h.attr(a)
	}
	return redactingHandler{Handler: h.Handler.WithAttrs(out), s: h.s}
}

func (h redactingHandler) WithGroup(name string) slog.Handler {
	return redactingHandler{Handler: h.Handler.WithGroup(name), s: h.s}
}
