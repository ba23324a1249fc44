package mcp

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm/llmtest"
)

// TestBearerTokenFromFile: the token file's token is sent, re-read at a
// reconnect (a rotated Secret works), and never shows in an error, a log
// or a span.
func TestBearerTokenFromFile(t *testing.T) {
	t.Parallel()
	ts := newTestServer(0)
	h := startHTTP(t, ts)
	first, rotated := canary, canary+"-rotated"
	h.token.Store(&first)
	tokenFile := writeFile(t, "token", first+"\n")
	log, logs := testLogger()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	m, err := Open(t.Context(), Options{Config: mustParse(t, httpYAML(h.url(), "    token_file: "+tokenFile+"\n", "{name: echo, effect: read}")),
		Logger: log, TracerProvider: tp})
	if err != nil {
		t.Fatalf("Open with the right token: %v", err)
	}
	defer m.Close()
	if _, err := call(t, m, "t__echo", `{}`); err != nil {
		t.Fatal(err)
	}

	// The Secret rotates and the server restarts, taking only the new token.
	if err := os.WriteFile(tokenFile, []byte(rotated), 0o600); err != nil {
		t.Fatal(err)
	}
	h.token.Store(&rotated)
	h.restart()
	eventually(t, "the worker notices its session is gone", func() bool { return sessionEnded(m, "t") })
	if _, err := call(t, m, "t__echo", `{}`); err != nil {
		t.Fatalf("call after the rotation: %v", err)
	}

	// A token the server refuses: a clear error, without the token.
	wrong := "nope"
	h.token.Store(&wrong)
	h.restart()
	eventually(t, "the worker notices its session is gone", func() bool { return sessionEnded(m, "t") })
	_, err = call(t, m, "t__echo", `{}`)
	if !errors.Is(err, subagent.ErrNotSent) || !strings.Contains(err.Error(), "Unauthorized") {
		t.Errorf("call with a refused token = %v; want not sent, saying Unauthorized", err)
	}
	if p, ok := llmtest.LeakedPiece(err.Error(), canary); ok {
		t.Errorf("error %q holds %q of the token", err, p)
	}
	_, err = Open(t.Context(), Options{Config: mustParse(t, httpYAML(h.url(), "    token_file: "+tokenFile+"\n", "{name: echo}")), Logger: log, TracerProvider: tp})
	if err == nil || !strings.Contains(err.Error(), "servers[0] (t)") || !strings.Contains(err.Error(), "Unauthorized") {
		t.Errorf("Open with a refused token = %v; want the entry and Unauthorized", err)
	}
	if p, ok := llmtest.LeakedPiece(err.Error(), canary); ok {
		t.Errorf("Open's error %q holds %q of the token", err, p)
	}
	if p, ok := llmtest.LeakedPiece(logs.String(), canary); ok {
		t.Errorf("the token (%q) is in the log:\n%s", p, llmtest.LinesHolding(logs.String(), p))
	}
	var spans strings.Builder
	failedConnects := 0
	for _, s := range rec.Ended() {
		fmt.Fprintf(&spans, "%s %v %v\n", s.Name(), s.Attributes(), s.Status())
		for _, e := range s.Events() {
			fmt.Fprintf(&spans, "  %s %v\n", e.Name, e.Attributes)
		}
		if s.Status().Code == codes.Error {
			failedConnects++
		}
	}
	if failedConnects == 0 {
		t.Errorf("no failed connect span recorded:\n%s", spans.String())
	}
	if p, ok := llmtest.LeakedPiece(spans.String(), canary); ok {
		t.Errorf("the token (%q) is in a span:\n%s", p, llmtest.LinesHolding(spans.String(), p))
	}
}
