package mcp

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fanout/fanout/subagent/llm/llmtest"
)

func TestParseFillsDefaults(t *testing.T) {
	t.Parallel()
	cfg := mustParse(t, `
servers:
  - name: memory
    transport: stdio
    command: npx
    args: ["-y", "@modelcontextprotocol/server-memory@2026.8.31"]
    env:
      - {name: MEMORY_FILE_PATH, value: /data/memory.jsonl}
      - {name: API_KEY, from_env: MEMORY_API_KEY}
      - {name: OTHER_KEY, from_file: /run/secrets/other}
    call_timeout: 20s
    max_in_flight: 4
    rpm: 120
    tools:
      - {name: search_nodes, effect: read, cache_ttl: 90s}
      - {name: create_entities, effect: write, max_in_flight: 1, call_timeout: 1m}
      - {name: read_graph}
  - name: github
    transport: http
    url: https://mcp.example.com/mcp
    token_file: /run/secrets/github/token
    trust_annotations: true
    max_result_bytes: 1000
    connect_timeout: 5s
    tools:
      - name: search_issues
`)
	if got, want := cfg.ToolNames(), []string{"memory__search_nodes", "memory__create_entities", "memory__read_graph", "github__search_issues"}; !slices.Equal(got, want) {
		t.Errorf("ToolNames() = %v, want %v", got, want)
	}
	mem, gh := cfg.Servers[0], cfg.Servers[1]
	if mem.ConnectTimeout != DefaultConnectTimeout || mem.MaxResultBytes != DefaultMaxResultBytes {
		t.Errorf("memory defaults: connect_timeout %s, max_result_bytes %d; want %s, %d", mem.ConnectTimeout, mem.MaxResultBytes, DefaultConnectTimeout, DefaultMaxResultBytes)
	}
	if mem.CallTimeout != 20*time.Second || mem.MaxInFlight != 4 || mem.RPM != 120 || len(mem.Args) != 2 {
		t.Errorf("memory = %+v", mem)
	}
	if e := mem.Env[1]; e.Name != "API_KEY" || e.FromEnv != "MEMORY_API_KEY" {
		t.Errorf("memory env[1] = %+v", e)
	}
	if tl := mem.Tools[0]; tl.Effect != EffectRead || tl.CacheTTL != 90*time.Second {
		t.Errorf("memory tools[0] = %+v; want a read with cache_ttl 90s", tl)
	}
	if tl := mem.Tools[1]; tl.Effect != EffectWrite || tl.MaxInFlight != 1 || tl.CallTimeout != time.Minute || tl.CacheTTL != 0 {
		t.Errorf("memory tools[1] = %+v", tl)
	}
	if gh.ConnectTimeout != 5*time.Second || gh.MaxResultBytes != 1000 || !gh.TrustAnnotations || gh.Tools[0].Effect != "" {
		t.Errorf("github = %+v", gh)
	}
}

func TestParseEmpty(t *testing.T) {
	t.Parallel()
	for _, text := range []string{"", "servers: []", "{}"} {
		cfg, err := Parse([]byte(text))
		if err != nil || len(cfg.ToolNames()) != 0 {
			t.Errorf("Parse(%q) = %v, %v; want no tools", text, cfg, err)
		}
	}
}

