package orchestrator_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// TestListRunsPageBounds measures ListRuns' three page bounds through the
// orchestrator's gRPC server (docs/api.md "Limits of the API": at most 100 runs a page, a
// larger page_size lowered to it, 0 meaning 50; the page ends early rather
// than pass 2 MiB encoded): exactly 50 for page_size 0, exactly 100 for any
// page_size above it, exactly what is asked below it; and a page of large
// summaries that ends before the run that would take it past 2 MiB, with
// every run listed once across the pages.
func TestListRunsPageBounds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The runs made in the store below are nobody's: never adopt them.
	n := b.orchestrator(t, "o1", orchestrator.Config{OrphanAfter: time.Hour})
	store := func(tenant string, count int, tasks int) {
		t.Helper()
		for i := range count {
			r := &fanoutv1.Run{RunId: fmt.Sprintf("%s-%03d", tenant, i), TenantId: tenant, IdempotencyKey: fmt.Sprint("k", i),
				Spec: &fanoutv1.RunSpec{IdempotencyKey: fmt.Sprint("k", i), TenantId: tenant, Goal: "g"}}
			for j := range tasks {
				r.Tasks = append(r.Tasks, &fanoutv1.TaskOutcome{TaskId: fmt.Sprintf("%064d", j)})
			}
			if tasks > 1 {
				// 256 tasks with 64-byte ids and the most labels a spec may
				// carry: a summary of about 35 KiB, some 58 runs to 2 MiB.
				r.Labels = map[string]string{}
				for j := range 64 {
					r.Labels[fmt.Sprintf("label-%02d", j)] = strings.Repeat("v", 255)
				}
			}
			if _, _, err := b.backend.Runs().CreateRun(t.Context(), r, "o1"); err != nil {
				t.Fatal(err)
			}
		}
	}
	store("small", 120, 1)
	store("large", 160, 256)

	list := func(tenant string, size int32, token string) *fanoutv1.ListRunsResponse {
		t.Helper()
		resp, err := n.client.ListRuns(tenantCtx(t, tenant), &fanoutv1.ListRunsRequest{TenantId: tenant, PageSize: size, PageToken: token})
		if err != nil {
			t.Fatalf("ListRuns(%s, page_size %d): %v", tenant, size, err)
		}
		return resp
	}
	for _, tc := range []struct {
		size int32
		want int
	}{{0, 50}, {1, 1}, {99, 99}, {100, 100}, {101, 100}, {500, 100}} {
		resp := list("small", tc.size, "")
		if got := len(resp.GetRuns()); got != tc.want || resp.GetNextPageToken() == "" {
			t.Errorf("page_size %d: %d runs, next token %q; want exactly %d and a next page", tc.size, got, resp.GetNextPageToken(), tc.want)
		}
	}

	const maxBytes = 2 << 20
	seen := map[string]bool{}
	token := ""
	for page := 0; ; page++ {
		resp := list("large", 100, token)
		size := proto.Size(resp)
		t.Logf("page %d: %d runs, %d bytes", page, len(resp.GetRuns()), size)
		if size > maxBytes {
			t.Errorf("page %d is %d bytes encoded, over the 2 MiB bound", page, size)
		}
		for _, r := range resp.GetRuns() {
			if seen[r.GetRunId()] {
				t.Errorf("run %s listed twice", r.GetRunId())
			}
			seen[r.GetRunId()] = true
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
		// It ended early only because the next run would not fit.
		next := list("large", 1, token).GetRuns()[0]
		with := &fanoutv1.ListRunsResponse{Runs: append(resp.GetRuns(), next), NextPageToken: resp.GetNextPageToken()}
		if len(resp.GetRuns()) < 100 && proto.Size(with) <= maxBytes {
			t.Errorf("page %d ended after %d runs (%d bytes) though the next run fit: %d bytes with it", page, len(resp.GetRuns()), size, proto.Size(with))
		}
		if page == 0 && len(resp.GetRuns()) == 100 {
			t.Fatalf("the first page of large summaries holds 100 runs in %d bytes: the runs are too small to test the byte bound", size)
		}
		if page > 10 {
			t.Fatal("too many pages")
		}
	}
	if len(seen) != 160 {
		t.Errorf("listed %d runs, want 160", len(seen))
	}
}
