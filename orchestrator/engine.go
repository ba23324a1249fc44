package orchestrator

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

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
	// Tenants reads tenants' quotas; nil: no tenant has any.
	Tenants TenantStore
	// Slots bounds tenants' tasks in flight; nil: unbounded.
	Slots TaskSlots
	// Priors keeps what tenants' tasks cost in earlier runs (store.Runs);
	// nil: a run's first tasks are forecast from their token_budget.
	Priors TaskPriors
	// Approvals lists and decides the writes that wait for approval
	// (store.ToolCalls), and lists a run's writes; nil: the approval RPCs
	// and ListToolCalls are UNIMPLEMENTED.
	Approvals Approvals
	// Spend reads a tenant's spend in money (store.Spending); nil: GetSpend
	// is UNIMPLEMENTED.
	Spend SpendReader
	// RateLimits reads the providers' rate limits, to size the concurrency
	// of runs that leave it unset (concurrency.go); nil: they run at
	// Config.DefaultConcurrency.
	RateLimits RateLimits
	// Events tells WatchRun's followers of the events other nodes write
	// (store.Notifier); nil: they poll every Config.WatchPollInterval.
	Events EventNotices
	// Recorded reads tenants' recorded tasks for ForkRun and the result
	// cache (store.Runs); nil: ForkRun and RunSpec.cache.task_max_age are
	// UNIMPLEMENTED.
	Recorded RecordedTasks
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
	tenants TenantStore
	priors  TaskPriors
	slots   TaskSlots
	appr    Approvals
	spend   SpendReader
	records RecordedTasks
	limits  RateLimits
	// rates is the one view of limits shared by the runs sized from them
	// (nil when limits is).
	rates *rateReads
	cfg   Config

	// base is the context of every run this engine drives: the engine's
	// lifetime, not any RPC's. Shutdown cancels it with errShutdown.
	base       context.Context
	cancelBase context.CancelCauseFunc
	wg         sync.WaitGroup // one per driven run and per run being adopted

	// stopBeat stops the heartbeat loop (lease.go), which closes beatDone.
	stopBeat context.CancelFunc
	beatDone chan struct{}
	// born and leaseFrom time the leases this engine holds (leaseHeld):
	// leaseFrom is when the last heartbeat that succeeded was sent, in
	// nanoseconds of the monotonic clock since born.
	born      time.Time
	leaseFrom atomic.Int64

	// followers are the runs streamed from this node, with their poller
	// and their listener of notifications (watch.go); stopPoll stops both,
	// which closes pollDone.
	followers *followers
	stopPoll  context.CancelFunc
	pollDone  chan struct{}

	mu       sync.Mutex
	closing  bool
	active   map[string]*activeRun // driven, or adopted and being ended
	adopting int                   // adopted runs being taken over (resumed or ended)
}

// activeRun is a run this engine drives (or ends, having adopted it).
type activeRun struct {
	cancel context.CancelCauseFunc
	// lostCh is closed once another replica owns the run: this one
	// abandons it and writes nothing more for it.
	lostOnce sync.Once
	lostCh   chan struct{}
}

func newActiveRun(cancel context.CancelCauseFunc) *activeRun {
	return &activeRun{cancel: cancel, lostCh: make(chan struct{})}
}

// lose abandons the run: another replica adopted it.
func (ar *activeRun) lose() {
	ar.lostOnce.Do(func() { close(ar.lostCh) })
	ar.cancel(errRunLost)
}

// isLost reports whether the run was abandoned to another replica (lose).
func (ar *activeRun) isLost() bool {
	select {
	case <-ar.lostCh:
		return true
	default:
		return false
	}
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
		tenants:    p.Tenants,
		slots:      p.Slots,
		priors:     p.Priors,
		appr:       p.Approvals,
		spend:      p.Spend,
		records:    p.Recorded,
		limits:     p.RateLimits,
		cfg:        p.Config.withDefaults(),
		base:       base,
		cancelBase: cancel,
		stopBeat:   stopBeat,
		beatDone:   make(chan struct{}),
		active:     map[string]*activeRun{},
		born:       time.Now(),
	}
	if e.limits != nil {
		e.rates = newRateReads(base, e.limits, e.cfg.ConcurrencyInterval, e.cfg.Logger)
	}
	go e.heartbeat(beatCtx)
	e.startFollowers(p.Events)
	return e, nil
}

