package orchestrator

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/peer"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

// cleanupTimeout bounds the writes that record how a run or task ended;
// they run on a context detached from the run's cancellation.
const cleanupTimeout = 30 * time.Second

// EngineParams are an Engine's collaborators. All are required.
type EngineParams struct {
	Store   RunStore
	Ledger  budget.Ledger
	Watcher RunWatcher
	Workers *WorkerPool
	// Signer signs every dispatch sent to a worker (workers refuse unsigned
	// ones). Required.
	Signer *peer.Signer
	Config Config
}

// Engine creates runs, drives them on this node (dispatching their tasks to
// workers, cancelling on any cause, joining), and reads any run from the
// store. It is independent of the gRPC adapter (Server).
type Engine struct {
	signer  *peer.Signer
	store   RunStore
	ledger  budget.Ledger
	watcher RunWatcher
	workers *WorkerPool
	cfg     Config

	// base is the context of every run this engine drives: the engine's
	// lifetime, not any RPC's. Shutdown cancels it with errShutdown.
	base       context.Context
	cancelBase context.CancelCauseFunc
	wg         sync.WaitGroup // one per driven run and per run being adopted

	// stopBeat stops the heartbeat loop (lease.go), which closes beatDone.
	stopBeat context.CancelFunc
	beatDone chan struct{}

	mu       sync.Mutex
	closing  bool
	active   map[string]*activeRun // driven, or adopted and being ended
	adopting int                   // adopted runs being ended
}

// activeRun is a run this engine drives (or ends, having adopted it).
type activeRun struct {
	cancel  context.CancelCauseFunc
	changed chan struct{} // closed and replaced on every new event
}

// NewEngine returns an engine. Call Shutdown to stop it.
func NewEngine(p EngineParams) (*Engine, error) {
	if p.Store == nil || p.Ledger == nil || p.Watcher == nil || p.Workers == nil || p.Signer == nil {
		return nil, errors.New("orchestrator: engine needs a store, a ledger, a watcher, workers and a signer")
	}
	base, cancel := context.WithCancelCause(context.Background())
	beatCtx, stopBeat := context.WithCancel(context.Background())
	e := &Engine{
		signer:     p.Signer,
		store:      p.Store,
		ledger:     p.Ledger,
		watcher:    p.Watcher,
		workers:    p.Workers,
		cfg:        p.Config.withDefaults(),
		base:       base,
		cancelBase: cancel,
		stopBeat:   stopBeat,
		beatDone:   make(chan struct{}),
		active:     map[string]*activeRun{},
	}
	go e.heartbeat(beatCtx)
	return e, nil
}

// Config returns the engine's configuration with defaults applied.
func (e *Engine) Config() Config { return e.cfg }

// Submit validates spec, then creates the run (persisted, with its ledger
// accounts) and starts driving it in the background, or returns the run
// the tenant already has under spec's idempotency key (created false).
//
// Returns a *ValidationError before anything is written, ErrSpecMismatch
// when the key was used with a different spec, ErrShuttingDown after
// Shutdown began.
func (e *Engine) Submit(ctx context.Context, spec *fanoutv1.RunSpec) (run *fanoutv1.Run, created bool, err error) {
	p, err := e.cfg.plan(spec)
	if err != nil {
		return nil, false, err
	}
	e.mu.Lock()
	closing := e.closing
	e.mu.Unlock()
	if closing {
		return nil, false, ErrShuttingDown
	}

	runID := newRunID()
	start := time.Now()
	draft := &fanoutv1.Run{
		RunId:          runID,
		TenantId:       p.tenantID,
		IdempotencyKey: spec.GetIdempotencyKey(),
		State:          fanoutv1.RunState_RUN_STATE_RUNNING,
		Spec:           spec,
		Labels:         spec.GetLabels(),
	}
	for i, t := range spec.GetTasks() {
		draft.Tasks = append(draft.Tasks, &fanoutv1.TaskOutcome{
			TaskId: t.GetId(), DispatchIndex: int32(i), Status: fanoutv1.TaskStatus_TASK_STATUS_PENDING,
		})
	}
	// Once the run row exists, finish creating it even if the caller leaves.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	run, created, err = e.store.CreateRun(ctx, draft, e.cfg.Node)
	if err != nil {
		return nil, false, err
	}
	if !created {
		if !proto.Equal(run.GetSpec(), spec) {
			return nil, false, fmt.Errorf("run %s: %w", run.GetRunId(), ErrSpecMismatch)
		}
		return run, false, nil
	}
	span := e.startRunSpan(ctx, start, runID, p)
	ctx = trace.ContextWithSpan(ctx, span) // the ledger and store calls below are the run's

	tasks := make([]budget.TaskBudget, len(spec.GetTasks()))
	for i, t := range spec.GetTasks() {
		tasks[i] = budget.TaskBudget{TaskID: t.GetId(), Limit: t.GetTokenBudget()}
	}
	accounts, err := e.ledger.OpenRun(ctx, budget.OpenRunParams{
		RunID:          runID,
		TenantID:       p.tenantID,
		Limit:          spec.GetBudget().GetLimitTokens(),
		MinReservation: p.minReservation,
		Tasks:          tasks,
	})
	if err != nil {
		cause := fmt.Sprintf("open ledger accounts: %v", err)
		e.finishRun(ctx, runID, fanoutv1.RunState_RUN_STATE_FAILED, cause, join(run.GetTasks()))
		span.RecordError(err)
		endRunSpan(span, fanoutv1.RunState_RUN_STATE_FAILED, cause, nil, nil, nil)
		return nil, false, fmt.Errorf("open ledger accounts of run %s: %w", runID, err)
	}
	run.Budget = snapshot(accounts.Run)

	ar := &activeRun{changed: make(chan struct{})}
	runCtx, cancelRun := context.WithCancelCause(trace.ContextWithSpan(e.base, span))
	ar.cancel = cancelRun
	e.mu.Lock()
	if e.closing {
		e.mu.Unlock()
		cancelRun(errShutdown)
		e.finishRun(ctx, runID, fanoutv1.RunState_RUN_STATE_CANCELLED, errShutdown.Error(), join(run.GetTasks()))
		if _, err := e.ledger.CloseRun(ctx, runID); err != nil {
			e.cfg.Logger.ErrorContext(ctx, "close ledger run", "run_id", runID, "err", err)
		}
		endRunSpan(span, fanoutv1.RunState_RUN_STATE_CANCELLED, errShutdown.Error(), errShutdown, nil, nil)
		return nil, false, ErrShuttingDown
	}
	e.active[runID] = ar
	e.wg.Add(1)
	e.mu.Unlock()

	if _, err := e.appendEvent(ctx, runID, &fanoutv1.RunEvent{
		Event: &fanoutv1.RunEvent_RunStarted{RunStarted: &fanoutv1.RunStarted{Run: run}},
	}); err != nil {
		e.cfg.Logger.ErrorContext(ctx, "append RunStarted", "run_id", runID, "err", err)
	}
	e.cfg.Logger.InfoContext(ctx, "run started", "run_id", runID, "tenant_id", p.tenantID,
		"tasks", len(spec.GetTasks()), "limit_tokens", spec.GetBudget().GetLimitTokens())
	d := &driver{e: e, p: p, runID: runID, accounts: accounts, ar: ar, span: span}
	go func() {
		defer e.wg.Done()
		d.drive(runCtx, cancelRun)
	}()
	return run, true, nil
}

