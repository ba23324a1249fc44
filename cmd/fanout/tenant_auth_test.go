package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// admin runs `fanout tenant|key ...` as the database's owner and returns
// its stdout.
func admin(t *testing.T, url string, args ...string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	args = append(args, "--database-url", url)
	if code := Main(context.Background(), args, &out, &errOut, func(string) string { return "" }); code != 0 {
		t.Fatalf("fanout %s: exit %d: %s", strings.Join(args, " "), code, errOut.String())
	}
	return out.String()
}

// newKey makes a key with `fanout key create` and returns its token (the
// last line printed).
func newKey(t *testing.T, url string, args ...string) string {
	t.Helper()
	out := strings.Fields(admin(t, url, append([]string{"key", "create"}, args...)...))
	token := out[len(out)-1]
	if !strings.HasPrefix(token, "fanout_fk_") {
		t.Fatalf("key create printed %q last, not a token", token)
	}
	return token
}

// keyID is the id part of a token.
func keyID(token string) string { return strings.Join(strings.SplitN(token, "_", 4)[1:3], "_") }

// keyClient is a client of addr that calls with token ("" for none).
func keyClient(t *testing.T, addr, token string) fanoutv1.OrchestratorServiceClient {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer{token: token}))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return fanoutv1.NewOrchestratorServiceClient(conn)
}

