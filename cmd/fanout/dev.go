package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fanout/fanout/node"
	"github.com/fanout/fanout/orchestrator"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
	"github.com/fanout/fanout/store/pglocal"
	"github.com/fanout/fanout/subagent"
	"github.com/fanout/fanout/subagent/mcp"
)

const devUsage = `
Run everything on loopback: a private PostgreSQL started from the local server
binaries (unless --database-url is given), the schema, N workers and an orchestrator,
all over real gRPC with the deterministic sim model. Ctrl-C stops it all cleanly.
With --demo it submits a sample run, shows live progress, the joined result and the
SQL audit of its spend, then exits.

Without --demo it also serves the API over HTTP and the web console on --http-listen
(127.0.0.1:8080: open http://127.0.0.1:8080/console/; authentication is off, so any key
or none signs in).

Usage:
  fanout dev [--demo] [--listen HOST:PORT] [--http-listen HOST:PORT] [--worker-count N] [--data-dir DIR] [--database-url URL]

Examples:
  fanout dev --demo
  fanout dev --worker-count 5        # then, in another terminal: fanout run -f examples/research.json
`

// databaseURLFile is where dev leaves the auditor's database URL, for `fanout ledger`.
const databaseURLFile = "database-url"

func cmdDev(ctx context.Context, env *Env, args []string) error {
	f := newFlags("dev", devUsage, env.Stderr)
	var sf serverFlags
	sf.register(f, "127.0.0.1:50051", "127.0.0.1:9464")
	var dataDir, spec, pgBinDir string
	var workers int
	var demo bool
	var httpListen string
	f.StringVar(&httpListen, "http-listen", "127.0.0.1:8080", "address of the HTTP/JSON API and the web console (empty: off)")
	f.StringVar(&dataDir, "data-dir", ".fanout", "where the private PostgreSQL keeps its data (reused between runs)")
	f.IntVar(&workers, "worker-count", 3, "worker processes' worth of subagent servers to start")
	f.BoolVar(&demo, "demo", false, "submit --spec, show its progress, result and audit, then exit")
	f.StringVar(&spec, "spec", "examples/research.json,examples/nested.json",
		"run requests the demo submits, one after the other (comma-separated)")
	f.StringVar(&pgBinDir, "pg-bin-dir", "", "directory of initdb/pg_ctl/postgres (default: found on PATH or /usr/lib/postgresql/*/bin)")
	var sim simFlags
	sim.register(f)
	var prov providerFlags
	prov.register(f)
	var tf toolFlags
	tf.register(f)
	if err := parseFlags(f, args, env); err != nil {
		return err
	}
	mcpCfg, err := tf.load()
	if err != nil {
		return err
	}
	var mcpTools []string
	var policy map[string]mcp.Policy
	if mcpCfg != nil {
		mcpTools, policy = mcpCfg.ToolNames(), mcpCfg.ToolPolicy()
	}
	if workers < 1 {
		return fmt.Errorf("--worker-count: need at least 1, got %d", workers)
	}
	if sf.logLevel == "info" && demo {
		sf.logLevel = "warn" // the demo's own output is the show
	}

	// The owner runs migrations; nodes log in as a member of fanout_app
	// only, auditors as a member of fanout_auditor. With --database-url all
	// three are that URL's role.
	ownerURL, auditURL, adminURL := sf.databaseURL, sf.databaseURL, sf.databaseURL
	if sf.databaseURL == "" {
		url, stop, err := startLocalPostgres(ctx, env, dataDir, pgBinDir)
		if err != nil {
			return err
		}
		defer stop()
		ownerURL = url
	}
	if err := store.Migrate(ctx, ownerURL); err != nil {
		return err
	}
	// Its orchestrator runs with --auth none: its AdminService acts as
	// "anonymous", which only a database opted in accepts.
	if err := store.AllowAnonymousAdmin(ctx, ownerURL); err != nil {
		return err
	}
	if sf.databaseURL == "" {
		var err error
		if sf.databaseURL, err = devRole(ctx, ownerURL, "fanout_node", "fanout_app"); err != nil {
			return err
		}
		if auditURL, err = devRole(ctx, ownerURL, "fanout_audit", "fanout_auditor"); err != nil {
			return err
		}
		if adminURL, err = devRole(ctx, ownerURL, "fanout_admins", "fanout_admin"); err != nil {
			return err
		}
		os.WriteFile(filepath.Join(dataDir, databaseURLFile), []byte(auditURL+"\n"), 0o600) //nolint:errcheck // only `fanout ledger`'s default
	}
	orchTrust, workerTrust, peerFiles, err := node.DevTrust(filepath.Join(dataDir, "peer"))
	if err != nil {
		return err
	}
	cfg := node.Config{Orchestrator: &node.OrchestratorConfig{Listen: sf.listen, Trust: orchTrust, MCPTools: mcpTools,
		ToolPolicy: policy,
		Auth:       node.CallerAuth{None: true}, Engine: orchestrator.Config{MaxRunTokens: defaultMaxRunTokens},
		AdminDatabaseURL: adminURL}}
	if httpListen != "" && !demo {
		cfg.Orchestrator.HTTP = node.HTTPConfig{Listen: httpListen, Console: consoleHandler()}
	}
	for i := range workers {
		wc := node.WorkerConfig{Listen: "127.0.0.1:0", Trust: workerTrust, Sim: sim.config(), MCP: mcpCfg,
			ModelsFunc: prov.modelsFunc(env), Server: subagent.ServerConfig{Name: fmt.Sprintf("worker-%d", i+1)}}
		tf.apply(&wc.Server)
		cfg.Workers = append(cfg.Workers, wc)
	}
	p, err := sf.start(ctx, env, "fanout-dev", cfg)
	if err != nil {
		return err
	}
	defer p.stop()
	orch := p.Orchestrator()
	addrs := make([]string, len(p.Workers()))
	for i, w := range p.Workers() {
		addrs[i] = w.Addr()
	}

	fmt.Fprintf(env.Stdout, "fanout dev: orchestrator on %s, %d workers on %s\n", orch.Addr(), workers, strings.Join(addrs, ", "))
	fmt.Fprintf(env.Stdout, "fanout dev: database  psql %q   (owner: migrations)\n", ownerURL)
	fmt.Fprintf(env.Stdout, "fanout dev:           psql %q   (nodes: fanout_app)\n", sf.databaseURL)
	fmt.Fprintf(env.Stdout, "fanout dev:           psql %q   (auditors: fanout_auditor)\n", auditURL)
	fmt.Fprintf(env.Stdout, "fanout dev: workers trust only the orchestrator: mutual TLS and signed dispatches, credentials in %s\n",
		filepath.Dir(peerFiles.CA))
	if addr := orch.HTTPAddr(); addr != "" {
		fmt.Fprintf(env.Stdout, "fanout dev: web console %s/console/   HTTP/JSON API %s (authentication is off: any key or none)\n",
			httpURL(addr, false), httpURL(addr, false))
	}
	if !demo {
		fmt.Fprintf(env.Stdout, "fanout dev: ready. Try: fanout run -f examples/research.json --addr %s   (Ctrl-C to stop)\n", orch.Addr())
		return p.wait(ctx)
	}
	for _, path := range strings.Split(spec, ",") {
		if err := runDemo(ctx, env, orch.Addr(), strings.TrimSpace(path), auditURL); err != nil {
			return err
		}
	}
	return nil
}

