package subagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/internal/redact"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/subagent/llm"
)

// Status is how a subagent ended.
type Status string

// The terminal statuses, as in fanout.v1.TaskStatus.
const (
	StatusSucceeded       Status = "SUCCEEDED"
	StatusFailed          Status = "FAILED"
	StatusTimedOut        Status = "TIMED_OUT"
	StatusCancelled       Status = "CANCELLED"
	StatusBudgetExhausted Status = "BUDGET_EXHAUSTED"
	StatusIterationLimit  Status = "ITERATION_LIMIT"
)

// Policy is what a run's budget exhaustion does to the in-flight model call.
type Policy int

// The exhaustion policies.
const (
	// PolicyCancel cancels the in-flight call; it is settled at its full
	// reservation, flagged estimated.
	PolicyCancel Policy = iota
	// PolicyDrain lets the in-flight call finish and settle its real usage;
	// nothing new starts.
	PolicyDrain
)

// RunWatch tells the loop that its run's budget ended, and when an
// exhausted run is then cancelled. *budget.Subscription implements it.
type RunWatch interface {
	Done() <-chan struct{}    // closed when the run's budget ended
	Signal() budget.RunSignal // what ended it first
	// Cancelled is closed when the run is cancelled or closed, also after
	// it was exhausted.
	Cancelled() <-chan struct{}
	CancelSignal() budget.RunSignal
}

// Fact is one thing a subagent found.
type Fact struct {
	Text    string
	Sources []string
}

// Task is one subagent's work.
type Task struct {
	RunID          string
	TenantID       string // the run's tenant: part of the grant every reserve names
	TaskID         string
	Goal           string
	Instruction    string
	ContextFacts   []Fact           // facts from the tasks this one depends on
	Account        budget.AccountID // the task's ledger account
	MinReservation int64            // smallest useful grant; default 1
	MaxIterations  int              // default Loop.MaxIterations
	AllowedTools   []string         // names in Loop.Tools; others are refused
	Attempt        int              // dispatch attempt the ledger recorded (BeginAttempt); in reserves and idempotency keys; default 1
	AttemptSecret  string           // the attempt's secret (budget.Attempt.Secret): a worker's login presents it on every ledger and tool-call write; never logged
	// FromHeld makes every reserve draw on what the run holds back for its
	// synthesis (Account is then the run's account): the run's synthesis.
	FromHeld bool
	// WindDownAfter, when > 0, winds the task down from its start
	// (Dispatch.wind_down_after): its iterations after this many are its
	// last, made without tools, as when a grant says Reservation.WindDown.
	WindDownAfter int
	// CacheTools lets the task's read calls be answered from its tenant's
	// result cache, for the tools with a Tool.CacheTTL
	// (Dispatch.cache_tools, from RunSpec.cache.tools).
	CacheTools bool
	// FanOut, if set, offers the task the built-in tool fan_out
	// (Dispatch.fan_out; fanout.go).
	FanOut       *FanOut
	OnExhaustion Policy
	// Watch, if not nil, reports that the run's budget ended. An exhausted run
	// cancels the in-flight call under PolicyCancel; a cancelled or closed run
	// cancels it under either policy, also when it was exhausted first.
	// Either way no new call starts.
	Watch RunWatch
	// Model settings passed through to the provider.
	ModelName   string
	Temperature float64
	Seed        int64

	// What a task may set in place of its Loop's (a worker's Loop is built
	// once, and each dispatch names its own): each defaults to the Loop's
	// field of the same name.

	// Model is the model the task calls (the dispatch's provider).
	Model llm.Model
	// Tools is the registry the task's AllowedTools name (a worker's
	// current one: an MCP server's tool list may change at run time).
	Tools *Tools
	// MaxOutputTokens is the output allowance reserved per call.
	MaxOutputTokens int
	// ProgressFunc and OnApproval hear of the task's iterations and of the
	// writes it waits on for approval (Loop.ProgressFunc, Loop.OnApproval).
	ProgressFunc func(Progress)
	OnApproval   func(runs.Write)
}

