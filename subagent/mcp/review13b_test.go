package mcp

import (
	"encoding/json"
	"io"
	"strings"
	"testing"
)

// TestRedactingBodyJSONEscapedToken (review of issue 13's fixes): a
// server that quotes the token in JSON with its "/" escaped ("\/", as
// PHP's json_encode does by default; base64 tokens hold "/") gets it past
// the byte-wise redaction: the SDK decodes the JSON, and the token is
// whole in the error text.
func TestRedactingBodyJSONEscapedToken(t *testing.T) {
	t.Parallel()
	const token = "sk/Zm9vYmFy+YmF6"
	body := `{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"token sk\/Zm9vYmFy+YmF6 is revoked"}}`
	b, err := io.ReadAll(newRedactingBody(io.NopCloser(strings.NewReader(body)), token))
	if err != nil {
		t.Fatal(err)
	}
	var msg struct {
		Error struct{ Message string } `json:"error"`
	}
	if err := json.Unmarshal(b, &msg); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(msg.Error.Message, token) {
		t.Errorf("the error the SDK decodes holds the token: %q", msg.Error.Message)
	}
}
