package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	"github.com/fanout/fanout/node"
	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

// clientFlags are the flags every client command shares.
type clientFlags struct {
	addr   string
	json   bool
	tenant string
	key    secretFlag
	tlsCA  string
	tls    bool
}

func (c *clientFlags) register(f *flags) {
	f.StringVar(&c.addr, "addr", "127.0.0.1:50051", "orchestrator address")
	f.BoolVar(&c.json, "json", false, "machine-readable output (protojson, one object per line)")
	f.StringVar(&c.tenant, "tenant", "", "with --auth none only: act as this tenant (with a key, the key's tenant is the tenant)")
	f.Var(&c.key, "api-key", "the API key to call with; give it as the environment variable, never on a command line")
	f.StringVar(&c.tlsCA, "tls-ca", "", "PEM file of the CA of the orchestrator's caller-facing certificate (implies --tls)")
	f.BoolVar(&c.tls, "tls", false, "call over TLS, trusting the system's CAs")
}

// secretFlag is a flag holding a credential: it never prints its value (in
// --help, in an error), so only the environment and the server see it.
type secretFlag struct{ v string }

func (s *secretFlag) String() string     { return "" }
func (s *secretFlag) Set(v string) error { s.v = v; return nil }

// callOptions are the dial options of a client command: TLS (--tls,
// --tls-ca) or plaintext, and the API key as `authorization: Bearer` on
// every call. A key is sent in plaintext only to a loopback address.
func (c *clientFlags) callOptions() ([]grpc.DialOption, error) {
	var opts []grpc.DialOption
	switch {
	case c.tlsCA != "":
		creds, err := credentials.NewClientTLSFromFile(c.tlsCA, "")
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		opts = append(opts, grpc.WithTransportCredentials(creds))
	case c.tls:
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})))
	default:
		if c.key.v != "" && !node.IsLoopback(strings.TrimPrefix(c.addr, "dns:///")) {
			return nil, fmt.Errorf("--addr %s: an API key goes to a non-loopback address only over TLS: pass --tls or --tls-ca", c.addr)
		}
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	if c.key.v != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer{token: c.key.v, tls: c.tls || c.tlsCA != ""}))
	}
	return opts, nil
}

// bearer sends an API key as `authorization: Bearer <key>`.
type bearer struct {
	token string
	tls   bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

func (b bearer) RequireTransportSecurity() bool { return b.tls }

func (c *clientFlags) dial() (fanoutv1.OrchestratorServiceClient, func(), error) {
	opts, err := c.callOptions()
	if err != nil {
		return nil, nil, err
	}
	if c.tenant != "" {
		// Every call carries the tenant, so the server scopes it.
		md := []string{orchestrator.TenantMetadataKey, c.tenant}
		opts = append(opts,
			grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, o ...grpc.CallOption) error {
				return invoker(metadata.AppendToOutgoingContext(ctx, md...), method, req, reply, cc, o...)
			}),
			grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, o ...grpc.CallOption) (grpc.ClientStream, error) {
				return streamer(metadata.AppendToOutgoingContext(ctx, md...), desc, cc, method, o...)
			}))
	}
	conn, err := grpc.NewClient(c.addr, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("--addr %q: %w", c.addr, err)
	}
	return fanoutv1.NewOrchestratorServiceClient(conn), func() { _ = conn.Close() }, nil
}

var jsonOut = protojson.MarshalOptions{EmitUnpopulated: false}

func printJSON(w io.Writer, m proto.Message) {
	b, _ := jsonOut.Marshal(m)
	fmt.Fprintln(w, string(b))
}

// describe renders an error for a person: a gRPC status with its code and
// every field violation or reason in words.
func describe(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return err.Error()
	}
	var b strings.Builder
	msg := st.Message()
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			// The violations follow one per line.
			msg = fmt.Sprintf("invalid request, %d field violation(s)", len(br.GetFieldViolations()))
		}
	}
	fmt.Fprintf(&b, "%s: %s", st.Code(), msg)
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				fmt.Fprintf(&b, "\n  field %s: %s", v.GetField(), v.GetDescription())
			}
		case *errdetails.ErrorInfo:
			fmt.Fprintf(&b, "\n  reason %s", d.GetReason())
			for k, v := range d.GetMetadata() {
				fmt.Fprintf(&b, " %s=%s", k, v)
			}
		case *errdetails.QuotaFailure:
			for _, v := range d.GetViolations() {
				fmt.Fprintf(&b, "\n  quota %s: %s", v.GetSubject(), v.GetDescription())
			}
		case *fanoutv1.Quote: // a reserve_quote refused
			b.WriteString("\n")
			printQuote(&b, d)
		}
	}
	return b.String()
}

