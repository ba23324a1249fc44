package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fanout/fanout/bench/internal/fleet"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// taskBudget is each task's token_budget; a sim call takes under 1,000.
const taskBudget = 5_000

// tenant is a tenant of the harness and its API key.
type tenant struct {
	id, token string
}

// newTenant makes a tenant named id-<n> and a key of it, as an operator
// does.
func (h *harness) newTenant(ctx context.Context, name string) (tenant, error) {
	id := fmt.Sprintf("%s-%d", name, h.tenantSeq.Add(1))
	tok, err := fleet.CreateKey(ctx, h.cfg.fanoutBin, h.db.OwnerURL, id, "bench-scale", "run,read,cancel", 0)
	return tenant{id: id, token: tok}, err
}

func (t tenant) creds() grpc.CallOption { return grpc.PerRPCCredentials(fleet.Bearer(t.token)) }

// shape is a run: tasks, each allowed tool (a task with a tool makes the
// deployment's finishAfter calls, one without makes one) and at most
// iterations.
type shape struct {
	tasks      int
	tool       string // "" none
	iterations int
}

func (h *harness) spec(t tenant, s shape) *fanoutv1.RunSpec {
	spec := &fanoutv1.RunSpec{
		IdempotencyKey: fmt.Sprintf("bench-scale-%d-%d", os.Getpid(), h.runSeq.Add(1)),
		TenantId:       t.id,
		Goal:           "bench-scale",
		Budget:         &fanoutv1.Budget{LimitTokens: int64(s.tasks) * 2 * taskBudget * int64(max(1, s.iterations)), MinReservationTokens: 1},
		Limits:         &fanoutv1.Limits{MaxConcurrency: int32(s.tasks), RunTimeout: durationpb.New(h.cfg.runLimit)},
		Model:          &fanoutv1.ModelSettings{Provider: "sim", MaxOutputTokens: 256, Seed: 7},
	}
	for i := range s.tasks {
		task := &fanoutv1.TaskSpec{Id: fmt.Sprintf("t%05d", i), Instruction: fmt.Sprintf("look up item %d", i),
			TokenBudget: taskBudget * int64(max(1, s.iterations)), MaxIterations: int32(max(1, s.iterations))}
		if s.tool != "" {
			task.AllowedTools = []string{s.tool}
		}
		spec.Tasks = append(spec.Tasks, task)
	}
	return spec
}

// followed is a run started with StartRun and followed with WatchRun to its
// end.
type followed struct {
	id           string
	sent         time.Time     // StartRun sent
	startRun     time.Duration // StartRun's answer, client side
	firstStarted time.Duration // from sent to the first TaskStarted (the event's time)
	finished     time.Time     // RunFinished received
	fin          *fanoutv1.RunFinished
	tasks        []*fanoutv1.TaskOutcome // every task of the joined result, paged
	started      map[string]int          // TaskStarted events per task
	events       int
}

// startRetries counts the StartRuns answered RESOURCE_EXHAUSTED and sent
// again.
var startRetries atomic.Int64

// startRun submits spec on client as t; its time is the call's, from the
// first attempt. A call the orchestrator refuses for the moment
// (RESOURCE_EXHAUSTED: e.g. too many unauthenticated calls read at once,
// "retry later") is sent again after a pause, with the same idempotency
// key, and counted in startRetries.
func startRun(ctx context.Context, client fanoutv1.OrchestratorServiceClient, t tenant, spec *fanoutv1.RunSpec) (string, time.Time, time.Duration, error) {
	sent := time.Now()
	for pause := 20 * time.Millisecond; ; pause = min(2*pause, time.Second) {
		resp, err := client.StartRun(ctx, &fanoutv1.StartRunRequest{Spec: spec}, t.creds())
		if status.Code(err) == codes.ResourceExhausted && strings.Contains(err.Error(), "retry later") {
			startRetries.Add(1)
			if err := fleet.Sleep(ctx, pause+time.Duration(rand.Int64N(int64(pause)))); err != nil {
				return "", sent, 0, fmt.Errorf("StartRun of %d tasks, retried: %w", len(spec.GetTasks()), err)
			}
			continue
		}
		if err != nil {
			return "", sent, 0, fleet.Refused(fmt.Sprintf("StartRun of %d tasks", len(spec.GetTasks())), err, t.id)
		}
		return resp.GetRunId(), sent, time.Since(sent), nil
	}
}

