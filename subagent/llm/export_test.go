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

// IdleModels makes every model m keeps limits for look unused for d
// longer, for tests of the model table's eviction.
func IdleModels(m Model, d time.Duration) {
	var c *caller
	switch m := m.(type) {
	case *OpenAI:
		c = m.c
	case *Anthropic:
		c = m.c
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range c.models {
		l.used = l.used.Add(-d)
	}
}