// readSpec reads a run request from path, or "-" for stdin: the JSON form
// of fanout.v1.RunRequest (the same file grpcurl takes with -d @), or the
// same document in YAML when the file ends in .yaml or .yml.
func readSpec(path string) (*fanoutv1.RunRequest, error) {
	var data []byte
	var err error
	if path == "-" {
		data, err = io.ReadAll(os.Stdin)
	} else {
		data, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("read spec: %w", err)
	}
	if strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml") {
		// The same document as the JSON form, written in YAML.
		if data, err = yaml.YAMLToJSON(data); err != nil {
			return nil, fmt.Errorf("spec %s is not valid YAML: %w", path, err)
		}
	}
	req := &fanoutv1.RunRequest{}
	if err := protojson.Unmarshal(data, req); err != nil {
		return nil, fmt.Errorf("spec %s is not a fanout.v1.RunRequest in JSON: %w", path, err)
	}
	return req, nil
}

const runUsage = `
Start a run from a spec file and stream its progress until it ends. The spec is the
JSON form of fanout.v1.RunRequest ({"spec": {...}}), the same file grpcurl takes, or the
same document in YAML (a .yaml or .yml file).
Ctrl-C cancels the run (the stream's cancellation cancels it on every node);
--detach starts it and prints the run id instead.
--quote prints what the run would cost (each task's forecast, the synthesis allowance,
the money, whether the tenant's budget covers it) and starts nothing; --reserve-quote
starts it only if the tenant's budget covers its quote (docs/budget.md#quotes), then
follows it as fanout watch does (Ctrl-C stops following; fanout cancel cancels it).

Usage:
  fanout run -f SPEC.(json|yaml) [--detach] [--quote | --reserve-quote] [--addr HOST:PORT] [--json]

Example:
  fanout run -f examples/research.json --quote
  fanout run -f examples/research.json
`

func cmdRun(ctx context.Context, env *Env, args []string) error {
	f := newFlags("run", runUsage, env.Stderr)
	var cf clientFlags
	cf.register(f)
	var file string
	var detach, quote, reserve bool
	var key string
	f.StringVar(&file, "f", "", "spec file (RunRequest as JSON, or YAML if it ends in .yaml/.yml), or - for stdin (JSON)")
	f.BoolVar(&detach, "detach", false, "start the run and print its id (StartRun) instead of streaming it")
	f.StringVar(&key, "idempotency-key", "", "override the spec's idempotency key (same key, same run)")
	f.BoolVar(&quote, "quote", false, "print the run's quote and start nothing (StartRun dry_run)")
	f.BoolVar(&reserve, "reserve-quote", false, "start the run only if the tenant's budget covers its quote (StartRun reserve_quote)")
	if err := parseFlags(f, args, env); err != nil {
		return err
	}
	if quote && reserve {
		return fmt.Errorf("--quote and --reserve-quote: give one (--quote starts nothing)")
	}
	if file == "" {
		return fmt.Errorf("-f SPEC is required (see examples/research.json)")
	}
	req, err := readSpec(file)
	if err != nil {
		return err
	}
	if key != "" && req.Spec != nil {
		req.Spec.IdempotencyKey = key
	}
	if cf.tenant != "" && req.GetSpec().GetTenantId() == "" && req.Spec != nil {
		req.Spec.TenantId = cf.tenant
	}
	if cf.tenant == "" {
		// With --auth none the run's reads name its tenant too (a key's
		// tenant is the tenant whatever the header says).
		cf.tenant = req.GetSpec().GetTenantId()
	}
	client, closeConn, err := cf.dial()
	if err != nil {
		return err
	}
	defer closeConn()
	var next func() (*fanoutv1.RunEvent, error)
	if detach || quote || reserve {
		resp, err := client.StartRun(ctx, &fanoutv1.StartRunRequest{Spec: req.GetSpec(), DryRun: quote,
			ReserveQuote: reserve})
		switch {
		case err != nil:
			return err
		case quote && cf.json:
			printJSON(env.Stdout, resp.GetQuote())
			return nil
		case quote:
			printQuote(env.Stdout, resp.GetQuote())
			return nil
		case detach && cf.json:
			printJSON(env.Stdout, resp)
			return nil
		case detach:
			fmt.Fprintln(env.Stdout, resp.GetRunId())
			return nil
		}
		// --reserve-quote: started; followed as fanout watch follows it.
		if !cf.json {
			printQuote(env.Stdout, resp.GetQuote())
		}
		ws, err := client.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: resp.GetRunId()})
		if err != nil {
			return err
		}
		next = func() (*fanoutv1.RunEvent, error) {
			m, err := ws.Recv()
			return m.GetEvent(), err
		}
	} else {
		stream, err := client.Run(ctx, req)
		if err != nil {
			return err
		}
		next = func() (*fanoutv1.RunEvent, error) {
			m, err := stream.Recv()
			return m.GetEvent(), err
		}
	}
	final, err := follow(ctx, env, client, cf.json, next)
	if err != nil {
		return err
	}
	if !cf.json && final != nil {
		run, err := client.GetRun(ctx, &fanoutv1.GetRunRequest{RunId: final.GetRunId()})
		if err != nil {
			return err
		}
		if err := completeRun(ctx, client, run.GetRun()); err != nil {
			return err
		}
		printRun(env.Stdout, run.GetRun())
	}
	return nil
}

// follow prints events from next until the stream ends and returns the last
// event. A RunFinished's result is printed whole: client pages through what
// the server cut of it (completeResult).
func follow(ctx context.Context, env *Env, client fanoutv1.OrchestratorServiceClient, asJSON bool,
	next func() (*fanoutv1.RunEvent, error)) (*fanoutv1.RunEvent, error) {
	var p *progress
	if !asJSON {
		p = newProgress(env.Stdout)
	}
	var last *fanoutv1.RunEvent
	for {
		ev, err := next()
		if errors.Is(err, io.EOF) {
			if p != nil {
				p.finish()
			}
			return last, nil
		}
		if err != nil {
			if p != nil {
				p.finish()
			}
			return last, err
		}
		last = ev
		if end := ev.GetRunFinished(); end != nil {
			if err := completeResult(ctx, client, ev.GetRunId(), end.GetResult()); err != nil {
				if p != nil {
					p.finish()
				}
				return last, err
			}
		}
		if asJSON {
			printJSON(env.Stdout, ev)
		} else {
			p.apply(ev)
		}
	}
}

const watchUsage = `
Stream a run's events from any orchestrator replica, from a sequence number on, until
it ends. Reconnect with --after LAST_SEQUENCE to resume without gaps or repeats.

Usage:
  fanout watch RUN_ID [--after N] [--addr HOST:PORT] [--json]

Example:
  fanout watch run_0123abcd --json
`

func cmdWatch(ctx context.Context, env *Env, args []string) error {
	f := newFlags("watch", watchUsage, env.Stderr)
	var cf clientFlags
	cf.register(f)
	var after int64
	f.Int64Var(&after, "after", 0, "stream events with a sequence greater than this")
	runID, err := parseWithRunID(f, args, env)
	if err != nil {
		return err
	}
	client, closeConn, err := cf.dial()
	if err != nil {
		return err
	}
	defer closeConn()
	stream, err := client.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: runID, AfterSequence: after})
	if err != nil {
		return err
	}
	_, err = follow(ctx, env, client, cf.json, func() (*fanoutv1.RunEvent, error) {
		m, err := stream.Recv()
		return m.GetEvent(), err
	})
	return err
}

