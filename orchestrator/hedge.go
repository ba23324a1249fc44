package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// Hedged tasks (fanout.v1.TaskSpec.hedge; docs/budget.md#hedged-tasks).
// A task with a hedge that runs far past its peers gets a second attempt
// on another worker while its first runs on; the first of the two to end
// with an answer (SUCCEEDED) is the task's outcome, the other is cancelled
// (errHedgeLost) and what it spent, settled in the ledger, is the task's
// too. The rules (tests in hedge_test.go and hedge_internal_test.go;
// mutants 410-419):
//
//   - Never without the field, never before the threshold: the first
//     attempt must have run (since its worker started it) past the earlier
//     of hedge.after and latency_factor times the median duration of the
//     run's tasks that answered, once min_peers of them have.
//   - Writes stay at most once: a task that allows a tool that may write
//     is refused at validation (planHedge). The second attempt runs on an
//     account of its own (Ledger.OpenHedge), so both attempts hold their
//     own fence at once, and each is fenced as any attempt is.
//   - Budget: under ADMISSION_POLICY_FORECAST a hedge starts only when
//     what is left, less what the tasks in flight still need, pays for the
//     task's forecast once more (forecaster.admitHedge); both attempts'
//     spend is the task's in the forecast. The ledger still enforces: the
//     hedge's account has the task's token budget, under the run's.
//   - Concurrency: a hedge takes no slot, of the run's or the tenant's: it
//     is at most one per task, and starts only for a straggler.
//   - Stopping: both attempts run under the task's context, so a run that
//     stops stops both; no hedge starts once the run was told to stop.
//   - One winner: the driver stores the task's one outcome (FinishTask);
//     an orchestrator that adopts the run fences a hedge begun before it
//     with the task (Engine.fence begins a new attempt on the hedge's
//     account too) and counts its spend as the task's (earlierHedgeSpent).

const (
	// defaultHedgeFactor is Hedge.latency_factor when neither it nor
	// Hedge.after is set.
	defaultHedgeFactor = 3.0
	// defaultHedgeMinPeers is Hedge.min_peers when unset.
	defaultHedgeMinPeers = 3
	minHedgeFactor       = 1.5
	maxHedgeFactor       = 100.0
	// minHedgeAfter is the smallest Hedge.after.
	minHedgeAfter = 100 * time.Millisecond
	// hedgeRecheck bounds how long a hedged task waits before it looks at
	// the forecast again (and its threshold, which it also looks at as soon
	// as a peer ends).
	hedgeRecheck = 250 * time.Millisecond
	// hedgeAccountPrefix prefixes a hedge's account's task id; no task id
	// starts with "_" (validate.go).
	hedgeAccountPrefix = "_hedge:"
)

// errHedgeLost is the cancel cause of the attempt of a hedged task that
// did not answer first.
var errHedgeLost = errors.New("the task's other attempt answered first (hedge)")

