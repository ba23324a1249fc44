package mcp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/subagent"
)

// Defaults of a server's settings (docs/mcp.md).
const (
	DefaultConnectTimeout = 30 * time.Second
	DefaultMaxResultBytes = 64 << 10
	// MaxMaxResultBytes caps max_result_bytes: a result is text the model
	// reads, and a bigger one only costs tokens.
	MaxMaxResultBytes = subagent.MaxToolResultBytes
)

// The transports a server may use.
const (
	TransportStdio = "stdio"
	TransportHTTP  = "http"
)

// The effects an operator may declare for a tool.
const (
	EffectRead  = "read"
	EffectWrite = "write"
)

// Config is the operator's MCP configuration: the servers a worker
// connects to and the tools of each that subagents may call. Parse and Load
// return it validated and with defaults filled in; nothing in it is a secret.
type Config struct {
	Servers []ServerConfig
	// Builtin is the policy of the workers' built-in tools
	// (subagent.BuiltinToolNames): which tenants may use each, and whether
	// its writes need approval. A built-in tool not listed is every
	// tenant's, without approval.
	Builtin []BuiltinConfig
}

// Policy is who may use a tool, and whether its writes wait for a
// person's approval (docs/mcp.md#policy-and-approvals). The zero Policy is every tenant's,
// without approval.
type Policy struct {
	// Tenants may use the tool; nil is every tenant.
	Tenants []string
	// Approval: each write of the tool waits, recorded awaiting_approval,
	// for a key with scope approve to approve it (ApproveToolCall), and is
	// denied if none does within ApprovalTimeout. A read never waits.
	Approval        bool
	ApprovalTimeout time.Duration
}

// Allows reports whether tenant may use a tool under p.
func (p Policy) Allows(tenant string) bool {
	return p.Tenants == nil || slices.Contains(p.Tenants, tenant)
}

// DefaultApprovalTimeout is how long a write waits for its approval when
// the config sets no approval_timeout: the task's default timeout, which
// bounds the wait anyway.
const DefaultApprovalTimeout = 5 * time.Minute

// The values of approval.
const (
	ApprovalRequired = "required"
	ApprovalNone     = "none"
)

// BuiltinConfig is the policy of one built-in tool.
type BuiltinConfig struct {
	Name string
	Policy
}

// ServerConfig is one MCP server.
type ServerConfig struct {
	// Name is the server's name in fanout: the prefix of its tools'
	// model-facing names (server__tool), its rate bucket and slot keys.
	Name string
	// Transport is TransportStdio (Command, Args, Env) or TransportHTTP
	// (URL, TokenFile).
	Transport string
	Command   string
	Args      []string
	// Env is the whole environment of a stdio server besides PATH and HOME:
	// nothing else of the worker's environment reaches it.
	Env []EnvVar
	URL string
	// TokenFile holds a bearer token for an HTTP server, read at every
	// connect (so a rotated Secret is picked up on reconnect).
	TokenFile string
	// ConnectTimeout bounds connecting and listing the tools. Default
	// DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// CallTimeout bounds one call of each tool that sets none; 0 leaves it
	// to the agent loop's default.
	CallTimeout time.Duration
	// MaxInFlight bounds the calls in flight to this server across the
	// fleet; 0 is unbounded.
	MaxInFlight int
	// RPM bounds calls per minute to this server across the fleet; 0 is
	// unbounded.
	RPM int
	// TrustAnnotations lets the server's readOnlyHint decide the effect of
	// a tool whose Effect is not declared.
	TrustAnnotations bool
	// MaxResultBytes is where a result's text is cut. Default
	// DefaultMaxResultBytes.
	MaxResultBytes int
	// Tools is the allowlist: only these tools are offered to subagents.
	Tools []ToolConfig
	// Policy is every tool's of this server, unless the tool sets its own
	// (tenants: both lists must name the tenant; approval: the tool's wins).
	Policy Policy
}

// EnvVar is one environment variable of a stdio server: exactly one of
// Value (a plain value, written in the file), FromEnv (the worker's
// environment variable of that name) or FromFile (a file's contents, less
// a trailing newline).
type EnvVar struct {
	Name     string
	Value    string
	FromEnv  string
	FromFile string
}

