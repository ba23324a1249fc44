package orchestrator

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

// Nested fan-out (docs/budget.md#nested-fan-out). A subagent of a run whose
// spec sets fan_out may call the worker's built-in tool fan_out. The worker
// records the call (a tool_call row, as a write is: at most once, and a
// re-dispatched attempt takes it up under the same key) and streams a
// SubagentFanOut; the driver of the task's run opens a child run under the
// task (childOpen: the run row, its ledger accounts carved from the task by
// ledger_open_child_run, its first events, one write) and starts driving
// it, here. When the child ends, whoever ends it (its driver, or the
// orchestrator that adopted it) settles its funding on the parent task and
// answers the call's row with the child's joined facts (childEnded); the
// worker, polling the row, hands them to its model as the tool's result.
//
// The child's run id is derived from the call's key, so the same call
// asked twice opens one child. Its spec is the parent's, one level down:
// the same tenant, model, exhaustion policy and tools as the calling task,
// fan_out with one level fewer (none at the last), a budget of what the
// call asked (at most what the task has left: the ledger grants it), and a
// run timeout of what the calling task has left.

// Limits of RunSpec.fan_out (proto comments).
const (
	maxFanOutDepth       = 4
	defaultMaxChildTasks = 8
	maxMaxChildTasks     = 64
	defaultMaxTreeTasks  = 256
	maxMaxTreeTasks      = 4096
	// A fan_out call's goal and each of its tasks, in bytes.
	maxChildTextBytes = 4096
	// maxCallKeyBytes is tool_call.key's limit.
	maxCallKeyBytes = 256
	// childKeyPrefix starts every child run's idempotency key; a caller's
	// may not (submit).
	childKeyPrefix = "child:"
	// maxChildAnswerBytes caps the answer a child's end writes into its
	// call's row: the joined facts, one a line, cut at a line (the rest
	// stays readable with ListRunFacts of the child run).
	maxChildAnswerBytes = 8192
)

func maxChildTasks(f *fanoutv1.FanOut) int {
	return int(cmp.Or(f.GetMaxChildTasks(), defaultMaxChildTasks))
}

func maxTreeTasks(f *fanoutv1.FanOut) int {
	return int(cmp.Or(f.GetMaxTreeTasks(), defaultMaxTreeTasks))
}

// checkFanOut checks spec.fan_out.
func checkFanOut(v *validator, spec *fanoutv1.RunSpec) {
	f := spec.GetFanOut()
	if f == nil {
		return
	}
	if d := f.GetMaxDepth(); d < 1 || d > maxFanOutDepth {
		v.add("spec.fan_out.max_depth", "must be 1 to %d, got %d", maxFanOutDepth, d)
	}
	if n := f.GetMaxChildTasks(); n > maxMaxChildTasks {
		v.add("spec.fan_out.max_child_tasks", "must be at most %d, got %d", maxMaxChildTasks, n)
	}
	switch n := f.GetMaxTreeTasks(); {
	case n > maxMaxTreeTasks:
		v.add("spec.fan_out.max_tree_tasks", "must be at most %d, got %d", maxMaxTreeTasks, n)
	case maxTreeTasks(f) < len(spec.GetTasks()):
		v.add("spec.fan_out.max_tree_tasks", "must be at least the run's own %d tasks, got %d", len(spec.GetTasks()),
			maxTreeTasks(f))
	}
	for i, t := range spec.GetTasks() {
		if t.GetHedge() != nil {
			v.add(fmt.Sprintf("spec.tasks[%d].hedge", i), "a task of a run whose subagents fan out cannot be hedged: "+
				"its second attempt would fan out again")
		}
	}
}

// tree is where a run stands in its tree of child runs.
type tree struct {
	parentRunID  string // "" for a root run
	parentTaskID string
	rootRunID    string // "" for a root run: itself
	depth        int32
}

// treeOf is where the stored run stands.
func treeOf(run *fanoutv1.Run) tree {
	if run.GetParentRunId() == "" {
		return tree{}
	}
	return tree{parentRunID: run.GetParentRunId(), parentTaskID: run.GetParentTaskId(), rootRunID: run.GetRootRunId(),
		depth: run.GetDepth()}
}

// root is the root run of the run runID standing at t.
func (t tree) root(runID string) string { return cmp.Or(t.rootRunID, runID) }