// Summary is what a subagent compresses its work into. Its Facts come from
// the compression call when the model is an llm.StructuredModel and the call
// could be made and paid for; otherwise (and whenever that call fails) from
// the final answer, or from the read tools' results if there was none. Why
// compression was skipped, failed or degraded is noted in Failed.
type Summary struct {
	Facts       []Fact
	Tried       []string // tool calls made, in call order
	Failed      []string // what failed and why, compression included
	TokensSpent int64    // settled in the ledger, estimated settlements included, the compression call's too
	// Iterations counts agent loop iterations that called the model. The
	// retries of a call that may have been billed belong to its iteration;
	// the compression call is none.
	Iterations int
	// WoundDown: the run wound the task down (a grant said
	// Reservation.WindDown), so its last iteration was made without tools
	// and its answer is what it had by then; no compression call follows.
	WoundDown bool
	// Peak is the most the task had spent and reserved at once: its spend
	// before a call plus that call's grant.
	Peak   int64
	Status Status
	Err    error // why it ended, if Status is not StatusSucceeded
}

// Progress reports one finished iteration.
type Progress struct {
	Iteration   int
	TokensSpent int64 // cumulative
	ToolCalls   int   // in this iteration
	// CachedToolCalls of ToolCalls were read calls answered from the
	// tenant's result cache (Task.CacheTools).
	CachedToolCalls int
	Peak            int64 // Summary.Peak so far
	Granted         int64 // this iteration's (last) grant
	// Last: this iteration's call was the task's last model call (it
	// answered, and no compression call follows).
	Last bool
	// Waited is the time this iteration's calls spent queued (a model-call
	// slot, the fleet's rate limiter, a 429's backoff) rather than served:
	// llm.WaitMeter.
	Waited time.Duration
}

// Loop runs subagents: reserve, call the model, settle, run tools, repeat;
// then, with an llm.StructuredModel, one more reserved and settled call that
// compresses the work into the Summary's facts (see Run). Set the fields,
// then call Run; a Loop may run many tasks at once. It is the tasks'
// shared configuration: what one task varies (its model, tools, output
// allowance, where it reports) it sets in its Task, which wins over the
// Loop's.
//
// Each call reserves an upper bound of its input tokens, never a guess:
// one token per byte of the whole prompt for a task's first call, then the
// previous call's reported usage plus one token per byte of what was
// appended since (llm.Estimator), plus the output allowance. Usage past the
// reservation (a provider billing more than the bound) is logged as a
// warning and counted in fanout.subagent.overrun.tokens.
type Loop struct {
	Ledger budget.Ledger // required
	Model  llm.Model     // required unless every Task names its Model
	Tools  *Tools        // default BuiltinTools()
	Holder string        // the worker's name, recorded on each reservation; required

	LeaseTTL        time.Duration // reservation lease; renewed every LeaseTTL/3 during a call; default 30s
	MaxIterations   int           // default when the task sets none; default 8
	MaxOutputTokens int           // output allowance reserved per call; default 1024
	ReadParallelism int           // read tools of one task run at once; default 4
	// ToolSlots, if not nil, bounds the tool calls in flight on the whole
	// worker: a call holds one element while it runs. The fleet's bounds
	// (MCP max_in_flight) are the tools' own, behind it.
	ToolSlots chan struct{}
	// ToolTimeout bounds each tool call whose Tool sets no Timeout; the
	// task's deadline caps both. Its expiry is the call's result ("timed
	// out: proceed without it"). Default DefaultToolTimeout.
	ToolTimeout time.Duration
	// MaxToolCallsPerTurn is the most tool calls of one model reply that
	// run; the model is told the rest were not run. Default
	// DefaultMaxToolCallsPerTurn.
	MaxToolCallsPerTurn int
	// Writes records every call of a write tool before it is sent, and
	// gives a later attempt of the task its earlier attempts' writes so it
	// never sends one again. nil records nothing (tests of the loop alone);
	// a Server requires it.
	Writes WriteLog
	// ToolAllowed, if not nil, says whether a tenant may use a tool (the
	// operator's policy, mcp.Config.ToolPolicy): a tool it refuses is not
	// offered to the model and a call of it is not run, whatever the
	// task's AllowedTools say. The orchestrator refuses such a spec first.
	ToolAllowed func(tool, tenant string) bool
	// ToolCache is the tenants' result cache of read tools: a task with
	// CacheTools asks it before calling a read tool with a CacheTTL, and
	// stores what such a call returned. nil: nothing is cached. Its errors
	// are logged (at most once a minute) and the tool is called.
	ToolCache ToolCache
	cacheWarn *every // limits the logs of ToolCache's errors
	// ApprovalPoll is how often a write waiting for approval reads its
	// state; default DefaultApprovalPoll.
	ApprovalPoll time.Duration
	// FanOutPoll is how often a task waiting for its child run reads its
	// fan_out call's row; default DefaultFanOutPoll.
	FanOutPoll time.Duration
	// OnApproval, if not nil, hears of each write this task waits on for
	// approval (its CallID, Tool, Preview and ApprovalDeadline), when the
	// wait begins.
	OnApproval   func(runs.Write)
	ProgressFunc func(Progress)
	// Logger is default slog.Default(), always behind internal/redact's
	// rule (redact.Logger).
	Logger *slog.Logger
	// CompressMaxTokens caps the output of the compression call (and is its
	// output allowance in the reservation); default 512.
	CompressMaxTokens int
	// BilledRetry bounds and spaces the retries of a model call that failed
	// after it may have been billed (llm.ErrMaybeBilled: a 5xx reply not in
	// the provider's error shape, such as a gateway's page). Such a call is
	// settled at its whole reservation, flagged estimated, and made again
	// under a new reservation after Backoff (a Retry-After is a floor): at
	// most MaxAttempts calls in all (default 3, so two retries), sleeping at
	// most MaxSleep in all (default 2m) and never past the task's deadline.
	// The other fields default as in llm.RetryPolicy.
	BilledRetry llm.RetryPolicy
	// CaptureContent puts prompts, completions and tool arguments and
	// results on the spans (gen_ai.input.messages, gen_ai.output.messages,
	// gen_ai.tool.call.arguments, gen_ai.tool.call.result). Default off:
	// they may hold what the tenant would not have in a tracing backend.
	CaptureContent bool
}

// settleTimeout bounds ledger calls made after the task's context ended.
const settleTimeout = 5 * time.Second

// ErrIterationLimit ends a task that reached its iteration cap without a
// final answer (StatusIterationLimit).
var ErrIterationLimit = errors.New("iteration limit reached without a final answer")

// errRunEnded is the stop reason when the worker already knows the run ended.
var errRunEnded = errors.New("run budget ended")

func (l *Loop) defaults() Loop {
	c := *l
	if c.Tools == nil {
		c.Tools = BuiltinTools()
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = 30 * time.Second
	}
	if c.MaxIterations <= 0 {
		c.MaxIterations = 8
	}
	if c.MaxOutputTokens <= 0 {
		c.MaxOutputTokens = 1024
	}
	if c.CompressMaxTokens <= 0 {
		c.CompressMaxTokens = 512
	}
	if c.ReadParallelism <= 0 {
		c.ReadParallelism = 4
	}
	if c.ToolTimeout <= 0 {
		c.ToolTimeout = DefaultToolTimeout
	}
	if c.MaxToolCallsPerTurn <= 0 {
		c.MaxToolCallsPerTurn = DefaultMaxToolCallsPerTurn
	}
	if c.BilledRetry.MaxAttempts <= 0 {
		c.BilledRetry.MaxAttempts = 3
	}
	if c.BilledRetry.MaxSleep <= 0 {
		c.BilledRetry.MaxSleep = 2 * time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Logger = redact.Logger(c.Logger)
	if c.cacheWarn == nil {
		c.cacheWarn = &every{interval: cacheWarnEvery}
	}
	return c
}

// Run runs t to an end and summarizes it. It never returns an error: every
// outcome, including a stop caused by ctx (cause budget.ErrExhausted,
// budget.ErrRunCancelled or a deadline), is a Status in the Summary, which
// keeps what was found and tried before the stop. When Run returns, every
// reservation it made has been settled or voided, or (if the ledger could not
// be reached) is left for the lease sweeper to count as spent.
//
// If the model is an llm.StructuredModel, the loop's end (a final answer,
// the iteration limit, a budget stop) is followed by one compression call
// (llm.Compress, output capped by CompressMaxTokens) whose facts replace the
// local ones. It is paid like any call: reserved in full on the task account
// (all or nothing: input bound plus cap), settled with the reported usage, or
// at the whole reservation, flagged estimated, if it fails or is cancelled;
// if it may have been billed, it is made again under a new reservation as
// BilledRetry allows, like an iteration's call.
// It is skipped, keeping the local facts, if the task failed, ctx ended, the
// worker knows the run ended or the ledger cannot grant the reservation; a
// reply that does not parse becomes one fact holding its text. Each of these
// is noted in Summary.Failed; the Status stays what the loop ended with.
func (l *Loop) Run(ctx context.Context, t Task) Summary {
	cfg := l.defaults()
	return *cfg.run(ctx, &t)
}

// run is Run on a Loop whose defaults are set (defaults): a worker's,
// built once, runs every task it is dispatched through it.
//
// It takes and returns pointers, as Execute does, for the frames of the
// goroutine a running subagent holds: its stack grows to the deepest they
// reach (docs/operations.md, "Memory").
func (l *Loop) run(ctx context.Context, t *Task) *Summary {
	r := &taskAttempt{Loop: l, task: *t}
	l.setDefaults(&r.task)
	ctx, span := r.startAgentSpan(ctx)
	running := metrics().running
	running.Add(ctx, 1)
	h := &hearing{}
	// The parent ending (stream cancelled, deadline, worker shutdown) is one
	// way to hear that the run ended; the watcher is the other.
	stopHearing := context.AfterFunc(ctx, h.hear)
	sum, cause := r.watched(ctx, h)
	ended := time.Now()
	stopHearing()
	running.Add(context.WithoutCancel(ctx), -1)
	r.endAgentSpan(ctx, span, sum, cause, h, ended)
	return &sum
}

// setDefaults sets what t leaves unset from l (defaulted).
func (l *Loop) setDefaults(t *Task) {
	if t.Attempt <= 0 {
		t.Attempt = 1
	}
	if t.MinReservation <= 0 {
		t.MinReservation = 1
	}
	if t.MaxIterations <= 0 {
		t.MaxIterations = l.MaxIterations
	}
	if t.MaxOutputTokens <= 0 {
		t.MaxOutputTokens = l.MaxOutputTokens
	}
	if t.Model == nil {
		t.Model = l.Model
	}
	if t.Tools == nil {
		t.Tools = l.Tools
	}
	if t.ProgressFunc == nil {
		t.ProgressFunc = l.ProgressFunc
	}
	if t.OnApproval == nil {
		t.OnApproval = l.OnApproval
	}
}

// watched runs the loop under the run's watcher and returns the summary and
// the cause that stopped the loop's context, if any.
func (r *taskAttempt) watched(ctx context.Context, h *hearing) (Summary, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if w := r.task.Watch; w != nil {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-stop:
			case <-w.Done():
				h.hear()
				sig := w.Signal()
				if sig.State == budget.StateExhausted && r.task.OnExhaustion == PolicyDrain {
					select { // the call runs on, unless the run is then cancelled
					case <-stop:
						return
					case <-w.Cancelled():
						sig = w.CancelSignal()
					}
				}
				cancel(sig.Err())
			}
		}()
		defer wg.Wait()
		defer close(stop)
	}
	sum := r.loop(ctx)
	return sum, context.Cause(ctx)
}

