package llm_test

import (
	"fmt"
	"log"
	"log/slog"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/fanout/fanout/subagent/llm/llmtest"
)

// canary is the API key of every provider test. No 8-byte piece of it is
// hexadecimal only, so it cannot be mistaken for a trace, span or key id.
const canary = "sk-canary-Qm7vXw2LpZr9TkNy4HbJs6GdWc8Fq"

// defaultLog is everything written through slog.Default() (and the log
// package, which SetDefault routes there) while the package's tests run.
// TestMain installs it, since tests running in parallel share the default.
var defaultLog witness

func TestMain(m *testing.M) {
	prev, prevOut, prevFlags := slog.Default(), log.Writer(), log.Flags()
	slog.SetDefault(slog.New(slog.NewJSONHandler(&defaultLog, &slog.HandlerOptions{Level: slog.LevelDebug})))
	code := m.Run()
	slog.SetDefault(prev)
	log.SetOutput(prevOut)
	log.SetFlags(prevFlags)
	if p, ok := llmtest.LeakedPiece(defaultLog.String(), canary); ok {
		fmt.Fprintf(os.Stderr, "the API key (%q) leaked into slog.Default():\n%s\n", p, llmtest.LinesHolding(defaultLog.String(), p))
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func TestLeakedPieceFindsAnyEightBytes(t *testing.T) {
	t.Parallel()
	for _, text := range []string{
		canary,
		"key_id=" + canary[len(canary)-llmtest.KeyPiece:], // a suffix as an id
		`{"key":"` + canary[:llmtest.KeyPiece] + `..."}`,  // a prefix
		"in the middle: " + canary[13:13+llmtest.KeyPiece] + ".",
	} {
		if _, ok := llmtest.LeakedPiece(text, canary); !ok {
			t.Errorf("llmtest.LeakedPiece(%q) found nothing", text)
		}
	}
	for _, text := range []string{"", "[REDACTED]", canary[:llmtest.KeyPiece-1], "sk-" + canary[len(canary)-llmtest.KeyPiece+1:]} {
		if p, ok := llmtest.LeakedPiece(text, canary); ok {
			t.Errorf("llmtest.LeakedPiece(%q) = %q: want nothing", text, p)
		}
	}
}
