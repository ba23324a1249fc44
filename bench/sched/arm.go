package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fanout/fanout/bench/internal/fleet"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// taskBudget is each task's token_budget: its three calls take about 1,500
// in all.
const taskBudget = 6_000

// model is the model the runs name and the workers default to: the
// (provider, key, model) whose limits the workers learn.
const model = "gpt-4o-mini"

// arm is one arm of a mode: its runs, all at once, at maxConcurrency fixed
// (0: unset), and what it measured.
type arm struct {
	mode  string
	fixed int

	wall    time.Duration // from the first StartRun sent to the last RunFinished
	samples []sample      // the mock's counters over the arm
	// outcomes are every task's, of every run.
	outcomes []*fanoutv1.TaskOutcome
	runs     map[string]int // runs by end state
	// chosen are the chosen-concurrency events, by run.
	chosen map[string][]chosen
	err    error
}

// chosen is one chosen-concurrency event: its kind (the event's field
// name), its number if it has one, and its JSON.
type chosen struct {
	kind   string
	n      int64
	hasN   bool
	detail string
}

func (a *arm) name() string {
	if a.fixed > 0 {
		return fmt.Sprintf("%s/fixed-%d", a.mode, a.fixed)
	}
	return a.mode + "/unset"
}

// runArm deploys a fleet whose workers call a fresh mock with a key of its
// own (nothing learned or limited by an earlier arm carries over), starts
// the arm's runs at once as one tenant and follows them to their ends.
func (h *harness) runArm(ctx context.Context, mode string, fixed int) (*arm, error) {
	c := h.cfg
	a := &arm{mode: mode, fixed: fixed, runs: map[string]int{}, chosen: map[string][]chosen{}}
	key := fmt.Sprintf("sk-bench-sched-%s-%d-%d", mode, fixed, os.Getpid())
	m := newMock(key, c.rpm, c.tpm, c.latencyMin, c.latencyMax, c.sample)
	a.err = h.load(ctx, a, m, key)
	a.samples = m.close()
	if a.err == nil && c.smoke {
		a.err = smokeCheck(a)
	}
	return a, a.err
}

// smokeCheck checks that a tiny arm did what the load is made of: every
// run and task SUCCEEDED, each task after at least 2 answered calls.
func smokeCheck(a *arm) error {
	s := summarize(a)
	if len(s.notSucceeded) > 0 || len(a.runs) != 1 || a.runs["SUCCEEDED"] == 0 {
		return fmt.Errorf("smoke: runs %s, tasks not SUCCEEDED %s; want every one SUCCEEDED", counts(a.runs), counts(s.notSucceeded))
	}
	if s.answered < 2*s.succeeded {
		return fmt.Errorf("smoke: %d answered calls for %d tasks, want at least 2 a task", s.answered, s.succeeded)
	}
	return nil
}