// taskAttempt is the state of one Run: one attempt of one task (the
// ledger's dispatch attempt, Task.Attempt). The Loop is shared by every
// attempt and never changed; what varies per task is in task, with the
// Loop's defaults filled in (setDefaults): read the model, the tools, the
// output allowance and the callbacks there, never the Loop's.
type taskAttempt struct {
	*Loop
	task  Task
	msgs  []llm.Message
	est   llm.Estimator // bounds each call's input from the last reported usage
	tools []llm.ToolDef
	sum   Summary
	found []Fact // read tool results, reported if the model never answers
	// prior are the writes this task made, in its earlier attempts and in
	// this one, by tool and argument digest (priorKey): none is sent again
	// (a write that was never sent is not one). priorOrder lists the
	// earlier attempts' oldest first for the prompt.
	prior      map[string]runs.Write
	priorOrder []runs.Write
	granted    int64 // the last grant (Progress.Granted)
	// waits meters the time the task's calls queued; reported is what
	// Progress has said of it so far.
	waits    llm.WaitMeter
	reported time.Duration
}

func (r *taskAttempt) loop(ctx context.Context) Summary {
	ctx = llm.WithWaitMeter(ctx, &r.waits)
	r.work(ctx)
	if sm, ok := r.task.Model.(llm.StructuredModel); ok && r.sum.Iterations > 0 && !r.sum.WoundDown {
		if err := r.compress(ctx, sm); err != nil {
			r.sum.Failed = append(r.sum.Failed, fmt.Sprintf("compress: %v; kept the local summary", err))
		}
	}
	return r.sum.redacted()
}

// redacted is sum as everyone but the model reads it: every text in it
// (facts and their sources, calls tried, failures, the error) passed
// through internal/redact's rule. The tools' arguments, results and errors
// reach it raw; this is where they leave the worker.
func (sum Summary) redacted() Summary {
	texts := func(ss []string) []string {
		if ss == nil {
			return nil
		}
		out := make([]string, len(ss))
		for i, s := range ss {
			out[i] = redact.Text(s)
		}
		return out
	}
	if sum.Facts != nil {
		facts := make([]Fact, len(sum.Facts))
		for i, f := range sum.Facts {
			facts[i] = Fact{Text: redact.Text(f.Text), Sources: texts(f.Sources)}
		}
		sum.Facts = facts
	}
	sum.Tried, sum.Failed, sum.Err = texts(sum.Tried), texts(sum.Failed), redact.Err(sum.Err)
	return sum
}

// work runs the agent loop to its end and fills r.sum with a local summary.
func (r *taskAttempt) work(ctx context.Context) {
	allowed := make([]string, 0, len(r.task.AllowedTools))
	for _, name := range r.task.AllowedTools {
		if r.toolAllowed(name) {
			allowed = append(allowed, name)
		}
	}
	if r.task.FanOut != nil {
		if tools, err := r.task.Tools.With(r.fanOutTool()); err != nil {
			r.Logger.WarnContext(ctx, "fan_out not offered", "run_id", r.task.RunID, "task_id", r.task.TaskID, "err", err)
		} else {
			r.task.Tools = tools
			r.task.AllowedTools = append(append([]string(nil), r.task.AllowedTools...), runs.FanOutTool)
			allowed = append(allowed, runs.FanOutTool)
		}
	}
	r.tools = r.task.Tools.Defs(allowed)
	if err := r.loadPrior(ctx); err != nil {
		r.finish(ctx, err)
		return
	}
	r.msgs = r.prompt()
	for it := 1; it <= r.task.MaxIterations; it++ {
		resp, err := r.iterate(ctx, it)
		if err != nil {
			r.finish(ctx, err)
			return
		}
		if len(resp.ToolCalls) == 0 || r.sum.WoundDown {
			// A wound-down iteration is the last: it was offered no tool,
			// and a tool call it made anyway is never run.
			r.sum.Facts = parseFacts(resp.Content)
			if len(r.sum.Facts) == 0 && r.sum.WoundDown {
				r.sum.Facts = r.found // it was cut short: what it found stands
			}
			r.sum.Status = StatusSucceeded
			_, compress := r.task.Model.(llm.StructuredModel)
			r.sendProgress(Progress{Iteration: it, Last: !compress || r.sum.WoundDown})
			return
		}
		n, cached := r.runTools(ctx, it, resp)
		r.sendProgress(Progress{Iteration: it, ToolCalls: n, CachedToolCalls: cached})
	}
	r.finish(ctx, fmt.Errorf("run %d iterations: %w", r.task.MaxIterations, ErrIterationLimit))
}