// childRunID derives a child run's id from its fan_out call's key: a UUID
// (version 8, name-based) of the key's SHA-256.
func childRunID(callKey string) string {
	b := sha256.Sum256([]byte("fanout.v1.child_run\x00" + callKey))
	b[6] = b[6]&0x0f | 0x80
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// errFanOutRefused marks a fan_out call the orchestrator refused: its
// answer says why, to the model.
var errFanOutRefused = errors.New("fan_out refused")

// errNotNow marks a fan_out call this orchestrator leaves unanswered for
// now (it is shutting down): the task's next attempt asks again.
var errNotNow = errors.New("fan_out not answered now")

func refuseFanOut(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errFanOutRefused, fmt.Sprintf(format, args...))
}

// fanOut answers task i's fan_out call f, made by its attempt attempt: it
// opens and starts the child run, or answers the call with why not.
// streamCtx is the dispatch's context (the Execute stream's reader runs
// this before it reads on): its deadline is the task's. Joining a child
// that has ended settles its funding here, which can hold that reader up
// to HeldWait while the worker, waiting for the answer, sends nothing.
func (d *driver) fanOut(streamCtx context.Context, i int, attempt int32, f *fanoutv1.SubagentFanOut) {
	deadline, _ := streamCtx.Deadline()
	ctx, cancel := cleanup(streamCtx)
	defer cancel()
	taskID := d.p.spec.GetTasks()[i].GetId()
	key := f.GetKey()
	log := d.e.cfg.Logger.With("run_id", d.runID, "task_id", taskID)
	cc, ok := d.e.store.(ChildCalls)
	if !ok {
		return
	}
	// What the worker sends is not trusted: only a fan_out call of this
	// very task, recorded and not answered yet, is answered. The
	// orchestrator's login may resolve any call; a key of another task's
	// (or tenant's) is dropped, unanswered.
	if !strings.HasPrefix(key, d.runID+"/"+taskID+"/a") || len(key) > maxCallKeyBytes {
		log.WarnContext(ctx, "fan_out for a call that is not the task's; ignored", "key_bytes", len(key))
		return
	}
	switch found, issued, err := cc.FanOutCall(ctx, d.runID, taskID, key); {
	case err != nil:
		// Unanswered: the task waits, and its next attempt asks again.
		log.ErrorContext(ctx, "read a fan_out call", "err", err)
		return
	case !found:
		log.WarnContext(ctx, "fan_out for a call the task never recorded; ignored")
		return
	case !issued:
		return // answered already
	}
	d.mu.Lock()
	if d.children == nil {
		d.children = map[int]bool{}
	}
	d.children[i] = true
	d.mu.Unlock()
	// Asked again (an attempt dispatched again takes up its call): the
	// child is there, and is never refused, whatever is left of the task.
	switch run, err := d.e.store.ReadRun(ctx, childRunID(key)); {
	case err == nil:
		d.e.joinChild(ctx, run, d.runID, taskID)
		return
	case !errors.Is(err, runs.ErrNotFound):
		log.ErrorContext(ctx, "read a fan_out call's child run", "err", err)
		return
	}
	child, err := d.openChild(ctx, i, attempt, f, deadline)
	switch {
	case errors.Is(err, errFanOutRefused):
		log.InfoContext(ctx, "fan_out refused", "err", err)
		d.e.answerCall(ctx, d.runID, taskID, key, "", strings.TrimPrefix(err.Error(), errFanOutRefused.Error()+": "))
		return
	case errors.Is(err, errNotNow):
		// Left unanswered: the task's next attempt (on the orchestrator
		// that takes the run over) asks again.
		log.InfoContext(ctx, "fan_out not answered here", "err", err)
		return
	case err != nil:
		log.ErrorContext(ctx, "open a child run", "err", err)
		// The open may have committed with its reply lost: then the
		// child is there, and is adopted and driven once its lease
		// lapses; its end answers the call. Else the call fails.
		if run, rerr := d.e.store.ReadRun(ctx, childRunID(key)); rerr == nil {
			d.e.joinChild(ctx, run, d.runID, taskID)
			return
		} else if !errors.Is(rerr, runs.ErrNotFound) {
			return // unknown: left issued, for the next attempt to ask again
		}
		d.e.answerCall(ctx, d.runID, taskID, key, "",
			"could not open the child run (an internal error; see the orchestrator's log): try again later")
		return
	}
	if child == nil {
		return // asked twice at once: the other ask opened it
	}
	d.event(ctx, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_ChildRunStarted{ChildRunStarted: &fanoutv1.ChildRunStarted{
		TaskId: taskID, ChildRunId: child.GetRunId(), TaskCount: int32(len(child.GetTasks())),
		LimitTokens: child.GetBudget().GetLimitTokens(), Depth: child.GetDepth()}}})
}