// startLocalPostgres starts (or restarts) the private cluster under dataDir
// and makes sure the database "fanout" exists.
func startLocalPostgres(ctx context.Context, env *Env, dataDir, binDir string) (string, func(), error) {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return "", nil, err
	}
	pgDir := filepath.Join(abs, "pg")
	if os.Geteuid() == 0 {
		if blocked := untraversable(abs); blocked != "" {
			// The server runs as an unprivileged user that cannot reach a
			// root-only home; keep the cluster where it can, one per data dir.
			sum := sha256.Sum256([]byte(abs))
			pgDir = filepath.Join(os.TempDir(), "fanout-dev-"+hex.EncodeToString(sum[:6]), "pg")
			fmt.Fprintf(env.Stdout, "fanout dev: %s is not reachable by the unprivileged database user; keeping the cluster in %s\n", blocked, pgDir)
		}
	}
	if err := os.MkdirAll(filepath.Dir(pgDir), 0o755); err != nil {
		return "", nil, err
	}
	fmt.Fprintf(env.Stdout, "fanout dev: starting PostgreSQL in %s\n", pgDir)
	logFile, err := os.OpenFile(filepath.Join(filepath.Dir(pgDir), "postgres.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return "", nil, err
	}
	srv, err := pglocal.Start(ctx, pglocal.Config{DataDir: pgDir, BinDir: binDir, Log: logFile})
	if err != nil {
		_ = logFile.Close()
		if errors.Is(err, pglocal.ErrNoBinaries) {
			return "", nil, fmt.Errorf("%w\n(or run `make demo`, which installs them when it can)", err)
		}
		return "", nil, err
	}
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		srv.Stop(ctx) //nolint:errcheck // best effort at exit; the cluster stops with the process anyway
		_ = logFile.Close()
	}
	if err := store.CreateDatabase(ctx, srv.URL("postgres"), "fanout"); err != nil {
		stop()
		return "", nil, err
	}
	url := srv.URL("fanout")
	os.MkdirAll(abs, 0o755) //nolint:errcheck // best effort: only `fanout ledger` reads the file
	return url, stop, nil
}