// newRunID returns a random (version 4) UUID.
func newRunID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func snapshot(a budget.Account) *fanoutv1.BudgetSnapshot {
	return &fanoutv1.BudgetSnapshot{
		LimitTokens:     a.Limit,
		AvailableTokens: a.Available(),
		ReservedTokens:  a.Reserved,
		SpentTokens:     a.Spent,
		Exhausted:       a.State == budget.StateExhausted,
	}
}

// appendEvent stores ev and wakes this node's watchers of the run.
func (e *Engine) appendEvent(ctx context.Context, runID string, ev *fanoutv1.RunEvent) (*fanoutv1.RunEvent, error) {
	out, err := e.store.AppendEvent(ctx, runID, ev)
	if err != nil {
		return nil, err
	}
	e.wake(runID)
	return out, nil
}

// wake tells this node's watchers of the run that it has new events.
func (e *Engine) wake(runID string) {
	e.mu.Lock()
	if ar := e.active[runID]; ar != nil {
		close(ar.changed)
		ar.changed = make(chan struct{})
	}
	e.mu.Unlock()
}

// changed returns a channel closed on the run's next event, or nil (never
// ready) when this node does not drive the run.
func (e *Engine) changed(runID string) <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ar := e.active[runID]; ar != nil {
		return ar.changed
	}
	return nil
}

// finishRun ends the run if this engine owns it and it is RUNNING, then
// appends its RunFinished, and reports whether it ended the run. A run that
// another replica adopted (or that ended otherwise) is left as it is: its
// RunFinished is the other's to append. If the write fails the run stays
// RUNNING; once this engine stops heartbeating it, it is adopted and ended.
func (e *Engine) finishRun(ctx context.Context, runID string, state fanoutv1.RunState, cause string,
	result *fanoutv1.JoinedResult) bool {
	stored, ended, err := e.store.FinishRun(ctx, runID, e.cfg.Node, state, cause, result)
	if err != nil {
		e.cfg.Logger.ErrorContext(ctx, "finish run", "run_id", runID, "err", err)
		return false
	}
	if !ended {
		e.cfg.Logger.WarnContext(ctx, "run ended elsewhere; not ending it here", "run_id", runID,
			"state", stored.GetState().String(), "cause", stored.GetCancelCause())
		return false
	}
	if _, err := e.appendEvent(ctx, runID, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_RunFinished{
		RunFinished: &fanoutv1.RunFinished{State: state, CancelCause: cause, Result: result},
	}}); err != nil {
		e.cfg.Logger.ErrorContext(ctx, "append RunFinished", "run_id", runID, "err", err)
	}
	metrics().runsFinished.Add(context.WithoutCancel(ctx), 1,
		metric.WithAttributes(attrRunState.String(runs.Text(state))))
	return true
}

// Get returns a run with its budget as the ledger has it now. An empty
// tenantID matches any tenant. Returns runs.ErrNotFound for an unknown run.
func (e *Engine) Get(ctx context.Context, tenantID, runID string) (*fanoutv1.Run, error) {
	run, err := e.store.GetRun(ctx, tenantID, runID)
	if err != nil {
		return nil, err
	}
	if acct, err := e.ledger.RunAccount(ctx, runID); err == nil {
		run.Budget = snapshot(acct)
	} else if !errors.Is(err, budget.ErrNotFound) {
		return nil, err
	}
	return run, nil
}

// Cancel cancels a running run, wherever it is driven: the ledger account is
// cancelled (every node's watcher hears it and the driving node cancels the
// run with a *CancelError carrying cause), and if this node drives the run
// it is cancelled at once. A run that has ended is returned unchanged.
// Returns runs.ErrNotFound for an unknown run.
func (e *Engine) Cancel(ctx context.Context, tenantID, runID, cause string) (*fanoutv1.Run, error) {
	run, err := e.store.GetRun(ctx, tenantID, runID)
	if err != nil {
		return nil, err
	}
	if run.GetState() != fanoutv1.RunState_RUN_STATE_RUNNING {
		return e.Get(ctx, tenantID, runID)
	}
	if _, err := e.ledger.CancelRun(ctx, runID, cause); err != nil && !errors.Is(err, budget.ErrNotFound) {
		return nil, fmt.Errorf("cancel run %s: %w", runID, err)
	}
	e.mu.Lock()
	ar := e.active[runID]
	e.mu.Unlock()
	if ar != nil {
		ar.cancel(&CancelError{Cause: cause})
	}
	return e.Get(ctx, tenantID, runID)
}

// ListParams select a page of runs.
type ListParams struct {
	TenantID      string // "" means "default"
	State         fanoutv1.RunState
	Limit         int       // 1..500
	BeforeCreated time.Time // zero for the first page
	BeforeID      string
}

// List returns a page of a tenant's runs, newest first.
func (e *Engine) List(ctx context.Context, p ListParams) ([]*fanoutv1.Run, error) {
	if p.TenantID == "" {
		p.TenantID = "default"
	}
	runs, err := e.store.ListRuns(ctx, p.TenantID, p.State, p.BeforeCreated, p.BeforeID, p.Limit)
	if err != nil {
		return nil, err
	}
	for _, r := range runs {
		if acct, err := e.ledger.RunAccount(ctx, r.GetRunId()); err == nil {
			r.Budget = snapshot(acct)
		}
	}
	return runs, nil
}

// Watch sends the run's events with sequence > after in order — stored
// history, then new events as they are stored, by this node or any other —
// until it has sent RunFinished (then it returns nil), send fails, or ctx
// ends. Returns runs.ErrNotFound for an unknown run.
func (e *Engine) Watch(ctx context.Context, tenantID, runID string, after int64,
	send func(*fanoutv1.RunEvent) error) error {
	if _, err := e.store.GetRun(ctx, tenantID, runID); err != nil {
		return err
	}
	const page = 256
	tick := time.NewTicker(e.cfg.WatchPollInterval)
	defer tick.Stop()
	for {
		changed := e.changed(runID) // before reading, so no event is missed
		evs, err := e.store.Events(ctx, tenantID, runID, after, page)
		if err != nil {
			return err
		}
		for _, ev := range evs {
			if err := send(ev); err != nil {
				return err
			}
			after = ev.GetSequence()
			if ev.GetRunFinished() != nil {
				return nil
			}
		}
		if len(evs) == page {
			continue
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-changed:
		case <-tick.C:
		}
	}
}

// Shutdown stops accepting runs and adopting orphaned ones, waits for the
// runs this engine drives (or ends, having adopted them) to end, and stops
// the heartbeat. When ctx ends first, it cancels them (cause: the orchestrator shut
// down; their ledger accounts are cancelled so workers stop too), waits for
// them to record how they ended, and returns ctx's error.
func (e *Engine) Shutdown(ctx context.Context) error {
	e.mu.Lock()
	e.closing = true
	e.mu.Unlock()
	done := make(chan struct{})
	go func() {
		e.wg.Wait()
		close(done)
	}()
	// The heartbeat keeps the runs' leases until they have ended.
	defer e.stopHeartbeat()
	select {
	case <-done:
		e.cancelBase(errShutdown)
		return nil
	case <-ctx.Done():
		e.cancelBase(errShutdown)
		<-done
		return ctx.Err()
	}
}

// driver drives one run on this node.
type driver struct {
	e        *Engine
	p        *plan
	runID    string
	accounts budget.RunAccounts
	ar       *activeRun
	span     trace.Span // the run span, ended by drive
	stopped  stopClock  // when the run was told to stop

	mu         sync.Mutex
	lastBudget time.Time     // when the last BudgetUpdate went out
	budgetOwed bool          // a task ended since then
	exhausted  bool          // the exhaustion was reported (event, drain)
	drain      chan struct{} // closed when DRAIN stops new dispatches
	drainOnce  sync.Once
}

// taskResult is how one dispatched task ended.
type taskResult struct {
	index   int
	outcome *fanoutv1.TaskOutcome
}

