package node_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/fanout/fanout/node"
)

// TestHTTPDryRunIsAQueryParameter: REST's StartRun binds its body to the
// spec, so a dry run is asked for in the query (POST /v1/runs?dryRun=true,
// docs/http.md): the answer is a quote, and no run is created.
func TestHTTPDryRunIsAQueryParameter(t *testing.T) {
	t.Parallel()
	b, _, base := openHTTP(t, node.BackendConfig{}, nil)
	token := newTenantKey(t, b, "acme")
	spec := `{"idempotencyKey":"q1","tenantId":"acme","goal":"g","budget":{"limitTokens":"5000"},` +
		`"model":{"provider":"sim"},"tasks":[{"id":"a","instruction":"x","tokenBudget":"1000"},{"id":"b","instruction":"y","tokenBudget":"1000"}]}`
	for _, q := range []string{"dryRun=true", "dry_run=true"} {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/v1/runs?"+q, strings.NewReader(spec))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		out := string(raw)
		if resp.StatusCode != http.StatusOK || !strings.Contains(out, `"tasksTokens":"2000"`) || !strings.Contains(out, `"runId":""`) {
			t.Errorf("POST /v1/runs?%s: %d %s; want a quote of 2000 task tokens and no run id", q, resp.StatusCode, out)
		}
	}
	var n int
	if err := b.Pool().QueryRow(t.Context(), `SELECT count(*) FROM run`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d runs after two dry runs; want none", n)
	}
}
