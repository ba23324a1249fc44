package redact

import (
	"context"
	"fmt"
	"log/slog"
)

// Logger is l with every record's message and attribute values redacted
// by Text before l's handler sees them (see NewHandler).
func Logger(l *slog.Logger) *slog.Logger {
	if _, ok := l.Handler().(handler); ok {
		return l
	}
	return slog.New(NewHandler(l.Handler()))
}

// NewHandler returns a handler that passes each record on to h with its
// message and every attribute value redacted by Text: strings, errors (as
// an error whose text is redacted and whose chain is e's) and anything else
// whose printed form Text changes (as that text). Attributes Text leaves
// alone reach h as they were.
func NewHandler(h slog.Handler) slog.Handler {
	if r, ok := h.(handler); ok {
		return r
	}
	return handler{h}
}

type handler struct{ slog.Handler }

func (h handler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, Text(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(attr(a))
		return true
	})
	return h.Handler.Handle(ctx, out)
}

func (h handler) WithAttrs(as []slog.Attr) slog.Handler {
	out := make([]slog.Attr, len(as))
	for i, a := range as {
		out[i] = attr(a)
	}
	return handler{h.Handler.WithAttrs(out)}
}

func (h handler) WithGroup(name string) slog.Handler { return handler{h.Handler.WithGroup(name)} }

func attr(a slog.Attr) slog.Attr {
	switch v := a.Value.Resolve(); v.Kind() {
	case slog.KindString:
		if Name(a.Key) && v.String() != "" {
			return slog.String(a.Key, Mark) // a secret's name: its value whole
		}
		return slog.String(a.Key, Text(v.String()))
	case slog.KindAny:
		if e, ok := v.Any().(error); ok {
			return slog.Any(a.Key, Err(e))
		}
		if Name(a.Key) {
			return slog.String(a.Key, Mark)
		}
		if s := fmt.Sprint(v.Any()); Text(s) != s {
			return slog.String(a.Key, Text(s))
		}
	case slog.KindGroup:
		as := v.Group()
		out := make([]any, len(as))
		for i, g := range as {
			out[i] = attr(g)
		}
		return slog.Group(a.Key, out...)
	}
	return a
}

// Err is e with its text redacted by Text; errors.Is and As still see e's
// chain. It returns e itself when Text changes nothing (nil for nil).
func Err(e error) error { return ErrWith(e, Text) }

// ErrWith is e with its text passed through redact (another rule, such as
// a server's own secrets); errors.Is and As still see e's chain. It returns
// e itself when redact changes nothing (nil for nil).
func ErrWith(e error, redact func(string) string) error {
	if e == nil {
		return nil
	}
	if msg := redact(e.Error()); msg != e.Error() {
		return &redactedError{msg: msg, err: e}
	}
	return e
}

type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }
