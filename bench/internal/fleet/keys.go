package fleet

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// CreateKey creates tenant and an API key of it named keyName with scopes
// (comma-separated), the way an operator makes a fleet's first ones:
// `fanout tenant create` and `fanout key create` as the schema's owner
// (--database-url); and, if budget > 0, gives the tenant a token budget of
// budget with no period (`fanout tenant set-budget`). It returns the key's
// token, which it never prints.
func CreateKey(ctx context.Context, bin, ownerURL, tenant, keyName, scopes string, budget int64) (string, error) {
	admin := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, bin, append(args, "--database-url", ownerURL)...)
		cmd.Env = ChildEnv()
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("fanout %s %s: %w: %s", args[0], args[1], err, strings.TrimSpace(stderr.String()))
		}
		return string(out), nil
	}
	if _, err := admin("tenant", "create", tenant); err != nil {
		return "", err
	}
	if budget > 0 {
		// No period: a day's would roll over in the middle of a run at
		// midnight UTC.
		if _, err := admin("tenant", "set-budget", tenant, "--limit", strconv.FormatInt(budget, 10), "--period", "none"); err != nil {
			return "", err
		}
	}
	out, err := admin("key", "create", "--tenant", tenant, "--name", keyName, "--scopes", scopes)
	if err != nil {
		return "", err
	}
	// The token is the last line printed.
	fields := strings.Fields(out)
	if len(fields) == 0 || !strings.HasPrefix(fields[len(fields)-1], "fanout_fk_") {
		return "", errors.New("fanout key create: no token in its output")
	}
	return fields[len(fields)-1], nil
}

// Bearer sends an API key as `authorization: Bearer <token>` on every call.
type Bearer string

// GetRequestMetadata is the key's header.
func (b Bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity is false: the bench calls on loopback in
// plaintext, as the orchestrator allows.
func (Bearer) RequireTransportSecurity() bool { return false }

// Dial connects to the orchestrator at addr in plain gRPC on loopback with
// the API key token (the orchestrator allows that on loopback only; the
// peer hop is mTLS), with gRPC's default receive limit (4 MiB): no response
// of the API grows with a run (docs/http.md "Sizes of a response"), and the
// bench reads a large run's tasks by page as any client must. With token "" the
// calls carry no key: each names its own (grpc.PerRPCCredentials).
func Dial(addr, token string) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(Bearer(token)))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial orchestrator %s: %w", addr, err)
	}
	return conn, nil
}

// CheckAuth checks, before anything is measured, that the orchestrator at
// addr accepts the bench's key (client) and refuses a call without one:
// the bench measures the production path, with caller authentication on.
func CheckAuth(ctx context.Context, addr string, client fanoutv1.OrchestratorServiceClient, tenant string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := client.ListRuns(ctx, &fanoutv1.ListRunsRequest{TenantId: tenant, PageSize: 1}); err != nil {
		return Refused("the orchestrator's check of the bench's API key (ListRuns)", err, tenant)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial orchestrator: %w", err)
	}
	defer func() { _ = conn.Close() }()
	_, err = fanoutv1.NewOrchestratorServiceClient(conn).ListRuns(ctx, &fanoutv1.ListRunsRequest{TenantId: tenant, PageSize: 1})
	if status.Code(err) != codes.Unauthenticated {
		return fmt.Errorf("the orchestrator answered a call without an API key with %v, want Unauthenticated: "+
			"the bench measures fanout with caller authentication on (--auth keys)", status.Code(err))
	}
	return nil
}

// Refused is err of a call described by what. A call the orchestrator
// refused for its credential says so plainly: the benchmark stops there,
// and nothing it measured is reported.
func Refused(what string, err error, tenant string) error {
	switch status.Code(err) {
	case codes.Unauthenticated, codes.PermissionDenied:
		return fmt.Errorf("%s: REFUSED by the orchestrator (%w); the bench calls with an API key of tenant %q "+
			"made by `fanout key create --database-url` (bench/README.md); no numbers are reported", what, err, tenant)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// AllTasks is every task outcome of run id's joined result: those res
// carries, then the rest by page (ListRunTasks), as a client with gRPC's
// default receive limit reads a large run (docs/http.md "Sizes of a
// response").
func AllTasks(ctx context.Context, client fanoutv1.OrchestratorServiceClient, id string, res *fanoutv1.JoinedResult,
	opts ...grpc.CallOption) ([]*fanoutv1.TaskOutcome, error) {
	tasks := res.GetTasks()
	for token := res.GetTasksNextPageToken(); token != ""; {
		page, err := client.ListRunTasks(ctx, &fanoutv1.ListRunTasksRequest{RunId: id, PageSize: 1000, PageToken: token}, opts...)
		if err != nil {
			return tasks, fmt.Errorf("ListRunTasks %s: %w", id, err)
		}
		tasks, token = append(tasks, page.GetTasks()...), page.GetNextPageToken()
	}
	return tasks, nil
}