// startFollowers starts the followers' poller and, with events, their
// listener: notifications then carry what other nodes write, and the poll
// is the fallback (watch.go).
func (e *Engine) startFollowers(events EventNotices) {
	ctx, stopPoll := context.WithCancel(context.Background())
	interval := e.cfg.WatchPollInterval
	if events != nil {
		interval = e.cfg.WatchFallbackPoll
	}
	e.followers = newFollowers(e.store, interval, func(err error) {
		e.cfg.Logger.Warn("read the heads of followed runs", "err", err)
	})
	e.stopPoll, e.pollDone = stopPoll, make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { e.followers.poll(ctx) })
	if events != nil {
		wg.Go(func() {
			if err := events.ListenEvents(ctx, e.followers.resync, e.followers.moved); err != nil {
				e.cfg.Logger.Warn("followers hear no notifications: other nodes' events reach them by the poll alone",
					"poll", interval, "err", err)
			}
		})
	}
	go func() {
		defer close(e.pollDone)
		wg.Wait()
	}()
}

// Config returns the engine's configuration with defaults applied.
func (e *Engine) Config() Config { return e.cfg }

// Submit validates spec, then creates the run (persisted, with its ledger
// accounts) and starts driving it in the background, or returns the run
// the tenant already has under spec's idempotency key (created false).
//
// Returns a budget.ValidationErrors before anything is written, ErrSpecMismatch
// when the key was used with a different spec, ErrShuttingDown after
// Shutdown began.
func (e *Engine) Submit(ctx context.Context, spec *fanoutv1.RunSpec) (run *fanoutv1.Run, created bool, err error) {
	run, created, _, err = e.submit(ctx, spec, nil, false)
	return run, created, err
}

// submit is Submit, and a fork's start when src is set: the tasks that
// reuse recorded facts (reuse.go) are stored ended with the run. With
// reserveQuote (StartRunRequest.reserve_quote) the run is quoted first and
// starts only if its tenant's available tokens cover min(forecast, limit)
// (docs/budget.md#quotes), else it is a *QuoteNotCoveredError; the quote
// is returned either way.
func (e *Engine) submit(ctx context.Context, spec *fanoutv1.RunSpec, src *forkSource,
	reserveQuote bool) (run *fanoutv1.Run, created bool, q *fanoutv1.Quote, err error) {
	spec = known(spec)
	p, err := e.cfg.callerPlan(spec)
	if err != nil {
		return nil, false, nil, err
	}
	if e.isClosing() {
		return nil, false, nil, ErrShuttingDown
	}
	if err := e.checkTenant(ctx, p, false); err != nil {
		// A retry of the call that created a run is answered with that run
		// whatever admission would say of a new one now.
		if run, ferr := e.store.RunByKey(ctx, p.tenantID, spec.GetIdempotencyKey()); ferr == nil {
			run, created, err := e.existing(run, spec)
			return run, created, nil, err
		}
		return nil, false, nil, err
	}
	e.sizeFirst(ctx, p)
	if reserveQuote {
		if q, err = e.reserveQuote(ctx, p); err != nil {
			if run, ferr := e.store.RunByKey(ctx, p.tenantID, spec.GetIdempotencyKey()); ferr == nil {
				run, created, err := e.existing(run, spec)
				return run, created, q, err
			}
			return nil, false, q, err
		}
	}
	start := time.Now()
	// Once the run row exists, finish creating it even if the caller leaves.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	// The run, its ledger accounts, its RunStarted, its first wave's
	// TaskQueued and the attempts of the tasks that can start at once: one
	// write.
	runID := newRunID()
	draft, keys, err := e.draftReusing(ctx, runID, p, src)
	if err != nil {
		return nil, false, nil, err
	}
	sched := newScheduler(p.deps)
	replayReused(sched, draft.GetTasks())
	ready := sched.Ready()
	var begin []string
	for _, i := range ready[:min(len(ready), p.concurrency)] {
		begin = append(begin, p.spec.GetTasks()[i].GetId())
	}
	run, accounts, created, err := e.store.OpenRun(ctx, draft, e.cfg.Node, openRunParams(runID, p),
		e.cfg.toolPolicy(p.spec), keys, begin, queuedEvents(p, ready))
	if err != nil {
		return nil, false, nil, err
	}
	if !created {
		run, created, err := e.existing(run, spec)
		return run, created, q, err
	}
	e.wake(runID)
	span := e.startRunSpan(ctx, start, runID, p)
	ctx = trace.ContextWithSpan(ctx, span) // the ledger and store calls below are the run's
	run.Budget = runs.Snapshot(accounts.Run)
	if err := e.start(ctx, run, p, accounts, span); err != nil {
		return nil, false, nil, err
	}
	return run, true, q, nil
}