// TestParseErrorsNameTheEntry: every bad entry is an error that names it
// (its index and name) and the field, and says what is wrong.
func TestParseErrorsNameTheEntry(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 62)
	for _, tc := range []struct {
		name, yaml string
		want       []string // each must appear in the error
	}{
		{"unknown transport", `
servers:
  - {name: gh, transport: grpc, tools: [{name: a}]}`, []string{`servers[0] (gh).transport: "grpc" is not stdio or http`}},
		{"no transport", `
servers:
  - {name: gh, tools: [{name: a}]}`, []string{`servers[0] (gh).transport: required`}},
		{"bad effect", `
servers:
  - name: ok
    transport: stdio
    command: x
  - name: github
    transport: stdio
    command: x
    tools: [{name: a}, {name: b}, {name: create_issue, effect: reed}]`, []string{`servers[1] (github).tools[2] (create_issue).effect: "reed" is not read or write`}},
		{"bad tool name", `
servers:
  - {name: gh, transport: stdio, command: x, tools: [{name: "create issue"}]}`, []string{`servers[0] (gh).tools[0] (create issue): model-facing name "gh__create issue" must match`}},
		{"name over 64", `
servers:
  - {name: gh, transport: stdio, command: x, tools: [{name: ` + long + `}]}`, []string{`servers[0] (gh).tools[0] (` + long + `): model-facing name "gh__` + long + `"`, "at most 64"}},
		{"collision in one server", `
servers:
  - {name: gh, transport: stdio, command: x, tools: [{name: a}, {name: a, effect: read}]}`,
			[]string{`servers[0] (gh).tools[1] (a): model-facing name "gh__a" collides with servers[0] (gh).tools[0] (a)`}},
		{"collision across servers", `
servers:
  - {name: a__b, transport: stdio, command: x, tools: [{name: c}]}
  - {name: a, transport: stdio, command: x, tools: [{name: b__c}]}`,
			[]string{`servers[1] (a).tools[0] (b__c): model-facing name "a__b__c" collides with servers[0] (a__b).tools[0] (c)`}},
		{"duplicate server", `
servers:
  - {name: gh, transport: stdio, command: x}
  - {name: gh, transport: stdio, command: y}`, []string{`servers[1] (gh).name: "gh" is also the name of servers[0] (gh)`}},
		{"unknown field in a server", `
servers:
  - {name: gh, transport: stdio, command: x, max_inflight: 2}`, []string{`servers[0] (gh): unknown field "max_inflight"`}},
		{"unknown field in a tool", `
servers:
  - {name: gh, transport: stdio, command: x, tools: [{name: a, efect: read}]}`, []string{`servers[0] (gh).tools[0] (a): unknown field "efect"`}},
		{"unknown field at the top", `
server:
  - {name: gh}`, []string{`config: unknown field "server"`}},
		{"field in another case", `
servers:
  - {Name: gh, transport: stdio, command: x}`, []string{`servers[0]: unknown field "Name"`, `servers[0].name: required`}},
		{"stdio without a command", `
servers:
  - {name: fs, transport: stdio}`, []string{`servers[0] (fs).command: required for transport stdio`}},
		{"stdio with a url", `
servers:
  - {name: fs, transport: stdio, command: x, url: "http://a"}`, []string{`servers[0] (fs).url: is for transport http, not stdio`}},
		{"http with a command", `
servers:
  - {name: gh, transport: http, url: "https://a/mcp", command: x}`, []string{`servers[0] (gh).command: is for transport stdio, not http`}},
		{"http without a url", `
servers:
  - {name: gh, transport: http}`, []string{`servers[0] (gh).url: required for transport http`}},
		{"url with a scheme that is not http", `
servers:
  - {name: gh, transport: http, url: "ftp://a/b"}`, []string{`servers[0] (gh).url: scheme "ftp" is not http or https`}},
		{"env with two sources", `
servers:
  - name: fs
    transport: stdio
    command: x
    env: [{name: K, value: v, from_env: K}]`, []string{`servers[0] (fs).env[0] (K): set exactly one of value, from_env or from_file`}},
		{"env with no source", `
servers:
  - {name: fs, transport: stdio, command: x, env: [{name: K}]}`, []string{`servers[0] (fs).env[0] (K): set exactly one`}},
		{"env set twice", `
servers:
  - {name: fs, transport: stdio, command: x, env: [{name: K, value: a}, {name: K, value: b}]}`, []string{`servers[0] (fs).env[1] (K): also set by env[0]`}},
		{"bad env name", `
servers:
  - {name: fs, transport: stdio, command: x, env: [{name: "A-B", value: a}]}`, []string{`servers[0] (fs).env[0] (A-B).name: "A-B" is not an environment variable name`}},
		{"negative bound", `
servers:
  - {name: fs, transport: stdio, command: x, max_in_flight: -1, tools: [{name: a, max_in_flight: -2}]}`,
			[]string{`servers[0] (fs).max_in_flight: -1 is negative`, `servers[0] (fs).tools[0] (a).max_in_flight: -2 is negative`}},
		{"fractional bound", `
servers:
  - {name: fs, transport: stdio, command: x, rpm: 1.5}`, []string{`servers[0] (fs).rpm: expected a whole number, got 1.5`}},
		{"bad duration", `
servers:
  - {name: fs, transport: stdio, command: x, call_timeout: 10, tools: [{name: a, call_timeout: soon}]}`,
			[]string{`servers[0] (fs).call_timeout: expected a duration such as "30s", got 10`, `servers[0] (fs).tools[0] (a).call_timeout: "soon" is not a duration`}},
		{"result cap over the limit", `
servers:
  - {name: fs, transport: stdio, command: x, max_result_bytes: 999999999}`, []string{`servers[0] (fs).max_result_bytes: 999999999 is over the limit of 16777216`}},
		{"cache_ttl on a write", `
servers:
  - {name: crm, transport: stdio, command: x, tools: [{name: a, effect: read}, {name: save, effect: write, cache_ttl: 1m}]}`,
			[]string{`servers[0] (crm).tools[1] (save).cache_ttl: the tool is not declared effect: read: only a read's results are cached, never a write's`}},
		{"cache_ttl on a tool of no declared effect", `
servers:
  - {name: crm, transport: stdio, command: x, trust_annotations: true, tools: [{name: get, cache_ttl: 1m}]}`,
			[]string{`servers[0] (crm).tools[0] (get).cache_ttl: the tool is not declared effect: read`}},
		{"cache_ttl of 0", `
servers:
  - {name: crm, transport: stdio, command: x, tools: [{name: get, effect: read, cache_ttl: 0s}]}`,
			[]string{`servers[0] (crm).tools[0] (get).cache_ttl: is 0: leave cache_ttl out`}},
		{"cache_ttl under the least", `
servers:
  - {name: crm, transport: stdio, command: x, tools: [{name: get, effect: read, cache_ttl: 999us}]}`,
			[]string{`servers[0] (crm).tools[0] (get).cache_ttl: 999µs is under the least of 1ms`}},
		{"cache_ttl over the limit", `
servers:
  - {name: crm, transport: stdio, command: x, tools: [{name: get, effect: read, cache_ttl: 25h}]}`,
			[]string{`servers[0] (crm).tools[0] (get).cache_ttl: 25h0m0s is over the limit of 24h0m0s`}},
		{"bad server name", `
servers:
  - {name: "git hub", transport: stdio, command: x}`, []string{`servers[0] (git hub).name: "git hub" must be letters, digits, _ or - only`}},
		{"tool without a name", `
servers:
  - {name: fs, transport: stdio, command: x, tools: [{effect: read}]}`, []string{`servers[0] (fs).tools[0].name: required`}},
		{"duplicate key", `
servers:
  - {name: fs, name: gs, transport: stdio, command: x}`, []string{`parse:`, `"name"`}},
		{"not a list", `
servers: {name: fs}`, []string{`config.servers: expected a list`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(tc.yaml))
			if err == nil {
				t.Fatalf("Parse(%s) succeeded; want an error", tc.yaml)
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error\n%v\nlacks %q", err, want)
				}
			}
		})
	}
}

