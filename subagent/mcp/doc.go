// Package mcp gives subagents the tools of the MCP servers an operator
// configures (docs/mcp.md): one long-lived session per server per worker,
// effects declared rather than guessed, and fleet-wide bounds per server
// and tool.
package mcp