func (d *driver) drive(parent context.Context, cancelRun context.CancelCauseFunc) {
	e, spec := d.e, d.p.spec
	defer func() {
		e.mu.Lock()
		delete(e.active, d.runID)
		e.mu.Unlock()
	}()
	d.drain = make(chan struct{})
	runCtx, cancelTimeout := context.WithTimeoutCause(parent, d.p.runTimeout, errRunTimeout)
	defer cancelTimeout()
	defer cancelRun(nil)
	active := metrics().runsActive
	active.Add(runCtx, 1)
	defer active.Add(context.WithoutCancel(runCtx), -1)
	stopClock := context.AfterFunc(runCtx, d.stopped.stop)
	defer stopClock()
	cleanup := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(runCtx), cleanupTimeout)
	}

	// Hear the run's end from any node: exhaustion or CancelRun elsewhere.
	sub := e.watcher.Subscribe(d.runID)
	defer sub.Close()
	watchDone := make(chan struct{})
	var watchWG sync.WaitGroup
	watchWG.Add(1)
	go func() {
		defer watchWG.Done()
		select {
		case <-watchDone:
		case <-sub.Done():
			switch sig := sub.Signal(); sig.State {
			case budget.StateExhausted:
				d.onExhausted(runCtx, cancelRun)
			case budget.StateCancelled:
				cause := sig.Cause
				if cause == "" { // a notice carries no cause; the account has it
					ctx, cancel := context.WithTimeout(context.WithoutCancel(runCtx), cleanupTimeout)
					if acct, err := e.ledger.RunAccount(ctx, d.runID); err == nil {
						cause = acct.Cause
					}
					cancel()
				}
				cancelRun(&CancelError{Cause: cmpOr(cause, budget.ErrRunCancelled.Error())})
			}
		}
	}()
	defer func() {
		close(watchDone)
		watchWG.Wait()
	}()

	n := len(spec.GetTasks())
	outcomes := make([]*fanoutv1.TaskOutcome, n) // by dispatch index
	waiting := make([]int, n)                    // dependencies not yet ended
	dependents := make([][]int, n)
	var ready []int // dispatch indexes, kept sorted
	for i, deps := range d.p.deps {
		waiting[i] = len(deps)
		for _, dep := range deps {
			dependents[dep] = append(dependents[dep], i)
		}
	}
	ended, running := 0, 0
	results := make(chan taskResult, n)
	var tasks sync.WaitGroup
	defer tasks.Wait()

	// finishUndispatched records a task that ends without being dispatched
	// (it has no summary: it never ran).
	finishUndispatched := func(i int, status fanoutv1.TaskStatus) {
		ctx, cancel := cleanup()
		defer cancel()
		outcomes[i] = d.finishTask(ctx, &fanoutv1.TaskOutcome{
			TaskId: spec.GetTasks()[i].GetId(), DispatchIndex: int32(i), Status: status,
		})
		ended++
	}
	makeReady := func(i int) {
		ready = insertSorted(ready, i)
		ctx, cancel := cleanup()
		defer cancel()
		d.event(ctx, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskQueued{TaskQueued: &fanoutv1.TaskQueued{
			TaskId: spec.GetTasks()[i].GetId(), DispatchIndex: int32(i),
		}}})
	}
	// skip ends every task that waits on i, transitively, as SKIPPED.
	var skip func(i int)
	skip = func(i int) {
		for _, j := range dependents[i] {
			if outcomes[j] != nil {
				continue
			}
			finishUndispatched(j, fanoutv1.TaskStatus_TASK_STATUS_SKIPPED)
			skip(j)
		}
	}
	// The first wave is queued in one write, so that a wide fan-out starts
	// dispatching at once instead of after n sequential appends.
	var queued []*fanoutv1.RunEvent
	for i := range n {
		if waiting[i] == 0 {
			ready = append(ready, i) // i ascends: ready stays sorted
			queued = append(queued, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskQueued{TaskQueued: &fanoutv1.TaskQueued{
				TaskId: spec.GetTasks()[i].GetId(), DispatchIndex: int32(i),
			}}})
		}
	}
	if len(queued) > 0 {
		ctx, cancel := cleanup()
		if _, err := e.store.AppendEvents(ctx, d.runID, queued); err != nil {
			e.cfg.Logger.ErrorContext(ctx, "append run events", "run_id", d.runID, "err", err)
		}
		e.wake(d.runID)
		cancel()
	}

	stopped := func() bool {
		if runCtx.Err() != nil {
			return true
		}
		select {
		case <-d.drain:
			return true
		default:
			return false
		}
	}
	runDone, drain := runCtx.Done(), (<-chan struct{})(d.drain)
	for ended < n {
		// Start what may start; after the run context fired (or DRAIN
		// began), queued tasks end without a dispatch.
		for len(ready) > 0 && (running < d.p.concurrency || stopped()) {
			i := ready[0]
			ready = ready[1:]
			if stopped() {
				finishUndispatched(i, d.undispatchedStatus(runCtx))
				skip(i)
				continue
			}
			req := d.request(runCtx, i, outcomes)
			w := e.workers.Next() // here, so that round-robin follows dispatch order
			running++
			tasks.Add(1)
			go func() {
				defer tasks.Done()
				results <- taskResult{index: i, outcome: d.runTask(runCtx, i, w, req)}
			}()
		}
		if ended == n {
			break
		}
		select {
		case r := <-results:
			running--
			ended++
			outcomes[r.index] = r.outcome
			st := r.outcome.GetStatus()
			if st == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
				for _, j := range dependents[r.index] {
					if waiting[j]--; waiting[j] == 0 && outcomes[j] == nil {
						makeReady(j)
					}
				}
			} else {
				skip(r.index)
			}
			switch spec.GetJoinPolicy() {
			case fanoutv1.JoinPolicy_JOIN_POLICY_FAIL_FAST:
				if st != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
					cancelRun(&failFastError{taskID: r.outcome.GetTaskId(), status: st,
						reason: r.outcome.GetSummary().GetError()})
				}
			case fanoutv1.JoinPolicy_JOIN_POLICY_FIRST_SUCCESS:
				if st == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
					cancelRun(errFirstSuccess)
				}
			}
		case <-runDone:
			runDone = nil // the loop's top ends the queued tasks
		case <-drain:
			drain = nil
		}
	}

	// Every task has ended: report the budget if an update is owed, decide
	// the run's state from the cause, join, persist, and close the ledger.
	{
		ctx, cancel := cleanup()
		d.reportBudget(ctx, runCtx, true)
		cancel()
	}
	if took, ok := d.stopped.since(); ok {
		stopCause := context.Cause(runCtx)
		reason := cancelReason(stopCause)
		if stopCause == nil {
			reason = "budget_exhausted" // DRAIN: stopped without a cancel
		}
		metrics().cancelLatency.Record(context.WithoutCancel(runCtx), took.Seconds(),
			metric.WithAttributes(attrCancelScope.String("run"), attrCancelReason.String(reason)))
	}
	ctx, cancel := cleanup()
	defer cancel()
	runCause := context.Cause(runCtx) // before the deferred cancelRun(nil)
	if runCause == nil {
		// Workers hear a CancelRun through the ledger as fast as this node's
		// watcher does, so every task can end CANCELLED before the run
		// context hears it: the ledger decides.
		if acct, err := e.ledger.RunAccount(ctx, d.runID); err == nil && acct.State == budget.StateCancelled {
			runCause = &CancelError{Cause: cmpOr(acct.Cause, budget.ErrRunCancelled.Error())}
		}
	}
	state, cause := d.outcome(runCause, outcomes)
	result := join(outcomes)
	if spec.GetSynthesize() {
		// Its own time, not the cleanup's: what follows must still be written.
		sctx, scancel := context.WithTimeout(context.WithoutCancel(runCtx), e.cfg.DefaultTaskTimeout)
		result.Synthesis, result.SynthesisSkippedReason = d.synthesize(sctx, runCause, result)
		scancel()
		ctx, cancel = cleanup()
		defer cancel()
	}
	if errors.Is(context.Cause(runCtx), errShutdown) {
		if _, err := e.ledger.CancelRun(ctx, d.runID, cause); err != nil {
			e.cfg.Logger.ErrorContext(ctx, "cancel ledger run at shutdown", "run_id", d.runID, "err", err)
		}
	}
	// Synthesis is waited for like every task: its call may still be
	// settling. Then close the ledger, so that whoever sees RunFinished
	// reads final spend.
	e.awaitHeld(runCtx, d.runID)
	// The wait can outlast a cleanup context (HeldWait is longer): the close
	// and the end, which must be written, get a fresh one.
	ctx, cancel = cleanup()
	defer cancel()
	acct, err := e.ledger.CloseRun(ctx, d.runID)
	if err != nil {
		e.cfg.Logger.ErrorContext(ctx, "close ledger run", "run_id", d.runID, "err", err)
	} else {
		// The ledger is the truth: it also counts calls cut off before their
		// worker could report (settled at their full reservation).
		result.TotalTokens = acct.Spent
	}
	if e.finishRun(ctx, d.runID, state, cause, result) {
		e.cfg.Logger.InfoContext(ctx, "run ended", "run_id", d.runID, "state", state.String(), "cause", cause,
			"tasks", n, "tokens", result.GetTotalTokens())
	}
	var closed *budget.Account
	if err == nil {
		closed = &acct
	}
	endRunSpan(d.span, state, cause, runCause, result, closed)
}

func insertSorted(s []int, v int) []int {
	i := 0
	for i < len(s) && s[i] < v {
		i++
	}
	s = append(s, 0)
	copy(s[i+1:], s[i:])
	s[i] = v
	return s
}

// outcome maps the run context's cause to the run's terminal state.
func (d *driver) outcome(cause error, outcomes []*fanoutv1.TaskOutcome) (fanoutv1.RunState, string) {
	var ff *failFastError
	var ce *CancelError
	switch {
	case cause == nil || errors.Is(cause, errFirstSuccess) || errors.Is(cause, context.Canceled):
		if d.isExhausted() {
			return fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED, budget.ErrExhausted.Error()
		}
		if d.p.spec.GetJoinPolicy() == fanoutv1.JoinPolicy_JOIN_POLICY_FIRST_SUCCESS {
			for _, o := range outcomes {
				if o.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
					return fanoutv1.RunState_RUN_STATE_SUCCEEDED, ""
				}
			}
			return fanoutv1.RunState_RUN_STATE_FAILED, "no task succeeded (join policy FIRST_SUCCESS)"
		}
		return fanoutv1.RunState_RUN_STATE_SUCCEEDED, ""
	case errors.Is(cause, budget.ErrExhausted):
		return fanoutv1.RunState_RUN_STATE_BUDGET_EXHAUSTED, budget.ErrExhausted.Error()
	case errors.As(cause, &ff):
		return fanoutv1.RunState_RUN_STATE_FAILED, ff.Error()
	case errors.As(cause, &ce):
		return fanoutv1.RunState_RUN_STATE_CANCELLED, ce.Cause
	case errors.Is(cause, errRunTimeout):
		return fanoutv1.RunState_RUN_STATE_TIMED_OUT, fmt.Sprintf("run timed out after %s", d.p.runTimeout)
	case errors.Is(cause, errShutdown):
		return fanoutv1.RunState_RUN_STATE_CANCELLED, errShutdown.Error()
	default:
		return fanoutv1.RunState_RUN_STATE_FAILED, cause.Error()
	}
}

// awaitHeld waits, up to Config.HeldWait (less on a forced shutdown), until
// the run holds no reservation. Every task (and synthesis) has ended by now, so a reservation
// still held belongs to a worker that is still settling or lost its task
// (killed, cut off) and may have paid for its call. CloseRun never voids
// it: a run that still holds reservations is cancelled and closes when the
// last one is settled or posted by the sweeper as estimated spend. Waiting
// here lets the run's total be final when RunFinished is written; a worker
// that is alive settles before it reports, so this is normally one read.
func (e *Engine) awaitHeld(parent context.Context, runID string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), e.cfg.HeldWait)
	defer cancel()
	tick := time.NewTicker(e.cfg.WatchPollInterval)
	defer tick.Stop()
	for failures := 0; ; {
		acct, err := e.ledger.RunAccount(ctx, runID)
		switch {
		case errors.Is(err, budget.ErrNotFound) || err == nil && acct.Reserved == 0:
			return
		case err != nil:
			if failures++; failures >= 3 { // the ledger cannot tell us; do not guess
				e.cfg.Logger.WarnContext(ctx, "cannot read the run's reservations", "run_id", runID, "err", err)
				return
			}
		}
		select {
		case <-ctx.Done():
			e.cfg.Logger.WarnContext(ctx, "run ends with reservations still held", "run_id", runID,
				"reserved", acct.Reserved, "waited", e.cfg.HeldWait)
			return
		case <-e.base.Done(): // forced shutdown: stop waiting
			return
		case <-tick.C:
		}
	}
}

// onExhausted applies the exhaustion policy, once.
func (d *driver) onExhausted(ctx context.Context, cancelRun context.CancelCauseFunc) {
	d.mu.Lock()
	first := !d.exhausted
	d.exhausted = true
	d.mu.Unlock()
	if !first {
		return
	}
	d.stopped.stop()
	d.span.AddEvent("budget.exhausted")
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	ev := &fanoutv1.BudgetExhausted{}
	if acct, err := d.e.ledger.RunAccount(cctx, d.runID); err == nil {
		ev.Budget = snapshot(acct)
	}
	d.event(cctx, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_BudgetExhausted{BudgetExhausted: ev}})
	if d.p.spec.GetOnExhaustion() == fanoutv1.ExhaustionPolicy_EXHAUSTION_POLICY_DRAIN {
		d.drainOnce.Do(func() { close(d.drain) })
		return
	}
	cancelRun(budget.ErrExhausted)
}

func (d *driver) isExhausted() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.exhausted
}

// undispatchedStatus is the status of a queued task that will not start.
func (d *driver) undispatchedStatus(runCtx context.Context) fanoutv1.TaskStatus {
	if d.isExhausted() || errors.Is(context.Cause(runCtx), budget.ErrExhausted) {
		return fanoutv1.TaskStatus_TASK_STATUS_BUDGET_EXHAUSTED
	}
	return fanoutv1.TaskStatus_TASK_STATUS_CANCELLED
}

// event appends an event, logging a failure: losing one progress event must
// not stop the run.
func (d *driver) event(ctx context.Context, ev *fanoutv1.RunEvent) {
	_, err := d.e.appendEvent(ctx, d.runID, ev)
	switch {
	case errors.Is(err, runs.ErrEnded): // the run ended on the replica that adopted it
		d.e.cfg.Logger.InfoContext(ctx, "run ended elsewhere; event dropped", "run_id", d.runID, "err", err)
	case err != nil:
		d.e.cfg.Logger.ErrorContext(ctx, "append run event", "run_id", d.runID, "err", err)
	}
}

