package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// TestBothListenersShareTheirLimits (docs/http.md: --max-streams and
// --tenant-max-streams are the gRPC listener's): through `fanout
// orchestrator` with both listeners up, a tenant's calls on one listener
// take its --tenant-max-streams slots from the other, both ways, and the
// calls of every tenant on both listeners count in one --max-streams.
func TestBothListenersShareTheirLimits(t *testing.T) {
	t.Parallel()
	// Runs that stay live: every model call takes 30 s.
	c := startWorkers(t, [][]string{{"--sim-latency", "30s"}})
	o := startOrchestratorMain(t, c.url, c.workers, "--auth", "keys", "--http-listen", "127.0.0.1:0",
		"--max-streams", "4", "--tenant-max-streams", "2")
	keys := map[string]string{}
	for _, tenant := range []string{"acme", "globex", "initech"} {
		admin(t, c.url, "tenant", "create", tenant)
		keys[tenant] = newKey(t, c.url, "--tenant", tenant, "--scopes", "run,read,cancel")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	live := func(tenant string) string {
		s := e2eSpec("live-"+tenant, 1, 100_000)
		s.TenantId = tenant
		resp, err := keyClient(t, o.addr, keys[tenant]).StartRun(ctx, &fanoutv1.StartRunRequest{Spec: s})
		if err != nil {
			t.Fatalf("StartRun for %s: %v", tenant, err)
		}
		t.Cleanup(func() {
			_, _ = keyClient(t, o.addr, keys[tenant]).CancelRun(context.Background(), &fanoutv1.CancelRunRequest{RunId: resp.GetRunId()})
		})
		return resp.GetRunId()
	}
	acmeRun, globexRun := live("acme"), live("globex")

	// watchGRPC holds a WatchRun stream open on the gRPC listener until
	// the returned func is called.
	watchGRPC := func(tenant, runID string) func() {
		sctx, stop := context.WithCancel(ctx)
		stream, err := keyClient(t, o.addr, keys[tenant]).WatchRun(sctx, &fanoutv1.WatchRunRequest{RunId: runID})
		if err == nil {
			_, err = stream.Recv()
		}
		if err != nil {
			stop()
			t.Fatalf("WatchRun of %s over gRPC: %v", tenant, err)
		}
		return stop
	}
	// watchHTTPOpen holds a Connect WatchRun stream open on the HTTP
	// listener until the returned func is called.
	watchHTTPOpen := func(tenant, runID string) func() {
		msg := fmt.Sprintf(`{"runId":%q}`, runID)
		var env bytes.Buffer
		env.WriteByte(0)
		_ = binary.Write(&env, binary.BigEndian, uint32(len(msg)))
		env.WriteString(msg)
		sctx, stop := context.WithCancel(ctx)
		req, _ := http.NewRequestWithContext(sctx, http.MethodPost, o.http+"/fanout.v1.OrchestratorService/WatchRun", &env)
		req.Header.Set("Content-Type", "application/connect+json")
		req.Header.Set("Authorization", "Bearer "+keys[tenant])
		resp, err := http.DefaultClient.Do(req) //nolint:bodyclose // the returned func closes it, as does every failure below
		if err != nil {
			stop()
			t.Fatalf("WatchRun of %s over HTTP: %v", tenant, err)
		}
		if resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("status %d", resp.StatusCode)
		} else {
			_, err = bufio.NewReader(resp.Body).Peek(5) // the first event's envelope
		}
		if err != nil {
			stop()
			_ = resp.Body.Close()
			t.Fatalf("WatchRun of %s over HTTP: %v", tenant, err)
		}
		return func() { stop(); _ = resp.Body.Close() }
	}
	// stalledHTTP holds an HTTP call whose body never comes: admitted (its
	// tenant's slot taken) before the body is read.
	stalledHTTP := func(tenant string) func() {
		conn, err := net.Dial("tcp", strings.TrimPrefix(o.http, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fmt.Fprintf(conn, "POST /fanout.v1.OrchestratorService/ListRuns HTTP/1.1\r\nHost: 127.0.0.1\r\n"+
			"Content-Type: application/json\r\nConnect-Protocol-Version: 1\r\nAuthorization: Bearer %s\r\nContent-Length: 100\r\n\r\n{", keys[tenant]); err != nil {
			t.Fatal(err)
		}
		return func() { _ = conn.Close() }
	}
	grpcList := func(tenant string) error {
		_, err := keyClient(t, o.addr, keys[tenant]).ListRuns(ctx, &fanoutv1.ListRunsRequest{})
		return err
	}
	httpList := func(tenant string) error {
		code, out := curl(t, "GET", o.http+"/v1/runs", keys[tenant], "")
		if code != http.StatusOK {
			return fmt.Errorf("%d %s", code, out)
		}
		return nil
	}
	// until polls call until it fails naming want (or, with want "", until
	// it succeeds), within a deadline.
	until := func(what string, call func() error, want string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			err := call()
			switch {
			case want == "" && err == nil:
				return
			case want != "" && err != nil && strings.Contains(err.Error(), want):
				return
			case time.Now().After(deadline):
				t.Fatalf("%s: %v; want %s within 30 s", what, err, wantText(want))
			}
			time.Sleep(50 * time.Millisecond) // polling the listener's answer
		}
	}

	// gRPC → HTTP: acme's two streams on gRPC fill its quota on HTTP.
	a1, a2 := watchGRPC("acme", acmeRun), watchGRPC("acme", acmeRun)
	if err := httpList("acme"); err == nil || !strings.Contains(err.Error(), "429") || !strings.Contains(err.Error(), "--tenant-max-streams") {
		t.Errorf("acme's GET /v1/runs with its 2 slots held on gRPC: %v; want 429 naming --tenant-max-streams", err)
	}
	if err := httpList("globex"); err != nil {
		t.Errorf("globex's GET /v1/runs beside acme's full quota: %v; want served", err)
	}
	a1()
	a2()
	until("acme's GET /v1/runs once its gRPC streams ended", func() error { return httpList("acme") }, "")

	// HTTP → gRPC: two stalled bodies of acme on HTTP fill its quota on gRPC.
	s1, s2 := stalledHTTP("acme"), stalledHTTP("acme")
	until("acme's ListRuns over gRPC with 2 stalled HTTP calls", func() error { return grpcList("acme") }, "--tenant-max-streams")
	if err := grpcList("acme"); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("acme's ListRuns over gRPC with its quota held on HTTP: %v; want RESOURCE_EXHAUSTED", err)
	}
	s1()
	s2()
	until("acme's ListRuns once its HTTP calls were closed", func() error { return grpcList("acme") }, "")

	// One --max-streams for both: 2 streams on gRPC and 2 on HTTP fill 4.
	a1, a2 = watchGRPC("acme", acmeRun), watchGRPC("acme", acmeRun)
	g1, g2 := watchHTTPOpen("globex", globexRun), watchHTTPOpen("globex", globexRun)
	for _, c := range []struct {
		listener string
		call     func(string) error
	}{{"gRPC", grpcList}, {"HTTP", httpList}} {
		if err := c.call("initech"); err == nil || !strings.Contains(err.Error(), "--max-streams") {
			t.Errorf("initech's call over %s with 2 streams on each listener: %v; want refused naming --max-streams", c.listener, err)
		}
	}
	a1()
	g1()
	until("initech's ListRuns once two streams ended", func() error { return grpcList("initech") }, "")
	a2()
	g2()
}