// planHedge checks task i's hedge: its limits, and that the task allows
// only tools that read (Config.ReadTools).
func (c Config) planHedge(v *validator, p *plan, i int) {
	t := p.spec.GetTasks()[i]
	h := t.GetHedge()
	if h == nil {
		return
	}
	field := func(name string) string { return fmt.Sprintf("spec.tasks[%d].hedge%s", i, name) }
	f := h.GetLatencyFactor()
	if f != 0 && !(f >= minHedgeFactor && f <= maxHedgeFactor) { // NaN too
		v.add(field(".latency_factor"), "must be 0 (the default, %g) or %g..%g, got %g", defaultHedgeFactor, minHedgeFactor, maxHedgeFactor, f)
	}
	others := len(p.spec.GetTasks()) - 1
	switch n := h.GetMinPeers(); {
	case n < 0:
		v.add(field(".min_peers"), "must be 0 (the default, %d) or 1..%d (the run's other tasks), got %d", defaultHedgeMinPeers, others, n)
	case n > int32(others):
		v.add(field(".min_peers"), "must be at most the run's other tasks (%d), got %d", others, n)
	case n == 0 && h.GetAfter() == nil && others == 0:
		v.add(field(""), "a run of one task has no peers whose durations its latency_factor needs: set after")
	case n == 0 && h.GetAfter() == nil && others < defaultHedgeMinPeers:
		v.add(field(""), "the run has %d other tasks, fewer than the %d (min_peers' default) whose durations its latency_factor needs: "+
			"set min_peers (1..%d) or after", others, defaultHedgeMinPeers, others)
	}
	if d := h.GetAfter(); d != nil {
		switch {
		case d.CheckValid() != nil:
			v.add(field(".after"), "is not a valid duration: %v", d.CheckValid())
		case d.AsDuration() < minHedgeAfter:
			v.add(field(".after"), "must be at least %s, got %s", minHedgeAfter, d.AsDuration())
		case p.taskTimeouts[i] > 0 && d.AsDuration() >= p.taskTimeouts[i]:
			v.add(field(".after"), "must be less than the task's timeout %s, got %s", p.taskTimeouts[i], d.AsDuration())
		}
	}
	for j, name := range t.GetAllowedTools() {
		if !slices.Contains(c.ReadTools, name) {
			v.add(field(""), "task %q allows tool %q (allowed_tools[%d]), which may write: a task that may write cannot be hedged "+
				"(its writes are at most once; read-only tools: %s)", t.GetId(), name, j, strings.Join(c.ReadTools, ", "))
			return
		}
	}
}

// peerDurations are how long the run's tasks that answered ran, for the
// hedges' thresholds. The zero value is ready to use.
type peerDurations struct {
	mu      sync.Mutex
	all     []time.Duration
	changed chan struct{} // closed when a task is recorded (wait)
}

// record adds a task that ended, if it answered (SUCCEEDED) on a worker.
func (p *peerDurations) record(o *fanoutv1.TaskOutcome) {
	if o.GetStatus() != fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED || o.GetStartedAt() == nil || o.GetFinishedAt() == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.all = append(p.all, o.GetFinishedAt().AsTime().Sub(o.GetStartedAt().AsTime()))
	if p.changed != nil {
		close(p.changed)
		p.changed = nil
	}
}

// wait returns a channel closed when the next task is recorded: the
// hedged tasks' thresholds change then.
func (p *peerDurations) wait() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.changed == nil {
		p.changed = make(chan struct{})
	}
	return p.changed
}

// median is the median duration of the tasks recorded, and how many.
func (p *peerDurations) median() (time.Duration, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.all)
	if n == 0 {
		return 0, 0
	}
	s := slices.Clone(p.all)
	slices.Sort(s)
	if n%2 == 1 {
		return s[n/2], n
	}
	return (s[n/2-1] + s[n/2]) / 2, n
}

// hedgeThreshold is how long a task with hedge h must run before it is
// hedged, given its peers, and on what that rests; ok is false while
// nothing sets one (no after, too few peers answered).
func hedgeThreshold(h *fanoutv1.Hedge, peers *peerDurations) (threshold time.Duration, why string, ok bool) {
	if d := h.GetAfter(); d != nil {
		threshold, why, ok = d.AsDuration(), fmt.Sprintf("after %s", d.AsDuration()), true
	}
	factor := h.GetLatencyFactor()
	if factor == 0 && h.GetAfter() == nil {
		factor = defaultHedgeFactor
	}
	minPeers := int(h.GetMinPeers())
	if minPeers == 0 {
		minPeers = defaultHedgeMinPeers
	}
	if factor == 0 {
		return threshold, why, ok
	}
	med, n := peers.median()
	if n < minPeers {
		return threshold, why, ok
	}
	t := time.Duration(math.Min(factor*float64(med), math.MaxInt64))
	if !ok || t < threshold {
		threshold, why, ok = t, fmt.Sprintf("%g × the median %s of %d tasks that answered", factor, med.Round(time.Millisecond), n), true
	}
	return threshold, why, ok
}

