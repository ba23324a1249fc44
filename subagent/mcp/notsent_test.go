package mcp

import (
	"context"
	"errors"
	"strings"
	"sync"
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

// TestCallOnAConnectionKnownBrokenIsSentAgain: the SDK knows a session's
// connection is broken (writing a reply to the server's ping failed)
// before the manager does (the connection has not ended: its Read still
// works). jsonrpc2 refuses to write the next call on it
// (ErrConnectionClosed, the request never handed to the connection): it
// provably never reached the tool, so it is sent once more on a fresh
// session, whatever its effect, and runs once.
func TestCallOnAConnectionKnownBrokenIsSentAgain(t *testing.T) {
	t.Parallel()
	ts := newTestServer(0)
	var ran atomic.Int64
	ts.srv.AddTool(&sdk.Tool{Name: "charge", InputSchema: objectSchema},
		func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
			ran.Add(1)
			return textResult("charged"), nil
		})
	first := &holdConn{closing: make(chan struct{}), release: make(chan struct{})}
	var server *sdk.ServerSession
	var connects atomic.Int64
	transport := func(ctx context.Context, _ ServerConfig) (sdk.Transport, error) {
		st, ct := sdk.NewInMemoryTransports()
		ss, err := ts.srv.Connect(ctx, st, nil)
		if err != nil {
			return nil, err
		}
		if connects.Add(1) > 1 {
			return ct, nil
		}
		server = ss // Read after the first call's connect returned.
		return holdTransport{ct, first}, nil
	}
	log, logBuf := testLogger()
	m, err := Open(t.Context(), Options{Config: mustParse(t, serverYAML("", "{name: charge, effect: write}")), Logger: log, transport: transport})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(m.Close)
	t.Cleanup(func() { close(first.release) }) // Before m.Close: it waits for the connection to end.

	first.failReplies.Store(true)
	pctx, stopPing := context.WithCancel(t.Context())
	pinged := make(chan error, 1)
	go func() { pinged <- server.Ping(pctx, nil) }()
	// jsonrpc2 closes a connection whose write failed once it is idle.
	await(t, first.closing, "the client fails to write its reply to the server's ping, and jsonrpc2 gives up the connection")
	stopPing()
	_ = await(t, pinged, "the server's ping ends") // Its error: no reply came, by design.
	if sessionEnded(m, "t") {
		t.Fatal("the manager already forgot the session; the test needs one only the SDK knows broken")
	}

	res, err := tool(t, m, "t__charge").Func(t.Context(), subagent.ToolCall{Name: "charge", IdempotencyKey: "run1/a/a1/i1/c0"})
	if err != nil {
		t.Fatalf("call on a session known broken = %v; want it sent again on a fresh session", err)
	}
	if res.Text != "charged" || ran.Load() != 1 || connects.Load() != 2 {
		t.Errorf("result %q, the server ran it %d times over %d connections; want charged, once, 2", res.Text, ran.Load(), connects.Load())
	}
	if log := logBuf.String(); !strings.Contains(log, "sending it on a fresh session") || !strings.Contains(log, "connection closed") {
		t.Errorf("the first attempt was not refused as ErrConnectionClosed; log:\n%s", log)
	}
}

// holdTransport connects once, over conn.
type holdTransport struct {
	sdk.Transport
	conn *holdConn
}

func (t holdTransport) Connect(ctx context.Context) (sdk.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	t.conn.Connection = c
	return t.conn, nil
}

// holdConn fails to write replies while failReplies is set, and holds its
// pipe open after Close until release: its session lives on, known broken
// to jsonrpc2 alone.
type holdConn struct {
	sdk.Connection
	failReplies atomic.Bool
	closing     chan struct{} // closed at the first Close
	release     chan struct{}
	once        sync.Once
}

func (c *holdConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if _, ok := msg.(*jsonrpc.Response); ok && c.failReplies.Load() {
		return errors.New("test: the reply cannot be written")
	}
	return c.Connection.Write(ctx, msg)
}

func (c *holdConn) Close() error {
	c.once.Do(func() {
		close(c.closing)
		go func() { // Ends at the test's cleanup.
			<-c.release
			_ = c.Connection.Close()
		}()
	})
	return nil
}