// watch opens WatchRun for runID from sequence after; next returns its
// events one by one, then io.EOF when the run has ended.
func (c *clientFlags) watch(ctx context.Context, runID string, after int64) (next func() (*fanoutv1.RunEvent, error), closeConn func(), err error) {
	client, closeConn, err := c.dial()
	if err != nil {
		return nil, nil, err
	}
	stream, err := client.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: runID, AfterSequence: after})
	if err != nil {
		closeConn()
		return nil, nil, err
	}
	return func() (*fanoutv1.RunEvent, error) {
		m, err := stream.Recv()
		return m.GetEvent(), err
	}, closeConn, nil
}

// parseWithRunID parses flags around one positional RUN_ID.
func parseWithRunID(f *flags, args []string, env *Env) (string, error) {
	var runID string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		runID, args = args[0], args[1:]
	}
	if err := parseFlags(f, args, env); err != nil {
		return "", err
	}
	if runID == "" && f.NArg() > 0 {
		runID = f.Arg(0)
	}
	if runID == "" {
		f.Usage()
		return "", errUsage
	}
	return runID, nil
}

const getUsage = `
Show one run: its state, budget, every task's outcome and the joined result.

Usage:
  fanout get RUN_ID [--addr HOST:PORT] [--json]

Example:
  fanout get run_0123abcd
`

func cmdGet(ctx context.Context, env *Env, args []string) error {
	f := newFlags("get", getUsage, env.Stderr)
	var cf clientFlags
	cf.register(f)
	runID, err := parseWithRunID(f, args, env)
	if err != nil {
		return err
	}
	client, closeConn, err := cf.dial()
	if err != nil {
		return err
	}
	defer closeConn()
	resp, err := client.GetRun(ctx, &fanoutv1.GetRunRequest{RunId: runID})
	if err != nil {
		return err
	}
	if err := completeRun(ctx, client, resp.GetRun()); err != nil {
		return err
	}
	if cf.json {
		printJSON(env.Stdout, resp.GetRun())
		return nil
	}
	printRun(env.Stdout, resp.GetRun())
	return printTree(ctx, env.Stdout, client, resp.GetRun())
}

// maxTreeLines bounds the child runs printTree lists.
const maxTreeLines = 200

// printTree lists the child runs under r's tasks, at every depth, as its
// events name them (ChildRunStarted): each with its task, state and spend.
// A run still going is not walked (its events are still coming).
func printTree(ctx context.Context, w io.Writer, client fanoutv1.OrchestratorServiceClient, r *fanoutv1.Run) error {
	if r.GetParentRunId() != "" {
		fmt.Fprintf(w, "\nchild run of task %s of run %s (depth %d; root %s)\n", r.GetParentTaskId(), r.GetParentRunId(),
			r.GetDepth(), r.GetRootRunId())
	}
	lines := 0
	var walk func(r *fanoutv1.Run, indent string) error
	walk = func(r *fanoutv1.Run, indent string) error {
		if r.GetState() == fanoutv1.RunState_RUN_STATE_RUNNING || lines >= maxTreeLines {
			return nil
		}
		children, err := childRuns(ctx, client, r.GetRunId())
		if err != nil || len(children) == 0 {
			return err
		}
		if indent == "" {
			fmt.Fprintf(w, "\nchild runs (each one's spend is its task's):\n")
		}
		for _, c := range children {
			if lines++; lines > maxTreeLines {
				fmt.Fprintf(w, "%s  ... (more: fanout get on a child run)\n", indent)
				return nil
			}
			got, err := client.GetRun(ctx, &fanoutv1.GetRunRequest{RunId: c.GetChildRunId()})
			if err != nil {
				return err
			}
			cr := got.GetRun()
			b := cr.GetBudget()
			fmt.Fprintf(w, "%s  task %-12s -> run %s %-16s %d tasks, %d of %d tokens\n", indent, c.GetTaskId(), cr.GetRunId(),
				runs.Text(cr.GetState()), max(int(cr.GetTaskCount()), len(cr.GetTasks())), b.GetSpentTokens(), b.GetLimitTokens())
			if err := walk(cr, indent+"    "); err != nil {
				return err
			}
		}
		return nil
	}
	return walk(r, "")
}