// sendProgress sends p, with the task's spend, peak and last grant so far.
func (r *taskAttempt) sendProgress(p Progress) {
	if r.task.ProgressFunc != nil {
		p.TokensSpent, p.Peak, p.Granted = r.sum.TokensSpent, r.sum.Peak, r.granted
		waited := r.waits.Waited()
		p.Waited, r.reported = waited-r.reported, waited
		r.task.ProgressFunc(p)
	}
}

// iterate makes iteration it's model call (see paid) and appends the reply
// to the conversation. Summary.Iterations counts iterations of the loop,
// not model calls: the retries of a call that may have been billed belong
// to its iteration.
func (r *taskAttempt) iterate(ctx context.Context, it int) (llm.Response, error) {
	c := paidCall{
		name:      fmt.Sprintf("iteration %d", it),
		key:       fmt.Sprintf("i%d", it),
		iteration: it,
		input:     r.est.Bound(r.msgs, r.tools...),
		output:    int64(r.task.MaxOutputTokens),
		least:     r.task.MinReservation,
		tools:     r.tools,
		do: func(ctx context.Context, req llm.Request) (llm.Response, error) {
			r.sum.Iterations = it
			return r.task.Model.Call(ctx, req)
		},
	}
	// The grant may say the task is wound down: the call is then its last,
	// made without tools and told to answer (a task without tools makes
	// its call as it is), and no compression call follows.
	c.windDown = func() { r.sum.WoundDown = true }
	if len(r.tools) > 0 {
		// The input bound covers the wound-down request too.
		c.input = max(c.input, r.est.Bound(append(r.msgs[:len(r.msgs):len(r.msgs)], WindDownMessage)))
		c.windDown = func() {
			if !r.sum.WoundDown { // once, also when a billed retry's grant says it again
				r.sum.WoundDown = true
				r.msgs = append(r.msgs, WindDownMessage)
			}
		}
	}
	if r.task.WindDownAfter > 0 && it > r.task.WindDownAfter {
		// Wound down from its start: this call is its last, as if its
		// grant said so.
		c.windDown()
		c.windDown, c.tools = nil, nil
	}
	resp, _, err := r.paid(ctx, c)
	if err != nil {
		return llm.Response{}, err
	}
	r.est.Record(len(r.msgs), resp.Usage)
	r.msgs = append(r.msgs, llm.Message{Role: llm.RoleAssistant, Content: resp.Content, ToolCalls: resp.ToolCalls})
	return resp, nil
}

// WindDownMessage ends the conversation of a task the run wound down. The
// input bound of every call that offers tools covers the request without
// them and with this message instead (the grant decides which is sent).
var WindDownMessage = llm.Message{Role: llm.RoleUser, Content: "The run's budget is nearly spent: this is your last turn " +
	"and no tool can be called. Answer now, in the JSON form asked for, with what you have found."}

