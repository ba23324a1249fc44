package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/fanout/fanout/subagent"
)

// workerToolConfig is the tool loop's part of the ServerConfig a worker
// builds from args and env: the tool flags registered on a worker's flag
// set, parsed as every command parses (parseFlags: the command line, then
// FANOUT_* variables) and applied as cmdWorker and cmdDev apply them.
func workerToolConfig(t *testing.T, args []string, env map[string]string) subagent.ServerConfig {
	t.Helper()
	f := newFlags("worker", workerUsage, io.Discard)
	var tf toolFlags
	tf.register(f)
	var stderr bytes.Buffer
	if err := parseFlags(f, args, &Env{Stdout: io.Discard, Stderr: &stderr, Getenv: func(k string) string { return env[k] }}); err != nil {
		t.Fatalf("parse %q: %v\n%s", args, err, stderr.String())
	}
	var sc subagent.ServerConfig
	tf.apply(&sc)
	return sc
}

// TestWorkerToolFlagsReachTheServerConfig: each tool bound a worker's
// flags set lands in its own ServerConfig field, with the defaults the
// docs/mcp.md "Running it" states (--tool-timeout 60s, --max-tool-calls-per-turn 8,
// --tool-parallelism 16) and with values set on the command line or in the
// environment. The values differ pairwise, so two flags that swapped
// fields fail; the numbers are written out, not read from the constants
// that set them.
func TestWorkerToolFlagsReachTheServerConfig(t *testing.T) {
	t.Parallel()
	type bounds struct {
		timeout           time.Duration
		perTurn, parallel int
	}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want bounds
	}{
		{"defaults", nil, nil, bounds{60 * time.Second, 8, 16}},
		{"flags", []string{"--tool-timeout", "7s", "--max-tool-calls-per-turn", "3", "--tool-parallelism", "5"}, nil, bounds{7 * time.Second, 3, 5}},
		{"one flag: the others keep their defaults", []string{"--tool-parallelism", "40"}, nil, bounds{60 * time.Second, 8, 40}},
		{"environment", nil, map[string]string{"FANOUT_TOOL_TIMEOUT": "9s", "FANOUT_MAX_TOOL_CALLS_PER_TURN": "2", "FANOUT_TOOL_PARALLELISM": "12"},
			bounds{9 * time.Second, 2, 12}},
		{"a flag wins over the environment", []string{"--tool-parallelism", "6"}, map[string]string{"FANOUT_TOOL_PARALLELISM": "12", "FANOUT_MAX_TOOL_CALLS_PER_TURN": "4"},
			bounds{60 * time.Second, 4, 6}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sc := workerToolConfig(t, tc.args, tc.env)
			got := bounds{sc.ToolTimeout, sc.MaxToolCallsPerTurn, sc.ToolParallelism}
			if got != tc.want {
				t.Errorf("ServerConfig{ToolTimeout: %v, MaxToolCallsPerTurn: %d, ToolParallelism: %d}, want {%v, %d, %d}",
					got.timeout, got.perTurn, got.parallel, tc.want.timeout, tc.want.perTurn, tc.want.parallel)
			}
		})
	}
}

// TestWorkerAndDevOfferTheToolFlags: the worker and dev commands take the
// tool flags with docs/mcp.md's defaults; their --help lists each with it.
// (TestWorkerToolFlagsReachTheServerConfig checks where they go.)
func TestWorkerAndDevOfferTheToolFlags(t *testing.T) {
	t.Parallel()
	for name, cmd := range map[string]func(context.Context, *Env, []string) error{"worker": cmdWorker, "dev": cmdDev} {
		var out bytes.Buffer
		err := cmd(t.Context(), &Env{Stdout: &out, Stderr: &out, Getenv: func(string) string { return "" }}, []string{"--help"})
		if !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("%s --help: err = %v, want flag.ErrHelp", name, err)
		}
		for _, want := range []string{
			"--tool-timeout  [FANOUT_TOOL_TIMEOUT] (default \"1m0s\")",
			"--max-tool-calls-per-turn  [FANOUT_MAX_TOOL_CALLS_PER_TURN] (default \"8\")",
			"--tool-parallelism  [FANOUT_TOOL_PARALLELISM] (default \"16\")",
		} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%s --help does not list %s:\n%s", name, want, out.String())
			}
		}
	}
}