// finishTask persists a task's terminal outcome and reports it.
func (d *driver) finishTask(ctx context.Context, o *fanoutv1.TaskOutcome) *fanoutv1.TaskOutcome {
	stored, err := d.e.store.FinishTask(ctx, d.runID, o)
	if errors.Is(err, runs.ErrEnded) {
		// The replica that adopted the run ended the task; its outcome stands.
		d.e.cfg.Logger.InfoContext(ctx, "task ended elsewhere", "run_id", d.runID, "task_id", o.GetTaskId(), "err", err)
		return o
	}
	if err != nil {
		d.e.cfg.Logger.ErrorContext(ctx, "finish task", "run_id", d.runID, "task_id", o.GetTaskId(), "err", err)
		stored = o
	}
	countTask(ctx, o.GetStatus())
	d.event(ctx, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskFinished{TaskFinished: &fanoutv1.TaskFinished{Outcome: stored}}})
	return stored
}

// countTask counts a task that ended.
func countTask(ctx context.Context, st fanoutv1.TaskStatus) {
	metrics().tasksFinished.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(attrTaskStatus.String(runs.Text(st))))
}

// request builds the Execute request of task i; its dependencies' facts
// (all succeeded) go along as context.
func (d *driver) request(runCtx context.Context, i int, outcomes []*fanoutv1.TaskOutcome) *fanoutv1.Dispatch {
	spec := d.p.spec
	task := proto.CloneOf(spec.GetTasks()[i])
	task.MaxIterations = d.p.iterations[i]
	timeout := d.p.taskTimeouts[i]
	if dl, ok := runCtx.Deadline(); ok {
		timeout = max(time.Millisecond, min(timeout, time.Until(dl)))
	}
	task.Timeout = durationpb.New(timeout)
	var facts []*fanoutv1.Fact
	index := map[string]int{}
	for _, dep := range d.p.deps[i] {
		facts = mergeFacts(facts, index, outcomes[dep].GetSummary().GetFacts())
	}
	return &fanoutv1.Dispatch{
		RunId:                d.runID,
		TenantId:             d.p.tenantID,
		Task:                 task,
		Goal:                 spec.GetGoal(),
		TaskAccountId:        int64(d.accounts.Tasks[task.GetId()]),
		MinReservationTokens: d.p.minReservation,
		Model:                spec.GetModel(),
		OnExhaustion:         spec.GetOnExhaustion(),
		ContextFacts:         facts,
	}
}

// runTask dispatches task i to workers until one takes it, follows its
// stream, persists its outcome and reports the run's budget.
func (d *driver) runTask(runCtx context.Context, i int, first Worker, req *fanoutv1.Dispatch) *fanoutv1.TaskOutcome {
	taskCtx, cancel := context.WithTimeoutCause(runCtx, req.GetTask().GetTimeout().AsDuration(), errTaskTimeout)
	defer cancel()

	o := d.dispatch(taskCtx, first, req)
	o.TaskId, o.DispatchIndex = req.GetTask().GetId(), int32(i)

	ctx, cancelCleanup := context.WithTimeout(context.WithoutCancel(runCtx), cleanupTimeout)
	defer cancelCleanup()
	if o.GetSummary() == nil && o.GetWorker() != "" {
		// The stream was cut: what the task spent is in the ledger, once the
		// worker has settled what it held (briefly; a dead worker's leases
		// are left to the sweeper and counted at the run's end).
		o.TokensSpent = d.settledSpend(ctx, budget.AccountID(req.GetTaskAccountId()))
	}
	stored := d.finishTask(ctx, o)
	d.reportBudget(ctx, runCtx, false)
	return stored
}

// settledSpend reads a task account's spend once nothing is reserved on it,
// waiting up to settleWait for the worker to settle a cut-off call.
func (d *driver) settledSpend(ctx context.Context, id budget.AccountID) int64 {
	ctx, cancel := context.WithTimeout(ctx, settleWait)
	defer cancel()
	var spent int64
	for {
		acct, err := d.e.ledger.Account(ctx, id)
		if err == nil {
			spent = acct.Spent
			if acct.Reserved == 0 {
				return spent
			}
		}
		select {
		case <-ctx.Done():
			return spent
		case <-time.After(20 * time.Millisecond): // polling the ledger, bounded by settleWait
		}
	}
}

// settleWait bounds how long a cut-off task's spend is waited for.
const settleWait = 3 * time.Second

// budgetEvery spaces a run's BudgetUpdate events: without it a wide fan-out
// reads the run account and appends an event for every task that ends.
const budgetEvery = 100 * time.Millisecond

// reportBudget appends a BudgetUpdate with the run account as it is now,
// unless one went out less than budgetEvery ago (then it is owed, and
// force sends it at the run's end).
func (d *driver) reportBudget(ctx, runCtx context.Context, force bool) {
	d.mu.Lock()
	if !force && time.Since(d.lastBudget) < budgetEvery || force && !d.budgetOwed {
		d.budgetOwed = d.budgetOwed || !force
		d.mu.Unlock()
		return
	}
	d.lastBudget, d.budgetOwed = time.Now(), false
	d.mu.Unlock()
	acct, err := d.e.ledger.RunAccount(ctx, d.runID)
	if err != nil {
		d.e.cfg.Logger.WarnContext(ctx, "read run budget", "run_id", d.runID, "err", err)
		return
	}
	d.event(ctx, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_BudgetUpdate{BudgetUpdate: &fanoutv1.BudgetUpdate{Budget: snapshot(acct)}}})
	if acct.State == budget.StateExhausted {
		// The ledger said so before the watcher did; act now.
		d.onExhausted(runCtx, d.ar.cancel)
	}
}

// dispatch sends the task to the next worker, and to another one (up to
// MaxAttempts, with backoff) while workers refuse it (RESOURCE_EXHAUSTED)
// or cannot be reached (UNAVAILABLE) before they started it.
func (d *driver) dispatch(taskCtx context.Context, w Worker, req *fanoutv1.Dispatch) *fanoutv1.TaskOutcome {
	cfg := d.e.cfg
	backoff := cfg.RetryBackoff
	// Every worker gets two chances before the task fails: with most of the
	// pool full or gone, a fixed small bound fails tasks that one live
	// worker would take.
	attempts := max(cfg.MaxAttempts, 2*d.e.workers.Len())
	var lastErr error
	for attempt := 1; ; attempt++ {
		if taskCtx.Err() != nil {
			return d.notStarted(taskCtx, req.GetTask().GetId(), lastErr)
		}
		if attempt > 1 {
			w = d.e.workers.After(w)
		}
		r := proto.CloneOf(req)
		n, err := d.beginAttempt(taskCtx, budget.AccountID(req.GetTaskAccountId()))
		if err != nil {
			return d.attemptRefused(taskCtx, req.GetTask().GetId(), err)
		}
		r.Attempt = n
		o, retry, err := d.execute(taskCtx, w, r)
		if !retry {
			return o
		}
		lastErr = err
		if attempt >= attempts {
			return &fanoutv1.TaskOutcome{Status: fanoutv1.TaskStatus_TASK_STATUS_FAILED,
				Summary: &fanoutv1.FactSummary{Status: fanoutv1.TaskStatus_TASK_STATUS_FAILED,
					Error: fmt.Sprintf("no worker took the task in %d attempts: %v", attempt, err)}}
		}
		cfg.Logger.InfoContext(taskCtx, "worker refused task; sending it elsewhere", "run_id", d.runID,
			"task_id", req.GetTask().GetId(), "worker", w.Addr, "attempt", attempt, "err", err)
		t := time.NewTimer(backoff)
		select {
		case <-taskCtx.Done():
			t.Stop()
		case <-t.C:
		}
		backoff = min(2*backoff, maxRetryBackoff)
	}
}

// envelope signs d for a worker: the worker runs exactly the bytes signed.
func (e *Engine) envelope(d *fanoutv1.Dispatch) (*fanoutv1.ExecuteRequest, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("encode dispatch of task %s: %w", d.GetTask().GetId(), err)
	}
	return &fanoutv1.ExecuteRequest{Dispatch: b, Signature: e.signer.SignDispatch(b), KeyId: e.signer.KeyID()}, nil
}

// beginAttempt records a new dispatch of the task (or synthesis) whose
// ledger account is acct and returns its attempt number: from now on only
// that attempt can reserve on it (an earlier one is fenced). A transient
// database error is retried with backoff until ctx (the task's deadline)
// ends; a refusal (the run ended, the account is not the run's) is not.
func (d *driver) beginAttempt(ctx context.Context, acct budget.AccountID) (int32, error) {
	backoff := d.e.cfg.RetryBackoff
	for {
		actx, cancel := context.WithTimeout(ctx, cleanupTimeout)
		n, err := d.e.ledger.BeginAttempt(actx, acct, d.runID, d.p.tenantID)
		cancel()
		switch {
		case err == nil:
			return int32(min(n, math.MaxInt32)), nil
		case errors.Is(err, budget.ErrExhausted), errors.Is(err, budget.ErrDenied), errors.Is(err, budget.ErrNotFound):
			return 0, err
		}
		d.e.cfg.Logger.WarnContext(ctx, "begin task attempt; retrying", "run_id", d.runID, "account", acct,
			"backoff", backoff, "err", err)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, err
		case <-t.C:
		}
		backoff = min(2*backoff, maxRetryBackoff)
	}
}

// attemptRefused is the outcome of a task the ledger would not let start:
// its run ended (exhausted, cancelled) before the dispatch, its context
// ended while the ledger could not be reached, or the ledger refused it.
func (d *driver) attemptRefused(taskCtx context.Context, taskID string, err error) *fanoutv1.TaskOutcome {
	var ex *budget.ExhaustedError
	switch {
	case errors.As(err, &ex):
		st := fanoutv1.TaskStatus_TASK_STATUS_CANCELLED
		if ex.State == budget.StateExhausted {
			st = fanoutv1.TaskStatus_TASK_STATUS_BUDGET_EXHAUSTED
		}
		return &fanoutv1.TaskOutcome{Status: st} // it never ran: no summary
	case taskCtx.Err() != nil:
		return d.notStarted(taskCtx, taskID, err)
	}
	d.e.cfg.Logger.ErrorContext(taskCtx, "begin task attempt", "run_id", d.runID, "task_id", taskID, "err", err)
	return &fanoutv1.TaskOutcome{Status: fanoutv1.TaskStatus_TASK_STATUS_FAILED,
		Summary: &fanoutv1.FactSummary{Status: fanoutv1.TaskStatus_TASK_STATUS_FAILED,
			Error: "internal error: the ledger refused to record the dispatch (see the orchestrator's log)"}}
}

// maxRetryBackoff caps the wait between two attempts to dispatch a task.
const maxRetryBackoff = 2 * time.Second

// notStarted is the outcome of a task whose context ended before a worker
// started it.
func (d *driver) notStarted(taskCtx context.Context, taskID string, lastErr error) *fanoutv1.TaskOutcome {
	st := causeStatus(context.Cause(taskCtx))
	if st == fanoutv1.TaskStatus_TASK_STATUS_TIMED_OUT && !errors.Is(context.Cause(taskCtx), errTaskTimeout) {
		st = fanoutv1.TaskStatus_TASK_STATUS_CANCELLED // the run timed out before the task started
	}
	if lastErr != nil {
		d.e.cfg.Logger.InfoContext(taskCtx, "task ended before a worker took it", "run_id", d.runID,
			"task_id", taskID, "cause", context.Cause(taskCtx), "last_worker_error", lastErr)
	}
	return &fanoutv1.TaskOutcome{Status: st} // it never ran: no summary
}

