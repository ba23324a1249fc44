package node_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fanout/fanout/node"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// BenchmarkRESTGetRun is one GetRun of a run, with an API key, through the
// listeners a process serves (`fanout orchestrator --auth keys
// --http-listen`): over native gRPC (the baseline), as a Connect unary call
// in JSON, and as REST (GET /v1/runs/{id}). Each reports req/s (its calls
// over its wall time, callers in parallel) beside allocs/op; the HTTP ones
// share one net/http client, so their client's cost is the same.
//
//	go test -run '^$' -bench BenchmarkRESTGetRun -benchmem -count 5 ./node/
func BenchmarkRESTGetRun(b *testing.B) {
	be, o, base := openHTTP(b, node.BackendConfig{}, nil)
	token := newScopedKey(b, be, "acme", "run", "read", "cancel")
	client := fanoutv1.NewOrchestratorServiceClient(dialKey(b, o.Addr(), token))
	ctx := context.Background()
	started, err := client.StartRun(ctx, &fanoutv1.StartRunRequest{Spec: &fanoutv1.RunSpec{
		IdempotencyKey: "bench", Goal: "g", Budget: &fanoutv1.Budget{LimitTokens: 10_000},
		Model: &fanoutv1.ModelSettings{Provider: "sim"},
		Tasks: []*fanoutv1.TaskSpec{{Id: "t1", Instruction: "x", TokenBudget: 5_000}}}})
	if err != nil {
		b.Fatal(err)
	}
	runID := started.GetRunId()
	// A run that ends now: nothing of it runs beside the benchmark.
	if _, err := client.CancelRun(ctx, &fanoutv1.CancelRunRequest{RunId: runID}); err != nil {
		b.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 10 * time.Second}
	do := func(method, path, body string) error {
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Connect-Protocol-Version", "1")
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return &httpStatusError{code: resp.StatusCode}
		}
		return nil
	}
	calls := []struct {
		name string
		call func() error
	}{
		{"grpc", func() error {
			_, err := client.GetRun(ctx, &fanoutv1.GetRunRequest{RunId: runID})
			return err
		}},
		{"connect", func() error {
			return do(http.MethodPost, "/fanout.v1.OrchestratorService/GetRun", `{"runId":"`+runID+`"}`)
		}},
		{"rest", func() error { return do(http.MethodGet, "/v1/runs/"+runID, "") }},
	}
	for _, c := range calls {
		b.Run(c.name, func(b *testing.B) {
			if err := c.call(); err != nil { // warm: the key verified, connections open
				b.Fatal(err)
			}
			b.ReportAllocs()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := c.call(); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
		})
	}
}

type httpStatusError struct{ code int }

func (e *httpStatusError) Error() string { return http.StatusText(e.code) }
