package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fanout/fanout/bench/internal/fleet"
	"github.com/fanout/fanout/peer"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/store"
)

// fanoutSide is a fanout deployment of separate OS processes of the real
// binary: workers and one orchestrator, against one PostgreSQL, peer mTLS
// and signed dispatches as `fanout dev` sets them up (fleet.Start). Its
// callers authenticate as in production (--auth keys): the bench calls with
// an API key of tenant benchTenant.
type fanoutSide struct {
	fleet   *fleet.Fleet
	conn    *grpc.ClientConn
	client  fanoutv1.OrchestratorServiceClient
	tenant  string   // of the runs and of the API key
	simLogs []string // each worker's sim call log, if fanoutConfig.SimLogs is set
	// queryRow runs a query as the database's owner.
	queryRow func(ctx context.Context, sql string, args ...any) scanner

	// reservations counts a run's reservations, and those settled, as
	// the database's owner; closeDB closes its pool.
	reservations func(ctx context.Context, runID string) (total, settled int, err error)
	// nextXID is the server's next transaction id: how many transactions
	// that wrote (the durable commits) began between two reads.
	nextXID func(ctx context.Context) (int64, error)
	closeDB func()
}

type fanoutConfig struct {
	Bin        string        // the fanout binary
	Token      string        // the bench's API key (fleet.CreateKey)
	Tenant     string        // the key's tenant, and the runs'
	Peer       peer.DevFiles // the peer credentials, as `fanout dev` makes them
	OwnerURL   string        // the migrated database, as its owner
	NodeURL    string        // the same database as a member of fanout_app
	Workers    int           // worker processes
	Capacity   int           // subagents per worker, and the orchestrator's task and concurrency caps
	Latency    time.Duration // of each sim call
	Calls      int           // the most sim calls a task makes (a task allowed no tool makes one)
	StartLimit time.Duration // for each process to start serving
	// SimLogs, if set, is the prefix of the workers' sim call logs
	// (--sim-log SimLogs-<i>.jsonl): every call's start and end.
	SimLogs string
}

// benchTenant is the tenant of the bench's runs and of its API key. It has
// no quotas and no budget, so a run does the same work as an anonymous
// caller's under --auth none (no task slots, no tenant account).
const benchTenant = "bench"

// startFanout starts cfg.Workers worker processes, then an orchestrator
// that dispatches to them, and connects to the orchestrator with the
// bench's API key.
func startFanout(ctx context.Context, cfg fanoutConfig) (_ *fanoutSide, err error) {
	f := &fanoutSide{tenant: cfg.Tenant}
	defer func() {
		if err != nil {
			f.stop()
		}
	}()
	if cfg.SimLogs != "" {
		for i := range cfg.Workers {
			f.simLogs = append(f.simLogs, fmt.Sprintf("%s-%d.jsonl", cfg.SimLogs, i+1))
		}
	}
	f.fleet, err = fleet.Start(ctx, fleet.Config{Bin: cfg.Bin, Peer: cfg.Peer, NodeURL: cfg.NodeURL, Prefix: "bench",
		Workers: cfg.Workers, StartLimit: cfg.StartLimit,
		WorkerArgs: func(i int) []string {
			// One model call per task: answer at the first iteration, no
			// tool calls (the tasks allow none either); or, for the agent
			// loop, one tool call an iteration, an answer at iteration
			// cfg.Calls (a task that allows no tool still answers at its
			// first). The sim model is not a StructuredModel, so there is
			// no compression call.
			args := []string{"--capacity", strconv.Itoa(cfg.Capacity),
				"--sim-latency", cfg.Latency.String(), "--sim-finish-after", strconv.Itoa(max(1, cfg.Calls)),
				"--sim-tool-calls", strconv.Itoa(min(1, max(0, cfg.Calls-1))), "--sim-output-tokens", "64"}
			if cfg.SimLogs != "" {
				args = append(args, "--sim-log", f.simLogs[i])
			}
			return args
		},
		OrchestratorArgs: func(int) []string {
			return []string{"--max-tasks", strconv.Itoa(cfg.Capacity), "--max-concurrency", strconv.Itoa(cfg.Capacity)}
		},
	})
	if err != nil {
		return nil, err
	}
	addr := f.fleet.Orchestrators[0].Addr
	if f.conn, err = fleet.Dial(addr, cfg.Token); err != nil {
		return nil, err
	}
	f.client = fanoutv1.NewOrchestratorServiceClient(f.conn)
	if err := fleet.CheckAuth(ctx, addr, f.client, f.tenant); err != nil {
		return nil, err
	}
	owner, err := store.Open(ctx, cfg.OwnerURL)
	if err != nil {
		return nil, err
	}
	f.closeDB = owner.Close
	f.queryRow = func(ctx context.Context, sql string, args ...any) scanner { return owner.QueryRow(ctx, sql, args...) }
	f.reservations = func(ctx context.Context, runID string) (total, settled int, err error) {
		err = owner.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE state = 'settled')
			FROM reservation WHERE run_id = $1`, runID).Scan(&total, &settled)
		return total, settled, err
	}
	f.nextXID = func(ctx context.Context) (next int64, err error) {
		// A transaction gets an id when it first writes: read-only ones
		// (a watcher's poll, a GetRun) take none, and this read neither.
		err = owner.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint`).Scan(&next)
		return next, err
	}
	return f, nil
}

