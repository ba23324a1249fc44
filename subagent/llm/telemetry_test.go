package llm_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/fanout/fanout/subagent/llm"
	"github.com/fanout/fanout/subagent/llm/llmtest"
)

// Instruments of the global meter bind to the first provider installed, so
// it is installed once per test binary.
var (
	readerOnce sync.Once
	reader     *sdkmetric.ManualReader
)

// providerMetrics holds what the provider metrics count.
type providerMetrics struct {
	responses map[int64]int64 // by status code
	waits     map[string]metricdata.HistogramDataPoint[float64]
	limited   map[string]int64 // fanout.provider.rate_limited by tenant
	limits    map[string]int64 // fanout.ratelimit.limit by "dimension/ceiling"
	requests  int64            // fanout.ratelimit.requests
	tokens    int64            // fanout.ratelimit.tokens
	text      string           // every metric and attribute (metricsText), grepped for the key
}

func readProviderMetrics(t *testing.T) providerMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	text := llmtest.MetricsText(rm)
	if p, ok := llmtest.LeakedPiece(text, canary); ok {
		t.Errorf("the API key (%q) is in the metrics (names, descriptions, units or attributes):\n%s", p, llmtest.LinesHolding(text, p))
	}
	out := providerMetrics{responses: map[int64]int64{}, waits: map[string]metricdata.HistogramDataPoint[float64]{},
		limited: map[string]int64{}, limits: map[string]int64{}, text: text}
	str := func(s attribute.Set, k string) string {
		v, _ := s.Value(attribute.Key(k))
		return v.AsString()
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Gauge[int64]:
				if m.Name != "fanout.ratelimit.limit" {
					continue
				}
				for _, p := range d.DataPoints {
					if str(p.Attributes, "gen_ai.provider.name") == "openai" {
						out.limits[str(p.Attributes, "fanout.ratelimit.dimension")+"/"+str(p.Attributes, "fanout.ratelimit.ceiling")] = p.Value
					}
				}
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if str(p.Attributes, "gen_ai.provider.name") != "openai" {
						continue
					}
					switch m.Name {
					case "fanout.provider.rate_limited":
						out.limited[str(p.Attributes, "fanout.tenant.id")] += p.Value
					case "fanout.ratelimit.requests":
						out.requests += p.Value
					case "fanout.ratelimit.tokens":
						out.tokens += p.Value
					}
				}
				if m.Name != "fanout.provider.responses" {
					continue
				}
				// Only openai's: with -count > 1 the reader holds the other
				// tests' points of earlier rounds too.
				for _, p := range d.DataPoints {
					switch str(p.Attributes, "gen_ai.provider.name") {
					case "":
						t.Errorf("fanout.provider.responses point without a provider: %v", p.Attributes.ToSlice())
					case "openai":
						if v, ok := p.Attributes.Value("http.response.status_code"); ok {
							out.responses[v.AsInt64()] += p.Value
						}
					}
				}
			case metricdata.Histogram[float64]:
				if m.Name != "fanout.ratelimit.wait" {
					continue
				}
				for _, p := range d.DataPoints {
					if str(p.Attributes, "gen_ai.provider.name") == "openai" {
						out.waits[str(p.Attributes, "fanout.ratelimit.source")] = p
					}
				}
			}
		}
	}
	return out
}

// TestProviderMetrics checks the 429 counter and the rate-limit waits. It
// is the only test of the package that reads the global meter provider,
// and it does not call t.Parallel, so it runs before the parallel tests
// resume and what the reader gains meanwhile is its own.
func TestProviderMetrics(t *testing.T) { //nolint:paralleltest // global meter provider
	readerOnce.Do(func() {
		reader = sdkmetric.NewManualReader()
		otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	})
	before := readProviderMetrics(t)

	f := newFixture(t, kinds[0], func(r llmtest.Request) llmtest.Reply {
		if r.N <= 2 {
			// The provider states its limits on a 429 too: 3,000 RPM
			// under the configured 6,000, 2,000,000 TPM over the
			// configured 1,000,000.
			return llmtest.Reply{Status: http.StatusTooManyRequests, Header: http.Header{
				"X-Ratelimit-Limit-Requests": {"3000"}, "X-Ratelimit-Limit-Tokens": {"2000000"}}}
		}
		return llmtest.Reply{Text: "ok", Usage: llm.Usage{InputTokens: 10, OutputTokens: 2}}
	}, func(c *llm.ProviderConfig) {
		c.Limiter = llm.NewMemoryLimiter() // starts empty: the first attempt waits ~10ms
		c.Limits = llm.RateLimit{RPM: 6000, TPM: 1_000_000, Burst: time.Second}
	})
	req := providerRequest()
	req.Meta.TenantID = "tenant-metrics"
	if _, err := f.call(t.Context(), req); err != nil {
		t.Fatal(err)
	}

	after := readProviderMetrics(t)
	if !strings.Contains(after.text, "fanout.provider.responses") || !strings.Contains(after.text, "gen_ai.provider.name=openai") {
		t.Errorf("the metrics grepped for the key hold no provider series with attributes:\n%s", after.text)
	}
	responses := map[int64]int64{}
	for code, n := range after.responses {
		responses[code] = n - before.responses[code]
	}
	waits := map[string]metricdata.HistogramDataPoint[float64]{}
	for src, p := range after.waits {
		waits[src] = metricdata.HistogramDataPoint[float64]{Count: p.Count - before.waits[src].Count, Sum: p.Sum - before.waits[src].Sum}
	}
	if responses[429] != 2 || responses[200] != 1 {
		t.Errorf("fanout.provider.responses by status = %v, want 429: 2, 200: 1", responses)
	}
	if p := waits["provider_429"]; p.Count != 2 {
		t.Errorf("fanout.ratelimit.wait{source=provider_429} has %d observations, want 2", p.Count)
	}
	if n := after.limited["tenant-metrics"] - before.limited["tenant-metrics"]; n != 2 {
		t.Errorf("fanout.provider.rate_limited{fanout.tenant.id=tenant-metrics} grew by %d, want 2", n)
	}
	want := map[string]int64{
		"rpm/stated": 3000, "rpm/configured": 6000, "rpm/effective": 2100, // the stated limit is the smaller
		"tpm/stated": 2_000_000, "tpm/configured": 1_000_000, "tpm/effective": 700_000, // the configured one is
	}
	for k, v := range want {
		if after.limits[k] != v {
			t.Errorf("fanout.ratelimit.limit{%s} = %d, want %d (all: %v)", k, after.limits[k], v, after.limits)
		}
	}
	if n := after.requests - before.requests; n != 3 {
		t.Errorf("fanout.ratelimit.requests grew by %d, want 3 (two 429s and the answer)", n)
	}
	if n := after.tokens - before.tokens; n != 12 {
		t.Errorf("fanout.ratelimit.tokens grew by %d, want 12: the answer's usage, nothing for the 429s", n)
	}
	if p := waits["limiter"]; p.Count != 3 || p.Sum <= 0 {
		t.Errorf("fanout.ratelimit.wait{source=limiter}: %d observations summing to %vs, want 3 and > 0", p.Count, p.Sum)
	}
}
