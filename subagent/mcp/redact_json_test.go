package mcp

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestTokenQuotedJSONEscapedIsRedacted (review of issue 13's fixes): a
// server that quotes the token in JSON with its "/" escaped ("\/", as PHP's
// json_encode does by default; base64 tokens hold "/") gets it past the
// byte-wise redaction of the body, and the token is whole once the SDK
// decoded it. The server's decoded errors and log records are redacted too.
func TestTokenQuotedJSONEscapedIsRedacted(t *testing.T) {
	t.Parallel()
	const token = "sk/Zm9vYmFy+YmF6"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			ID json.RawMessage `json:"id"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		if len(req.ID) == 0 {
			w.WriteHeader(http.StatusAccepted) // a notification
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(req.ID) +
			`,"error":{"code":-32001,"message":"token sk\/Zm9vYmFy+YmF6 is revoked"}}`))
	}))
	t.Cleanup(srv.Close)
	log, logs := testLogger()
	_, err := Open(t.Context(), Options{Config: mustParse(t, httpYAML(srv.URL, "    token_file: "+writeFile(t, "token", token)+"\n",
		"{name: echo, effect: read}")), Logger: log})
	if err == nil || !strings.Contains(err.Error(), "is revoked") {
		t.Fatalf("Open = %v, want the server's refusal", err)
	}
	if strings.Contains(err.Error(), token) {
		t.Errorf("Open's error holds the token: %q", err)
	}
	if strings.Contains(logs.String(), token) {
		t.Errorf("the log holds the token:\n%s", logs)
	}
}