// admitHedge reports whether the forecast affords a second attempt of task
// i, in flight: what is left, less what the tasks in flight are forecast
// to still need, covers the task's forecast once more. Never while the
// tasks in flight are wound down (the budget is short already). On ok the
// hedge is in flight beside the first attempt (inFlight.hedge) until the
// task ends, or dropHedge if it does not start after all.
func (f *forecaster) admitHedge(i int) (ok bool, need, room int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	need = f.need(i)
	room = f.left() - f.committed()
	t := f.flight[i]
	ok = !f.wound && t != nil && t.hedge == nil && room >= need
	if ok {
		t.hedge = &inFlight{forecast: need, short: t.short}
	}
	return ok, need, room
}

// dropHedge forgets the hedge of task i that admitHedge admitted but that
// did not start.
func (f *forecaster) dropHedge(i int) {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if t := f.flight[i]; t != nil {
		t.hedge = nil
	}
}

// attemptSpend is what a hedged task's attempts have spent so far, from
// their iterations: the task's TaskIteration events say both.
type attemptSpend struct{ first, hedge atomic.Int64 }

func (s *attemptSpend) total() int64 { return s.first.Load() + s.hedge.Load() }

// attemptProgress is the progress of one attempt of a hedged task. The
// first attempt's is the task's (its start and its iterations are
// recorded, the events with the spend of both); the hedge's tells the
// forecast what it spends, and records nothing else (its TaskHedged said
// it started). The forecast and the call statistics see each attempt's
// own spend and grants.
type attemptProgress struct {
	task      progress // the first attempt's (taskProgress, with spend); nil for the hedge
	d         *driver
	index     int
	spend     *attemptSpend
	startedAt chan<- time.Time // the first attempt's start, once
}

func (p attemptProgress) started(ctx context.Context, worker string) {
	if p.task == nil {
		return
	}
	p.task.started(ctx, worker)
	select {
	case p.startedAt <- time.Now():
	default: // a later try of the same attempt (a lost worker): the first start counts
	}
}

func (p attemptProgress) iteration(ctx context.Context, it *fanoutv1.SubagentIteration) {
	if p.task != nil {
		p.spend.first.Store(it.GetTokensSpent())
		p.task.iteration(ctx, it)
		return
	}
	p.spend.hedge.Store(it.GetTokensSpent())
	if p.d.fc == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if tasks := p.d.fc.progressHedge(p.index, it.GetTokensSpent(), it.GetGrantedTokens(), it.GetLast()); len(tasks) > 0 {
		p.d.windDown(ctx, tasks)
	}
}

func (p attemptProgress) approval(ctx context.Context, a *fanoutv1.SubagentApproval) {
	if p.task != nil {
		p.task.approval(ctx, a)
	}
}

// fanOut: a run whose tasks may fan out hedges none (checkFanOut).
func (p attemptProgress) fanOut(ctx context.Context, attempt int32, f *fanoutv1.SubagentFanOut) {
	if p.task != nil {
		p.task.fanOut(ctx, attempt, f)
	}
}

// attemptEnd is how one attempt of a hedged task ended.
type attemptEnd struct {
	hedge   bool
	outcome *fanoutv1.TaskOutcome
}