// compress makes the compression call (see Run) and puts its facts in
// r.sum. It returns why it kept the local facts instead, if it did.
func (r *taskAttempt) compress(ctx context.Context, sm llm.StructuredModel) error {
	var ex *budget.ExhaustedError
	switch {
	case r.sum.Status == StatusFailed:
		return errors.New("skipped: the task failed") // the same failure would most likely repeat
	case errors.As(r.sum.Err, &ex) && ex.Kind != budget.KindTask && ex.State.Ended():
		return fmt.Errorf("skipped: %w", ex) // the ledger already said the run ended
	}
	var out llm.Compressed
	resp, started, err := r.paid(ctx, r.compressCall(sm, &out))
	switch {
	case err != nil && !started:
		return fmt.Errorf("skipped: %w", err)
	case err != nil && ctx.Err() != nil:
		return fmt.Errorf("cancelled: %w", err)
	case err != nil:
		return err
	case len(out.Facts) == 0:
		return errors.New("the reply was empty")
	}
	r.sum.Facts = make([]Fact, len(out.Facts))
	for i, f := range out.Facts {
		r.sum.Facts[i] = Fact{Text: f.Text, Sources: f.Sources}
	}
	if out.Degraded {
		r.sum.Failed = append(r.sum.Failed, fmt.Sprintf(
			"compress: the reply (finish reason %s) is not a fact summary; kept its text as one fact", resp.FinishReason))
	}
	return nil
}

// compressCall is the compression call, which puts its outcome in out.
func (r *taskAttempt) compressCall(sm llm.StructuredModel, out *llm.Compressed) paidCall {
	input := r.est.Bound(r.msgs) + llm.CompressTokens()
	return paidCall{
		name:      "compression",
		key:       "compress",
		iteration: r.sum.Iterations + 1,
		input:     input,
		output:    int64(r.CompressMaxTokens),
		// All or nothing: a summary cut off by a smaller grant would not parse.
		least:      input + int64(r.CompressMaxTokens),
		outputType: outputJSON,
		do: func(ctx context.Context, req llm.Request) (llm.Response, error) {
			var err error
			*out, err = llm.Compress(ctx, sm, req)
			return out.Response, err
		},
		shown: func(req llm.Request) llm.Request { // as llm.Compress sends it
			req.Messages = append(req.Messages[:len(req.Messages):len(req.Messages)],
				llm.Message{Role: llm.RoleUser, Content: llm.CompressInstruction})
			return req
		},
	}
}

func (r *taskAttempt) runEnded() bool {
	if r.task.Watch == nil {
		return false
	}
	select {
	case <-r.task.Watch.Done():
		return true
	default:
		return false
	}
}

func (r *taskAttempt) endedErr() error {
	sig := r.task.Watch.Signal()
	return fmt.Errorf("%w (%s): %w", errRunEnded, sig.State, sig.Err())
}

// finish ends the loop with err and classifies it (stopStatus).
func (r *taskAttempt) finish(ctx context.Context, err error) {
	r.sum.Err = err
	r.sum.Facts = r.found
	r.sum.Status = stopStatus(err, context.Cause(ctx))
	if r.sum.Status != StatusIterationLimit && r.sum.Status != StatusSucceeded {
		r.sum.Failed = append(r.sum.Failed, err.Error())
	}
}

// stopStatus is the one place the worker decides what status a stop is.
// err is why the loop stopped; cause is its context's cause, nil if the
// context had not ended. A ledger refusal names the run's state: a run
// cancelled or closed is CANCELLED, one out of tokens BUDGET_EXHAUSTED; a
// cancel is what its cause says (budget.ErrExhausted, budget.ErrRunCancelled,
// a deadline, ErrShuttingDown...), except that a lease that could not be
// renewed is a failure of this worker, not a cancel.
func stopStatus(err, cause error) Status {
	var ex *budget.ExhaustedError
	switch {
	case errors.As(err, &ex) && ex.Kind != budget.KindTask && ex.State.Ended() && ex.State != budget.StateExhausted:
		return StatusCancelled // the run was cancelled or closed
	case errors.Is(err, budget.ErrExhausted):
		return StatusBudgetExhausted
	case errors.Is(err, budget.ErrRunCancelled):
		return StatusCancelled
	case errors.Is(cause, context.DeadlineExceeded):
		return StatusTimedOut
	case cause != nil && errors.Is(err, cause) && !errors.Is(cause, budget.ErrLeaseLost):
		return StatusCancelled
	case errors.Is(err, ErrIterationLimit):
		return StatusIterationLimit
	default:
		return StatusFailed
	}
}