// childRuns are the ChildRunStarted events of the ended run runID.
func childRuns(ctx context.Context, client fanoutv1.OrchestratorServiceClient, runID string) ([]*fanoutv1.ChildRunStarted, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	stream, err := client.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: runID})
	if err != nil {
		return nil, err
	}
	var out []*fanoutv1.ChildRunStarted
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read the events of run %s: %w", runID, err)
		}
		if c := m.GetEvent().GetChildRunStarted(); c != nil {
			out = append(out, c)
		}
	}
}

const cancelUsage = `
Cancel a run. The ledger refuses its reservations at once and every node cancels the
run's subagents (whichever replica drives it); settled work is kept.

Usage:
  fanout cancel RUN_ID [--reason TEXT] [--addr HOST:PORT] [--json]

Example:
  fanout cancel run_0123abcd --reason "wrong goal"
`

func cmdCancel(ctx context.Context, env *Env, args []string) error {
	f := newFlags("cancel", cancelUsage, env.Stderr)
	var cf clientFlags
	cf.register(f)
	var reason string
	f.StringVar(&reason, "reason", "cancelled from the CLI", "why, kept as the run's cancel cause")
	runID, err := parseWithRunID(f, args, env)
	if err != nil {
		return err
	}
	client, closeConn, err := cf.dial()
	if err != nil {
		return err
	}
	defer closeConn()
	resp, err := client.CancelRun(ctx, &fanoutv1.CancelRunRequest{RunId: runID, Reason: reason})
	if err != nil {
		return err
	}
	if cf.json {
		if err := completeRun(ctx, client, resp.GetRun()); err != nil {
			return err
		}
		printJSON(env.Stdout, resp.GetRun())
		return nil
	}
	r := resp.GetRun()
	if r.GetState() == fanoutv1.RunState_RUN_STATE_RUNNING {
		fmt.Fprintf(env.Stdout, "%s: cancel sent; every node stops its subagents (follow with: fanout watch %s)\n", runID, runID)
	} else {
		fmt.Fprintf(env.Stdout, "%s: %s %s\n", runID, runs.Text(r.GetState()), r.GetCancelCause())
	}
	return nil
}

const runsUsage = `
List runs, newest first.

Usage:
  fanout runs [--state STATE] [--limit N] [--addr HOST:PORT] [--json]

Example:
  fanout runs --state RUNNING
`

func cmdRuns(ctx context.Context, env *Env, args []string) error {
	f := newFlags("runs", runsUsage, env.Stderr)
	var cf clientFlags
	cf.register(f)
	var state string
	var limit int
	f.StringVar(&state, "state", "", "only runs in this state (RUNNING, SUCCEEDED, FAILED, CANCELLED, BUDGET_EXHAUSTED, TIMED_OUT)")
	f.IntVar(&limit, "limit", 20, fmt.Sprintf("the most runs to list, newest first (1 to %d); pages are followed to reach it", maxListLimit))
	if err := parseFlags(f, args, env); err != nil {
		return err
	}
	if limit < 1 || limit > maxListLimit {
		return fmt.Errorf("--limit: must be between 1 and %d, got %d", maxListLimit, limit)
	}
	req := &fanoutv1.ListRunsRequest{TenantId: cf.tenant}
	if state != "" {
		v, err := runs.ParseState(state)
		if err != nil {
			return fmt.Errorf("--state: %w", err)
		}
		req.State = v
	}
	client, closeConn, err := cf.dial()
	if err != nil {
		return err
	}
	defer closeConn()
	resp, err := listRuns(ctx, client, req, limit)
	if err != nil {
		return err
	}
	if cf.json {
		printJSON(env.Stdout, resp)
		return nil
	}
	fmt.Fprintf(env.Stdout, "%-36s %-17s %6s %10s %10s  %s\n", "RUN", "STATE", "TASKS", "SPENT", "LIMIT", "CREATED")
	for _, r := range resp.GetRuns() {
		fmt.Fprintf(env.Stdout, "%-36s %-17s %6d %10d %10d  %s\n", r.GetRunId(), runs.Text(r.GetState()),
			max(int(r.GetTaskCount()), len(r.GetTasks())), r.GetBudget().GetSpentTokens(), r.GetBudget().GetLimitTokens(),
			r.GetCreatedAt().AsTime().Local().Format(time.DateTime))
	}
	return nil
}