// runHedged runs task i's dispatch c, and a second attempt of it when its
// hedge's threshold passes while c runs (see the top of the file). ctx is
// the task's context, runCtx the run's. Without a hedge, or without a
// second worker, it is c.run.
func (d *driver) runHedged(runCtx, ctx context.Context, i int, c *dispatch) *fanoutv1.TaskOutcome {
	h := d.p.spec.GetTasks()[i].GetHedge()
	if h == nil || d.e.workers.Len() < 2 {
		return c.run(ctx)
	}
	tp, ok := c.progress.(taskProgress)
	if !ok {
		return c.run(ctx)
	}
	spend := &attemptSpend{}
	tp.attempts = spend // its TaskIteration events say both attempts' spend
	startedAt := make(chan time.Time, 1)
	c.progress = attemptProgress{task: tp, d: d, index: i, spend: spend, startedAt: startedAt}
	firstCtx, cancelFirst := context.WithCancelCause(ctx)
	defer cancelFirst(nil)
	ends := make(chan attemptEnd, 2)
	go func() { ends <- attemptEnd{outcome: c.run(firstCtx)} }()

	// Until the first attempt ends or its threshold passes.
	var since time.Time
	select {
	case e := <-ends:
		return e.outcome // it never started, or ended at once
	case since = <-startedAt:
	}
	var hedge *hedgeAttempt
	for hedge == nil {
		peerEnded := d.hedges.wait()
		wait := hedgeRecheck
		if threshold, why, ok := hedgeThreshold(h, &d.hedges); ok {
			ran := time.Since(since)
			if ran >= threshold && !d.stopping(runCtx) {
				var again bool
				if hedge, again = d.startHedge(ctx, i, c, spend, ends, ran, threshold, why); hedge != nil {
					break
				}
				if !again {
					return (<-ends).outcome // the first runs on alone
				}
			}
			if ran < threshold {
				wait = min(wait, threshold-ran)
			} // else: refused for now (the forecast, the ledger) or stopping: look again in hedgeRecheck
		}
		t := time.NewTimer(wait)
		select {
		case e := <-ends:
			t.Stop()
			return e.outcome
		case <-peerEnded:
			t.Stop()
		case <-t.C:
		}
	}
	defer hedge.cancel(nil)

	// The first of the two to answer wins; the other is cancelled.
	var first, second *fanoutv1.TaskOutcome
	var winner fanoutv1.HedgeAttempt
	for first == nil || second == nil {
		e := <-ends
		if e.hedge {
			second = e.outcome
		} else {
			first = e.outcome
		}
		if winner == fanoutv1.HedgeAttempt_HEDGE_ATTEMPT_UNSPECIFIED &&
			e.outcome.GetStatus() == fanoutv1.TaskStatus_TASK_STATUS_SUCCEEDED {
			if e.hedge {
				winner = fanoutv1.HedgeAttempt_HEDGE_ATTEMPT_HEDGE
				cancelFirst(errHedgeLost)
			} else {
				winner = fanoutv1.HedgeAttempt_HEDGE_ATTEMPT_FIRST
				hedge.cancel(errHedgeLost)
			}
		}
	}
	cctx, cancel := cleanup(runCtx)
	defer cancel()
	report := &fanoutv1.HedgeReport{Winner: winner, HedgeWorker: second.GetWorker(),
		StartedAfter: durationpb.New(hedge.after),
		FirstTokens:  d.attemptSpent(cctx, first, budget.AccountID(c.req.GetTaskAccountId()), d.resumed != nil && d.resumed[i]),
		HedgeTokens:  d.attemptSpent(cctx, second, hedge.account, d.resumed != nil && d.resumed[i])}
	o, lost := first, report.GetHedgeTokens()
	if winner == fanoutv1.HedgeAttempt_HEDGE_ATTEMPT_HEDGE {
		o, lost = second, report.GetFirstTokens()
	}
	if winner != fanoutv1.HedgeAttempt_HEDGE_ATTEMPT_UNSPECIFIED {
		metrics().hedgeTokens.Add(cctx, lost)
	}
	o.Hedge = report
	o.TokensSpent = report.GetFirstTokens() + report.GetHedgeTokens()
	return o
}

// hedgeAttempt is a hedged task's second attempt, under way.
type hedgeAttempt struct {
	account budget.AccountID
	after   time.Duration // how long the first had run when it started
	cancel  context.CancelCauseFunc
}

