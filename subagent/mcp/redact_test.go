package mcp

import (
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// TestRedactingBody: a secret is replaced wherever it falls, split across
// reads of any size included, and the rest of the body is unchanged.
func TestRedactingBody(t *testing.T) {
	t.Parallel()
	const secret = "tok-secret-123"
	for _, body := range []string{
		"", "no secret here", secret, "a " + secret + " b " + secret, "tok-secre", "tok-secret-12" + "x" + secret,
		strings.Repeat("x", 5000) + secret + strings.Repeat("y", 5000),
	} {
		want := strings.ReplaceAll(body, secret, redacted)
		for _, r := range []io.Reader{strings.NewReader(body), iotest.OneByteReader(strings.NewReader(body)),
			iotest.HalfReader(strings.NewReader(body)), iotest.DataErrReader(strings.NewReader(body))} {
			got, err := io.ReadAll(newRedactingBody(io.NopCloser(r), secret))
			if err != nil || string(got) != want {
				t.Errorf("body %.40q read as %.40q (%v), want %.40q", body, got, err, want)
			}
		}
	}
	// An event that ends a read is not held back for the next one: a
	// long-lived SSE stream's events arrive when they are sent.
	pr, pw := io.Pipe()
	body := newRedactingBody(pr, secret)
	go func() { _, _ = pw.Write([]byte("data: {\"ok\":true}\n\n")) }()
	buf := make([]byte, 64)
	n, err := body.Read(buf)
	if err != nil || string(buf[:n]) != "data: {\"ok\":true}\n\n" {
		t.Errorf("first read %q, %v; want the whole event at once", buf[:n], err)
	}
	_ = pw.Close()
}