// maxListLimit bounds `fanout runs --limit`: run summaries are small, but
// a listing is held in memory before it is printed.
const maxListLimit = 10_000

// listPageSize is the page size `fanout runs` asks for: the server's
// maximum (ListRunsRequest.page_size).
const listPageSize = 100

// listRuns lists up to limit runs matching req, newest first, following
// next_page_token from page to page. Each page asks for no more than the
// runs still wanted, so the response's next_page_token, if any, continues
// exactly after the last run returned.
func listRuns(ctx context.Context, client fanoutv1.OrchestratorServiceClient, req *fanoutv1.ListRunsRequest, limit int) (*fanoutv1.ListRunsResponse, error) {
	req = proto.CloneOf(req)
	out := &fanoutv1.ListRunsResponse{}
	for len(out.Runs) < limit {
		req.PageSize = int32(min(limit-len(out.Runs), listPageSize)) //nolint:gosec // at most listPageSize
		page, err := client.ListRuns(ctx, req)
		if err != nil {
			return nil, err
		}
		out.Runs = append(out.Runs, page.GetRuns()...)
		out.NextPageToken = page.GetNextPageToken()
		if out.NextPageToken == "" {
			break
		}
		if len(page.GetRuns()) == 0 {
			return nil, fmt.Errorf("list runs: the server returned an empty page with a next page token")
		}
		req.PageToken = out.NextPageToken
	}
	return out, nil
}

// printRun prints a run's outcome for a person.
func printRun(w io.Writer, r *fanoutv1.Run) {
	fmt.Fprintf(w, "\nrun %s: %s", r.GetRunId(), runs.Text(r.GetState()))
	if c := r.GetCancelCause(); c != "" {
		fmt.Fprintf(w, " (%s)", c)
	}
	b := r.GetBudget()
	fmt.Fprintf(w, "\nbudget: %d of %d tokens spent, %d reserved, %d available", b.GetSpentTokens(), b.GetLimitTokens(),
		b.GetReservedTokens(), b.GetAvailableTokens())
	if h := b.GetHeldTokens(); h > 0 {
		fmt.Fprintf(w, ", %d held for the synthesis", h)
	}
	fmt.Fprintln(w)
	if c := r.GetConcurrency(); c != nil {
		fmt.Fprintf(w, "concurrency: %d tasks at once, from the rate limits: %s\n", c.GetConcurrency(), c.GetReason())
	}
	res := r.GetResult()
	if res == nil {
		return
	}
	fmt.Fprintf(w, "\nfacts (%d, deduplicated, in dispatch order):\n", len(res.GetFacts()))
	for i, f := range res.GetFacts() {
		fmt.Fprintf(w, "  %2d. %s\n", i+1, f.GetText())
		if len(f.GetSources()) > 0 {
			fmt.Fprintf(w, "      sources: %s\n", strings.Join(f.GetSources(), ", "))
		}
	}
	fmt.Fprintf(w, "\ntasks (dispatch order):\n")
	for _, t := range res.GetTasks() {
		line := fmt.Sprintf("  %-16s %-17s %3d iterations %7d tokens", t.GetTaskId(), runs.Text(t.GetStatus()),
			t.GetSummary().GetIterations(), t.GetTokensSpent())
		if f := t.GetForecastTokens(); f > 0 {
			line += fmt.Sprintf("  (forecast %d)", f)
		}
		if t.GetSummary().GetWoundDown() {
			line += "  wound down: answered without tools"
		}
		if h := hedgeNote(t.GetHedge()); h != "" {
			line += "  " + h
		}
		if e := t.GetSummary().GetError(); e != "" {
			line += "  " + e
		}
		fmt.Fprintln(w, line)
	}
	fmt.Fprintf(w, "total: %d tokens\n", res.GetTotalTokens())
	if s := res.GetSynthesis(); s != "" {
		fmt.Fprintf(w, "\nsynthesis:\n%s\n", s)
	} else if reason := res.GetSynthesisSkippedReason(); reason != "" {
		fmt.Fprintf(w, "synthesis skipped: %s\n", reason)
	}
}
