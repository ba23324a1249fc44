package llm_test

import (
	"fmt"
	"log"
	"log/slog"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// canary is the API key of every provider test. No 8-byte piece of it is
// hexadecimal only, so it cannot be mistaken for a trace, span or key id.
const canary = "sk-canary-Qm7vXw2LpZr9TkNy4HbJs6GdWc8Fq"

// keyPiece is the shortest piece of an API key that counts as leaked: a
// prefix or a suffix that long, logged as an "id", still narrows the key
// down to a few candidates.
const keyPiece = 8

// leakedPiece returns the first piece of key, keyPiece bytes long, that
// text holds. Any longer piece holds one of those.
func leakedPiece(text, key string) (string, bool) {
	for i := 0; i+keyPiece <= len(key); i++ {
		if p := key[i : i+keyPiece]; strings.Contains(text, p) {
			return p, true
		}
	}
	return "", false
}

// linesHolding returns the lines of text that hold piece, so that a
// failure shows where the key went without repeating a whole log.
func linesHolding(text, piece string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, piece) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

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
	if p, ok := leakedPiece(defaultLog.String(), canary); ok {
		fmt.Fprintf(os.Stderr, "the API key (%q) leaked into slog.Default():\n%s\n", p, linesHolding(defaultLog.String(), p))
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
		"key_id=" + canary[len(canary)-keyPiece:], // a suffix as an id
		`{"key":"` + canary[:keyPiece] + `..."}`,  // a prefix
		"in the middle: " + canary[13:13+keyPiece] + ".",
	} {
		if _, ok := leakedPiece(text, canary); !ok {
			t.Errorf("leakedPiece(%q) found nothing", text)
		}
	}
	for _, text := range []string{"", "[REDACTED]", canary[:keyPiece-1], "sk-" + canary[len(canary)-keyPiece+1:]} {
		if p, ok := leakedPiece(text, canary); ok {
			t.Errorf("leakedPiece(%q) = %q: want nothing", text, p)
		}
	}
}
