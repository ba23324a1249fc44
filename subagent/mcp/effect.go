package mcp

import (
	"fmt"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fanout/fanout/subagent"
)

// effectOf decides a tool's effect (docs/mcp.md#effects): the operator's declaration
// wins; an undeclared tool is a read only if the operator trusts the
// server's annotations and the server says readOnlyHint: true; anything
// else is a write. A tool declared read that the server marks destructive
// is an error, whatever the trust: the operator's claim contradicts the
// server's, and a human must decide.
func effectOf(declared string, trusted bool, ann *sdk.ToolAnnotations) (subagent.Effect, error) {
	switch declared {
	case EffectRead:
		if destructive(ann) {
			return subagent.EffectWrite, fmt.Errorf("effect: declared read, but the server marks the tool destructiveHint: true; " +
				"declare it write, or fix the server")
		}
		return subagent.EffectRead, nil
	case EffectWrite:
		return subagent.EffectWrite, nil
	}
	if trusted && ann != nil && ann.ReadOnlyHint {
		return subagent.EffectRead, nil
	}
	return subagent.EffectWrite, nil
}

// destructive reports whether the server says, explicitly, that the tool
// is destructive (the hint's default of true for a tool that is not
// read-only does not count: it is the absence of a claim).
func destructive(ann *sdk.ToolAnnotations) bool {
	return ann != nil && ann.DestructiveHint != nil && *ann.DestructiveHint
}