// ToolConfig is one allowed tool of a server.
type ToolConfig struct {
	// Name is the tool's name on its server.
	Name string
	// Effect is EffectRead, EffectWrite or "" (then the server's
	// annotations decide, if trusted; else it is a write).
	Effect string
	// CallTimeout overrides the server's CallTimeout.
	CallTimeout time.Duration
	// MaxInFlight bounds the calls of this tool in flight across the fleet;
	// 0 is unbounded (the server's bound still applies).
	MaxInFlight int
	// CacheTTL is how long a result of the tool may answer the same call
	// (same arguments, same tenant) in runs that opt in (RunSpec.cache.tools;
	// docs/mcp.md#the-result-cache-for-read-tools): more than 0, at most
	// runs.MaxCacheTTL, on a tool declared effect read only. 0: never cached.
	CacheTTL time.Duration
	// Policy is the tool's own; ToolPolicy merges it with its server's.
	Policy Policy
	// approvalSet: the tool says approval itself (required or none).
	approvalSet bool
}

// ModelName returns the model-facing name of tool t of server s.
func ModelName(server, tool string) string { return server + "__" + tool }

// toolNameRE is the providers' limit on a tool's name.
var toolNameRE = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

var (
	serverNameRE = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)
	envNameRE    = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// ToolNames returns the model-facing names of every configured tool, in
// the file's order. The orchestrator checks a task's allowed_tools against
// them without connecting to any server.
func (c *Config) ToolNames() []string {
	var names []string
	for _, s := range c.Servers {
		for _, t := range s.Tools {
			names = append(names, ModelName(s.Name, t.Name))
		}
	}
	return names
}

// ToolPolicy returns the policy of every configured tool by model-facing
// name: MCP tools (the server's policy merged with the tool's) and the
// built-in tools the config lists. What it leaves out is every tenant's,
// without approval.
func (c *Config) ToolPolicy() map[string]Policy {
	out := map[string]Policy{}
	for _, s := range c.Servers {
		for _, t := range s.Tools {
			p := s.Policy
			if t.approvalSet {
				p.Approval, p.ApprovalTimeout = t.Policy.Approval, t.Policy.ApprovalTimeout
			}
			if t.Effect == EffectRead {
				p.Approval, p.ApprovalTimeout = false, 0
			}
			switch {
			case s.Policy.Tenants == nil:
				p.Tenants = t.Policy.Tenants
			case t.Policy.Tenants != nil:
				p.Tenants = []string{}
				for _, tn := range t.Policy.Tenants {
					if slices.Contains(s.Policy.Tenants, tn) {
						p.Tenants = append(p.Tenants, tn)
					}
				}
			}
			out[ModelName(s.Name, t.Name)] = p
		}
	}
	for _, b := range c.Builtin {
		out[b.Name] = b.Policy
	}
	return out
}

// Server returns the server called name.
func (c *Config) Server(name string) (ServerConfig, bool) {
	for _, s := range c.Servers {
		if s.Name == name {
			return s, true
		}
	}
	return ServerConfig{}, false
}

// Load reads and parses the config file at path (Parse), makes its
// relative file names relative to the file's directory, then checks that
// every secret it names is there: each token_file and env from_file exists
// and is not empty, each env from_env is set. It connects to nothing. The
// error names the file and every bad entry; it never holds a secret.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("mcp config: %w", err)
	}
	cfg, err := Parse(data)
	if err == nil {
		cfg.resolveFiles(filepath.Dir(path))
		err = cfg.checkSecrets()
	}
	if err != nil {
		return nil, fmt.Errorf("mcp config %s: %w", path, err)
	}
	return cfg, nil
}

// Parse parses and validates a config (YAML, or JSON, which is YAML). It
// is strict: an unknown or duplicate field is an error. It reads no file
// and no environment (Load checks the secrets). The error joins one line
// per bad entry, each naming it: servers[1] (github).tools[2]
// (create_issue).effect: "reed" is not read or write.
func Parse(data []byte) (*Config, error) {
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	p := &parser{}
	cfg := p.config(js)
	if len(p.errs) > 0 {
		return nil, errors.Join(p.errs...)
	}
	return cfg, nil
}

// parser decodes the config's JSON one object at a time, so that every
// error names its entry and only the exact field names are accepted (Go's
// JSON decoder would also take "Max_In_Flight").
type parser struct{ errs []error }