// openChild opens and starts the child run task i's call f asks for, or
// returns nil when the call's child exists already (answering the call
// again if it has ended), or why it cannot be had.
func (d *driver) openChild(ctx context.Context, i int, attempt int32, f *fanoutv1.SubagentFanOut, deadline time.Time) (*fanoutv1.Run, error) {
	e := d.e
	// What the task has left of its token_budget: a child may have all
	// but what the task keeps to answer with (parentKeeps).
	taskID := d.p.spec.GetTasks()[i].GetId()
	acct, err := e.ledger.Account(ctx, d.accounts.Tasks[taskID])
	if err != nil {
		return nil, fmt.Errorf("read the account of task %s: %w", taskID, err)
	}
	left := d.p.spec.GetTasks()[i].GetTokenBudget() - acct.Spent - acct.Reserved
	// A task's token_budget is a cap: the run (whose limit the tasks'
	// caps may pass) may have less. What the task keeps is of what can
	// be granted, or the child would take the run below its minimum: the
	// run's free tokens and what its tasks' slices hold unreserved (this
	// task's among them; a grant takes from the others' only as far as
	// the ledger lets it, so this may be more than the grant, never less).
	if run, err := e.ledger.RunAccount(ctx, d.runID); err == nil {
		left = min(left, run.Available()+run.Sliced)
	}
	left = max(left, 0)
	spec, err := d.childSpec(i, f, deadline, left)
	if err != nil {
		return nil, err
	}
	p, err := e.cfg.plan(spec)
	if err != nil {
		return nil, refuseFanOut("the child run does not plan: %v", err)
	}
	if e.isClosing() {
		return nil, fmt.Errorf("%w: this orchestrator is shutting down", errNotNow)
	}
	// The tenant's quotas are the parent's: its tasks in flight count every
	// level; its budget is above the parent task, which funds the child.
	p.maxTasksInFlight, p.headroom, p.prior = d.p.maxTasksInFlight, d.p.headroom, d.p.prior
	p.tree = tree{parentRunID: d.runID, parentTaskID: taskID, rootRunID: d.p.tree.root(d.runID), depth: d.p.tree.depth + 1}
	e.sizeFirst(ctx, p)

	childID := childRunID(f.GetKey())
	draft := draftRun(childID, p)
	draft.ParentRunId, draft.ParentTaskId, draft.RootRunId, draft.Depth = p.tree.parentRunID, p.tree.parentTaskID,
		p.tree.rootRunID, p.tree.depth
	open := openRunParams(childID, p)
	open.TenantAccount = 0
	open.Child = &budget.ChildFunding{ParentTask: d.accounts.Tasks[taskID], Attempt: int64(attempt), Min: p.minReservation,
		TTL: min(p.runTimeout+e.cfg.HeldWait+time.Minute, budget.MaxLeaseTTL), ParentRunID: d.runID, ParentTaskID: taskID,
		Call: f.GetKey(), RootRunID: p.tree.rootRunID, Depth: p.tree.depth, MaxTreeTasks: maxTreeTasks(d.p.spec.GetFanOut())}
	sched := newScheduler(p.deps)
	ready := sched.Ready()
	var begin []string
	for _, k := range ready[:min(len(ready), p.concurrency)] {
		begin = append(begin, p.spec.GetTasks()[k].GetId())
	}
	start := time.Now()
	run, accounts, created, err := e.store.OpenRun(ctx, draft, e.cfg.Node, open, e.cfg.toolPolicy(p.spec), nil, begin,
		queuedEvents(p, ready))
	var ex *budget.ExhaustedError
	var full *runs.TreeFullError
	switch {
	case errors.As(err, &full):
		return nil, refuseFanOut("%v", full)
	case errors.As(err, &ex):
		return nil, refuseFanOut("the task has too little of its budget left for a child run (at least %d tokens): %v",
			p.minReservation, ex)
	case errors.Is(err, budget.ErrExhausted), errors.Is(err, budget.ErrDenied):
		return nil, refuseFanOut("the ledger refused the child run: %v", err)
	case err != nil:
		return nil, fmt.Errorf("open child run %s: %w", childID, err)
	case !created && run.GetRunId() != childID:
		// The tenant's idempotency key of the child is another run's
		// (submit keeps callers off the prefix; older runs could have it).
		return nil, refuseFanOut("the child run's idempotency key %q is taken by run %s", draft.GetIdempotencyKey(),
			run.GetRunId())
	case !created:
		e.joinChild(ctx, run, d.runID, taskID)
		return nil, nil
	}
	// The plan's budget is what the ledger granted (the stored spec says so
	// too: OpenRun wrote it), which may be less than the call asked.
	p.spec = run.GetSpec()
	e.wake(childID)
	span := e.startRunSpan(ctx, start, childID, p)
	span.SetAttributes(attrParentRunID.String(d.runID), attrParentTaskID.String(taskID))
	ctx = trace.ContextWithSpan(ctx, span)
	run.Budget = runs.Snapshot(accounts.Run)
	if err := e.start(ctx, run, p, accounts, span); err != nil {
		return nil, fmt.Errorf("%w: %w", errNotNow, err) // it ended CANCELLED, and its end answered the call
	}
	return run, nil
}

