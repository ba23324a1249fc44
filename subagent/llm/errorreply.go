package llm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// maxErrorBody is how much of an error reply's body is read; a longer one
// is not in a provider's shape.
const maxErrorBody = 1 << 20

// maxErrorMessage caps StatusError.Message.
const maxErrorMessage = 512

// foreignReply is an error reply whose body is not in the provider's error
// shape, caught by errorShapeMiddleware before the provider's client tries
// to decode it (and fails, losing the status and the body, or makes up an
// empty error). The provider turns it into a *StatusError.
type foreignReply struct {
	status int
	body   []byte
	header http.Header
}

func (e *foreignReply) Error() string {
	return fmt.Sprintf("HTTP %d reply not in the provider's error shape", e.status)
}

// errorShapeMiddleware returns an HTTP middleware (the signature of both
// clients' option.Middleware) that lets a reply through unless it has an
// error status and a body that shaped does not accept; that one becomes a
// *foreignReply error. It notes every reply's status and headers for the
// caller first (noteReply), whatever happens to the reply next.
func errorShapeMiddleware(shaped func([]byte) bool) func(*http.Request, func(*http.Request) (*http.Response, error)) (*http.Response, error) {
	return func(req *http.Request, next func(*http.Request) (*http.Response, error)) (*http.Response, error) {
		res, err := next(req)
		if err == nil {
			noteReply(req.Context(), res)
		}
		if err != nil || res.StatusCode < 400 {
			return res, err
		}
		body, err := io.ReadAll(io.LimitReader(res.Body, maxErrorBody+1))
		_ = res.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("read the body of an HTTP %d reply: %w", res.StatusCode, err)
		}
		if len(body) <= maxErrorBody && shaped(body) {
			res.Body = io.NopCloser(bytes.NewReader(body))
			return res, nil
		}
		return nil, &foreignReply{status: res.StatusCode, body: body, header: res.Header}
	}
}

// openAIErrorShape reports whether body is an OpenAI error:
// {"error":{"message":"...",...}}.
func openAIErrorShape(body []byte) bool {
	var doc struct {
		Error *struct {
			Message *string `json:"message"`
		} `json:"error"`
	}
	return json.Unmarshal(body, &doc) == nil && doc.Error != nil && doc.Error.Message != nil
}

// anthropicErrorShape reports whether body is an Anthropic error:
// {"type":"error","error":{"type":"...","message":"..."}}.
func anthropicErrorShape(body []byte) bool {
	var doc struct {
		Type  string `json:"type"`
		Error *struct {
			Type    *string `json:"type"`
			Message *string `json:"message"`
		} `json:"error"`
	}
	return json.Unmarshal(body, &doc) == nil && doc.Type == "error" && doc.Error != nil &&
		doc.Error.Type != nil && doc.Error.Message != nil
}

// statusError returns the *StatusError of a foreign reply: its status,
// Retry-After and request id, and its body, redacted and cut to
// maxErrorMessage bytes.
func (c *caller) statusError(runID string, fr *foreignReply, requestIDHeader string) *StatusError {
	body := strings.Join(strings.Fields(strings.ToValidUTF8(string(fr.body), "\uFFFD")), " ")
	return &StatusError{
		Provider:    c.provider,
		RunID:       runID,
		StatusCode:  fr.status,
		Message:     truncateBytes(c.redact.String(body), maxErrorMessage),
		RequestID:   c.redact.String(fr.header.Get(requestIDHeader)),
		RetryAfter:  ParseRetryAfter(fr.header, time.Now()),
		ForeignBody: true,
	}
}

// truncateBytes cuts s to at most n bytes, "..." included, never inside a
// UTF-8 sequence.
func truncateBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const ellipsis = "..."
	cut := n - len(ellipsis)
	for cut > 0 && cut < len(s) && s[cut]&0xC0 == 0x80 {
		cut-- // a continuation byte: back to the start of its rune
	}
	return s[:cut] + ellipsis
}
