package mcp

import "github.com/fanout/fanout/store"

// *store.RateLimiter is a RateLimiter as it is. *store.Semaphore is a
// Semaphore through node's adapter (package subagent may not import
// store), which checks that it fits (node/mcp.go).
var _ RateLimiter = (*store.RateLimiter)(nil)
