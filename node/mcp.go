package node

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/fanout/fanout/orchestrator"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/mcp"
)

// workerTools is a worker's tool registry: the built-ins plus the tools of
// its MCP servers, rebuilt when a server's tool list changed.
type workerTools struct {
	builtins *subagent.Tools
	m        *mcp.Manager // nil without MCP servers
	log      *slog.Logger

	mu   sync.Mutex
	last *subagent.Tools
	sig  string // the tool definitions last built from
}

// openWorkerTools connects to cfg's servers (nil cfg: built-ins only) with
// the fleet-wide bounds on b's database. holder names this worker's slots;
// their lease is ttl, the worker's reservation lease (0: mcp's default), so
// a dead worker's slots are free as soon as its reservations are.
func openWorkerTools(ctx context.Context, b *Backend, cfg *mcp.Config, holder string, ttl time.Duration, log *slog.Logger) (*workerTools, error) {
	wt := &workerTools{builtins: subagent.BuiltinTools(), log: log}
	wt.last = wt.builtins
	if cfg == nil || len(cfg.Servers) == 0 {
		return wt, nil
	}
	m, err := mcp.Open(ctx, mcp.Options{
		Config:      cfg,
		Semaphore:   storeSemaphore{b.stores.Semaphore},
		RateLimiter: b.stores.RateLimiter,
		Holder:      holder,
		SlotTTL:     ttl,
		Logger:      log,
	})
	if err != nil {
		return nil, fmt.Errorf("worker: MCP servers: %w", err)
	}
	wt.m = m
	if _, err := wt.current(); err != nil {
		m.Close()
		return nil, fmt.Errorf("worker: MCP servers: %w", err)
	}
	return wt, nil
}

// toolAllowed is subagent.ServerConfig.ToolAllowed of the operator's
// policy: the worker refuses a tool the policy keeps from a task's tenant,
// whatever the dispatch allows.
func toolAllowed(policy map[string]mcp.Policy) func(tool, tenant string) bool {
	return func(tool, tenant string) bool {
		p, ok := policy[tool]
		return !ok || p.Allows(tenant)
	}
}

// toolRules is the orchestrator's view of the operator's policy.
func toolRules(policy map[string]mcp.Policy) map[string]orchestrator.ToolRule {
	rules := make(map[string]orchestrator.ToolRule, len(policy))
	for name, p := range policy {
		rules[name] = orchestrator.ToolRule{Tenants: p.Tenants, Approval: p.Approval, ApprovalTimeout: p.ApprovalTimeout}
	}
	return rules
}

// registry is subagent.ServerConfig.ToolsFunc: the current registry. A
// changed tool list that cannot be registered (a server renamed a tool to
// one the providers refuse) keeps the last good one, and is logged.
func (wt *workerTools) registry() *subagent.Tools {
	t, err := wt.current()
	if err != nil {
		wt.log.Warn("an MCP server's changed tool list is not usable; tasks keep the previous one", "err", err)
	}
	return t
}

func (wt *workerTools) current() (*subagent.Tools, error) {
	wt.mu.Lock()
	defer wt.mu.Unlock()
	if wt.m == nil {
		return wt.last, nil
	}
	tools := wt.m.Tools()
	sig := toolsSignature(tools)
	if sig == wt.sig {
		return wt.last, nil
	}
	t, err := wt.builtins.With(tools...)
	if err != nil {
		return wt.last, err
	}
	wt.last, wt.sig = t, sig
	return t, nil
}

// toolsSignature identifies a tool list by what the model is shown.
func toolsSignature(tools []subagent.Tool) string {
	var b []byte
	for _, t := range tools {
		b = fmt.Appendf(b, "%s\x00%s\x00%d\x00%s\x00%s\x01", t.Name, t.Server, t.Effect, t.Description, t.Schema)
	}
	return string(b)
}

func (wt *workerTools) close() {
	if wt.m != nil {
		wt.m.Close()
	}
}

// storeSemaphore is *store.Semaphore as an mcp.Semaphore (package subagent
// may not import store).
type storeSemaphore struct{ s *store.Semaphore }

var _ mcp.Semaphore = storeSemaphore{}

func (a storeSemaphore) Acquire(ctx context.Context, holder string, want []mcp.SlotRequest, ttl time.Duration) (mcp.Lease, error) {
	req := make([]store.SlotRequest, len(want))
	for i, w := range want {
		req[i] = store.SlotRequest{Key: w.Key, Limit: w.Limit}
	}
	l, err := a.s.Acquire(ctx, holder, req, ttl)
	if err != nil {
		return nil, err
	}
	return &storeLease{s: a.s, l: l}, nil
}

type storeLease struct {
	s *store.Semaphore
	l store.SlotLease
}

func (l *storeLease) Hold(ctx context.Context, fn func(context.Context) error) error {
	return l.s.Hold(ctx, &l.l, fn)
}

func (l *storeLease) Release(ctx context.Context, grace time.Duration) error {
	return l.s.Release(ctx, l.l, grace)
}