func (r *taskAttempt) prompt() []llm.Message {
	var sys strings.Builder
	sys.WriteString("You are a research subagent. Use the tools to gather facts, then answer with JSON " +
		`{"facts":[{"text":"...","sources":["..."]}]} and nothing else.`)
	if len(r.tools) > 0 {
		fmt.Fprintf(&sys, "\nCall independent tools together in one reply (at most %d run). "+
			"A failed or timed-out call is reported as such: proceed without it.", r.MaxToolCallsPerTurn)
	}
	if r.task.Goal != "" {
		fmt.Fprintf(&sys, "\nThe overall goal: %s", r.task.Goal)
	}
	msgs := []llm.Message{{Role: llm.RoleSystem, Content: sys.String()}}
	if len(r.task.ContextFacts) > 0 {
		var b strings.Builder
		b.WriteString("Facts already established:\n")
		for _, f := range r.task.ContextFacts {
			fmt.Fprintf(&b, "- %s [%s]\n", f.Text, strings.Join(f.Sources, ", "))
		}
		msgs = append(msgs, llm.Message{Role: llm.RoleUser, Content: b.String()})
	}
	if len(r.priorOrder) > 0 {
		var b strings.Builder
		b.WriteString("Earlier attempts of this task already made these writes. They are not sent again; " +
			"the same call returns the earlier outcome:\n")
		for _, w := range r.priorOrder {
			fmt.Fprintf(&b, "- %s: %s", w.Tool, w.State)
			switch {
			case w.State == runs.WriteDone && w.Result != "":
				fmt.Fprintf(&b, ": %s", firstLine(w.Result))
			case w.State == runs.WriteIssued || w.State == runs.WriteUnknown:
				b.WriteString(" (may have happened)")
			case pending(w):
				b.WriteString(" (waits for a person's approval; calling it again waits for that decision)")
			case w.Error != "":
				fmt.Fprintf(&b, ": %s", w.Error)
			}
			b.WriteString("\n")
		}
		msgs = append(msgs, llm.Message{Role: llm.RoleUser, Content: b.String()})
	}
	return append(msgs, llm.Message{Role: llm.RoleUser, Content: r.task.Instruction})
}

// parseFacts reads a final answer of the form {"facts":[{"text","sources"}]}.
// Anything else becomes one fact holding the text, so a result is never lost.
func parseFacts(content string) []Fact {
	var answer struct {
		Facts []struct {
			Text    string   `json:"text"`
			Sources []string `json:"sources"`
		} `json:"facts"`
	}
	s := strings.TrimSpace(content)
	s = strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(s, "```json"), "```"), "```")
	if err := json.Unmarshal([]byte(strings.TrimSpace(s)), &answer); err == nil && len(answer.Facts) > 0 {
		facts := make([]Fact, 0, len(answer.Facts))
		for _, f := range answer.Facts {
			if strings.TrimSpace(f.Text) != "" {
				facts = append(facts, Fact{Text: f.Text, Sources: f.Sources})
			}
		}
		if len(facts) > 0 {
			return facts
		}
	}
	if strings.TrimSpace(content) == "" {
		return nil
	}
	return []Fact{{Text: strings.TrimSpace(content)}}
}

// describeCall is a call as the summary lists it: the tool and its
// arguments redacted (as JSON if they are), then cut at 200 bytes (at a
// character boundary): a secret is whole when it is redacted.
func describeCall(c llm.ToolCall) string {
	args := redact.RawJSON(c.Args)
	if len(args) > 200 {
		cut := 200
		for cut > 0 && !utf8.RuneStart(args[cut]) {
			cut--
		}
		args = args[:cut] + "…"
	}
	return fmt.Sprintf("%s(%s)", c.Name, args)
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func contains(names []string, name string) bool {
	for _, n := range names {
		if n == name {
			return true
		}
	}
	return false
}
