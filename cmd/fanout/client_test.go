package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// TestSpecFilesParse: every example spec parses, and the YAML form of a
// request is the same message as its JSON form.
func TestSpecFilesParse(t *testing.T) {
	files, err := filepath.Glob("../../examples/*.*")
	if err != nil {
		t.Fatal(err)
	}
	parsed := 0
	for _, f := range files {
		if ext := filepath.Ext(f); ext != ".json" && ext != ".yaml" && ext != ".yml" || filepath.Base(f) == "mcp.yaml" {
			continue // mcp.yaml is an MCP config (subagent/mcp tests it), not a run
		}
		req, err := readSpec(f)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if len(req.GetSpec().GetTasks()) == 0 || req.GetSpec().GetIdempotencyKey() == "" {
			t.Errorf("%s: parsed to %v", f, req)
		}
		parsed++
	}
	if parsed < 2 {
		t.Fatalf("parsed %d example specs, want the JSON and the YAML one at least", parsed)
	}

	dir := t.TempDir()
	jsonPath, yamlPath := filepath.Join(dir, "s.json"), filepath.Join(dir, "s.yaml")
	writeFile(t, jsonPath, `{"spec": {"idempotencyKey": "k", "tasks": [{"id": "a", "tokenBudget": 5, "dependsOn": []}],
		"budget": {"limitTokens": 9}, "onExhaustion": "EXHAUSTION_POLICY_DRAIN", "limits": {"runTimeout": "90s"}}}`)
	writeFile(t, yamlPath, "spec:\n  idempotencyKey: k\n  tasks:\n    - {id: a, tokenBudget: 5}\n  budget: {limitTokens: 9}\n"+
		"  onExhaustion: EXHAUSTION_POLICY_DRAIN\n  limits: {runTimeout: 90s}\n")
	fromJSON, err := readSpec(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	fromYAML, err := readSpec(yamlPath)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(fromJSON, fromYAML) {
		t.Errorf("YAML spec = %v\nJSON spec = %v", fromYAML, fromJSON)
	}
	writeFile(t, yamlPath, "spec: [unclosed")
	if _, err := readSpec(yamlPath); err == nil {
		t.Error("a malformed YAML spec parsed")
	}
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// pagedRuns is an OrchestratorService whose ListRuns serves total runs
// (run-0000 newest) in pages of at most 100, as the real server caps them,
// and records the page sizes it was asked for.
type pagedRuns struct {
	fanoutv1.UnimplementedOrchestratorServiceServer
	total int

	mu    sync.Mutex
	asked []int32
}

func (p *pagedRuns) ListRuns(_ context.Context, req *fanoutv1.ListRunsRequest) (*fanoutv1.ListRunsResponse, error) {
	p.mu.Lock()
	p.asked = append(p.asked, req.GetPageSize())
	p.mu.Unlock()
	from := 0
	if tok := req.GetPageToken(); tok != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(tok, "after-"))
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "page_token %q", tok)
		}
		from = n
	}
	size := int(req.GetPageSize())
	if size == 0 {
		size = 50
	}
	to := min(from+min(size, 100), p.total)
	resp := &fanoutv1.ListRunsResponse{}
	for i := from; i < to; i++ {
		resp.Runs = append(resp.Runs, &fanoutv1.Run{RunId: fmt.Sprintf("run-%04d", i)})
	}
	if to < p.total {
		resp.NextPageToken = fmt.Sprintf("after-%d", to)
	}
	return resp, nil
}

// TestRunsListFollowsPages: `fanout runs --limit N` lists N runs, newest
// first, across as many pages as the server's cap of 100 takes, never
// asking for more than it still wants; and it stops when the runs do.
func TestRunsListFollowsPages(t *testing.T) {
	t.Parallel()
	srv := &pagedRuns{total: 250}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	fanoutv1.RegisterOrchestratorServiceServer(g, srv)
	served := make(chan error, 1)
	go func() { served <- g.Serve(lis) }()
	t.Cleanup(func() {
		g.Stop()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})

	for _, tc := range []struct {
		args  []string
		want  int     // runs listed
		asked []int32 // page sizes asked for
	}{
		{nil, 20, []int32{20}},
		{[]string{"--limit", "150"}, 150, []int32{100, 50}},
		{[]string{"--limit", "250"}, 250, []int32{100, 100, 50}},
		{[]string{"--limit", "1000"}, 250, []int32{100, 100, 100}},
	} {
		srv.mu.Lock()
		srv.asked = nil
		srv.mu.Unlock()
		var stdout, stderr strings.Builder
		args := append([]string{"runs", "--addr", lis.Addr().String()}, tc.args...)
		if code := Main(t.Context(), args, &stdout, &stderr, func(string) string { return "" }); code != 0 {
			t.Fatalf("fanout %v: exit %d: %s", args, code, stderr.String())
		}
		lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")[1:] // after the header
		if len(lines) != tc.want {
			t.Errorf("fanout %v listed %d runs, want %d", args, len(lines), tc.want)
		}
		for i, l := range lines {
			if want := fmt.Sprintf("run-%04d", i); !strings.HasPrefix(l, want+" ") {
				t.Errorf("fanout %v: line %d is %q, want run %s (newest first, no page skipped or repeated)", args, i, l, want)
				break
			}
		}
		srv.mu.Lock()
		if !slices.Equal(srv.asked, tc.asked) {
			t.Errorf("fanout %v asked for pages of %v, want %v", args, srv.asked, tc.asked)
		}
		srv.mu.Unlock()
	}

	for _, limit := range []string{"0", "-1", "10001"} {
		var stdout, stderr strings.Builder
		code := Main(t.Context(), []string{"runs", "--addr", lis.Addr().String(), "--limit", limit}, &stdout, &stderr,
			func(string) string { return "" })
		if code == 0 || !strings.Contains(stderr.String(), "--limit: must be between 1 and 10000") {
			t.Errorf("--limit %s: exit %d, stderr %q; want a refusal naming the flag and its bounds", limit, code, stderr.String())
		}
	}
}
