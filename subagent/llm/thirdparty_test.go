package llm_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/fanout/fanout/subagent/llm"
)

// mockoonCLI is where scripts/ensure-mcp-servers.sh installs Mockoon's CLI
// (pinned in .ci/mcp/package.json), relative to this package.
const mockoonCLI = "../../.ci/mcp/node_modules/@mockoon/cli/bin/run.js"

// startMockoon serves testdata/mockoon-rate-limits.json with Mockoon's
// CLI, a mock server nobody here wrote, and returns its base URL. It
// fails saying how to install what it needs.
func startMockoon(t *testing.T) string {
	t.Helper()
	cli, err := filepath.Abs(mockoonCLI)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(cli); err != nil {
		t.Fatalf("Mockoon's CLI is not installed (%v): run scripts/ensure-mcp-servers.sh (make test runs it)", err)
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatalf("the third-party server test runs Mockoon's CLI with Node.js, which is not on PATH (%v): "+
			"install Node.js 18 or later (Debian: sudo apt-get install -y nodejs npm)", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	var out bytes.Buffer
	cmd := exec.Command("node", cli, "start", "--data", "testdata/mockoon-rate-limits.json",
		"--port", strconv.Itoa(port), "--hostname", "127.0.0.1")
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start Mockoon: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if err := <-exited; err == nil {
			t.Log("Mockoon exited cleanly before it was killed")
		}
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(60 * time.Second)
	for {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			_ = c.Close()
			return "http://" + addr
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("Mockoon exited before serving (%v):\n%s", err, out.String())
		case <-time.After(100 * time.Millisecond): // a poll interval, not synchronization
		}
		if time.Now().After(deadline) {
			t.Fatalf("Mockoon did not serve on %s within 60s:\n%s", addr, out.String())
		}
	}
}

// TestThirdPartyServerLimitsLearned: against a mock server nobody here
// wrote (Mockoon, configured to answer with the OpenAI and Anthropic
// rate-limit headers, a 429 with retry-after among them), the providers
// learn the stated limits, write them and the 429, and enforce them times
// the headroom.
func TestThirdPartyServerLimitsLearned(t *testing.T) {
	t.Parallel()
	base := startMockoon(t)
	const key = "sk-third-party-key"
	for _, c := range []struct {
		provider string
		calls    int
		stated   [2]int64 // rpm, tpm
		enforced [2]int64
	}{
		// Replies 200, 429 (retry-after 1) and 200 again: two calls.
		{"openai", 2, [2]int64{600, 200_000}, [2]int64{420, 140_000}},
		// tokens-limit, not the smaller input or output limit: it is the
		// most restrictive one, as Anthropic states it.
		{"anthropic", 2, [2]int64{50, 40_000}, [2]int64{35, 28_000}},
	} {
		t.Run(c.provider, func(t *testing.T) {
			lim := &defineLog{MemoryLimiter: llm.NewMemoryLimiter()}
			b := &book{}
			pc := llm.ProviderConfig{
				APIKey: key, Model: "test-model", CallTimeout: 10 * time.Second,
				Retry:   llm.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond},
				Limiter: lim, Book: b, LearnEvery: time.Hour,
				Limits: llm.RateLimit{Burst: time.Minute}, // a minute's worth: no waits
				Logger: slog.New(slog.DiscardHandler),
			}
			var m llm.Model
			if c.provider == "openai" {
				pc.BaseURL = base + "/v1/"
				o, err := llm.NewOpenAI(llm.OpenAIConfig{ProviderConfig: pc})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(o.Close)
				m = o
			} else {
				pc.BaseURL = base + "/"
				a, err := llm.NewAnthropic(llm.AnthropicConfig{ProviderConfig: pc})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(a.Close)
				m = a
			}
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			for i := range c.calls {
				if _, err := m.Call(ctx, providerRequest()); err != nil {
					t.Fatalf("call %d: %v", i+1, err)
				}
			}
			w := b.all()
			if len(w) == 0 {
				t.Fatal("nothing learned from the third-party server's headers")
			}
			l := w[0]
			if l.LimitRequests != c.stated[0] || l.LimitTokens != c.stated[1] || l.Bucket != llm.BucketName(c.provider, key) ||
				l.RemainingRequests < 0 || l.RequestsResetAt.IsZero() {
				t.Errorf("learned %+v, want %d RPM and %d TPM stated, what is left and its reset", l, c.stated[0], c.stated[1])
			}
			want := defined{llm.ModelBucket(c.provider, key, "test-model"), c.enforced[0], c.enforced[1]}
			if d := lim.all(); len(d) == 0 || d[len(d)-1] != want {
				t.Errorf("Defines = %+v, want the last %+v: the stated limits x 0.7", d, want)
			}
			if c.provider != "openai" {
				return
			}
			if len(w) != 2 || w[1].Throttled != 1 || w[1].ThrottledUntil.IsZero() || w[1].RemainingRequests != 0 {
				t.Errorf("writes %+v: want the first reading, then the 429 at once with its retry-after and 0 requests left", w)
			}
		})
	}
}
