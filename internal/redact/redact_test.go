package redact_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fanout/fanout/internal/redact"
)

// TestText: in free text, the value of a secret-looking name and a string
// that looks like a credential are redacted, whatever quoting or escaping
// surrounds them; the rest is kept; a second pass changes nothing.
func TestText(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, secret, kept string }{
		{`password=S1 and more`, "S1", " and more"},
		{`{"q":"x","password":"S1 S2","n":1}`, "S1 S2", `"q":"x"`},
		{`{"api_key": "S1"}`, "S1", `"api_key": "`},
		{`{\"token\":\"S1\",\"q\":\"x\"}`, "S1", `\"q\":\"x\"`},
		{`Authorization: Bearer S1xyz`, "S1xyz", "Authorization: "},
		{`got Bearer S1xyz back`, "S1xyz", "got "},
		{`header 'Authorization: Basic dXNlcjpwdw=='`, "dXNlcjpwdw==", "header '"},
		{`Basic S1abc`, "S1abc", ""},
		{`dial postgres://u:S1@db:5432/x: refused`, "S1", "postgres://"},
		{`use sk-live-abcdefgh12345 here`, "sk-live-abcdefgh12345", "use "},
		{`ghp_abcdefghijklmnopqrstuvwx and AKIAABCDEFGHIJKLMNOP`, "ghp_", " and "},
		{`AKIAABCDEFGHIJKLMNOP`, "AKIA", ""},
		{`jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig`, "eyJ", "jwt "},
		{`run tool x: calling "tools/call": token=S1, retry`, "S1", ", retry"},
		{`x: password=S1`, "S1", "x: password="},
		{`GET /a?session=S1&page=2`, "S1", "&page=2"},
		{`PGPASSWORD='S1' psql`, "S1", " psql"},
		{`secret: "S1`, "S1", "secret: "}, // cut before its closing quote
	} {
		got := redact.Text(c.in)
		if strings.Contains(got, c.secret) || !strings.Contains(got, redact.Mark) || !strings.Contains(got, c.kept) {
			t.Errorf("Text(%q) = %q; want %q gone, %q kept", c.in, got, c.secret, c.kept)
		}
		if again := redact.Text(got); again != got {
			t.Errorf("Text(Text(%q)) = %q, not %q", c.in, again, got)
		}
	}
	for _, in := range []string{
		"fact 1 of task t01: on \"find facts\", simulated finding 0a1b2c3d",
		"https://example.com/a?page=2", "not run: tool \"x\" is not allowed", "a basic example", "at 12:30",
		`search({"q":"go"})`, "the tool reported an error: not found",
	} {
		if got := redact.Text(in); got != in {
			t.Errorf("Text(%q) = %q; want it unchanged", in, got)
		}
	}
}

// TestTextTimeIsLinear: a tool's error or result of pathological text
// (names and separators back to back, unclosed quotes) is redacted in time
// linear in its length: 64 KiB well within the bound (a pattern that
// rescanned each value took 47 s on the first string alone).
func TestTextTimeIsLinear(t *testing.T) {
	t.Parallel()
	const n = 64 << 10
	started := time.Now()
	for _, s := range []string{strings.Repeat("a:", n/2), strings.Repeat(`a:"`, n/3), strings.Repeat("password=", n/9),
		strings.Repeat("a", n) + ":", strings.Repeat("bearer ", n/7), strings.Repeat("://a:", n/5)} {
		redact.Text(s)
	}
	if d := time.Since(started); d > 20*time.Second {
		t.Errorf("Text of 6 pathological strings of 64 KiB took %v", d)
	}
}

// TestJSON: the value of a secret-looking key is redacted whatever it is,
// other strings as text; numbers are kept as written.
func TestJSON(t *testing.T) {
	t.Parallel()
	in := `{"amount":12345678901234567890,"auth":{"user":"u"},"list":["Bearer S1abc","ok"],"note":"password=S2","pwd":7}`
	got := redact.RawJSON([]byte(in))
	const want = `{"amount":12345678901234567890,"auth":"[redacted]","list":["[redacted]","ok"],"note":"password=[redacted]","pwd":"[redacted]"}`
	if got != want {
		t.Errorf("RawJSON = %s\nwant      %s", got, want)
	}
	if got := redact.RawJSON([]byte(`not json, token=S1`)); got != "not json, token=[redacted]" {
		t.Errorf("RawJSON of text = %q", got)
	}
	var v any
	if err := json.Unmarshal([]byte(`[{"secret":"S1"},"x"]`), &v); err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(redact.JSON(v)); string(b) != `[{"secret":"[redacted]"},"x"]` {
		t.Errorf("JSON = %s", b)
	}
}

// TestHandler: a record's message, string attributes, errors (their chain
// kept), other values and grouped attributes are redacted; attributes the
// rule leaves alone keep their kind.
func TestHandler(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	base := errors.New("mcp: token=S3")
	l := redact.Logger(slog.New(slog.NewJSONHandler(&buf, nil)))
	if redact.Logger(l) != l {
		t.Error("Logger wraps a redacting logger again")
	}
	l = l.With("with", "password=S5")
	l.Info("call failed: Bearer S1xyz", "args", "api_key=S2", "err", base, "n", 3,
		"v", struct{ A string }{"secret=S4"}, slog.Group("g", "h", "cookie=S6"))
	out := buf.String()
	for _, s := range []string{"S1", "S2", "S3", "S4", "S5", "S6"} {
		if strings.Contains(out, s) {
			t.Errorf("log shows %s: %s", s, out)
		}
	}
	if !strings.Contains(out, `"n":3`) {
		t.Errorf("log lost a number: %s", out)
	}
	if !errors.Is(redact.Err(base), base) {
		t.Error("a redacted error is not its cause")
	}
	if errors.Unwrap(redact.Err(errors.New("plain"))) != nil {
		t.Error("Err changed an error without secrets")
	}
}

// TestReviewFindings (issue 40, its review): a log attribute named like a
// secret is hidden whole; a credential header's value is the rest of its
// line, whatever its scheme; an Anthropic-style key is a credential.
func TestReviewFindings(t *testing.T) {
	for _, c := range []struct{ in, leak string }{
		{"Authorization: Bot MTk4NjIyNDgzNDcxOTI1MjQ4.Cl2FMQ", "MTk4NjIy"},
		{"Authorization: ApiKey abcdef0123456789", "abcdef0123"},
		{`{"header":"Proxy-Authorization: SSWS 00QCjAl4MlV"}`, "00QCjAl4"},
		{"key is sk-ant-api03-abcdefghij0123456789", "abcdefghij"},
	} {
		if out := redact.Text(c.in); strings.Contains(out, c.leak) || redact.Text(out) != out {
			t.Errorf("Text(%q) = %q: leaks %q or is not idempotent", c.in, out, c.leak)
		}
	}
	var buf strings.Builder
	redact.Logger(slog.New(slog.NewTextHandler(&buf, nil))).Info("x", "password", "hunter2", "api_key", "abcdef0123", "token", "t0k3n", "tokens", 42)
	if out := buf.String(); strings.Contains(out, "hunter2") || strings.Contains(out, "abcdef0123") || strings.Contains(out, "t0k3n") || !strings.Contains(out, "tokens=42") {
		t.Errorf("log line %q: a secret-named attribute shown, or a count hidden", out)
	}
}
