package node

import (
	"context"

	"github.com/fanout/fanout/orchestrator"
	"github.com/fanout/fanout/store"
)

// rateLimits is store.ProviderLimits as the engine's orchestrator.RateLimits:
// the stated limits summed over the fleet's keys, and the running runs
// that share them.
type rateLimits struct{ p *store.ProviderLimits }

var _ orchestrator.RateLimits = rateLimits{}

func (r rateLimits) RateLimits(ctx context.Context, provider, model string) (orchestrator.RateLimit, error) {
	var out orchestrator.RateLimit
	ls, err := r.p.Limits(ctx, provider, model)
	if err != nil {
		return out, err
	}
	for _, l := range ls {
		out.RPM += l.RPM()
		out.TPM += l.TPM()
		out.Throttled += l.Throttled
	}
	if out.Runs, err = r.p.RunsNaming(ctx, provider, model); err != nil {
		return out, err
	}
	return out, nil
}
