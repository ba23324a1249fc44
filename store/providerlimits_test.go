package store_test

import (
	"testing"
	"time"

	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/storetest"
)

// TestProviderLimitsAreLearnedByWorkersAndReadByOrchestrators: a worker's
// login records what a provider stated, reading after reading (a figure
// not stated keeps its last value, 429s add up, retry-after only moves
// forward), and an orchestrator's login reads it by the provider and model
// a run names, "" meaning the workers' defaults
// (docs/operations.md#rate-limits-and-headroom).
func TestProviderLimitsAreLearnedByWorkersAndReadByOrchestrators(t *testing.T) {
	t.Parallel()
	b := setup(t)
	worker, err := store.OpenPool(b.ctx, storetest.WorkerURL(t, b.url), store.PoolConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(worker.Close)
	node, err := store.OpenPool(b.ctx, storetest.NodeURL(t, b.url), store.PoolConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(node.Close)
	learn, read := store.NewProviderLimits(worker), store.NewProviderLimits(node)

	reset := time.Now().Add(20 * time.Second).Truncate(time.Microsecond)
	until := time.Now().Add(3 * time.Second).Truncate(time.Microsecond)
	for _, l := range []store.ProviderLimit{
		{Bucket: "openai:aaa", Provider: "openai", Model: "gpt-a", ProviderDefault: true, ModelDefault: true,
			LimitRequests: 600, LimitTokens: 200_000, RemainingRequests: 599, RemainingTokens: 199_000,
			RequestsResetAt: reset, ConfiguredTPM: 150_000},
		// A 429 that states nothing but its retry-after.
		{Bucket: "openai:aaa", Provider: "openai", Model: "gpt-a", ProviderDefault: true, ModelDefault: true,
			RemainingRequests: -1, RemainingTokens: -1, ConfiguredTPM: 150_000, Throttled: 1, ThrottledUntil: until},
		{Bucket: "openai:aaa", Provider: "openai", Model: "gpt-a", ProviderDefault: true, ModelDefault: true,
			RemainingRequests: 12, RemainingTokens: -1, ConfiguredTPM: 150_000, Throttled: 2, ThrottledUntil: until.Add(-time.Second)},
		{Bucket: "anthropic:bbb", Provider: "anthropic", Model: "claude-x", LimitRequests: 50, RemainingRequests: -1, RemainingTokens: -1},
	} {
		if err := learn.Learn(b.ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range []struct{ provider, model, want string }{
		{"", "", "openai:aaa"}, {"openai", "", "openai:aaa"}, {"openai", "gpt-a", "openai:aaa"},
		{"anthropic", "claude-x", "anthropic:bbb"}, {"anthropic", "", ""}, {"", "claude-x", ""}, {"openai", "gpt-b", ""},
	} {
		got, err := read.Limits(b.ctx, q.provider, q.model)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case q.want == "" && len(got) != 0:
			t.Errorf("Limits(%q, %q) = %d rows, want none", q.provider, q.model, len(got))
		case q.want != "" && (len(got) != 1 || got[0].Bucket != q.want):
			t.Errorf("Limits(%q, %q) = %+v, want %s's", q.provider, q.model, got, q.want)
		}
	}
	got, err := read.Limits(b.ctx, "openai", "gpt-a")
	if err != nil || len(got) != 1 {
		t.Fatalf("Limits: %v, %v", got, err)
	}
	l := got[0]
	if l.LimitRequests != 600 || l.LimitTokens != 200_000 || l.RemainingRequests != 12 || l.RemainingTokens != 199_000 {
		t.Errorf("limits %d rpm %d tpm, remaining %d requests %d tokens: want 600, 200000, 12, 199000 (a figure not stated keeps its last value)",
			l.LimitRequests, l.LimitTokens, l.RemainingRequests, l.RemainingTokens)
	}
	if !l.RequestsResetAt.Equal(reset) || !l.TokensResetAt.IsZero() {
		t.Errorf("resets %s, %s: want %s and none", l.RequestsResetAt, l.TokensResetAt, reset)
	}
	if l.Throttled != 3 || !l.ThrottledUntil.Equal(until) {
		t.Errorf("throttled %d until %s: want 3 (they add up) until %s (it only moves forward)", l.Throttled, l.ThrottledUntil, until)
	}
	if l.RPM() != 600 || l.TPM() != 150_000 {
		t.Errorf("RPM %d, TPM %d: want 600 (stated, no ceiling) and 150000 (the ceiling under the stated 200000)", l.RPM(), l.TPM())
	}
	if err := learn.Learn(b.ctx, store.ProviderLimit{Bucket: "key:probe", Provider: "openai", Model: "m"}); err == nil {
		t.Error("a worker recorded limits under an API key's bucket")
	}
}

// TestProviderLimitsForgetStaleRowsAndDefaults: Limits reads only rows
// learned within the last ProviderLimitsFresh (a rotated key's old row is
// not summed with the new one's), and a row written as a default takes
// the flag from the rows it replaces: model_default from the provider's
// other models, provider_default from the other providers' rows
// (docs/operations.md#rate-limits-and-headroom).
func TestProviderLimitsForgetStaleRowsAndDefaults(t *testing.T) {
	t.Parallel()
	b := setup(t)
	worker, err := store.OpenPool(b.ctx, storetest.WorkerURL(t, b.url), store.PoolConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(worker.Close)
	p := store.NewProviderLimits(worker)
	learn := func(l store.ProviderLimit) {
		t.Helper()
		l.RemainingRequests, l.RemainingTokens, l.LimitRequests = -1, -1, 600
		if err := p.Learn(b.ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	read := func(provider, model string) []string {
		t.Helper()
		ls, err := p.Limits(b.ctx, provider, model)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, l := range ls {
			out = append(out, l.Bucket+" "+l.Model)
		}
		return out
	}

	// A key rotated: the old key's row was last learned before the window.
	learn(store.ProviderLimit{Bucket: "openai:old", Provider: "openai", Model: "gpt-a", ProviderDefault: true, ModelDefault: true})
	if _, err := b.pool.Exec(b.ctx, `UPDATE fanout.provider_limit SET learned_at = now() - make_interval(secs => $1) WHERE bucket = 'openai:old'`,
		(store.ProviderLimitsFresh + time.Second).Seconds()); err != nil {
		t.Fatal(err)
	}
	learn(store.ProviderLimit{Bucket: "openai:new", Provider: "openai", Model: "gpt-a", ProviderDefault: true, ModelDefault: true})
	if got := read("openai", "gpt-a"); len(got) != 1 || got[0] != "openai:new gpt-a" {
		t.Errorf("Limits(openai, gpt-a) = %v, want the new key's row alone", got)
	}

	// --openai-model changed from gpt-a to gpt-b; a second key still
	// serves gpt-a, called by name.
	learn(store.ProviderLimit{Bucket: "openai:two", Provider: "openai", Model: "gpt-a", ProviderDefault: true, ModelDefault: true})
	learn(store.ProviderLimit{Bucket: "openai:new", Provider: "openai", Model: "gpt-b", ProviderDefault: true, ModelDefault: true})
	if got := read("openai", ""); len(got) != 1 || got[0] != "openai:new gpt-b" {
		t.Errorf("Limits(openai, \"\") = %v, want gpt-b's row alone (the default now)", got)
	}
	if got := read("openai", "gpt-a"); len(got) != 2 || got[0] != "openai:new gpt-a" || got[1] != "openai:two gpt-a" {
		t.Errorf("Limits(openai, gpt-a) = %v, want both fresh keys' rows of gpt-a, named", got)
	}

	// --provider changed to anthropic.
	learn(store.ProviderLimit{Bucket: "anthropic:k", Provider: "anthropic", Model: "claude-x", ProviderDefault: true, ModelDefault: true})
	if got := read("", ""); len(got) != 1 || got[0] != "anthropic:k claude-x" {
		t.Errorf("Limits(\"\", \"\") = %v, want anthropic's default row alone", got)
	}
	if got := read("openai", ""); len(got) != 1 || got[0] != "openai:new gpt-b" {
		t.Errorf("Limits(openai, \"\") = %v, want openai's default model still: only the provider's flag moved", got)
	}
}
