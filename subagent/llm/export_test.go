package llm

import "time"

// NewMemoryLimiterAt returns an empty MemoryLimiter on the clock now, for
// tests that step time instead of waiting for it.
func NewMemoryLimiterAt(now func() time.Time) *MemoryLimiter {
	m := NewMemoryLimiter()
	m.now = now
	return m
}

// MaxModels is maxModels, for tests that fill a caller's model table.
const MaxModels = maxModels