func wantText(want string) string {
	if want == "" {
		return "served"
	}
	return "refused naming " + want
}

// TestHTTPSecurityHeadersOnEveryAnswer (docs/http.md "Security"): through
// `fanout orchestrator --http-listen --console`, every answer — an API
// answer, the listener's own refusal before the body, a path it does not
// serve, the console and its redirect — carries the documented headers,
// and the API's answers Cache-Control: no-store.
func TestHTTPSecurityHeadersOnEveryAnswer(t *testing.T) {
	t.Parallel()
	c := startWorkers(t, [][]string{{}})
	o := startOrchestratorMain(t, c.url, c.workers, "--auth", "keys", "--http-listen", "127.0.0.1:0", "--console")
	admin(t, c.url, "tenant", "create", "acme")
	key := newKey(t, c.url, "--tenant", "acme", "--scopes", "read")
	want := map[string]string{
		"Content-Security-Policy":      "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
		"X-Content-Type-Options":       "nosniff",
		"X-Frame-Options":              "DENY",
		"Referrer-Policy":              "no-referrer",
		"Cross-Origin-Opener-Policy":   "same-origin",
		"Cross-Origin-Resource-Policy": "same-origin",
	}
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, c := range []struct {
		name, method, path, key string
		code                    int
		api                     bool
	}{
		{"an API answer", "GET", "/v1/runs", key, http.StatusOK, true},
		{"a refusal before the body", "GET", "/v1/runs", "", http.StatusUnauthorized, true},
		{"a path not served", "POST", "/grpc.health.v1.Health/Check", key, http.StatusNotFound, true},
		{"the console", "GET", "/console/", "", http.StatusOK, false},
		{"the redirect to it", "GET", "/", "", http.StatusFound, false},
	} {
		req, _ := http.NewRequestWithContext(t.Context(), c.method, o.http+c.path, nil)
		if c.key != "" {
			req.Header.Set("Authorization", "Bearer "+c.key)
		}
		if c.method == "POST" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != c.code {
			t.Errorf("%s (%s %s): %d; want %d", c.name, c.method, c.path, resp.StatusCode, c.code)
		}
		for h, v := range want {
			if got := resp.Header.Get(h); got != v {
				t.Errorf("%s: %s %q; want %q", c.name, h, got, v)
			}
		}
		if got := resp.Header.Get("Cache-Control"); c.api && got != "no-store" {
			t.Errorf("%s: Cache-Control %q; want no-store", c.name, got)
		}
		if got := resp.Header.Get("Strict-Transport-Security"); got != "" {
			t.Errorf("%s: Strict-Transport-Security %q on a plaintext listener; want none", c.name, got)
		}
	}
}
