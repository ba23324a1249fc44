// Command fanout is one binary for every role: the servers (orchestrator,
// worker), the schema migrator, an all-in-one dev mode, and the client.
//
// Run `fanout help` for the list of subcommands.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(Main(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv))
}

// command is one subcommand.
type command struct {
	summary string
	run     func(ctx context.Context, env *Env, args []string) error
}

// Env is what a subcommand may touch of the world: its output streams and
// the environment. Tests pass their own.
type Env struct {
	Stdout, Stderr io.Writer
	Getenv         func(string) string
}

var commands = map[string]command{
	"dev":          {"run Postgres, an orchestrator and workers on loopback (the embedded default)", cmdDev},
	"orchestrator": {"serve fanout.v1.OrchestratorService", cmdOrchestrator},
	"worker":       {"serve fanout.v1.SubagentService (runs subagents)", cmdWorker},
	"mcp":          {"inspect a configured MCP server's tools (mcp inspect SERVER)", cmdMCP},
	"migrate":      {"apply the database schema", cmdMigrate},
	"run":          {"start a run from a spec file and stream its progress", cmdRun},
	"runs":         {"list runs", cmdRuns},
	"get":          {"show one run", cmdGet},
	"watch":        {"stream a run's events (from any replica, resumable)", cmdWatch},
	"cancel":       {"cancel a run on every node", cmdCancel},
	"continue":     {"continue a run with more budget: top it up, or reopen one whose budget ran out", cmdContinue},
	"fork":         {"fork a recorded run with tasks changed, added or removed; unchanged tasks reuse their facts", cmdFork},
	"approvals":    {"list, approve or deny the writes that wait for approval (approvals list|approve|deny)", cmdApprovals},
	"writes":       {"list a run's tool writes: states, decisions, previews", cmdWrites},
	"spend":        {"the tenant's spend per day in tokens and money, at the operator's prices (audit scope)", cmdSpend},
	"tenant":       {"manage tenants: quotas and token budgets (tenant create|set-budget|set-quotas|show)", cmdTenant},
	"key":          {"manage API keys (key create|list|revoke); a token is shown once", cmdKey},
	"ledger":       {"audit one run's spend through the auditor views (SQL)", cmdLedger},
	"audit":        {"make a database role the auditor of one tenant (audit grant|revoke)", cmdAudit},
	"trace":        {"draw a run's timeline: subagents, iterations, tools, the moment the budget ran out", cmdTrace},
	"doctor":       {"check a database for fanout: durability settings, standbys, this login's roles; a verdict", cmdDoctor},
}

const mainUsage = `fanout fans one request out to many LLM subagents under one exact token budget.

Usage:
  fanout <command> [flags]

Commands:
%s
Run "fanout <command> --help" for a command's flags and an example.

Examples:
  fanout dev --demo                      # everything on loopback, a sample run, its audit
  fanout dev                             # the same, then wait for runs
  fanout run -f examples/research.json   # in a second terminal: stream a run
`

func usage(w io.Writer) {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "  %-13s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(w, mainUsage, b.String())
}

// Main runs the subcommand named by args[0] and returns the exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	env := &Env{Stdout: stdout, Stderr: stderr, Getenv: getenv}
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "fanout: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	err := cmd.run(ctx, env, args[1:])
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	}
	fmt.Fprintf(stderr, "fanout %s: %s\n", args[0], describe(err))
	return 1
}

// errUsage: the flags were wrong and the flag package already said how.
var errUsage = errors.New("usage")

func parseFlags(f *flags, args []string, env *Env) error {
	if err := f.parse(args, env.Getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		fmt.Fprintln(env.Stderr, err)
		return errUsage
	}
	return nil
}

func newLogger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(traceHandler{slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})})
}

// defaultGrace is how long a server drains on SIGTERM before it cancels
// what is left and stops.
const defaultGrace = 30 * time.Second