// startHedge starts the second attempt of task i, whose first is c, which
// has run ran past threshold (why says it), if the forecast affords it and
// the ledger opens its account; its end goes to ends. It returns nil when
// it did not start it, and again whether it may later (the forecast may
// afford it then; a ledger that refused its account will not open it), or
// whether the first attempt has ended meanwhile (again false: its end is
// in ends, to be received).
func (d *driver) startHedge(ctx context.Context, i int, c *dispatch, spend *attemptSpend, ends chan<- attemptEnd,
	ran, threshold time.Duration, why string) (h *hedgeAttempt, again bool) {
	taskID := c.req.GetTask().GetId()
	if len(ends) > 0 { // the first attempt has ended: nothing to hedge
		return nil, false
	}
	if d.fc != nil {
		if ok, need, room := d.fc.admitHedge(i); !ok {
			d.e.cfg.Logger.DebugContext(ctx, "hedge not afforded by the forecast; the task runs on alone for now",
				"run_id", d.runID, "task_id", taskID, "need", need, "room", room)
			return nil, true
		}
	}
	actx, cancel := context.WithTimeout(ctx, cleanupTimeout)
	acct, err := d.e.ledger.OpenHedge(actx, budget.AccountID(c.req.GetTaskAccountId()), d.runID, d.p.tenantID, d.epoch)
	cancel()
	switch {
	case errors.Is(err, budget.ErrDenied): // another orchestrator took the run
		d.fc.dropHedge(i)
		d.lose(ctx, err)
		return nil, false
	case err != nil:
		d.fc.dropHedge(i)
		d.e.cfg.Logger.WarnContext(ctx, "open a hedge's account; the task runs on alone", "run_id", d.runID, "task_id", taskID, "err", err)
		return nil, false
	}
	hedgeOpened(func() bool { return len(ends) > 0 })
	if len(ends) > 0 { // the first attempt ended while the account opened: its account stays empty
		d.fc.dropHedge(i)
		return nil, false
	}
	req := proto.CloneOf(c.req)
	req.TaskAccountId = int64(acct)
	if dl, ok := ctx.Deadline(); ok { // what is left of the task's time
		req.Task.Timeout = durationpb.New(max(time.Millisecond, time.Until(dl)))
	}
	w := d.e.workers.After(c.sentTo())
	hc := d.newDispatch(w, req, attemptProgress{d: d, index: i, spend: spend})
	hctx, hcancel := context.WithCancelCause(ctx)
	h = &hedgeAttempt{account: acct, after: ran, cancel: hcancel}
	ectx, ecancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	d.event(ectx, &fanoutv1.RunEvent{Event: &fanoutv1.RunEvent_TaskHedged{TaskHedged: &fanoutv1.TaskHedged{
		TaskId: taskID, Worker: w.Addr, After: durationpb.New(ran), Threshold: durationpb.New(threshold), Reason: why}}})
	ecancel()
	d.e.wake(d.runID)
	metrics().tasksHedged.Add(context.WithoutCancel(ctx), 1)
	go func() { ends <- attemptEnd{hedge: true, outcome: hc.run(hctx)} }()
	return h, false
}

// hedgeOpened is called once a hedge's account is open, before the
// hedge is dispatched, with whether the first attempt has ended: a hook
// for the test of a first attempt that ends then.
var hedgeOpened = func(firstEnded func() bool) {}

// attemptSpent is what one attempt of a hedged task spent, settled in the
// ledger: its summary's figure, or, for an attempt cut off (no summary)
// or one this driver resumed (whose account an earlier orchestrator's
// attempt spent on too), its account's once the worker has settled.
func (d *driver) attemptSpent(ctx context.Context, o *fanoutv1.TaskOutcome, acct budget.AccountID, resumed bool) int64 {
	if resumed || o.GetSummary() == nil && o.GetWorker() != "" {
		return d.settledSpend(ctx, acct)
	}
	return o.GetTokensSpent()
}

// earlierHedgeSpent is what the hedge of task taskID, resumed, spent
// before this orchestrator took the run (once settled), if it had one and
// this orchestrator did not hedge the task again: the task's spend too.
func (d *driver) earlierHedgeSpent(ctx context.Context, taskID string) int64 {
	acct, ok := d.accounts.Tasks[hedgeAccountPrefix+taskID]
	if !ok {
		return 0
	}
	return d.settledSpend(ctx, acct)
}
