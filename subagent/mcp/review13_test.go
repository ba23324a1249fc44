package mcp

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fanout/fanout/subagent"
)

// TestServerErrorReplyIsNotProofOfNotSent (review of issue 13): a server
// acts on a write, then answers the call with a JSON-RPC error whose code
// is -32004 (or -32003): codes in the implementation-defined server range
// that the SDK's client maps to ErrConnectionClosed, whatever their
// origin. The reply is the server's answer: the call reached the tool. It
// must not be sent again on a fresh session, and its error must not wrap
// ErrNotSent (the loop would record the write failed, not "may have
// happened").
func TestServerErrorReplyIsNotProofOfNotSent(t *testing.T) {
	t.Parallel()
	for _, transport := range []string{"memory", "http"} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			ts := newTestServer(0)
			var ran atomic.Int64
			ts.srv.AddTool(&sdk.Tool{Name: "charge", InputSchema: objectSchema},
				func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
					ran.Add(1) // the charge is made; then the server says it is closing
					return nil, &jsonrpc.Error{Code: -32004, Message: "server is closing"}
				})
			var m *Manager
			if transport == "http" {
				h := startHTTP(t, ts)
				m = openHTTP(t, mustParse(t, httpYAML(h.url(), "", "{name: charge, effect: write}")))
			} else {
				m = openInMemory(t, ts, mustParse(t, serverYAML("", "{name: charge, effect: write}")), nil)
			}
			_, err := tool(t, m, "t__charge").Func(t.Context(),
				subagent.ToolCall{Name: "charge", IdempotencyKey: "run1/a/a1/i1/c0"})
			if err == nil {
				t.Fatal("the call succeeded; want the server's error")
			}
			if n := ran.Load(); n != 1 {
				t.Errorf("the server ran the write %d times, want 1 (err %v)", n, err)
			}
			if errors.Is(err, subagent.ErrNotSent) {
				t.Errorf("err = %v wraps ErrNotSent, but the server ran the call", err)
			}
		})
	}
}