func (p *parser) errorf(path, format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("%s: %s", path, fmt.Sprintf(format, args...)))
}

// object is one JSON object of the config, at path.
type object struct {
	p      *parser
	path   string
	fields map[string]json.RawMessage
}

func (p *parser) object(path string, raw json.RawMessage, known ...string) *object {
	o := &object{p: p, path: path}
	if isNull(raw) {
		return o
	}
	if err := json.Unmarshal(raw, &o.fields); err != nil {
		p.errorf(path, "expected a mapping, got %s", describe(raw))
		return o
	}
	keys := make([]string, 0, len(o.fields))
	for k := range o.fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !slices.Contains(known, k) {
			p.errorf(path, "unknown field %q (known: %s)", k, strings.Join(known, ", "))
		}
	}
	return o
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(bytes.TrimSpace(raw)) == "null"
}

// describe shows a bad value in an error: short, and never a whole blob.
func describe(raw json.RawMessage) string {
	s := string(bytes.TrimSpace(raw))
	if len(s) > 40 {
		s = s[:40] + "..."
	}
	return s
}

func (o *object) field(key string) string { return o.path + "." + key }

func (o *object) decode(key, want string, v any) bool {
	raw, ok := o.fields[key]
	if !ok || isNull(raw) {
		return false
	}
	if err := json.Unmarshal(raw, v); err != nil {
		o.p.errorf(o.field(key), "expected %s, got %s", want, describe(raw))
		return false
	}
	return true
}

func (o *object) str(key string) string {
	var s string
	o.decode(key, "a string", &s)
	return s
}

func (o *object) bool(key string) bool {
	var b bool
	o.decode(key, "true or false", &b)
	return b
}

// count is a whole number >= 0.
func (o *object) count(key string) int {
	var n int
	if o.decode(key, "a whole number", &n) && n < 0 {
		o.p.errorf(o.field(key), "%d is negative: want 0 (no bound) or more", n)
		return 0
	}
	return n
}

// duration is a Go duration string ("30s", "2m") >= 0.
func (o *object) duration(key string) time.Duration {
	var s string
	if !o.decode(key, `a duration such as "30s"`, &s) {
		return 0
	}
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		o.p.errorf(o.field(key), "%q is not a duration such as \"30s\" or \"2m\"", s)
	case d < 0:
		o.p.errorf(o.field(key), "%s is negative", s)
	default:
		return d
	}
	return 0
}

func (o *object) strings(key string) []string {
	var ss []string
	o.decode(key, "a list of strings", &ss)
	return ss
}

func (o *object) list(key string) []json.RawMessage {
	var l []json.RawMessage
	o.decode(key, "a list", &l)
	return l
}

func (o *object) has(key string) bool {
	raw, ok := o.fields[key]
	return ok && !isNull(raw)
}

// entryName reads the name of a list entry for its path, before the entry
// is checked: "servers[1] (github)".
func entryName(raw json.RawMessage) string {
	var fields map[string]json.RawMessage
	var name string
	_ = json.Unmarshal(raw, &fields)          // A bad entry has no name to show; its errors say why.
	_ = json.Unmarshal(fields["name"], &name) // Neither has one whose name is not a string.
	if name != "" {
		return fmt.Sprintf(" (%s)", name)
	}
	return ""
}

var (
	serverFields = []string{"name", "transport", "command", "args", "env", "url", "token_file",
		"connect_timeout", "call_timeout", "max_in_flight", "rpm", "trust_annotations", "max_result_bytes", "tools",
		"tenants", "approval", "approval_timeout"}
	toolFields    = []string{"name", "effect", "call_timeout", "max_in_flight", "cache_ttl", "tenants", "approval", "approval_timeout"}
	builtinFields = []string{"name", "tenants", "approval", "approval_timeout"}
	envFields     = []string{"name", "value", "from_env", "from_file"}
)