// existing answers a StartRun whose idempotency key names run: run itself
// when spec is the spec it was created with, else ErrSpecMismatch.
func (e *Engine) existing(run *fanoutv1.Run, spec *fanoutv1.RunSpec) (*fanoutv1.Run, bool, error) {
	if !proto.Equal(run.GetSpec(), spec) {
		return nil, false, fmt.Errorf("run %s: %w", run.GetRunId(), ErrSpecMismatch)
	}
	return run, false, nil
}

// known returns a copy of spec without the fields this server does not
// know (a caller built against a newer fanout.proto may send some). The
// store keeps specs as protojson, which has no place for them, so the spec
// that is planned, stored, compared with an idempotent retry and executed
// is this one.
func known(spec *fanoutv1.RunSpec) *fanoutv1.RunSpec {
	if spec == nil {
		return nil
	}
	spec = proto.CloneOf(spec)
	dropUnknown(spec.ProtoReflect())
	return spec
}

func dropUnknown(m protoreflect.Message) {
	m.SetUnknown(nil)
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i, l := 0, v.List(); i < l.Len(); i++ {
				dropUnknown(l.Get(i).Message())
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				dropUnknown(mv.Message())
				return true
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			dropUnknown(v.Message())
		}
		return true
	})
}

// draftRun is a new run of plan p, RUNNING, every task PENDING.
func draftRun(runID string, p *plan) *fanoutv1.Run {
	spec := p.spec
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
	return draft
}

// toolPolicy is the run's tool policy, recorded with it: every tool its
// tasks allow, with its approval rule.
func (c Config) toolPolicy(spec *fanoutv1.RunSpec) []runs.ToolPolicy {
	var out []runs.ToolPolicy
	seen := map[string]bool{}
	for _, t := range spec.GetTasks() {
		for _, name := range t.GetAllowedTools() {
			if seen[name] {
				continue
			}
			seen[name] = true
			rule := c.ToolRules[name]
			p := runs.ToolPolicy{Tool: name, Approval: rule.Approval}
			if rule.Approval {
				p.ApprovalTimeout = rule.ApprovalTimeout
			}
			out = append(out, p)
		}
	}
	if spec.GetFanOut() != nil && !seen[runs.FanOutTool] {
		// The worker records each fan_out call as it records a write (a
		// run with a policy denies a tool it does not name). It waits for
		// no approval: what the child's tasks write does.
		out = append(out, runs.ToolPolicy{Tool: runs.FanOutTool})
	}
	return out
}

// openRunParams are the ledger accounts of run runID planned as p.
func openRunParams(runID string, p *plan) budget.OpenRunParams {
	// Each task's account is a slice of the run's budget, as large as the
	// task is forecast to need before any task has answered, and no larger
	// than an even share of the budget among the tasks that start at once,
	// nor, under a tenant budget, of half what the tenant had left (other
	// runs of the tenant carve from it too): what it may reserve without
	// touching the run's account (docs/ledger.md#budget-slices).
	f := newForecaster(p, p.spec.GetBudget().GetLimitTokens(), p.synthesisHeld)
	wave := int64(max(1, min(len(p.spec.GetTasks()), p.concurrency)))
	room := f.budget
	if p.tenantAccount != 0 {
		room = min(room, p.tenantAvailable/2)
	}
	share := max(room/wave, p.minReservation)
	tasks := make([]budget.TaskBudget, len(p.spec.GetTasks()))
	for i, t := range p.spec.GetTasks() {
		tasks[i] = budget.TaskBudget{TaskID: t.GetId(), Limit: t.GetTokenBudget(), Slice: min(f.need(i), share)}
	}
	return budget.OpenRunParams{
		RunID:          runID,
		TenantID:       p.tenantID,
		TenantAccount:  p.tenantAccount,
		Limit:          p.spec.GetBudget().GetLimitTokens(),
		MinReservation: p.minReservation,
		Tasks:          tasks,
		Held:           p.synthesisHeld,
	}
}