// TestParseErrorsKeepCredentialsOut: a credential written in the URL (by
// mistake) is refused without being repeated.
func TestParseErrorsKeepCredentialsOut(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"https://bot:" + canary + "@mcp.example.com/mcp", "https://" + canary + "@h/mcp", "http://[::1" + canary} {
		_, err := Parse([]byte(httpYAML(`"`+u+`"`, "", "{name: a}")))
		if err == nil {
			t.Fatalf("Parse accepted url %s", u)
		}
		if !strings.Contains(err.Error(), "servers[0] (t).url") {
			t.Errorf("error %v does not name the entry", err)
		}
		if p, ok := llmtest.LeakedPiece(err.Error(), canary); ok {
			t.Errorf("error %q holds %q of the credential", err, p)
		}
	}
}

func TestLoadChecksSecrets(t *testing.T) {
	dir := t.TempDir()
	token := writeFile(t, "token", canary+"\n")
	empty := writeFile(t, "empty", "\n")
	t.Setenv("FANOUT_MCP_TEST_SET", canary)
	t.Setenv("FANOUT_MCP_TEST_UNSET", "") // empty counts as unset
	write := func(yaml string) string {
		p := dir + "/mcp.yaml"
		if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write(`
servers:
  - {name: gh, transport: http, url: "https://a/mcp", token_file: ` + token + `, tools: [{name: a}]}
  - name: fs
    transport: stdio
    command: x
    env: [{name: A, from_env: FANOUT_MCP_TEST_SET}, {name: B, from_file: ` + token + `}, {name: C, value: plain}]
    tools: [{name: b}]
`)
	if _, err := Load(good); err != nil {
		t.Fatalf("Load: %v", err)
	}
	if err := os.WriteFile(dir+"/relative-token", []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(write(`
servers:
  - {name: gh, transport: http, url: "https://a/mcp", token_file: relative-token, tools: [{name: a}]}`))
	if err != nil || cfg.Servers[0].TokenFile != dir+"/relative-token" {
		t.Errorf("Load with a relative token_file = %v, %v; want it relative to the config's directory", cfg, err)
	}
	for _, tc := range []struct{ name, yaml, want string }{
		{"missing token file", `
servers:
  - {name: gh, transport: http, url: "https://a/mcp", token_file: ` + dir + `/nope}`,
			`servers[0] (gh).token_file: read ` + dir + `/nope: no such file or directory`},
		{"empty token file", `
servers:
  - {name: gh, transport: http, url: "https://a/mcp", token_file: ` + empty + `}`,
			`servers[0] (gh).token_file: ` + empty + ` is empty`},
		{"missing env file", `
servers:
  - {name: fs, transport: stdio, command: x, env: [{name: K, from_file: ` + dir + `/nope}]}`,
			`servers[0] (fs).env[0] (K).from_file: read ` + dir + `/nope: no such file or directory`},
		{"unset env", `
servers:
  - {name: fs, transport: stdio, command: x, env: [{name: K, from_env: FANOUT_MCP_TEST_UNSET}]}`,
			`servers[0] (fs).env[0] (K).from_env: environment variable FANOUT_MCP_TEST_UNSET is not set`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := write(tc.yaml)
			_, err := Load(path)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("Load = %v; want an error naming %s and saying %q", err, path, tc.want)
			}
		})
	}
	if _, err := Load(dir + "/absent.yaml"); err == nil || !strings.Contains(err.Error(), "absent.yaml") {
		t.Errorf("Load of a missing file = %v; want an error naming it", err)
	}
}