func (p *parser) config(js []byte) *Config {
	top := p.object("config", js, "servers", "builtin")
	cfg := &Config{}
	if len(p.errs) > 0 {
		return cfg
	}
	servers := top.list("servers")
	seenServer := map[string]string{} // name -> path
	seenTool := map[string]string{}   // model-facing name -> path
	for i, raw := range servers {
		path := fmt.Sprintf("servers[%d]%s", i, entryName(raw))
		s := p.server(path, raw)
		if s.Name != "" {
			if other, dup := seenServer[s.Name]; dup {
				p.errorf(path+".name", "%q is also the name of %s", s.Name, other)
			}
			seenServer[s.Name] = path
		}
		for j, t := range s.Tools {
			if s.Name == "" || t.Name == "" {
				continue
			}
			tpath := fmt.Sprintf("%s.tools[%d] (%s)", path, j, t.Name)
			name := ModelName(s.Name, t.Name)
			if !toolNameRE.MatchString(name) {
				p.errorf(tpath, "model-facing name %q must match %s (at most 64 letters, digits, _ or -)", name, toolNameRE)
				continue
			}
			if other, dup := seenTool[name]; dup {
				p.errorf(tpath, "model-facing name %q collides with %s", name, other)
				continue
			}
			seenTool[name] = tpath
		}
		cfg.Servers = append(cfg.Servers, s)
	}
	seenBuiltin := map[string]int{}
	for i, raw := range top.list("builtin") {
		path := fmt.Sprintf("builtin[%d]%s", i, entryName(raw))
		b := p.builtin(path, raw)
		if j, dup := seenBuiltin[b.Name]; dup && b.Name != "" {
			p.errorf(path+".name", "%q is also builtin[%d]", b.Name, j)
		}
		seenBuiltin[b.Name] = i
		cfg.Builtin = append(cfg.Builtin, b)
	}
	return cfg
}

// builtinEffects are the built-in tools' effects, by name.
var builtinEffects = func() map[string]subagent.Effect {
	m := map[string]subagent.Effect{}
	for _, name := range subagent.BuiltinToolNames() {
		t, _ := subagent.BuiltinTools().Get(name)
		m[name] = t.Effect
	}
	return m
}()

func (p *parser) builtin(path string, raw json.RawMessage) BuiltinConfig {
	o := p.object(path, raw, builtinFields...)
	b := BuiltinConfig{Name: o.str("name")}
	b.Policy, _ = o.policy()
	effect, ok := builtinEffects[b.Name]
	switch {
	case b.Name == "":
		p.errorf(o.field("name"), "required")
	case !ok:
		p.errorf(o.field("name"), "%q is not a built-in tool (they are: %s)", b.Name, strings.Join(subagent.BuiltinToolNames(), ", "))
	case effect == subagent.EffectRead && b.Approval:
		p.errorf(o.field("approval"), "%s is a read: a read never needs approval", b.Name)
	}
	return b
}

// policy reads an entry's tenants, approval and approval_timeout; set
// says whether it named approval itself.
func (o *object) policy() (pol Policy, set bool) {
	if o.has("tenants") {
		pol.Tenants = o.strings("tenants")
		if pol.Tenants == nil {
			pol.Tenants = []string{}
		}
		if len(pol.Tenants) == 0 {
			o.p.errorf(o.field("tenants"), "is empty: no tenant could use it (leave tenants out for every tenant)")
		}
		for i, tn := range pol.Tenants {
			if tn == "" || len(tn) > 128 { // a tenant id's bounds (admin_check_tenant_id)
				o.p.errorf(fmt.Sprintf("%s[%d]", o.field("tenants"), i), "a tenant id is 1 to 128 bytes, got %d", len(tn))
			}
		}
	}
	switch a := o.str("approval"); a {
	case ApprovalRequired:
		pol.Approval, set = true, true
	case ApprovalNone:
		set = true
	case "":
	default:
		o.p.errorf(o.field("approval"), "%q is not required or none", a)
	}
	pol.ApprovalTimeout = o.duration("approval_timeout")
	switch {
	case o.has("approval_timeout") && !pol.Approval:
		o.p.errorf(o.field("approval_timeout"), "is set, but approval is not required here")
		pol.ApprovalTimeout = 0
	case pol.Approval && pol.ApprovalTimeout == 0 && !o.has("approval_timeout"):
		pol.ApprovalTimeout = DefaultApprovalTimeout
	case pol.Approval && pol.ApprovalTimeout < time.Second:
		o.p.errorf(o.field("approval_timeout"), "%s is under the minimum of 1s", pol.ApprovalTimeout)
	}
	return pol, set
}

