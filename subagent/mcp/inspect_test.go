package mcp

import (
	"context"
	"strings"
	"testing"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

func TestInspect(t *testing.T) {
	t.Parallel()
	ts := newTestServer(2)
	ts.srv.AddTool(&sdk.Tool{Name: "bad.name", InputSchema: objectSchema},
		func(context.Context, *sdk.CallToolRequest) (*sdk.CallToolResult, error) { return textResult(""), nil })
	for _, trusted := range []bool{false, true} {
		cfg := mustParse(t, serverYAML("", "{name: fail, effect: read}")).Servers[0]
		cfg.TrustAnnotations = trusted
		var out strings.Builder
		connect := func(ctx context.Context) (sdk.Transport, error) { return ts.inMemory(nil)(ctx, cfg) }
		if err := inspect(t.Context(), cfg, &out, &secrets{}, connect); err != nil {
			t.Fatal(err)
		}
		got := out.String()
		echo := "effect: write  # REVIEW: readOnlyHint: true, but trust_annotations is false"
		if trusted {
			echo = "effect: read  # readOnlyHint: true, and this server's annotations are trusted"
		}
		for _, want := range []string{
			"server t (stdio, testserver 1, protocol 2025-11-25): 8 tools",
			"echo\n  Echoes its arguments and _meta.\n  annotations: readOnlyHint=true destructiveHint=unset (true by default)",
			"delete_all\n  annotations: readOnlyHint=false destructiveHint=true",
			"      - name: echo\n        " + echo,
			"      - name: delete_all\n        effect: write  # destructiveHint: true",
			"      - name: big\n        effect: write  # REVIEW: no annotations",
			"      - name: fail\n        effect: read  # declared in the config now",
			`      - name: bad.name` + "\n" + `        # CANNOT BE OFFERED: the model-facing name "t__bad.name"`,
		} {
			if !strings.Contains(got, want) {
				t.Errorf("trusted %t: output lacks %q:\n%s", trusted, want, got)
			}
		}
	}
}