// firstEvent calls a streaming RPC and returns the error of its first
// receive (nil if an event came).
func firstEvent(recv func() error) error {
	err := recv()
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// TestEveryRPCIsScopedToTheCredentialsTenant: with API keys, every RPC of
// OrchestratorService refuses a call with no credential, with another
// tenant's key, with a key missing the scope, with an expired, a revoked
// and an admin key — with the right code, nothing written, nothing of
// acme's returned; a stream open on a key ends when the key is revoked;
// and no token's secret appears in anything the run wrote.
func TestEveryRPCIsScopedToTheCredentialsTenant(t *testing.T) {
	t.Parallel()
	c := startWorkers(t, [][]string{{"--sim-latency", "1h"}}) // acme's run stays RUNNING
	o := startOrchestratorMain(t, c.url, c.workers, "--auth", "keys", "--http-listen", "127.0.0.1:0")
	owner := c.url // the owner's URL: `fanout tenant` and `fanout key` act as the owner role
	admin(t, owner, "tenant", "create", "acme")
	admin(t, owner, "tenant", "create", "globex")
	acme := newKey(t, owner, "--tenant", "acme", "--scopes", "run,read,cancel", "--name", "acme-full")
	reader := newKey(t, owner, "--tenant", "acme", "--scopes", "read")
	globex := newKey(t, owner, "--tenant", "globex", "--scopes", "run,read,cancel,approve")
	revoked := newKey(t, owner, "--tenant", "acme", "--scopes", "run,read,cancel")
	expired := newKey(t, owner, "--tenant", "acme", "--scopes", "run,read,cancel", "--expires", "1s")
	adminKey := newKey(t, owner, "--admin", "--name", "ops")
	watched := newKey(t, owner, "--tenant", "acme", "--scopes", "read")
	admin(t, owner, "key", "revoke", keyID(revoked))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	spec := e2eSpec("acme-run", 1, 100_000)
	spec.TenantId = "acme"
	started, err := keyClient(t, o.addr, acme).StartRun(ctx, &fanoutv1.StartRunRequest{Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	runID := started.GetRunId()
	waitFor(t, 10*time.Second, "the 1s key expires", func() (bool, string) {
		_, err := keyClient(t, o.addr, expired).GetRun(ctx, &fanoutv1.GetRunRequest{RunId: runID})
		return status.Code(err) == codes.Unauthenticated, status.Code(err).String()
	})
	countRuns := func() int {
		var n int
		if err := c.pool.QueryRow(ctx, `SELECT count(*) FROM run`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := countRuns()

	globexSpec := e2eSpec("stolen", 1, 100_000)
	globexSpec.TenantId = "acme" // names acme; the key is globex's
	rpcs := map[string]func(fanoutv1.OrchestratorServiceClient) error{
		"StartRun": func(cl fanoutv1.OrchestratorServiceClient) error {
			s := e2eSpec("refused", 1, 100_000)
			s.TenantId = "acme"
			_, err := cl.StartRun(ctx, &fanoutv1.StartRunRequest{Spec: s})
			return err
		},
		"Run": func(cl fanoutv1.OrchestratorServiceClient) error {
			s := e2eSpec("refused-stream", 1, 100_000)
			s.TenantId = "acme"
			st, err := cl.Run(ctx, &fanoutv1.RunRequest{Spec: s})
			if err != nil {
				return err
			}
			return firstEvent(func() error { _, err := st.Recv(); return err })
		},
		"GetRun": func(cl fanoutv1.OrchestratorServiceClient) error {
			_, err := cl.GetRun(ctx, &fanoutv1.GetRunRequest{RunId: runID})
			return err
		},
		"WatchRun": func(cl fanoutv1.OrchestratorServiceClient) error {
			st, err := cl.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: runID})
			if err != nil {
				return err
			}
			return firstEvent(func() error { _, err := st.Recv(); return err })
		},
		"CancelRun": func(cl fanoutv1.OrchestratorServiceClient) error {
			_, err := cl.CancelRun(ctx, &fanoutv1.CancelRunRequest{RunId: runID, Reason: "not yours"})
			return err
		},
		"ListRuns": func(cl fanoutv1.OrchestratorServiceClient) error {
			_, err := cl.ListRuns(ctx, &fanoutv1.ListRunsRequest{TenantId: "acme"})
			return err
		},
		"ListApprovals": func(cl fanoutv1.OrchestratorServiceClient) error {
			_, err := cl.ListApprovals(ctx, &fanoutv1.ListApprovalsRequest{RunId: runID})
			return err
		},
		"ApproveToolCall": func(cl fanoutv1.OrchestratorServiceClient) error {
			_, err := cl.ApproveToolCall(ctx, &fanoutv1.ApproveToolCallRequest{CallId: "tc_00000000000000000000000000000000"})
			return err
		},
		"DenyToolCall": func(cl fanoutv1.OrchestratorServiceClient) error {
			_, err := cl.DenyToolCall(ctx, &fanoutv1.DenyToolCallRequest{CallId: "tc_00000000000000000000000000000000"})
			return err
		},
		"ListToolCalls": func(cl fanoutv1.OrchestratorServiceClient) error {
			_, err := cl.ListToolCalls(ctx, &fanoutv1.ListToolCallsRequest{RunId: runID})
			return err
		},
		"GetSpend": func(cl fanoutv1.OrchestratorServiceClient) error {
			_, err := cl.GetSpend(ctx, &fanoutv1.GetSpendRequest{TenantId: "acme", RunIds: []string{runID}})
			return err
		},
		"ListRunTasks": func(cl fanoutv1.OrchestratorServiceClient) error {
			_, err := cl.ListRunTasks(ctx, &fanoutv1.ListRunTasksRequest{RunId: runID})
			return err
		},
		"ListRunFacts": func(cl fanoutv1.OrchestratorServiceClient) error {
			_, err := cl.ListRunFacts(ctx, &fanoutv1.ListRunFactsRequest{RunId: runID})
			return err
		},
	}
	// Another tenant's key: a spec or request naming acme is
	// PERMISSION_DENIED; a run id of acme's is NOT_FOUND (its existence is
	// not told).
	wrongTenant := map[string]codes.Code{"StartRun": codes.PermissionDenied, "Run": codes.PermissionDenied,
		"GetRun": codes.NotFound, "WatchRun": codes.NotFound, "CancelRun": codes.NotFound, "ListRuns": codes.PermissionDenied,
		"ApproveToolCall": codes.NotFound, "DenyToolCall": codes.NotFound, // ListApprovals: globex's own, none
		"ListToolCalls": codes.NotFound, "GetSpend": codes.PermissionDenied,
		"ListRunTasks": codes.NotFound, "ListRunFacts": codes.NotFound}
	missingScope := map[string]codes.Code{"StartRun": codes.PermissionDenied, "Run": codes.PermissionDenied,
		"CancelRun": codes.PermissionDenied, "ListApprovals": codes.PermissionDenied, "ApproveToolCall": codes.PermissionDenied,
		"DenyToolCall": codes.PermissionDenied, "GetSpend": codes.PermissionDenied}
	// The same table on both listeners: gRPC, and HTTP in the Connect
	// protocol's JSON (issue 29: the HTTP listener adds no way around it).
	clients := map[string]func(token string) fanoutv1.OrchestratorServiceClient{
		"gRPC": func(token string) fanoutv1.OrchestratorServiceClient { return keyClient(t, o.addr, token) },
		"HTTP": func(token string) fanoutv1.OrchestratorServiceClient { return httpClient(t, o.http, token) },
	}
	for _, listener := range []string{"gRPC", "HTTP"} {
		for name, call := range rpcs {
			for _, cs := range []struct {
				who   string
				token string
				want  codes.Code
			}{
				{"no credential", "", codes.Unauthenticated},
				{"another tenant's key", globex, wrongTenant[name]},
				{"an expired key", expired, codes.Unauthenticated},
				{"a revoked key", revoked, codes.Unauthenticated},
				{"a malformed key", "fanout_fk_0123456789abcdef_nope", codes.Unauthenticated},
				{"an admin key", adminKey, codes.PermissionDenied},
				{"a key without the scope", reader, missingScope[name]},
			} {
				if cs.want == codes.OK {
					continue // the reader may read
				}
				if got := status.Code(call(clients[listener](cs.token))); got != cs.want {
					t.Errorf("%s over %s with %s: %s, want %s", name, listener, cs.who, got, cs.want)
				}
			}
		}
	}
	if n := countRuns(); n != before {
		t.Errorf("refused calls wrote %d runs", n-before)
	}
	got, err := keyClient(t, o.addr, reader).GetRun(ctx, &fanoutv1.GetRunRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetRun().GetState() != fanoutv1.RunState_RUN_STATE_RUNNING {
		t.Errorf("acme's run is %s (%q) after the refused calls, want RUNNING", got.GetRun().GetState(), got.GetRun().GetCancelCause())
	}
	// And by REST paths: another tenant's run by id is 404, naming its
	// tenant 403, nothing written.
	for _, cs := range []struct {
		method, path, body string
		want               int
	}{
		{"GET", "/v1/runs/" + runID, "", http.StatusNotFound},
		{"GET", "/v1/runs/" + runID + "/tool-calls", "", http.StatusNotFound},
		{"GET", "/v1/runs/" + runID + "/tasks", "", http.StatusNotFound},
		{"GET", "/v1/runs/" + runID + "/facts", "", http.StatusNotFound},
		{"POST", "/v1/runs/" + runID + ":cancel", `{"reason":"not yours"}`, http.StatusNotFound},
		{"GET", "/v1/runs?tenantId=acme", "", http.StatusForbidden},
		{"GET", "/v1/spend?tenantId=acme", "", http.StatusForbidden},
		{"POST", "/v1/runs", `{"idempotencyKey":"stolen-rest","tenantId":"acme","goal":"g","budget":{"limitTokens":"100"},"tasks":[{"id":"t","instruction":"x","tokenBudget":"50"}]}`, http.StatusForbidden},
	} {
		if code, out := curl(t, cs.method, o.http+cs.path, globex, cs.body); code != cs.want {
			t.Errorf("%s %s with globex's key: %d %.200s; want %d", cs.method, cs.path, code, out, cs.want)
		}
	}
	for listener, client := range clients {
		list, err := client(globex).ListRuns(ctx, &fanoutv1.ListRunsRequest{})
		if err != nil || len(list.GetRuns()) != 0 {
			t.Errorf("globex's ListRuns over %s: %d runs, %v; want none of acme's", listener, len(list.GetRuns()), err)
		}
		if pending, err := client(globex).ListApprovals(ctx, &fanoutv1.ListApprovalsRequest{}); err != nil || len(pending.GetCalls()) != 0 {
			t.Errorf("globex's ListApprovals over %s: %v, %v; want none of acme's", listener, pending.GetCalls(), err)
		}
		if got, err := client(reader).ListToolCalls(ctx, &fanoutv1.ListToolCallsRequest{RunId: runID}); err != nil {
			t.Errorf("acme's reader's ListToolCalls over %s: %v, %v", listener, got, err)
		}
	}

	// An open stream ends when its key is revoked.
	stream, err := keyClient(t, o.addr, watched).WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: runID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatalf("watch with a good key: %v", err)
	}
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	admin(t, owner, "key", "revoke", keyID(watched))
	select {
	case err := <-ended:
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("the stream of a revoked key ended with %v, want UNAUTHENTICATED", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream of a revoked key was still open 10s after the revocation")
	}

	if _, err := keyClient(t, o.addr, acme).CancelRun(ctx, &fanoutv1.CancelRunRequest{RunId: runID}); err != nil {
		t.Fatal(err)
	}
	watchAll(t, keyClient(t, o.addr, acme), runID, nil)

	// No secret of any key in the logs or the database.
	written := o.logs.all() + c.workers[0].logs.all() + dumpTables(t, c.pool)
	for _, token := range []string{acme, reader, globex, revoked, expired, adminKey, watched} {
		secret := strings.SplitN(token, "_", 4)[3] // base64url: may hold '_'
		if len(secret) < 40 {
			t.Fatalf("key %s: secret of %d characters, want 256 bits", keyID(token), len(secret))
		}
		if strings.Contains(written, secret) {
			t.Errorf("the secret of key %s was written to a log or the database", keyID(token))
		}
	}
}