// parentKeeps is what a task with left tokens keeps for itself when it
// fans out: a quarter of it, and at least room for two of its calls at
// the smallest input (the minimum reservation) and its whole output
// allowance, so that it can read the child's answer and reply, also as an
// attempt dispatched again (which asks for the same child first).
func parentKeeps(left, minReservation int64, maxOutput int32) int64 {
	output := int64(maxOutput)
	if output <= 0 {
		output = defaultSynthesisOutput // the worker's default max_output_tokens
	}
	return max(left/4, 2*(minReservation+output))
}

// fannedOut reports whether task i started a child run (or found one
// started by its earlier attempt).
func (d *driver) fannedOut(i int) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.children[i]
}

// childSpec is the spec of the child run task i's call f asks for: the
// call checked against the run's fan_out (the worker offers the tool only
// where it is allowed, and says what it may ask, but what it sends is
// checked here), the parent's settings one level down.
func (d *driver) childSpec(i int, f *fanoutv1.SubagentFanOut, deadline time.Time, left int64) (*fanoutv1.RunSpec, error) {
	parent := d.p.spec
	fo := parent.GetFanOut()
	if fo == nil {
		return nil, refuseFanOut("this run's spec does not let its subagents fan out (spec.fan_out), at depth %d", d.p.tree.depth)
	}
	tasks := f.GetTasks()
	switch n := len(tasks); {
	case n == 0:
		return nil, refuseFanOut("fan_out.tasks: at least one task is required")
	case n > maxChildTasks(fo):
		return nil, refuseFanOut("fan_out.max_child_tasks is %d; the call asked for %d tasks", maxChildTasks(fo), n)
	case n > maxTreeTasks(fo):
		return nil, refuseFanOut("fan_out.max_tree_tasks is %d; the call asked for %d tasks", maxTreeTasks(fo), n)
	}
	if msg := childText(f.GetGoal()); msg != "" {
		return nil, refuseFanOut("fan_out.goal %s", msg)
	}
	if f.GetTokenBudget() < 0 {
		return nil, refuseFanOut("fan_out.token_budget must be >= 0, got %d", f.GetTokenBudget())
	}
	task := parent.GetTasks()[i]
	keeps := parentKeeps(left, d.p.minReservation, parent.GetModel().GetMaxOutputTokens())
	want := left - keeps
	if b := f.GetTokenBudget(); b > 0 && b < d.p.minReservation {
		return nil, refuseFanOut("fan_out.token_budget %d is below the run's minimum reservation, %d", b, d.p.minReservation)
	} else if b > 0 {
		want = min(want, b)
	}
	if want < d.p.minReservation {
		return nil, refuseFanOut("the task has %d tokens left and keeps %d of them to answer: too little for a child run "+
			"(at least %d)", left, min(keeps, left), d.p.minReservation)
	}
	minRes := min(d.p.minReservation, want)
	timeout := d.p.taskTimeouts[i]
	if !deadline.IsZero() {
		// A tenth of what the task has left is the parent's, to read the
		// child's answer and reply with it.
		timeout = time.Until(deadline) * 9 / 10
	}
	if timeout < time.Second {
		return nil, refuseFanOut("the task has less than a second left")
	}
	var next *fanoutv1.FanOut
	if fo.GetMaxDepth() > 1 {
		next = &fanoutv1.FanOut{MaxDepth: fo.GetMaxDepth() - 1, MaxChildTasks: fo.GetMaxChildTasks(), MaxTreeTasks: fo.GetMaxTreeTasks()}
	}
	spec := &fanoutv1.RunSpec{
		IdempotencyKey: childKeyPrefix + childRunID(f.GetKey()),
		TenantId:       d.p.tenantID,
		Goal:           cmp.Or(f.GetGoal(), task.GetInstruction()),
		Budget: &fanoutv1.Budget{LimitTokens: want, MinReservationTokens: minRes,
			Admission: parent.GetBudget().GetAdmission()},
		Limits:       &fanoutv1.Limits{MaxConcurrency: parent.GetLimits().GetMaxConcurrency(), RunTimeout: durationpb.New(timeout)},
		OnExhaustion: parent.GetOnExhaustion(),
		Model:        parent.GetModel(),
		FanOut:       next,
	}
	share := max(want/int64(len(tasks)), minRes)
	for k, text := range tasks {
		if msg := childText(text); msg != "" || text == "" {
			return nil, refuseFanOut("fan_out.tasks[%d] %s", k, cmp.Or(msg, "must not be empty"))
		}
		spec.Tasks = append(spec.Tasks, &fanoutv1.TaskSpec{Id: fmt.Sprintf("c%d", k+1), Instruction: text,
			TokenBudget: share, MaxIterations: task.GetMaxIterations(), AllowedTools: task.GetAllowedTools()})
	}
	return spec, nil
}