// scanner is a row of a query's result.
type scanner interface{ Scan(dest ...any) error }

// stop stops the orchestrator first (it drains its runs), then the workers.
func (f *fanoutSide) stop() {
	if f.conn != nil {
		_ = f.conn.Close()
	}
	if f.closeDB != nil {
		f.closeDB()
	}
	if f.fleet != nil {
		f.fleet.Stop()
	}
}

// alive returns an error if a process of the deployment has exited.
func (f *fanoutSide) alive() error { return f.fleet.Alive() }

// fanoutRun is what one run measured.
type fanoutRun struct {
	start  time.Time     // Run sent
	wall   time.Duration // Run sent -> RunFinished received
	runID  string
	phases string // where the time went, from the events' database times
	xids   int64  // transactions that wrote, on the whole server, meanwhile
}

// runs counts the runs submitted, on every deployment: each run's
// idempotency key is its own.
var runs int

// taskBudget is each task's token_budget; a task needs under 1,000 a call.
const taskBudget = 5_000

// run submits one run of case c, all its tasks allowed at once, and times it
// from sending Run to receiving RunFinished. It checks that every task
// succeeded after exactly c.calls iterations and that the ledger saw
// c.n * c.calls reservations, one per model call.
func (f *fanoutSide) run(ctx context.Context, c benchCase, limit time.Duration) (fanoutRun, error) {
	if err := f.alive(); err != nil {
		return fanoutRun{}, err
	}
	runs++
	n := c.n
	spec := &fanoutv1.RunSpec{
		IdempotencyKey: fmt.Sprintf("bench-compare-%d-%d-%d", os.Getpid(), n, runs),
		TenantId:       f.tenant,
		Goal:           "bench-compare",
		// Twice what the tasks' token_budgets add up to, or (the one-wave
		// case) exactly that: either way the default admission by
		// forecast starts every task at once, as LangGraph.js does.
		Budget: &fanoutv1.Budget{LimitTokens: int64(n) * c.budgetPerTask(), MinReservationTokens: 1},
		Limits: &fanoutv1.Limits{MaxConcurrency: int32(n), RunTimeout: durationpb.New(limit)},
		Model:  &fanoutv1.ModelSettings{Provider: "sim", MaxOutputTokens: 256, Seed: 7},
	}
	for i := range n {
		t := &fanoutv1.TaskSpec{Id: fmt.Sprintf("t%04d", i), Instruction: fmt.Sprintf("look up item %d", i),
			TokenBudget: taskBudget, MaxIterations: int32(c.calls)}
		if c.calls > 1 {
			t.AllowedTools = []string{"search"} // the sim calls it between two model calls
		}
		spec.Tasks = append(spec.Tasks, t)
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	xidBefore, err := f.nextXID(ctx)
	if err != nil {
		return fanoutRun{}, fmt.Errorf("read the next transaction id: %w", err)
	}
	start := time.Now()
	stream, err := f.client.Run(ctx, &fanoutv1.RunRequest{Spec: spec})
	if err != nil {
		return fanoutRun{}, fleet.Refused(fmt.Sprintf("run %d tasks", n), err, f.tenant)
	}
	r := fanoutRun{start: start}
	var evs []*fanoutv1.RunEvent
	var fin *fanoutv1.RunFinished
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return r, fleet.Refused(fmt.Sprintf("run %d tasks", n), err, f.tenant)
		}
		ev := m.GetEvent()
		evs = append(evs, ev)
		if fin = ev.GetRunFinished(); fin != nil {
			r.wall = time.Since(start)
			r.runID = ev.GetRunId()
			break
		}
	}
	if fin == nil {
		return r, fmt.Errorf("run %d tasks: the stream ended without RunFinished", n)
	}
	if fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		return r, fmt.Errorf("run %s ended %s (%s)", r.runID, fin.GetState(), fin.GetCancelCause())
	}
	tasks, err := fleet.AllTasks(ctx, f.client, r.runID, fin.GetResult())
	if err != nil {
		return r, err
	}
	if len(tasks) != n {
		return r, fmt.Errorf("run %s: %d task outcomes, want %d", r.runID, len(tasks), n)
	}
	var bad []*fanoutv1.TaskOutcome
	for _, o := range tasks {
		if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED || o.GetSummary().GetIterations() != int32(c.calls) {
			bad = append(bad, o)
		}
	}
	if len(bad) > 0 {
		o := bad[0]
		return r, fmt.Errorf("run %s: %d of %d tasks did not succeed after %d iterations; the first, %s, ended %s after %d (error %q, worker %s)",
			r.runID, len(bad), n, c.calls, o.GetTaskId(), o.GetStatus(), o.GetSummary().GetIterations(), o.GetSummary().GetError(), o.GetWorker())
	}
	xidAfter, err := f.nextXID(ctx)
	if err != nil {
		return r, fmt.Errorf("read the next transaction id: %w", err)
	}
	if err := f.checkCalls(ctx, r.runID, n*c.calls); err != nil {
		return r, err
	}
	r.xids = xidAfter - xidBefore
	r.phases = phases(start, evs) + writes(r.xids, n)
	return r, nil
}