// devRole makes the login role role (a member of memberOf) on the dev
// cluster and returns ownerURL logging in as it.
func devRole(ctx context.Context, ownerURL, role, memberOf string) (string, error) {
	if err := store.CreateLoginRole(ctx, ownerURL, role, memberOf); err != nil {
		return "", err
	}
	u, err := url.Parse(ownerURL)
	if err != nil {
		return "", err
	}
	u.User = url.User(role)
	return u.String(), nil
}

// untraversable returns the first directory on the way to dir that the
// unprivileged database user could not pass through, or "".
func untraversable(dir string) string {
	uid := -1
	for _, name := range []string{"postgres", "nobody"} {
		if u, err := user.Lookup(name); err == nil {
			uid, _ = strconv.Atoi(u.Uid)
			break
		}
	}
	for d := dir; ; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil {
			st, _ := fi.Sys().(*syscall.Stat_t)
			if fi.Mode().Perm()&0o001 == 0 && (st == nil || int(st.Uid) != uid) {
				return d
			}
		}
		if d == filepath.Dir(d) {
			return ""
		}
	}
}

// runDemo submits the spec, draws its progress, then prints the joined
// result and the SQL audit of its spend.
func runDemo(ctx context.Context, env *Env, addr, specPath, auditURL string) error {
	req, err := readSpec(specPath)
	if err != nil {
		return err
	}
	// A fresh key per demo, so each `make demo` is a new run.
	req.Spec.IdempotencyKey = fmt.Sprintf("demo-%d", time.Now().UnixNano())
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	client := fanoutv1.NewOrchestratorServiceClient(conn)
	fmt.Fprintf(env.Stdout, "\n== fan-out: %q, %d subagents, run budget %d tokens\n\n", req.GetSpec().GetGoal(),
		len(req.GetSpec().GetTasks()), req.GetSpec().GetBudget().GetLimitTokens())
	stream, err := client.Run(ctx, req)
	if err != nil {
		return err
	}
	last, err := follow(ctx, env, client, false, func() (*fanoutv1.RunEvent, error) {
		m, err := stream.Recv()
		return m.GetEvent(), err
	})
	if err != nil {
		return err
	}
	if last == nil {
		return errors.New("demo: the run sent no events")
	}
	// A run whose budget ran out is continued, not started again: its
	// quote first, then the continuation, up to three times.
	for k := 1; k <= 3 && last.GetRunFinished().GetState() == fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED; k++ {
		next, err := continueDemo(ctx, env, client, last, k)
		if err != nil || next == nil {
			if err != nil {
				return err
			}
			break
		}
		last = next
	}
	got, err := client.GetRun(ctx, &fanoutv1.GetRunRequest{RunId: last.GetRunId()})
	if err != nil {
		return err
	}
	if err := completeRun(ctx, client, got.GetRun()); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "\n== joined result\n")
	printRun(env.Stdout, got.GetRun())
	if err := printTree(ctx, env.Stdout, client, got.GetRun()); err != nil {
		return err
	}
	tenant := got.GetRun().GetTenantId()
	auditPool, err := store.Open(ctx, auditURL)
	if err != nil {
		return err
	}
	defer auditPool.Close()
	audit, err := store.NewAudit(auditPool).Run(ctx, tenant, last.GetRunId())
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "\n== timeline (fanout trace %s)\n", last.GetRunId())
	if err := cmdTrace(ctx, env, []string{last.GetRunId(), "--addr", addr}); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "\n== spend audit (as role fanout_auditor, through the audit views)\n")
	printAudit(env.Stdout, audit)
	if err := printTreeSpend(ctx, env.Stdout, auditPool, last.GetRunId()); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "\nAudit it yourself: fanout ledger %s   or SQL in docs/auditing.md\n", last.GetRunId())
	if audit.Broken != 0 {
		return fmt.Errorf("ledger not conserved on %d accounts of run %s", audit.Broken, last.GetRunId())
	}
	return nil
}