// cancelChildren cancels the child runs of task taskID of run runID still
// running, with cause: in the ledger (which ends their own children in
// the same commit, and every node hears), and here if they are driven
// here.
func (e *Engine) cancelChildren(ctx context.Context, runID, taskID, cause string) {
	cc, ok := e.store.(ChildCalls)
	if !ok {
		return
	}
	ids, err := cc.RunningChildren(ctx, runID, taskID)
	if err != nil {
		e.cfg.Logger.ErrorContext(ctx, "read a task's child runs", "run_id", runID, "task_id", taskID, "err", err)
		return
	}
	for _, id := range ids {
		if _, err := e.ledger.CancelRun(ctx, id, cause); err != nil && !errors.Is(err, budget.ErrNotFound) {
			e.cfg.Logger.ErrorContext(ctx, "cancel a child run", "run_id", id, "err", err)
		}
		e.mu.Lock()
		ar := e.active[id]
		e.mu.Unlock()
		if ar != nil {
			ar.cancel(&CancelError{Cause: cause})
		}
	}
}

// joinChild is a fan_out call asked again of its existing child run:
// the child's end answers the call; if it has ended, its end's duties are
// done again (each is idempotent; the call is answered if it was not, the
// event is not appended twice).
func (e *Engine) joinChild(ctx context.Context, child *fanoutv1.Run, parentRunID, taskID string) {
	if child.GetParentRunId() != parentRunID || child.GetParentTaskId() != taskID {
		e.cfg.Logger.WarnContext(ctx, "fan_out's child run is another task's; ignored", "run_id", parentRunID,
			"task_id", taskID, "child_run_id", child.GetRunId())
		return
	}
	if child.GetState() != fanoutv1.RunState_RUN_STATE_RUNNING {
		e.childEndedAgain(ctx, child.GetRunId(), child.GetState(), child.GetResult())
	}
}

// childText says what is wrong with a fan_out call's goal or task, or "".
func childText(s string) string {
	if n := len(s); n > maxChildTextBytes {
		return fmt.Sprintf("must be at most %d bytes, got %d", maxChildTextBytes, n)
	}
	return textProblem(s)
}

// childEnded does what a child run's end owes its parent, once the child
// is closed: it settles the child's funding on the parent task (what the
// child spent stays spent there, the rest goes back), answers the fan_out
// call with the child's joined facts, and tells the parent run
// (ChildRunFinished). A run that is no child does nothing here. Each step
// is idempotent: the end of an adopted child does them again.
func (e *Engine) childEnded(ctx context.Context, runID string, state fanoutv1.RunState, result *fanoutv1.JoinedResult) {
	e.endChild(ctx, runID, state, result, true)
}

// childEndedAgain is childEnded for a child whose end did its duties
// before (or may have): the same, without a second ChildRunFinished.
func (e *Engine) childEndedAgain(ctx context.Context, runID string, state fanoutv1.RunState, result *fanoutv1.JoinedResult) {
	e.endChild(ctx, runID, state, result, false)
}

