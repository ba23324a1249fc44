package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/mcp"
)

// TestCutOffMCPCallKeepsItsSlotForTheGrace: a call cut off mid-flight
// keeps its max_in_flight slot for the grace (the server may still be
// running it), beyond its lease; a call that was answered frees its slot at
// once. Both on the real fleet semaphore.
func TestCutOffMCPCallKeepsItsSlotForTheGrace(t *testing.T) {
	t.Parallel()
	started := make(chan struct{}, 1)
	stop := make(chan struct{})
	srv := sdk.NewServer(&sdk.Implementation{Name: "s", Version: "1"}, nil)
	obj := json.RawMessage(`{"type":"object"}`)
	srv.AddTool(&sdk.Tool{Name: "block", InputSchema: obj}, func(ctx context.Context, _ *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		started <- struct{}{}
		select {
		case <-ctx.Done():
		case <-stop:
		}
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "late"}}}, nil
	})
	srv.AddTool(&sdk.Tool{Name: "quick", InputSchema: obj}, func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) {
		return &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: "done"}}}, nil
	})
	hs := httptest.NewServer(sdk.NewStreamableHTTPHandler(func(*http.Request) *sdk.Server { return srv }, nil))
	t.Cleanup(func() {
		close(stop)
		for ss := range srv.Sessions() {
			_ = ss.Close()
		}
		hs.Close()
	})
	cfg, err := mcp.Parse(fmt.Appendf(nil, `servers:
  - name: s
    transport: http
    url: %s/
    tools:
      - {name: block, effect: read, max_in_flight: 1}
      - {name: quick, effect: read, max_in_flight: 1}
`, hs.URL))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	b, err := OpenBackend(t.Context(), BackendConfig{DatabaseURL: storetest.NodeURL(t, storetest.NewDB(t)), Logger: log, HealthInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	const lease = 3 * time.Second
	wt, err := openWorkerTools(t.Context(), b, cfg, "w1", lease, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wt.close)
	held := func(key string) (n int, left time.Duration) {
		t.Helper()
		var secs float64
		if err := b.Pool().QueryRow(t.Context(), `SELECT count(*), coalesce(extract(epoch FROM max(expires_at) - now()), 0)
			FROM semaphore_slot WHERE key = $1 AND expires_at > now()`, key).Scan(&n, &secs); err != nil {
			t.Fatal(err)
		}
		return n, time.Duration(secs * float64(time.Second))
	}

	quick, _ := wt.registry().Get("s__quick")
	if _, err := quick.Func(t.Context(), subagent.ToolCall{Name: quick.Name, Args: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if n, _ := held("mcp:s/quick"); n != 0 {
		t.Errorf("an answered call left %d slots held, want them freed at once", n)
	}

	block, _ := wt.registry().Get("s__block")
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		select {
		case <-started:
			cancel()
		case <-time.After(30 * time.Second):
		}
	}()
	_, err = block.Func(ctx, subagent.ToolCall{Name: block.Name, Args: json.RawMessage(`{}`)})
	if err == nil || errors.Is(err, subagent.ErrNotSent) {
		t.Fatalf("the cut-off call returned %v, want an error that does not say it was never sent", err)
	}
	n, left := held("mcp:s/block")
	if n != 1 || left <= lease {
		t.Errorf("after the cut-off call: %d slots held for %v more; want its slot kept for the grace (%v), past its lease (%v)",
			n, left, mcp.DefaultSlotGrace, lease)
	}
}
