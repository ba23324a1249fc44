package mcp_test

import (
	"fmt"

	"github.com/fanout/fanout/subagent/mcp"
)

// A worker Loads the file and Opens a Manager on it (docs/mcp.md,
// "Wiring"); the orchestrator needs only the tools' names.
func ExampleParse() {
	cfg, err := mcp.Parse([]byte(`
servers:
  - name: memory
    transport: stdio
    command: npx
    args: ["-y", "@modelcontextprotocol/server-memory@2026.8.31"]
    tools:
      - {name: search_nodes, effect: read}
      - {name: create_entities, effect: write, max_in_flight: 1}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(cfg.ToolNames())

	_, err = mcp.Parse([]byte(`
servers:
  - {name: memory, transport: stdio, command: npx, tools: [{name: search_nodes, effect: reed}]}
`))
	fmt.Println(err)
	// Output:
	// [memory__search_nodes memory__create_entities]
	// servers[0] (memory).tools[0] (search_nodes).effect: "reed" is not read or write
}