func (e *Engine) endChild(ctx context.Context, runID string, state fanoutv1.RunState, result *fanoutv1.JoinedResult, announce bool) {
	cc, ok := e.store.(ChildCalls)
	if !ok {
		return
	}
	link, err := cc.ChildLink(ctx, runID)
	if err != nil {
		e.cfg.Logger.ErrorContext(ctx, "read the parent of a run that ended", "run_id", runID, "err", err)
		return
	}
	if link.Call == "" {
		return // a root run
	}
	spent := e.settleFunding(ctx, runID)
	e.answerCall(ctx, link.ParentRunID, link.ParentTaskID, link.Call, childAnswer(runID, state, spent, result), "")
	if !announce {
		return
	}
	facts := int32(len(result.GetFacts()))
	if n := result.GetFactCount(); n > facts {
		facts = n
	}
	if _, err := e.appendEvent(ctx, link.ParentRunID, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_ChildRunFinished{
		ChildRunFinished: &fanoutv1.ChildRunFinished{TaskId: link.ParentTaskID, ChildRunId: runID, State: state,
			SpentTokens: spent, FactCount: facts}}}); err != nil && !errors.Is(err, runs.ErrEnded) {
		e.cfg.Logger.ErrorContext(ctx, "append ChildRunFinished", "run_id", link.ParentRunID, "child_run_id", runID, "err", err)
	}
}

// settleFunding settles child run runID's funding and returns what the
// child spent. The ledger closes a child that still holds reservations
// only when the last is settled (or swept): until then the settle is a
// conflict, tried again every poll up to HeldWait. A funding left
// unsettled expires with its lease, charging the parent the child's whole
// limit: never less than it spent.
func (e *Engine) settleFunding(ctx context.Context, runID string) int64 {
	fl, ok := e.ledger.(FundingLedger)
	if !ok {
		return 0
	}
	wait, cancel := context.WithTimeout(ctx, e.cfg.HeldWait)
	defer cancel()
	for {
		r, err := fl.SettleFunding(wait, runID)
		var conflict *budget.ConflictError
		switch {
		case err == nil:
			return r.Spent
		case !errors.As(err, &conflict) || !sleep(wait, e.cfg.WatchPollInterval):
			e.cfg.Logger.WarnContext(ctx, "settle a child run's funding", "run_id", runID, "err", err)
			acct, rerr := e.ledger.RunAccount(ctx, runID)
			if rerr != nil {
				return 0
			}
			return acct.Spent
		}
	}
}

// answerCall resolves the fan_out call key of task taskID of run runID
// with the child's answer, or as failed with refusal: the worker waiting
// on it hands either to its model. An answered call is left as it is.
func (e *Engine) answerCall(ctx context.Context, runID, taskID, key, answer, refusal string) {
	cc, ok := e.store.(ChildCalls)
	if !ok {
		return
	}
	if err := cc.AnswerCall(ctx, runID, taskID, key, answer, refusal); err != nil {
		e.cfg.Logger.ErrorContext(ctx, "answer a fan_out call", "key", key, "err", err)
	}
}

// childAnswer is the fan_out call's result: how the child ended, what it
// spent, and its joined facts, a line each (with their sources), cut at
// maxChildAnswerBytes.
func childAnswer(runID string, state fanoutv1.RunState, spent int64, result *fanoutv1.JoinedResult) string {
	var b strings.Builder
	facts := result.GetFacts()
	total := max(int(result.GetFactCount()), len(facts))
	fmt.Fprintf(&b, "child run %s ended %s, spent %d tokens, %d facts:\n", runID, runs.Text(state), spent, total)
	if s := result.GetSynthesis(); s != "" {
		fmt.Fprintf(&b, "synthesis: %s\n", oneLine(s))
	}
	for k, f := range facts {
		line := "- " + oneLine(f.GetText())
		if len(f.GetSources()) > 0 {
			line += " [" + strings.Join(f.GetSources(), " ") + "]"
		}
		line += "\n"
		if b.Len()+len(line) > maxChildAnswerBytes-128 {
			fmt.Fprintf(&b, "(%d more facts: ListRunFacts of run %s)\n", total-k, runID)
			break
		}
		b.WriteString(line)
	}
	return b.String()
}

// oneLine is s on one line, at most 1 KiB (cut at a character).
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= 1024 {
		return s
	}
	cut := 1024
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