func (p *parser) server(path string, raw json.RawMessage) ServerConfig {
	o := p.object(path, raw, serverFields...)
	s := ServerConfig{
		Name:             o.str("name"),
		Transport:        o.str("transport"),
		Command:          o.str("command"),
		Args:             o.strings("args"),
		URL:              o.str("url"),
		TokenFile:        o.str("token_file"),
		ConnectTimeout:   o.duration("connect_timeout"),
		CallTimeout:      o.duration("call_timeout"),
		MaxInFlight:      o.count("max_in_flight"),
		RPM:              o.count("rpm"),
		TrustAnnotations: o.bool("trust_annotations"),
		MaxResultBytes:   o.count("max_result_bytes"),
	}
	s.Policy, _ = o.policy()
	switch {
	case s.Name == "":
		p.errorf(o.field("name"), "required")
	case !serverNameRE.MatchString(s.Name):
		p.errorf(o.field("name"), "%q must be letters, digits, _ or - only", s.Name)
	}
	switch s.Transport {
	case TransportStdio:
		if s.Command == "" {
			p.errorf(o.field("command"), "required for transport stdio")
		}
		for _, k := range []string{"url", "token_file"} {
			if o.has(k) {
				p.errorf(o.field(k), "is for transport http, not stdio")
			}
		}
	case TransportHTTP:
		p.checkURL(o.field("url"), s.URL)
		for _, k := range []string{"command", "args", "env"} {
			if o.has(k) {
				p.errorf(o.field(k), "is for transport stdio, not http")
			}
		}
	case "":
		p.errorf(o.field("transport"), "required: stdio or http")
	default:
		p.errorf(o.field("transport"), "%q is not stdio or http", s.Transport)
	}
	if s.ConnectTimeout == 0 {
		s.ConnectTimeout = DefaultConnectTimeout
	}
	switch {
	case s.MaxResultBytes == 0:
		s.MaxResultBytes = DefaultMaxResultBytes
	case s.MaxResultBytes > MaxMaxResultBytes:
		p.errorf(o.field("max_result_bytes"), "%d is over the limit of %d", s.MaxResultBytes, MaxMaxResultBytes)
	}
	seenEnv := map[string]int{}
	for i, raw := range o.list("env") {
		e := p.env(fmt.Sprintf("%s.env[%d]%s", path, i, entryName(raw)), raw)
		if j, dup := seenEnv[e.Name]; dup && e.Name != "" {
			p.errorf(fmt.Sprintf("%s.env[%d] (%s)", path, i, e.Name), "also set by env[%d]", j)
		}
		seenEnv[e.Name] = i
		s.Env = append(s.Env, e)
	}
	for i, raw := range o.list("tools") {
		t := p.tool(fmt.Sprintf("%s.tools[%d]%s", path, i, entryName(raw)), raw)
		if t.Effect == "" && (t.Policy.Approval || (!t.approvalSet && s.Policy.Approval)) {
			// A tool that needs approval is a write: no server annotation
			// (readOnlyHint) may make it a read that skips the gate.
			t.Effect = EffectWrite
		}
		s.Tools = append(s.Tools, t)
	}
	return s
}

func (p *parser) checkURL(path, raw string) {
	if raw == "" {
		p.errorf(path, "required for transport http")
		return
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		// url's error quotes the URL, which may hold a credential.
		p.errorf(path, "not a URL")
	case u.User != nil:
		p.errorf(path, "holds a user or password: put the credential in token_file")
	case u.Scheme != "http" && u.Scheme != "https":
		p.errorf(path, "scheme %q is not http or https", u.Scheme)
	case u.Host == "":
		p.errorf(path, "has no host")
	}
}

func (p *parser) env(path string, raw json.RawMessage) EnvVar {
	o := p.object(path, raw, envFields...)
	e := EnvVar{Name: o.str("name"), Value: o.str("value"), FromEnv: o.str("from_env"), FromFile: o.str("from_file")}
	switch {
	case e.Name == "":
		p.errorf(o.field("name"), "required")
	case !envNameRE.MatchString(e.Name):
		p.errorf(o.field("name"), "%q is not an environment variable name", e.Name)
	}
	n := 0
	for _, k := range []string{"value", "from_env", "from_file"} {
		if o.has(k) {
			n++
		}
	}
	if n != 1 {
		p.errorf(path, "set exactly one of value, from_env or from_file (a secret goes in a file or the worker's environment, never in this file)")
	}
	if o.has("from_env") && !envNameRE.MatchString(e.FromEnv) {
		p.errorf(o.field("from_env"), "%q is not an environment variable name", e.FromEnv)
	}
	return e
}

