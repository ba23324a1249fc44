package main

import (
	"context"
	"fmt"
	"testing"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
	"github.com/fanout/fanout/subagent/llm"
	"github.com/fanout/fanout/subagent/llm/llmtest"
)

// TestWorkerLearnsProviderLimits: a worker process whose providers state
// their limits in their own header shapes (the in-repo servers) records
// them in provider_limit, where an orchestrator finds them for a run that
// names no provider or model (the worker's defaults), and its limiter
// enforces them times the headroom in the bucket of the key and model:
// the stated limit without a flag, the flag's ceiling when it is lower
// (docs/operations.md#rate-limits-and-headroom).
func TestWorkerLearnsProviderLimits(t *testing.T) {
	t.Parallel()
	const openaiKey, anthropicKey = "sk-limits-openai-key", "sk-limits-anthropic-key"
	facts := func(llmtest.Request) llmtest.Reply {
		return llmtest.Reply{Text: `{"facts": [{"text": "a fact", "sources": ["https://example.test/0"]}]}`}
	}
	oai := llmtest.New(llmtest.Config{Provider: llmtest.OpenAI, Key: openaiKey, Script: facts,
		Limits: llm.RateLimit{RPM: 600, TPM: 200_000}})
	t.Cleanup(oai.Close)
	ant := llmtest.New(llmtest.Config{Provider: llmtest.Anthropic, Key: anthropicKey, Script: facts,
		Limits: llm.RateLimit{RPM: 1000, TPM: 400_000}})
	t.Cleanup(ant.Close)

	url := storetest.NewDB(t)
	pool := openPool(t, url)
	w := startWorkerProcEnv(t, url, "w1",
		[]string{"OPENAI_API_KEY=" + openaiKey, "OPENAI_BASE_URL=" + oai.BaseURL(),
			"ANTHROPIC_API_KEY=" + anthropicKey, "ANTHROPIC_BASE_URL=" + ant.BaseURL()},
		"--provider", "openai", "--openai-model", "gpt-test", "--anthropic-model", "claude-test",
		"--anthropic-rpm", "100") // a ceiling under the 1,000 Anthropic states
	o := startOrchestratorMain(t, url, []*workerProc{w})

	for i, m := range []*fanoutv1.ModelSettings{
		{MaxOutputTokens: 200},                        // the worker's defaults: openai, gpt-test
		{Provider: "anthropic", MaxOutputTokens: 200}, // anthropic's default model
	} {
		s := e2eSpec(fmt.Sprintf("limits-%d", i), 3, 1_000_000)
		s.Model = m
		evs := runAll(t, o.client, s)
		checkOutcomes(t, s, evs[len(evs)-1].GetRunFinished().GetResult().GetTasks())
	}

	ctx := context.Background()
	limits := store.NewProviderLimits(pool)
	for _, c := range []struct {
		provider, model, key string
		wantModel            string
		stated               [2]int64 // rpm, tpm
		configuredRPM        int64
		providerDefault      bool
		enforced             [2]int64 // rpm, tpm the bucket holds: min(stated, configured) x 0.7
	}{
		{"", "", openaiKey, "gpt-test", [2]int64{600, 200_000}, 0, true, [2]int64{420, 140_000}},
		{"anthropic", "", anthropicKey, "claude-test", [2]int64{1000, 400_000}, 100, false, [2]int64{70, 280_000}},
	} {
		provider := c.provider
		if provider == "" {
			provider = "openai"
		}
		rows, err := limits.Limits(ctx, c.provider, c.model)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 1 {
			t.Fatalf("Limits(%q, %q) = %+v, want the one row of the %s key", c.provider, c.model, rows, provider)
		}
		l := rows[0]
		if l.Bucket != llm.BucketName(provider, c.key) || l.Provider != provider || l.Model != c.wantModel ||
			l.ProviderDefault != c.providerDefault || !l.ModelDefault {
			t.Errorf("row %+v: want bucket %s, provider %s, model %s (the default), provider default %t",
				l, llm.BucketName(provider, c.key), provider, c.wantModel, c.providerDefault)
		}
		if l.LimitRequests != c.stated[0] || l.LimitTokens != c.stated[1] || l.ConfiguredRPM != c.configuredRPM {
			t.Errorf("row %+v: want %d RPM and %d TPM stated, %d RPM configured", l, c.stated[0], c.stated[1], c.configuredRPM)
		}
		if l.RemainingRequests < 0 || l.RequestsResetAt.IsZero() || l.Throttled != 0 {
			t.Errorf("row %+v: want what is left of the window and its reset, no 429", l)
		}
		bucket := llm.ModelBucket(provider, c.key, c.wantModel)
		var rpm, tpm int64
		if err := pool.QueryRow(ctx, `SELECT rpm, tpm FROM fanout.rate_bucket WHERE bucket = $1`, bucket).Scan(&rpm, &tpm); err != nil {
			t.Fatalf("rate bucket %s: %v", bucket, err)
		}
		if rpm != c.enforced[0] || tpm != c.enforced[1] {
			t.Errorf("rate bucket %s holds %d RPM, %d TPM; want %d, %d: min(stated, configured) x headroom 0.7",
				bucket, rpm, tpm, c.enforced[0], c.enforced[1])
		}
	}
}