// continueDemo continues the demo's run, which ended at last with its
// budget spent (docs/budget.md#continue): it quotes what is left, adds the
// quote's forecast and follows the run to its next end, which it returns;
// nil when no task is left to run.
func continueDemo(ctx context.Context, env *Env, client fanoutv1.OrchestratorServiceClient, last *fanoutv1.RunEvent,
	k int) (*fanoutv1.RunEvent, error) {
	runID := last.GetRunId()
	probe, err := client.ContinueRun(ctx, &fanoutv1.ContinueRunRequest{RunId: runID, AddTokens: 1, DryRun: true})
	if err != nil {
		return nil, err
	}
	add := probe.GetQuote().GetForecastTokens()
	if probe.GetQuote().GetTasksTokens() == 0 || add <= 0 {
		return nil, nil
	}
	fmt.Fprintf(env.Stdout, "\n== continue: the budget ran out; add the forecast of what is left (fanout continue %s --add %d --quote)\n\n",
		runID, add)
	quoted, err := client.ContinueRun(ctx, &fanoutv1.ContinueRunRequest{RunId: runID, AddTokens: add, DryRun: true})
	if err != nil {
		return nil, err
	}
	printQuote(env.Stdout, quoted.GetQuote())
	if _, err := client.ContinueRun(ctx, &fanoutv1.ContinueRunRequest{RunId: runID, AddTokens: add,
		IdempotencyKey: fmt.Sprintf("demo-continue-%d", k), Reason: "the demo: the tasks not started"}); err != nil {
		return nil, err
	}
	fmt.Fprintf(env.Stdout, "\n")
	stream, err := client.WatchRun(ctx, &fanoutv1.WatchRunRequest{RunId: runID, AfterSequence: last.GetSequence()})
	if err != nil {
		return nil, err
	}
	next, err := follow(ctx, env, client, false, func() (*fanoutv1.RunEvent, error) {
		m, err := stream.Recv()
		return m.GetEvent(), err
	})
	if err == nil && next.GetRunFinished() == nil {
		err = fmt.Errorf("demo: the continued run %s sent no end", runID)
	}
	return next, err
}

// printTreeSpend prints the audit view run_tree_spend of the tree under
// root, when it has child runs: each level's own spend and what rolls up.
func printTreeSpend(ctx context.Context, w io.Writer, pool *store.Pool, root string) error {
	rows, err := pool.Query(ctx, `SELECT depth, run_id, coalesce(parent_task_id, ''), own_spent_tokens, spent_tokens
		FROM run_tree_spend WHERE root_run_id = $1 ORDER BY depth, run_id`, root)
	if err != nil {
		return fmt.Errorf("read run_tree_spend: %w", err)
	}
	defer rows.Close()
	type level struct {
		depth, runs int
		own         int64
	}
	var levels []level
	var total int64
	for rows.Next() {
		var depth int
		var id, task string
		var own, spent int64
		if err := rows.Scan(&depth, &id, &task, &own, &spent); err != nil {
			return err
		}
		if depth == 0 {
			total = spent
		}
		if len(levels) == 0 || levels[len(levels)-1].depth != depth {
			levels = append(levels, level{depth: depth})
		}
		levels[len(levels)-1].runs++
		levels[len(levels)-1].own += own
	}
	if err := rows.Err(); err != nil || len(levels) < 2 {
		return err
	}
	fmt.Fprintf(w, "run_tree_spend (each level's own spend; the root's spent counts them all):\n")
	var sum int64
	for _, l := range levels {
		fmt.Fprintf(w, "  depth %d: %2d runs, own spend %7d\n", l.depth, l.runs, l.own)
		sum += l.own
	}
	fmt.Fprintf(w, "  levels add up to %d; the root spent %d\n", sum, total)
	if sum != total {
		return fmt.Errorf("the tree's levels add up to %d, its root spent %d", sum, total)
	}
	return nil
}