// watch follows run id from its first event to RunFinished; ready, if
// not nil, is closed once the stream is open (its first event came).
func watch(ctx context.Context, client fanoutv1.OrchestratorServiceClient, t tenant, id string, sent time.Time, ready chan<- struct{}) (*followed, error) {
	f := &followed{id: id, sent: sent, started: map[string]int{}}
	fin, err := fleet.Watch(ctx, client, id, func(ev *fanoutv1.RunEvent) {
		if ready != nil {
			close(ready)
			ready = nil
		}
		f.events++
		if ts := ev.GetTaskStarted(); ts != nil {
			if len(f.started) == 0 && !sent.IsZero() {
				f.firstStarted = ev.GetTime().AsTime().Sub(sent)
			}
			f.started[ts.GetTaskId()]++
		}
	}, t.creds())
	if err != nil {
		if f.events == 0 {
			return f, fleet.Refused("follow run", err, t.id)
		}
		return f, err
	}
	f.finished, f.fin = time.Now(), fin
	f.tasks, err = fleet.AllTasks(ctx, client, id, fin.GetResult(), t.creds())
	return f, err
}

// startAndFollow starts spec and follows it to its end.
func startAndFollow(ctx context.Context, client fanoutv1.OrchestratorServiceClient, t tenant, spec *fanoutv1.RunSpec) (*followed, error) {
	id, sent, took, err := startRun(ctx, client, t, spec)
	if err != nil {
		return nil, err
	}
	f, err := watch(ctx, client, t, id, sent, nil)
	f.startRun = took
	return f, err
}

// checkSucceeded checks that run f of n tasks succeeded with its result
// joined, each task SUCCEEDED after iterations and started once (one
// TaskStarted on the stream).
func checkSucceeded(f *followed, n, iterations int) error {
	if f.fin.GetState() != fanoutv1.RunState_RUN_STATE_SUCCEEDED {
		return fmt.Errorf("run %s ended %s (%s)", f.id, f.fin.GetState(), f.fin.GetCancelCause())
	}
	tasks := f.tasks
	if len(tasks) != n {
		return fmt.Errorf("run %s: the joined result has %d task outcomes, want %d", f.id, len(tasks), n)
	}
	var bad []*fanoutv1.TaskOutcome
	byStatus := map[string]int{}
	for _, o := range tasks {
		if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED || o.GetSummary().GetIterations() != int32(iterations) {
			bad = append(bad, o)
			byStatus[o.GetStatus().String()]++
		}
	}
	if len(bad) > 0 {
		o := bad[0]
		return fmt.Errorf("run %s: %d of %d tasks did not SUCCEED after %d iterations (%s); the first, %s, ended %s after %d (error %q)",
			f.id, len(bad), n, iterations, byApp(byStatus), o.GetTaskId(), o.GetStatus(), o.GetSummary().GetIterations(), o.GetSummary().GetError())
	}
	if len(f.started) != n {
		return fmt.Errorf("run %s: %d tasks started, want %d", f.id, len(f.started), n)
	}
	for task, c := range f.started {
		if c != 1 {
			return fmt.Errorf("run %s: task %s started %d times, want once", f.id, task, c)
		}
	}
	return nil
}

// checkLedger checks, as the database's owner, that the runs made exactly
// calls model calls, each paid by one reservation, all settled; and that
// every account on the server is conserved (the conservation_check view).
func (h *harness) checkLedger(ctx context.Context, ids []string, calls int) (string, error) {
	var total, settled int
	if err := h.owner.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE state = 'settled')
		FROM reservation WHERE run_id = ANY($1)`, ids).Scan(&total, &settled); err != nil {
		return "", fmt.Errorf("count reservations: %w", err)
	}
	if total != calls || settled != calls {
		return "", fmt.Errorf("%d reservations (%d settled) for %d runs, want %d model calls, one settled reservation each", total, settled, len(ids), calls)
	}
	var accounts, bad int
	if err := h.owner.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE NOT conserved) FROM conservation_check`).Scan(&accounts, &bad); err != nil {
		return "", fmt.Errorf("read conservation_check: %w", err)
	}
	if bad != 0 {
		return "", fmt.Errorf("%d of %d accounts not conserved (conservation_check)", bad, accounts)
	}
	return fmt.Sprintf("%d reservations, one per model call, all settled; all %d accounts conserved (conservation_check)", total, accounts), nil
}
