package main

import (
	"io"
	"strings"
	"testing"
)

// TestEngineFlagsValidated: a --headroom outside (0, 1] (NaN too) and a
// --concurrency-interval under a second are refused, naming the flag and
// the bound, rather than silently replaced or let through
// (docs/operations.md#concurrency-from-the-rate-limits).
func TestEngineFlagsValidated(t *testing.T) {
	t.Parallel()
	noEnv := &Env{Stdout: io.Discard, Stderr: io.Discard, Getenv: func(string) string { return "" }}
	for _, tc := range []struct {
		args []string
		want []string // nothing: accepted
	}{
		{args: []string{"--headroom", "0"}, want: []string{"--headroom 0", "(0, 1]"}},
		{args: []string{"--headroom", "1.5"}, want: []string{"--headroom 1.5", "(0, 1]"}},
		{args: []string{"--headroom", "-1"}, want: []string{"--headroom -1", "(0, 1]"}},
		{args: []string{"--headroom", "NaN"}, want: []string{"--headroom NaN", "(0, 1]"}},
		{args: []string{"--concurrency-interval", "1ms"}, want: []string{"--concurrency-interval 1ms", "at least 1s"}},
		{args: []string{"--concurrency-interval", "0s"}, want: []string{"--concurrency-interval 0s", "at least 1s"}},
		{args: []string{"--headroom", "1", "--concurrency-interval", "1s"}},
		{args: []string{"--headroom", "0.05", "--concurrency-interval", "1m"}},
	} {
		c, err := parseOrchestrator(noEnv, tc.args)
		if len(tc.want) == 0 {
			if err != nil {
				t.Errorf("%q: %v, want accepted", tc.args, err)
			} else if c.oc.Engine.DefaultHeadroom <= 0 {
				t.Errorf("%q: headroom %v", tc.args, c.oc.Engine.DefaultHeadroom)
			}
			continue
		}
		if err == nil {
			t.Errorf("%q: accepted, want an error naming %q", tc.args, tc.want)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: %v, want it to say %q", tc.args, err, w)
			}
		}
	}
}