func printAudit(w io.Writer, a store.RunAudit) {
	r := a.Run
	fmt.Fprintf(w, "run_spend   %s (tenant %s): %s\n", r.RunID, r.TenantID, r.State)
	fmt.Fprintf(w, "  limit %d = spent %d + reserved %d + held %d + available %d\n", r.Limit, r.Spent, r.Reserved, r.Held, r.Available)
	if r.Synthesis > 0 {
		fmt.Fprintf(w, "  the synthesis spent %d, from what the run held back for it\n", r.Synthesis)
	}
	fmt.Fprintf(w, "  spent: %d reported by the model, %d estimated (cancelled in flight), %d overrun; %d reservations\n",
		r.Reported, r.Estimated, r.Overrun, r.Reservations)
	fmt.Fprintf(w, "task_spend\n  %-16s %8s %8s %9s %9s %6s\n", "task", "limit", "spent", "reported", "estimated", "calls")
	for _, t := range a.Tasks {
		fmt.Fprintf(w, "  %-16s %8d %8d %9d %9d %6d\n", t.TaskID, t.Limit, t.Spent, t.Reported, t.Estimated, t.Reservations)
	}
	verdict := "conserved"
	if a.Broken > 0 {
		verdict = fmt.Sprintf("NOT CONSERVED on %d", a.Broken)
	}
	if len(a.Continuations) > 0 {
		fmt.Fprintf(w, "run_continuations\n  %3s %8s %8s %12s %8s  %s\n", "#", "added", "limit", "spent before", "spent", "")
		for _, c := range a.Continuations {
			how := "topped up"
			if c.Reopened {
				how = "reopened"
			}
			fmt.Fprintf(w, "  %3d %8d %8d %12d %8d  %s by %s\n", c.Continuation, c.Added, c.Limit, c.SpentBefore, c.Spent, how, c.Actor)
		}
	}
	fmt.Fprintf(w, "conservation_check: %d accounts, %s (limit = available + reserved + spent + held; entries sum to rows)\n", a.Accounts, verdict)
}

const ledgerUsage = `
Audit one run's spend the way an auditor does: as the read-only role fanout_auditor,
through the audit views (run_spend, task_spend, conservation_check). Needs the
database URL; under "fanout dev" it is found in the data dir.

Usage:
  fanout ledger RUN_ID [--tenant ID] [--database-url URL] [--json]

Example:
  fanout ledger run_0123abcd --tenant default
`

func cmdLedger(ctx context.Context, env *Env, args []string) error {
	f := newFlags("ledger", ledgerUsage, env.Stderr)
	var url, tenant, dataDir string
	f.secretVar(&url, "database-url", "PostgreSQL URL (default: the one `fanout dev` wrote in --data-dir)")
	f.alsoEnv("database-url", "DATABASE_URL")
	f.StringVar(&tenant, "tenant", "default", "the run's tenant")
	f.StringVar(&dataDir, "data-dir", ".fanout", "the data dir of `fanout dev`")
	asJSON := f.Bool("json", false, "machine-readable output (one JSON object)")
	runID, err := parseWithRunID(f, args, env)
	if err != nil {
		return err
	}
	if url == "" {
		b, err := os.ReadFile(filepath.Join(dataDir, databaseURLFile))
		if err != nil {
			return fmt.Errorf("--database-url or --database-url-file (or DATABASE_URL) is required: no `fanout dev` URL in %s", dataDir)
		}
		url = strings.TrimSpace(string(b))
	}
	pool, err := store.Open(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	a, err := store.NewAudit(pool).Run(ctx, tenant, runID)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(env.Stdout).Encode(a)
	}
	printAudit(env.Stdout, a)
	return nil
}
