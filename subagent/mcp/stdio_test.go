package mcp

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/llm/llmtest"
)

// stdioYAML is a config of one stdio server "t": this test binary, serving
// MCP (serveStdio), with extra env entries and the given tools.
func stdioYAML(t *testing.T, env string, tools ...string) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString("servers:\n  - name: t\n    transport: stdio\n    command: " + strconv.Quote(exe) + "\n")
	b.WriteString("    env:\n      - {name: " + serveEnv + ", value: \"1\"}\n" + env)
	b.WriteString("    tools:\n")
	for _, tl := range tools {
		b.WriteString("      - " + tl + "\n")
	}
	return b.String()
}

func openStdio(t *testing.T, yaml string) (*Manager, *syncBuffer) {
	t.Helper()
	log, buf := testLogger()
	m, err := Open(t.Context(), Options{Config: mustParse(t, yaml), Logger: log})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(m.Close)
	return m, buf
}

func pidOf(t *testing.T, m *Manager) int {
	t.Helper()
	res, err := call(t, m, "t__pid", `{}`)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(res.Text)
	if err != nil {
		t.Fatalf("pid %q: %v", res.Text, err)
	}
	return pid
}

// TestStdioServerKilledRecovered: the server's process is killed between
// calls; the worker notices and the next call runs in a new process.
func TestStdioServerKilledRecovered(t *testing.T) {
	t.Parallel()
	m, _ := openStdio(t, stdioYAML(t, "", "{name: pid, effect: read}", "{name: echo, effect: write}"))
	first := pidOf(t, m)
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the worker notices its server process died", func() bool { return sessionEnded(m, "t") })
	if _, err := call(t, m, "t__echo", `{"n":1}`); err != nil {
		t.Fatalf("call after the kill: %v", err)
	}
	if second := pidOf(t, m); second == first {
		t.Errorf("pid %d after the kill; want a new process", second)
	}
}

// TestWriteThatMayHaveHappenedIsNotRetried: the server process dies while
// it runs a write: the call fails, its error does not claim it was never
// sent, and it is not sent again (the server logged it once).
func TestWriteThatMayHaveHappenedIsNotRetried(t *testing.T) {
	t.Parallel()
	dieLog := t.TempDir() + "/die.log"
	m, _ := openStdio(t, stdioYAML(t, "      - {name: FANOUT_MCP_TEST_DIE_LOG, value: "+strconv.Quote(dieLog)+"}\n",
		"{name: die, effect: write}", "{name: echo, effect: read}"))
	die := tool(t, m, "t__die")
	_, err := die.Func(t.Context(), subagent.ToolCall{Name: die.Name, Args: []byte(`{}`), IdempotencyKey: "k1"})
	if err == nil || errors.Is(err, subagent.ErrNotSent) {
		t.Fatalf("write whose server died mid-call = %v; want an error that does not wrap ErrNotSent", err)
	}
	log, err2 := os.ReadFile(dieLog)
	if err2 != nil || strings.Count(string(log), "die called") != 1 {
		t.Errorf("the server ran the write %d times (%v); want once", strings.Count(string(log), "die called"), err2)
	}
	eventually(t, "the worker notices its server process died", func() bool { return sessionEnded(m, "t") })
	if _, err := call(t, m, "t__echo", `{}`); err != nil {
		t.Errorf("next call: %v", err)
	}
}

// TestStdioEnvironment: the server's environment is PATH, HOME and the
// configured entries; a secret from a file or the worker's environment
// reaches it, and is redacted from its stderr in the worker's log, as is a
// password nobody configured (internal/redact's rule).
func TestStdioEnvironment(t *testing.T) {
	t.Setenv("FANOUT_MCP_TEST_WORKER_ONLY", "must not reach the server")
	t.Setenv("FANOUT_MCP_TEST_SECRET", canary)
	file := writeFile(t, "secret", "from-a-file\n")
	m, logs := openStdio(t, stdioYAML(t, "      - {name: SECRET_FOR_STDERR, from_env: FANOUT_MCP_TEST_SECRET}\n"+
		"      - {name: FILE_SECRET, from_file: "+strconv.Quote(file)+"}\n      - {name: PLAIN, value: plain}\n",
		"{name: env, effect: read}"))
	res, err := call(t, m, "t__env", `{}`)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	vars := map[string]string{}
	for _, line := range strings.Split(res.Text, "\n") {
		k, v, _ := strings.Cut(line, "=")
		names = append(names, k)
		vars[k] = v
	}
	if vars["SECRET_FOR_STDERR"] != canary || vars["FILE_SECRET"] != "from-a-file" || vars["PLAIN"] != "plain" || vars["PATH"] != os.Getenv("PATH") {
		t.Errorf("server env %v", names)
	}
	for _, k := range names {
		switch k {
		case "PATH", "HOME", "SECRET_FOR_STDERR", "FILE_SECRET", "PLAIN", serveEnv:
		default:
			t.Errorf("the server's environment has %s, which the config does not give it", k)
		}
	}
	eventually(t, "the server's stderr line logged", func() bool { return strings.Contains(logs.String(), "starting with secret") })
	if p, ok := llmtest.LeakedPiece(logs.String(), canary); ok {
		t.Errorf("the secret (%q) is in the worker's log:\n%s", p, llmtest.LinesHolding(logs.String(), p))
	}
	if !strings.Contains(logs.String(), "starting with secret [redacted]") {
		t.Errorf("log lacks the redacted stderr line:\n%s", logs.String())
	}
	eventually(t, "the server's password line logged", func() bool { return strings.Contains(logs.String(), "connecting with password=") })
	if strings.Contains(logs.String(), "stderr-pw-Q7") || !strings.Contains(logs.String(), "connecting with password=[redacted]") {
		t.Errorf("the password on the server's stderr is not redacted in the worker's log:\n%s", logs.String())
	}
}

func TestStdioCommandMissingIsAStartError(t *testing.T) {
	t.Parallel()
	log, _ := testLogger()
	_, err := Open(t.Context(), Options{Config: mustParse(t, `
servers:
  - {name: gone, transport: stdio, command: /nonexistent/mcp-server, tools: [{name: a}]}`), Logger: log})
	if err == nil || !strings.Contains(err.Error(), "servers[0] (gone): connect to /nonexistent/mcp-server") {
		t.Fatalf("Open = %v; want the connect failure, naming the entry", err)
	}
}