// checkCalls checks that run runID made exactly n model calls: every call
// is paid through one reservation, settled with its real usage.
func (f *fanoutSide) checkCalls(ctx context.Context, runID string, n int) error {
	total, settled, err := f.reservations(ctx, runID)
	if err != nil {
		return fmt.Errorf("count the reservations of run %s: %w", runID, err)
	}
	if total != n || settled != n {
		return fmt.Errorf("run %s: %d reservations (%d settled), want %d model calls, one settled reservation each",
			runID, total, settled, n)
	}
	return nil
}

// phases says where a run's time went: the events' times (recorded by the
// database, on this machine's clock) from the moment Run was sent.
func phases(start time.Time, evs []*fanoutv1.RunEvent) string {
	var accepted, lastQueued, firstStarted, lastStarted, firstFinished, lastFinished, runFinished time.Duration
	var started, firstWave int
	first := func(d *time.Duration, v time.Duration) {
		if *d == 0 || v < *d {
			*d = v
		}
	}
	last := func(d *time.Duration, v time.Duration) { *d = max(*d, v) }
	for _, ev := range evs {
		at := ev.GetTime().AsTime().Sub(start)
		switch {
		case ev.GetRunStarted() != nil:
			accepted = at
		case ev.GetTaskQueued() != nil:
			last(&lastQueued, at)
		case ev.GetTaskStarted() != nil:
			first(&firstStarted, at)
			last(&lastStarted, at)
			started++
			if firstFinished == 0 {
				firstWave = started
			}
		case ev.GetTaskFinished() != nil:
			first(&firstFinished, at)
			last(&lastFinished, at)
		case ev.GetRunFinished() != nil:
			runFinished = at
		}
	}
	r := func(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
	return fmt.Sprintf("accepted %s, last queued %s, started %s..%s, finished %s..%s, run finished %s ms (%d events); "+
		"%d of %d tasks started before the first finished",
		r(accepted), r(lastQueued), r(firstStarted), r(lastStarted), r(firstFinished), r(lastFinished), r(runFinished), len(evs),
		firstWave, started)
}

// writes says how many transactions that wrote (the durable commits, on
// the whole server) began from before Run was sent to after RunFinished,
// and how many that is per task: the nodes' idle heartbeats and polls in
// that time are in it too.
func writes(xids int64, n int) string {
	return fmt.Sprintf("; %d write transactions, %.1f per task", xids, float64(xids)/float64(n))
}