func (p *parser) tool(path string, raw json.RawMessage) ToolConfig {
	o := p.object(path, raw, toolFields...)
	t := ToolConfig{
		Name:        o.str("name"),
		Effect:      o.str("effect"),
		CallTimeout: o.duration("call_timeout"),
		MaxInFlight: o.count("max_in_flight"),
		CacheTTL:    o.duration("cache_ttl"),
	}
	t.Policy, t.approvalSet = o.policy()
	if t.Name == "" {
		p.errorf(o.field("name"), "required")
	}
	switch {
	case !o.has("cache_ttl"):
	case t.CacheTTL == 0:
		p.errorf(o.field("cache_ttl"), "is 0: leave cache_ttl out for a tool whose results are never cached")
	case t.CacheTTL < runs.MinCacheTTL:
		p.errorf(o.field("cache_ttl"), "%s is under the least of %s", t.CacheTTL, runs.MinCacheTTL)
		t.CacheTTL = 0
	case t.CacheTTL > runs.MaxCacheTTL:
		p.errorf(o.field("cache_ttl"), "%s is over the limit of %s", t.CacheTTL, runs.MaxCacheTTL)
		t.CacheTTL = 0
	case t.Effect != EffectRead:
		// Not even a tool the server's annotations make a read: only an
		// operator's declaration lets a result stand in for a call.
		p.errorf(o.field("cache_ttl"), "the tool is not declared effect: read: only a read's results are cached, never a write's")
		t.CacheTTL = 0
	}
	switch t.Effect {
	case "", EffectWrite:
	case EffectRead:
		if t.Policy.Approval {
			p.errorf(o.field("approval"), "the tool is declared read: a read never needs approval")
		}
	default:
		p.errorf(o.field("effect"), "%q is not read or write", t.Effect)
	}
	return t
}

// resolveFiles makes the relative secret file names relative to dir.
func (c *Config) resolveFiles(dir string) {
	abs := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	for i := range c.Servers {
		s := &c.Servers[i]
		s.TokenFile = abs(s.TokenFile)
		for j := range s.Env {
			s.Env[j].FromFile = abs(s.Env[j].FromFile)
		}
	}
}

// checkSecrets checks that every secret the config names is there, without
// reading more of it than it must and never putting it in an error.
func (c *Config) checkSecrets() error {
	var errs []error
	for i, s := range c.Servers {
		path := fmt.Sprintf("servers[%d] (%s)", i, s.Name)
		if s.TokenFile != "" {
			if _, err := readSecretFile(s.TokenFile); err != nil {
				errs = append(errs, fmt.Errorf("%s.token_file: %w", path, err))
			}
		}
		for j, e := range s.Env {
			epath := fmt.Sprintf("%s.env[%d] (%s)", path, j, e.Name)
			switch {
			case e.FromFile != "":
				if _, err := readSecretFile(e.FromFile); err != nil {
					errs = append(errs, fmt.Errorf("%s.from_file: %w", epath, err))
				}
			case e.FromEnv != "":
				if _, err := lookupSecretEnv(e.FromEnv); err != nil {
					errs = append(errs, fmt.Errorf("%s.from_env: %w", epath, err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// readSecretFile returns the contents of a secret file less a trailing
// newline; an empty one is an error. The error names the file, never its
// contents.
func readSecretFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return "", fmt.Errorf("read %s: %w", path, pe.Err)
		}
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	s := strings.TrimRight(string(b), "\r\n")
	if strings.TrimSpace(s) == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return s, nil
}

// lookupSecretEnv returns the worker's environment variable name; unset
// or empty is an error.
func lookupSecretEnv(name string) (string, error) {
	v, ok := os.LookupEnv(name)
	if !ok || v == "" {
		return "", fmt.Errorf("environment variable %s is not set", name)
	}
	return v, nil
}