// load deploys the arm's fleet and runs its load.
func (h *harness) load(ctx context.Context, a *arm, m *mock, key string) error {
	c := h.cfg
	capacity := (c.runs*c.tasks + c.workers - 1) / c.workers
	fl, err := fleet.Start(ctx, fleet.Config{Bin: c.fanoutBin, Peer: h.peer, NodeURL: h.db.NodeURL, Prefix: "sched",
		Workers: c.workers, Orchestrators: c.orchestrators, StartLimit: 60 * time.Second,
		Env: []string{"OPENAI_API_KEY=" + key, "OPENAI_BASE_URL=" + m.BaseURL()},
		WorkerArgs: func(int) []string {
			// --capacity: every task of the arm fits at once, so that the
			// workers' capacity is not what limits the arm.
			args := []string{"--capacity", strconv.Itoa(max(64, capacity)), "--openai-model", model}
			if a.mode == modeFlags {
				args = append(args, "--openai-rpm", strconv.FormatInt(c.rpm, 10), "--openai-tpm", strconv.FormatInt(c.tpm, 10))
			}
			return args
		},
	})
	if err != nil {
		return err
	}
	defer fl.Stop()
	tenant := "sched-" + strings.ReplaceAll(a.name(), "/", "-")
	token, err := fleet.CreateKey(ctx, c.fanoutBin, h.db.OwnerURL, tenant, "bench-sched", "run,read", 0)
	if err != nil {
		return err
	}
	var clients []fanoutv1.OrchestratorServiceClient
	for _, o := range fl.Orchestrators {
		conn, err := fleet.Dial(o.Addr, token)
		if err != nil {
			return err
		}
		defer func() { _ = conn.Close() }()
		clients = append(clients, fanoutv1.NewOrchestratorServiceClient(conn))
	}
	if err := fleet.CheckAuth(ctx, fl.Orchestrators[0].Addr, clients[0], tenant); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeoutCause(ctx, c.runLimit, fmt.Errorf("%s ran past -run-timeout %v", a.name(), c.runLimit))
	defer cancel()
	var mu sync.Mutex
	began := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	for i := range c.runs {
		client := clients[i%len(clients)]
		g.Go(func() error {
			outs, state, chosen, err := h.followRun(gctx, client, tenant, a, i)
			mu.Lock()
			defer mu.Unlock()
			a.outcomes = append(a.outcomes, outs...)
			if state != "" {
				a.runs[state]++
			}
			if len(chosen) > 0 {
				a.chosen[fmt.Sprint(i)] = chosen
			}
			return err
		})
	}
	err = g.Wait()
	a.wall = time.Since(began)
	if err != nil {
		if dead := fl.Alive(); dead != nil {
			return fmt.Errorf("%w (a node died: %w)", err, dead)
		}
	}
	return err
}

// followRun starts run i of arm a and follows it to its end: its tasks'
// outcomes, its end state, its chosen-concurrency events.
func (h *harness) followRun(ctx context.Context, client fanoutv1.OrchestratorServiceClient, tenant string, a *arm, i int) (
	[]*fanoutv1.TaskOutcome, string, []chosen, error) {
	spec := h.spec(tenant, a, i)
	resp, err := client.StartRun(ctx, &fanoutv1.StartRunRequest{Spec: spec})
	if err != nil {
		return nil, "", nil, fleet.Refused(fmt.Sprintf("StartRun of %d tasks", len(spec.GetTasks())), err, tenant)
	}
	var cs []chosen
	fin, err := fleet.Watch(ctx, client, resp.GetRunId(), func(ev *fanoutv1.RunEvent) {
		if kind := fleet.EventKind(ev); strings.Contains(kind, "concurrency") {
			n, ok := fleet.EventNumber(ev, "concurrency")
			detail, _ := protojson.Marshal(ev) // A message always marshals.
			cs = append(cs, chosen{kind: kind, n: n, hasN: ok, detail: string(detail)})
		}
	})
	if err != nil {
		return nil, "", cs, err
	}
	outs, err := fleet.AllTasks(ctx, client, resp.GetRunId(), fin.GetResult())
	return outs, strings.TrimPrefix(fin.GetState().String(), "RUN_STATE_"), cs, err
}

// spec is run i of arm a: c.tasks tasks, each allowed the search tool and 3
// iterations (a search, then an answer; then the compression call).
func (h *harness) spec(tenant string, a *arm, i int) *fanoutv1.RunSpec {
	c := h.cfg
	spec := &fanoutv1.RunSpec{
		IdempotencyKey: fmt.Sprintf("bench-sched-%d-%s-%d", os.Getpid(), a.name(), i),
		TenantId:       tenant,
		Goal:           "bench-sched",
		Budget:         &fanoutv1.Budget{LimitTokens: int64(c.tasks) * 2 * taskBudget, MinReservationTokens: 1},
		Limits:         &fanoutv1.Limits{MaxConcurrency: int32(a.fixed), RunTimeout: durationpb.New(c.runLimit)},
		Model:          &fanoutv1.ModelSettings{Provider: "openai", Model: model, MaxOutputTokens: 256},
	}
	for j := range c.tasks {
		spec.Tasks = append(spec.Tasks, &fanoutv1.TaskSpec{Id: fmt.Sprintf("t%03d", j),
			Instruction: fmt.Sprintf("Find item %d of catalogue %d.", j, i), TokenBudget: taskBudget, MaxIterations: 3,
			AllowedTools: []string{searchTool}})
	}
	return spec
}