// start registers the run as driven here and starts its driver, unless
// Shutdown began (then the run ends CANCELLED).
func (e *Engine) start(ctx context.Context, run *fanoutv1.Run, p *plan, accounts budget.RunAccounts, span trace.Span) error {
	runID := run.GetRunId()
	runCtx, cancelRun := context.WithCancelCause(trace.ContextWithSpan(e.base, span))
	ar := newActiveRun(cancelRun)
	e.mu.Lock()
	if e.closing {
		e.mu.Unlock()
		cancelRun(errShutdown)
		// Its ledger run closed and its end in one write, as endRun does (a
		// run this engine just created has changed hands 0 times).
		closing, err := e.store.CloseRun(ctx, runID, e.cfg.Node, 0, fanoutv1.RunState_RUN_STATE_CANCELLED,
			errShutdown.Error(), join(run.GetTasks()))
		if e.finished(ctx, runID, fanoutv1.RunState_RUN_STATE_CANCELLED, closing, err) && p.tree.parentRunID != "" {
			e.childEnded(ctx, runID, fanoutv1.RunState_RUN_STATE_CANCELLED, join(run.GetTasks()))
		}
		endRunSpan(span, fanoutv1.RunState_RUN_STATE_CANCELLED, errShutdown.Error(), errShutdown, nil, nil)
		return ErrShuttingDown
	}
	e.active[runID] = ar
	e.wg.Add(1)
	e.mu.Unlock()

	e.cfg.Logger.InfoContext(ctx, "run started", "run_id", runID, "tenant_id", p.tenantID,
		"tasks", len(p.spec.GetTasks()), "limit_tokens", p.spec.GetBudget().GetLimitTokens())
	d := newDriver(e, p, runID, accounts, ar, span)
	d.queued = true // OpenRun wrote the first wave's TaskQueued
	d.restoreReused(ctx, run.GetTasks())
	go func() {
		defer e.wg.Done()
		d.drive(runCtx, cancelRun)
	}()
	return nil
}

func (e *Engine) isClosing() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closing
}

// forget removes a run that this engine no longer drives or ends.
func (e *Engine) forget(runID string) {
	e.mu.Lock()
	delete(e.active, runID)
	e.mu.Unlock()
}

// forgetOwn is forget for the driver of ar: it leaves alone a later
// driver of the same run (a continuation that reopened it here while
// this one was ending).
func (e *Engine) forgetOwn(runID string, ar *activeRun) {
	e.mu.Lock()
	if e.active[runID] == ar {
		delete(e.active, runID)
	}
	e.mu.Unlock()
}

// newRunID returns a random (version 4) UUID.
func newRunID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
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

// wake tells this node's followers of the run that it has new events.
func (e *Engine) wake(runID string) { e.followers.wake(runID) }

// Get returns a run with its budget as the ledger has it now. An empty
// tenantID matches any tenant. Returns runs.ErrNotFound for an unknown run.
func (e *Engine) Get(ctx context.Context, tenantID, runID string) (*fanoutv1.Run, error) {
	run, err := e.store.GetRun(ctx, tenantID, runID)
	if err != nil {
		return nil, err
	}
	if acct, err := e.ledger.RunAccount(ctx, runID); err == nil {
		run.Budget = runs.Snapshot(acct)
	} else if !errors.Is(err, budget.ErrNotFound) {
		return nil, err
	}
	if err := e.lastConcurrency(ctx, run); err != nil {
		return nil, err
	}
	return run, nil
}

// List returns summaries of up to limit of tenantID's runs in state (any
// for UNSPECIFIED), newest first, before (beforeCreated, beforeID) when
// beforeCreated is not zero (RunStore.ListRuns). Budgets come from the
// store's one query on the API's pool: no per-run ledger read on the
// ledger's.
func (e *Engine) List(ctx context.Context, tenantID string, state fanoutv1.RunState, beforeCreated time.Time,
	beforeID string, limit int) ([]*fanoutv1.Run, error) {
	return e.store.ListRuns(ctx, tenantID, state, beforeCreated, beforeID, limit)
}

// Tasks returns up to limit of tenantID's run runID's task outcomes in
// dispatch order from dispatch index from, and how many tasks it has
// (RunStore.RunTasks). Returns runs.ErrNotFound for an unknown run.
func (e *Engine) Tasks(ctx context.Context, tenantID, runID string, from, limit int) ([]*fanoutv1.TaskOutcome, int, error) {
	return e.store.RunTasks(ctx, tenantID, runID, from, limit)
}

// Facts returns up to limit of the facts of tenantID's run runID's joined
// result from index from, and how many it has (RunStore.RunFacts).
// Returns runs.ErrNotFound for an unknown run.
func (e *Engine) Facts(ctx context.Context, tenantID, runID string, from, limit int) ([]*fanoutv1.Fact, int, error) {
	return e.store.RunFacts(ctx, tenantID, runID, from, limit)
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
		if e.rates != nil {
			e.rates.wait() // the runs released their limits: their reading loops end
		}
		close(done)
	}()
	// The heartbeat keeps the runs' leases until they have ended.
	defer e.stopHeartbeat()
	defer e.stopFollowers()
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

// stopFollowers stops the followers' poller and waits for it. Idempotent.
func (e *Engine) stopFollowers() {
	e.stopPoll()
	<-e.pollDone
}