// TestExampleConfigParses keeps examples/mcp.yaml valid.
func TestExampleConfigParses(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../examples/mcp.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Parse(data)
	if err != nil {
		t.Fatalf("examples/mcp.yaml: %v", err)
	}
	if _, err := Load("../../examples/mcp.yaml"); err != nil {
		t.Errorf("Load(examples/mcp.yaml): %v", err)
	}
	if len(cfg.Servers) != 2 || cfg.Servers[0].Transport != TransportStdio || cfg.Servers[1].Transport != TransportHTTP {
		t.Errorf("examples/mcp.yaml: want one stdio and one http server, got %+v", cfg.Servers)
	}
	if !slices.Contains(cfg.ToolNames(), "memory__create_entities") || !slices.Contains(cfg.ToolNames(), "memory__search_nodes") {
		t.Errorf("examples/mcp.yaml tools = %v", cfg.ToolNames())
	}
}

// TestPolicyIsParsed (issue 28): tenants and approval per server and tool,
// the built-ins' list; a tool that needs approval is a write even when its
// effect is undeclared on a trusted server (no readOnlyHint can make it a
// read that skips the gate); a read cannot need approval.
func TestPolicyIsParsed(t *testing.T) {
	t.Parallel()
	cfg := mustParse(t, `
servers:
  - name: crm
    transport: http
    url: https://crm.example.com/mcp
    trust_annotations: true
    tenants: [acme, globex]
    approval: required
    tools:
      - {name: refund}
      - {name: lookup, effect: read}
      - {name: note, effect: write, approval: none, tenants: [acme, initech]}
      - {name: wire, effect: write, approval_timeout: 30s, approval: required}
builtin:
  - {name: note, tenants: [acme], approval: required, approval_timeout: 10m}
`)
	if e := cfg.Servers[0].Tools[0].Effect; e != EffectWrite {
		t.Errorf("refund (no effect, approval required, trusted server) has effect %q; want write", e)
	}
	pol := cfg.ToolPolicy()
	for name, want := range map[string]Policy{
		"crm__refund": {Tenants: []string{"acme", "globex"}, Approval: true, ApprovalTimeout: DefaultApprovalTimeout},
		"crm__lookup": {Tenants: []string{"acme", "globex"}},
		"crm__note":   {Tenants: []string{"acme"}},
		"crm__wire":   {Tenants: []string{"acme", "globex"}, Approval: true, ApprovalTimeout: 30 * time.Second},
		"note":        {Tenants: []string{"acme"}, Approval: true, ApprovalTimeout: 10 * time.Minute},
	} {
		got := pol[name]
		if !slices.Equal(got.Tenants, want.Tenants) || got.Approval != want.Approval || got.ApprovalTimeout != want.ApprovalTimeout {
			t.Errorf("%s: policy %+v, want %+v", name, got, want)
		}
	}
	if !pol["crm__note"].Allows("acme") || pol["crm__note"].Allows("initech") || !(Policy{}).Allows("anyone") {
		t.Error("Allows: want acme only for crm__note, everyone for no policy")
	}
	for _, tc := range []struct{ yaml, want string }{
		{"builtin: [{name: search, approval: required}]", "search is a read: a read never needs approval"},
		{"builtin: [{name: nope}]", `"nope" is not a built-in tool`},
		{"builtin: [{name: note, approval: maybe}]", `"maybe" is not required or none`},
		{"builtin: [{name: note, approval_timeout: 1m}]", "approval is not required here"},
		{"builtin: [{name: note, approval: required, approval_timeout: 10ms}]", "under the minimum of 1s"},
		{"builtin: [{name: note, tenants: []}]", "is empty: no tenant could use it"},
		{"servers: [{name: s, transport: http, url: 'https://x/mcp', tools: [{name: r, effect: read, approval: required}]}]",
			"the tool is declared read: a read never needs approval"},
	} {
		if _, err := Parse([]byte(tc.yaml)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%s) = %v; want an error saying %q", tc.yaml, err, tc.want)
		}
	}
}
