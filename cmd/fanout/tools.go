package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/mcp"
)

// toolFlags are the tool loop's flags: the MCP servers' config file and
// the loop's bounds (workers and dev; orchestrators read only the file).
type toolFlags struct {
	mcpConfig   string
	timeout     time.Duration
	perTurn     int
	parallelism int
}

func (t *toolFlags) registerConfig(f *flags) {
	f.StringVar(&t.mcpConfig, "mcp-config", "", "YAML file of the MCP servers whose tools subagents may call (docs/mcp.md); empty: the built-in tools only")
}

func (t *toolFlags) register(f *flags) {
	t.registerConfig(f)
	def := subagent.DefaultServerConfig()
	f.DurationVar(&t.timeout, "tool-timeout", def.ToolTimeout, "a tool call's timeout when its tool sets none (an MCP tool's call_timeout); capped by the task's deadline")
	f.IntVar(&t.perTurn, "max-tool-calls-per-turn", def.MaxToolCallsPerTurn, "most tool calls of one model reply that run; the model is told the rest were not run")
	f.IntVar(&t.parallelism, "tool-parallelism", def.ToolParallelism, "most tool calls in flight on this worker, all subagents together")
}

// apply sets the loop's bounds on sc.
func (t *toolFlags) apply(sc *subagent.ServerConfig) {
	sc.ToolTimeout, sc.MaxToolCallsPerTurn, sc.ToolParallelism = t.timeout, t.perTurn, t.parallelism
}

// load reads the MCP config for a worker: every secret file must exist.
// nil without --mcp-config.
func (t *toolFlags) load() (*mcp.Config, error) {
	if t.mcpConfig == "" {
		return nil, nil
	}
	cfg, err := mcp.Load(t.mcpConfig)
	if err != nil {
		return nil, fmt.Errorf("--mcp-config: %w", err)
	}
	return cfg, nil
}

// toolNames reads the MCP config for an orchestrator, which only checks
// allowed_tools against the tools' names and the tool policy: the servers'
// secrets need not be mounted there.
func (t *toolFlags) toolNames() ([]string, map[string]mcp.Policy, error) {
	if t.mcpConfig == "" {
		return nil, nil, nil
	}
	b, err := os.ReadFile(t.mcpConfig)
	if err != nil {
		return nil, nil, fmt.Errorf("--mcp-config: %w", err)
	}
	cfg, err := mcp.Parse(b)
	if err != nil {
		return nil, nil, fmt.Errorf("--mcp-config %s: %w", t.mcpConfig, err)
	}
	return cfg.ToolNames(), cfg.ToolPolicy(), nil
}

const mcpUsage = `
Inspect a configured MCP server: connect to it as a worker would and print its
tools, their annotations and a suggested tools: block to review (the effect of a
tool nobody declared is write; docs/mcp.md).

Usage:
  fanout mcp inspect SERVER --mcp-config FILE

Example:
  fanout mcp inspect memory --mcp-config examples/mcp.yaml
`

func cmdMCP(ctx context.Context, env *Env, args []string) error {
	if len(args) == 0 || args[0] != "inspect" {
		fmt.Fprint(env.Stderr, strings.TrimPrefix(mcpUsage, "\n"))
		return errors.New("mcp: the only subcommand is inspect")
	}
	f := newFlags("mcp inspect", mcpUsage, env.Stderr)
	var tf toolFlags
	tf.registerConfig(f)
	var server string
	rest := args[1:]
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		server, rest = rest[0], rest[1:]
	}
	if err := parseFlags(f, rest, env); err != nil {
		return err
	}
	if server == "" && f.NArg() == 1 {
		server = f.Arg(0)
	}
	if server == "" || tf.mcpConfig == "" {
		return errors.New("mcp inspect: need a SERVER name and --mcp-config FILE (or FANOUT_MCP_CONFIG)")
	}
	cfg, err := tf.load()
	if err != nil {
		return err
	}
	sc, ok := cfg.Server(server)
	if !ok {
		names := make([]string, len(cfg.Servers))
		for i, s := range cfg.Servers {
			names[i] = s.Name
		}
		return fmt.Errorf("mcp inspect: %s configures no server %q (it has: %s)", tf.mcpConfig, server, strings.Join(names, ", "))
	}
	return mcp.Inspect(ctx, sc, env.Stdout)
}
