package mcp

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"unicode/utf8"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// Inspect connects to one configured server, lists its tools and writes
// them to w with their annotations, then a suggested tools: block for the
// config with each effect filled in by the rules Open applies and a
// REVIEW comment where a human must decide. It changes nothing on the
// server (it calls no tool). `fanout mcp inspect SERVER` runs it.
func Inspect(ctx context.Context, cfg ServerConfig, w io.Writer) error {
	sec := &secrets{}
	return sec.err(inspect(ctx, cfg, w, sec, nil))
}

func inspect(ctx context.Context, cfg ServerConfig, w io.Writer, sec *secrets, connect func(context.Context) (sdk.Transport, error)) error {
	log := slog.New(slog.DiscardHandler)
	d := newDialer(cfg, log, sec)
	defer d.close()
	if connect == nil {
		connect = d.transport
	}
	timeout := cfg.ConnectTimeout
	if timeout <= 0 {
		timeout = DefaultConnectTimeout // a ServerConfig not from Parse
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t, err := connect(ctx)
	if err != nil {
		return fmt.Errorf("inspect %s: connect to %s: %w", cfg.Name, d.endpoint(), err)
	}
	cs, err := newClient(log, 0, nil).Connect(ctx, t, &sdk.ClientSessionOptions{ProtocolVersion: protocolVersion})
	if err != nil {
		return fmt.Errorf("inspect %s: connect to %s: %w", cfg.Name, d.endpoint(), cutCause(ctx, err))
	}
	defer func() { _ = cs.Close() }() // Only reading: nothing to lose if the goodbye fails.
	tools, err := listTools(ctx, cs)
	if err != nil {
		return fmt.Errorf("inspect %s: list tools: %w", cfg.Name, cutCause(ctx, err))
	}
	writeInspection(w, cfg, cs.InitializeResult(), tools)
	return nil
}

func writeInspection(w io.Writer, cfg ServerConfig, init *sdk.InitializeResult, tools []*sdk.Tool) {
	fmt.Fprintf(w, "server %s (%s", cfg.Name, cfg.Transport)
	if init != nil {
		if init.ServerInfo != nil {
			fmt.Fprintf(w, ", %s %s", init.ServerInfo.Name, init.ServerInfo.Version)
		}
		fmt.Fprintf(w, ", protocol %s", init.ProtocolVersion)
	}
	fmt.Fprintf(w, "): %d tools; trust_annotations: %t\n\n", len(tools), cfg.TrustAnnotations)
	declared := map[string]ToolConfig{}
	for _, t := range cfg.Tools {
		declared[t.Name] = t
	}
	for _, t := range tools {
		fmt.Fprintf(w, "%s\n", t.Name)
		if d := firstLine(t.Description); d != "" {
			fmt.Fprintf(w, "  %s\n", d)
		}
		fmt.Fprintf(w, "  annotations: %s\n", annotations(t.Annotations))
	}
	fmt.Fprintf(w, "\nSuggested config (review each effect; docs/mcp.md has the rules):\n\n    tools:\n")
	for _, t := range tools {
		fmt.Fprintf(w, "      - name: %s\n", t.Name)
		if name := ModelName(cfg.Name, t.Name); !toolNameRE.MatchString(name) {
			fmt.Fprintf(w, "        # CANNOT BE OFFERED: the model-facing name %q must match %s\n", name, toolNameRE)
		}
		effect, why := suggest(cfg.TrustAnnotations, t.Annotations)
		if dt, ok := declared[t.Name]; ok && dt.Effect != "" {
			effect, why = dt.Effect, "declared in the config now"
		}
		fmt.Fprintf(w, "        effect: %s  # %s\n", effect, why)
	}
}

// suggest is the effect Open would give an undeclared tool, and why; where
// the server claims a read that is not trusted, a human decides.
func suggest(trusted bool, ann *sdk.ToolAnnotations) (effect, why string) {
	switch {
	case ann == nil:
		return EffectWrite, "REVIEW: no annotations; write unless you know it only reads"
	case destructive(ann) && ann.ReadOnlyHint:
		return EffectWrite, "REVIEW: the server says both readOnlyHint and destructiveHint: write until a human checks"
	case destructive(ann):
		return EffectWrite, "destructiveHint: true"
	case ann.ReadOnlyHint && trusted:
		return EffectRead, "readOnlyHint: true, and this server's annotations are trusted"
	case ann.ReadOnlyHint:
		return EffectWrite, "REVIEW: readOnlyHint: true, but trust_annotations is false; declare read if it only reads"
	}
	return EffectWrite, "readOnlyHint: false"
}

func annotations(a *sdk.ToolAnnotations) string {
	if a == nil {
		return "none"
	}
	opt := func(p *bool, def string) string {
		if p == nil {
			return "unset (" + def + ")"
		}
		return fmt.Sprint(*p)
	}
	s := fmt.Sprintf("readOnlyHint=%t destructiveHint=%s idempotentHint=%t openWorldHint=%s",
		a.ReadOnlyHint, opt(a.DestructiveHint, "true by default"), a.IdempotentHint, opt(a.OpenWorldHint, "true by default"))
	if a.Title != "" {
		s += fmt.Sprintf(" title=%q", a.Title)
	}
	return s
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 120 {
		cut := 117
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "..."
	}
	return s
}