// causeStatus maps a task context's cause to the task's status.
func causeStatus(cause error) fanoutv1.TaskStatus {
	switch {
	case errors.Is(cause, budget.ErrExhausted):
		return fanoutv1.TaskStatus_TASK_STATUS_BUDGET_EXHAUSTED
	case errors.Is(cause, errTaskTimeout), errors.Is(cause, errRunTimeout):
		return fanoutv1.TaskStatus_TASK_STATUS_TIMED_OUT
	default:
		return fanoutv1.TaskStatus_TASK_STATUS_CANCELLED
	}
}

// workerHears reports whether a worker learns of cause by itself (through
// the ledger or its own deadline), so that it can be given CancelGrace to
// send its summary before the call is cut.
func workerHears(cause error) bool {
	return errors.Is(cause, budget.ErrExhausted) || errors.Is(cause, budget.ErrRunCancelled) ||
		errors.Is(cause, errTaskTimeout) || errors.Is(cause, errRunTimeout)
}

// execute runs the task on one worker. retry reports that the worker
// refused or could not be reached before it started the task.
func (d *driver) execute(taskCtx context.Context, w Worker, req *fanoutv1.Dispatch) (o *fanoutv1.TaskOutcome, retry bool, err error) {
	cfg := d.e.cfg
	// The call outlives taskCtx by up to CancelGrace when the worker hears
	// the cancel by itself, so that its summary (what it found before it
	// stopped) still arrives.
	callCtx, cutCall := context.WithCancelCause(context.WithoutCancel(taskCtx))
	defer cutCall(nil)
	streamDone := make(chan struct{})
	afterDone := make(chan struct{})
	stop := context.AfterFunc(taskCtx, func() {
		defer close(afterDone)
		cause := context.Cause(taskCtx)
		if workerHears(cause) && cfg.CancelGrace > 0 {
			t := time.NewTimer(cfg.CancelGrace)
			defer t.Stop()
			select {
			case <-streamDone:
			case <-t.C:
			}
		}
		cutCall(cause)
	})
	defer func() {
		close(streamDone)
		if !stop() {
			<-afterDone
		}
	}()

	env, err := d.e.envelope(req)
	if err != nil {
		return d.callFailed(taskCtx, callCtx, w, false, err)
	}
	stream, err := w.Client.Execute(callCtx, env)
	if err != nil {
		return d.callFailed(taskCtx, callCtx, w, false, err)
	}
	worker := ""
	for {
		msg, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("worker closed the stream without a summary")
			}
			o, retry, err := d.callFailed(taskCtx, callCtx, w, worker != "", err)
			if o != nil { // nil: refused before it started, to be sent elsewhere
				o.Worker = worker
			}
			return o, retry, err
		}
		switch ev := msg.GetEvent().(type) {
		case *fanoutv1.ExecuteResponse_Started:
			worker = cmpOr(ev.Started.GetWorker(), w.Addr)
			ctx, cancel := context.WithTimeout(context.WithoutCancel(taskCtx), cleanupTimeout)
			_, err := d.e.store.StartTask(ctx, d.runID, req.GetTask().GetId(), worker)
			switch {
			case errors.Is(err, runs.ErrEnded): // ended by the replica that adopted the run
				cfg.Logger.InfoContext(ctx, "task ended elsewhere", "run_id", d.runID, "task_id", req.GetTask().GetId(), "err", err)
			case err != nil:
				cfg.Logger.ErrorContext(ctx, "start task", "run_id", d.runID, "task_id", req.GetTask().GetId(), "err", err)
			}
			if !errors.Is(err, runs.ErrEnded) {
				d.event(ctx, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskStarted{TaskStarted: &fanoutv1.TaskStarted{
					TaskId: req.GetTask().GetId(), Worker: worker}}})
			}
			cancel()
		case *fanoutv1.ExecuteResponse_Iteration:
			ctx, cancel := context.WithTimeout(context.WithoutCancel(taskCtx), cleanupTimeout)
			d.event(ctx, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskIteration{TaskIteration: &fanoutv1.TaskIteration{
				TaskId: req.GetTask().GetId(), Iteration: ev.Iteration.GetIteration(), TokensSpent: ev.Iteration.GetTokensSpent(),
				ToolCalls: ev.Iteration.GetToolCalls()}}})
			cancel()
		case *fanoutv1.ExecuteResponse_Summary:
			s := ev.Summary
			st := s.GetStatus()
			if st == fanoutv1.TaskStatus_TASK_STATUS_UNSPECIFIED || st == fanoutv1.TaskStatus_TASK_STATUS_PENDING ||
				st == fanoutv1.TaskStatus_TASK_STATUS_RUNNING || st == fanoutv1.TaskStatus_TASK_STATUS_SKIPPED {
				s.Error = fmt.Sprintf("worker reported non-terminal status %s; %s", st, s.GetError())
				st = fanoutv1.TaskStatus_TASK_STATUS_FAILED
				s.Status = st
			}
			return &fanoutv1.TaskOutcome{Status: st, Summary: s, TokensSpent: s.GetTokensSpent(),
				Worker: cmpOr(worker, w.Addr)}, false, nil
		}
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// callFailed maps a failed Execute call to an outcome.
func (d *driver) callFailed(taskCtx, callCtx context.Context, w Worker, started bool, err error) (*fanoutv1.TaskOutcome, bool, error) {
	if callCtx.Err() != nil {
		// We cut the call: the task's context ended.
		cause := context.Cause(callCtx)
		st := causeStatus(cause)
		if !started {
			return d.notStarted(taskCtx, "", nil), false, err
		}
		return &fanoutv1.TaskOutcome{Status: st, Summary: nil}, false, err
	}
	code := status.Code(err)
	if !started && (code == codes.ResourceExhausted || code == codes.Unavailable) {
		return nil, true, err
	}
	msg := fmt.Sprintf("worker %s failed: %v", w.Addr, err)
	if !started {
		msg = fmt.Sprintf("worker %s refused the task: %v", w.Addr, err)
	}
	return &fanoutv1.TaskOutcome{Status: fanoutv1.TaskStatus_TASK_STATUS_FAILED,
		Summary: &fanoutv1.FactSummary{Status: fanoutv1.TaskStatus_TASK_STATUS_FAILED, Error: msg}}, false, err
}
