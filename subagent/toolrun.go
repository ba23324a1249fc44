package subagent

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"go.opentelemetry.io/otel/metric"
	"golang.org/x/sync/errgroup"

	"github.com/fanout/fanout/internal/redact"
	"github.com/fanout/fanout/runs"
	"github.com/fanout/fanout/subagent/llm"
)

// The tool loop's defaults (Loop.ToolTimeout, Loop.MaxToolCallsPerTurn).
const (
	DefaultToolTimeout         = 60 * time.Second
	DefaultMaxToolCallsPerTurn = 8
)

// WriteLog records the tool calls with effect write (store.ToolCalls
// implements it): each is recorded before it is sent (issued, or
// awaiting_approval when its run's policy says so) and resolved once, and
// a later attempt of the task reads its earlier attempts' writes so that it
// never sends one again. secret is the attempt's (Task.AttemptSecret),
// which a worker's database login must present.
type WriteLog interface {
	// IssueWrite records w and returns it as stored: issued, or
	// awaiting_approval (with its CallID and ApprovalDeadline).
	IssueWrite(ctx context.Context, w runs.Write, secret string) (runs.Write, error)
	// SendWrite moves an approved call to issued for w's attempt.
	SendWrite(ctx context.Context, w runs.Write, secret string) (sent bool, state runs.WriteState, err error)
	// WriteStatus is where a call stands now.
	WriteStatus(ctx context.Context, key, secret string) (runs.WriteStatus, error)
	// ExpireWrite denies a call whose approval deadline passed.
	ExpireWrite(ctx context.Context, key, secret string) (runs.WriteState, error)
	ResolveWrite(ctx context.Context, key, secret string, state runs.WriteState, result, errText string) error
	Writes(ctx context.Context, tenantID, runID, taskID, secret string) ([]runs.Write, error)
}

// notRunSuperseded answers a write of an attempt the orchestrator replaced.
const notRunSuperseded = "not run: this attempt of the task was superseded by a newer one, which makes its writes"

// errToolTimeout is the cause of a tool call's context when its own
// timeout (Tool.Timeout or Loop.ToolTimeout) ends it.
var errToolTimeout = errors.New("tool call timed out")

// toolOutcome is what became of one tool call of a turn.
type toolOutcome struct {
	res      ToolResult
	err      error  // the call failed: shown to the model as an error
	notRun   string // the call was not run, and why (shown to the model)
	unknown  bool   // a write that was cut off: it may have happened
	timedOut bool   // its own timeout ended it
	notSent  bool   // the tool said it never sent the call (ErrNotSent)
	ran      bool   // the tool's Func was called
	cached   bool   // answered from the tenant's result cache: not called
}

func (o toolOutcome) failed() bool { return o.notRun != "" || o.err != nil || o.res.IsError }

// outcome classes of fanout.tool.calls.
const (
	outcomeOK       = "ok"
	outcomeError    = "error"   // the tool failed or reported isError
	outcomeTimeout  = "timeout" // its own timeout ended it
	outcomeCutOff   = "cancelled"
	outcomeNotRun   = "not_run" // over the cap, after a failed write, refused, an earlier attempt's write
	outcomeReplayed = "replayed"
	outcomeCached   = "cached" // a read answered from the result cache
)

// runTools runs the model's tool calls of iteration it and appends their
// results to the conversation in call order. At most MaxToolCallsPerTurn
// run; the rest are answered "not run". Consecutive reads run in parallel
// (ReadParallelism of this task, and the worker's ToolSlots); a write waits
// for everything before it and runs alone, and after a write fails no
// later write of the turn runs. It returns how many calls ran or were
// answered from the result cache, and how many of them were.
func (r *taskAttempt) runTools(ctx context.Context, it int, resp llm.Response) (ran, cached int) {
	calls := resp.ToolCalls
	outs := make([]toolOutcome, len(calls))
	limit := min(len(calls), r.MaxToolCallsPerTurn)
	for i := limit; i < len(calls); i++ {
		outs[i].notRun = fmt.Sprintf("not run: over the per-turn cap of %d tool calls per reply; "+
			"call it again in a later reply if you still need it", r.MaxToolCallsPerTurn)
	}
	writeFailed := false
	for start := 0; start < limit; {
		if r.effect(calls[start]) == EffectWrite {
			if _, ok := r.lookup(calls[start]); ok && writeFailed {
				outs[start].notRun = "not run: an earlier write in this reply failed"
			} else {
				outs[start] = r.runTool(ctx, it, start, calls[start])
				writeFailed = writeFailed || (ok && outs[start].failed())
			}
			start++
			continue
		}
		end := start + 1
		for end < limit && r.effect(calls[end]) == EffectRead {
			end++
		}
		var g errgroup.Group
		g.SetLimit(r.ReadParallelism)
		for i := start; i < end; i++ {
			g.Go(func() error {
				outs[i] = r.runTool(ctx, it, i, calls[i])
				return nil // A tool's failure goes to the model, not up.
			})
		}
		_ = g.Wait()
		start = end
	}
	for i, c := range calls {
		if outs[i].ran || outs[i].cached {
			ran++
		}
		if outs[i].cached {
			cached++
		}
		r.report(c, outs[i])
	}
	return ran, cached
}

// report appends call c's outcome to the conversation and the summary.
func (r *taskAttempt) report(c llm.ToolCall, o toolOutcome) {
	desc := describeCall(c)
	msg := llm.Message{Role: llm.RoleTool, ToolCallID: c.ID, Content: o.res.Text, IsError: o.failed()}
	switch {
	case o.notRun != "":
		msg.Content = o.notRun
		r.sum.Failed = append(r.sum.Failed, fmt.Sprintf("%s: %s", desc, o.notRun))
	case o.err != nil && o.unknown:
		msg.Content = fmt.Sprintf("error: %v; the write may have happened: do not assume either way", o.err)
		r.sum.Tried = append(r.sum.Tried, desc)
		r.sum.Failed = append(r.sum.Failed, fmt.Sprintf("%s: may have happened: %v", desc, o.err))
	case o.err != nil:
		msg.Content = "error: " + o.err.Error()
		r.sum.Tried = append(r.sum.Tried, desc)
		r.sum.Failed = append(r.sum.Failed, fmt.Sprintf("%s: %v", desc, o.err))
	case o.res.IsError:
		msg.Content = "error: " + o.res.Text
		r.sum.Tried = append(r.sum.Tried, desc)
		r.sum.Failed = append(r.sum.Failed, fmt.Sprintf("%s: the tool reported an error: %s", desc, firstLine(o.res.Text)))
	default:
		r.sum.Tried = append(r.sum.Tried, desc)
		if r.effect(c) == EffectRead && o.res.Text != "" {
			r.found = append(r.found, Fact{Text: firstLine(o.res.Text), Sources: o.res.Sources})
		}
		if c.Name == runs.FanOutTool && r.task.FanOut != nil {
			// What the child found is the task's, also when the task
			// cannot answer after it (its own budget spent).
			r.found = append(r.found, childFacts(o.res.Text)...)
		}
	}
	r.msgs = append(r.msgs, msg)
}

// lookup returns the tool c calls if it exists and the task allows it.
func (r *taskAttempt) lookup(c llm.ToolCall) (Tool, bool) {
	tool, ok := r.task.Tools.Get(c.Name)
	if !ok || !contains(r.task.AllowedTools, c.Name) || !r.toolAllowed(c.Name) {
		return Tool{}, false
	}
	return tool, true
}

// effect treats a tool that is unknown or not allowed as a write, so it is
// not run in parallel (it is refused anyway).
func (r *taskAttempt) effect(c llm.ToolCall) Effect {
	if tool, ok := r.lookup(c); ok {
		return tool.Effect
	}
	return EffectWrite
}

// runTool runs call i of iteration it under its own timeout.
func (r *taskAttempt) runTool(ctx context.Context, it, i int, c llm.ToolCall) (o toolOutcome) {
	tool, ok := r.lookup(c)
	spanCtx, span := r.startToolSpan(ctx, c, tool)
	started := time.Now()
	defer func() { r.endToolSpan(ctx, span, tool, o, started) }()
	if !ok {
		o.notRun = fmt.Sprintf("not run: tool %q is not allowed", c.Name)
		return o
	}
	call := ToolCall{Name: c.Name, Args: c.Args}
	if r.cacheable(tool) {
		key := r.cachedCall(tool, c.Args)
		if o.res, o.cached = r.fromCache(spanCtx, tool, key); o.cached {
			return o
		}
		defer func() { r.toCache(ctx, tool, key, o) }()
	}
	var w runs.Write
	if tool.Effect == EffectWrite {
		// Recorded before anything else, and approved first if the run's
		// policy says so: the wait holds no tool slot and runs before the
		// call's own timeout starts.
		var done bool
		if w, o, done = r.recordWrite(ctx, it, i, tool, c); done {
			return o
		}
		call.IdempotencyKey = w.Key
	}
	timeout := tool.Timeout
	if timeout <= 0 {
		timeout = r.ToolTimeout
	}
	callCtx, cancel := context.WithTimeoutCause(spanCtx, timeout, errToolTimeout)
	defer cancel()
	if r.ToolSlots != nil && !tool.answered { // the worker's bound, in front of the fleet's
		select {
		case r.ToolSlots <- struct{}{}:
			defer func() { <-r.ToolSlots }()
		case <-callCtx.Done():
			o.notRun = fmt.Sprintf("not run: no tool slot on this worker within %s", timeout)
			if tool.Effect == EffectWrite {
				o.notSent = true
				r.resolve(ctx, w, &o)
			}
			return o
		}
	}
	inFlight := metrics().toolInFlight
	attrs := toolMetricAttrs(tool)
	inFlight.Add(ctx, 1, metric.WithAttributeSet(attrs))
	o.ran = true
	o.res, o.err = tool.Func(callCtx, call)
	inFlight.Add(context.WithoutCancel(ctx), -1, metric.WithAttributeSet(attrs))
	o.notSent = errors.Is(o.err, ErrNotSent)
	switch {
	case o.err != nil && ctx.Err() == nil && errors.Is(context.Cause(callCtx), errToolTimeout):
		o.timedOut = true
		o.err = fmt.Errorf("timed out after %s: proceed without it", timeout)
	case o.err != nil:
		o.err = fmt.Errorf("run tool %s: %w", c.Name, o.err)
	}
	if tool.Effect == EffectWrite && (!tool.answered || o.notSent) {
		r.resolve(ctx, w, &o)
	}
	return o
}

// recordWrite records write call i of iteration it before it is sent: it
// returns the row to send under, or done with the call's outcome when it
// must not be sent (made before by this task, refused, denied, or the
// task ended while it waited for approval).
func (r *taskAttempt) recordWrite(ctx context.Context, it, i int, tool Tool, c llm.ToolCall) (w runs.Write, o toolOutcome, done bool) {
	w = r.newWrite(it, i, tool, c)
	if prior, ok := r.prior[priorKey(w.Tool, w.ArgsDigest)]; ok && tool.answered && prior.State == runs.WriteIssued {
		// An earlier attempt's fan_out whose child has not answered: wait
		// for the same child, under the call's key.
		return prior, o, false
	}
	if prior, ok := r.prior[priorKey(w.Tool, w.ArgsDigest)]; ok && !pending(prior) {
		return w, replayed(prior), true
	} else if ok {
		// An earlier attempt asked for this call's approval: take it up
		// under its key and id, never ask again.
		w = prior
	} else if r.Writes != nil {
		got, err := r.Writes.IssueWrite(ctx, w, r.task.AttemptSecret)
		switch {
		case errors.Is(err, runs.ErrAttemptSuperseded):
			o.notRun = notRunSuperseded
			return w, o, true
		case err != nil:
			// Perhaps recorded after all (a reply lost): say it was never sent.
			o.notRun = fmt.Sprintf("not run: the write could not be recorded before it was sent: %v", err)
			o.notSent = true
			r.resolve(ctx, w, &o)
			return w, o, true
		}
		w.State, w.CallID, w.ApprovalDeadline = got.State, got.CallID, got.ApprovalDeadline
	}
	if pending(w) && r.Writes != nil {
		if o, ok := r.awaitApproval(ctx, tool, w); !ok {
			return w, o, true
		}
		w.State = runs.WriteIssued // tool_call_send said so
	}
	if w.State != runs.WriteIssued {
		// Only the database's "issued" sends a write: a path that skipped
		// the wait stops here.
		o.notRun = fmt.Sprintf("not run: the write is %s, not issued", w.State)
		return w, o, true
	}
	return w, o, false
}

// toolAllowed reports whether the task's tenant may use the tool (the
// operator's policy, Loop.ToolAllowed).
func (r *taskAttempt) toolAllowed(name string) bool {
	if name == runs.FanOutTool && r.task.FanOut != nil {
		return true // the run's spec allows it, not the operator's tool policy
	}
	return r.ToolAllowed == nil || r.ToolAllowed(name, r.task.TenantID)
}

// newWrite is the tool_call row of a write about to be sent.
func (r *taskAttempt) newWrite(it, i int, tool Tool, c llm.ToolCall) runs.Write {
	return runs.Write{
		Key:      fmt.Sprintf("%s/%s/a%d/i%d/c%d", r.task.RunID, r.task.TaskID, r.task.Attempt, it, i),
		Account:  int64(r.task.Account),
		TenantID: r.task.TenantID, RunID: r.task.RunID, TaskID: r.task.TaskID,
		Attempt: int64(r.task.Attempt), Iteration: it, Index: i,
		Server: tool.Server, Tool: tool.Name, ArgsDigest: argsDigest(c.Args), State: runs.WriteIssued,
		Preview: preview(c.Args),
	}
}

// resolve records how write w ended and marks o unknown if it may have
// happened. The row is written even if ctx ended: it is what a later
// attempt reads.
func (r *taskAttempt) resolve(ctx context.Context, w runs.Write, o *toolOutcome) {
	state, errText := runs.WriteDone, ""
	switch {
	case o.notSent:
		state, errText = runs.WriteNotSent, cmp.Or(o.notRun, fmt.Sprint(o.err))
	case o.err != nil:
		state, errText, o.unknown = runs.WriteUnknown, o.err.Error(), true
	case o.res.IsError:
		state, errText = runs.WriteFailed, "the tool reported: "+firstLine(o.res.Text)
	}
	// The error is served (ListToolCalls, the auditors' tool_calls): redacted
	// as the summary is. The result is not served: what the model was shown.
	errText = redact.Text(errText)
	if state != runs.WriteNotSent {
		// Asked again later in this attempt (after a timeout, say), the
		// same call is answered from this one, never sent under another key.
		w.State, w.Result, w.Error = state, o.res.Text, errText
		r.remember(w)
	}
	if r.Writes == nil {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	if err := r.Writes.ResolveWrite(rctx, w.Key, r.task.AttemptSecret, state, o.res.Text, errText); err != nil {
		// The row stays issued: a later attempt treats it as may have happened.
		r.Logger.WarnContext(ctx, "resolve tool write", "key", w.Key, "state", state, "err", err)
	}
}

// remember records a write this task made, so that the same call is never
// sent again (runTool answers it with replayed).
func (r *taskAttempt) remember(w runs.Write) {
	if r.prior == nil {
		r.prior = map[string]runs.Write{}
	}
	r.prior[priorKey(w.Tool, w.ArgsDigest)] = w
}

// replayed is the outcome of a write this task already made with the same
// tool and arguments, in an earlier attempt or earlier in this one: it is
// not sent again.
func replayed(w runs.Write) toolOutcome {
	not := fmt.Sprintf("not sent again: this task already made this exact call (attempt %d, iteration %d)", w.Attempt, w.Iteration)
	switch w.State {
	case runs.WriteDone:
		return toolOutcome{res: ToolResult{Text: fmt.Sprintf("%s, which succeeded: %s", not, w.Result)}}
	case runs.WriteFailed:
		return toolOutcome{res: ToolResult{Text: fmt.Sprintf("%s, which failed: %s", not, w.Error), IsError: true}}
	case runs.WriteDenied:
		return toolOutcome{err: fmt.Errorf("%s, which was %s", not, w.Error)}
	default: // issued or unknown: it was sent and never heard back
		return toolOutcome{err: fmt.Errorf("%s, which was cut off", not), unknown: true}
	}
}

// loadPrior reads the writes of the task's earlier attempts, so none is
// sent again. Without them the task must not run: it could repeat one.
func (r *taskAttempt) loadPrior(ctx context.Context) error {
	if r.Writes == nil || r.task.Attempt <= 1 {
		return nil
	}
	ws, err := r.Writes.Writes(ctx, r.task.TenantID, r.task.RunID, r.task.TaskID, r.task.AttemptSecret)
	if err != nil {
		return fmt.Errorf("read the writes of earlier attempts: %w", err)
	}
	for _, w := range ws {
		if w.State == runs.WriteNotSent {
			continue // it never reached the tool: this attempt may make it
		}
		if w.Attempt < int64(r.task.Attempt) {
			r.remember(w)
			r.priorOrder = append(r.priorOrder, w)
		}
	}
	return nil
}

func priorKey(tool, digest string) string { return tool + "\x00" + digest }

// argsDigest is the hex SHA-256 of a call's arguments in canonical form
// (canonicalArgs), so the same arguments written differently match; it
// keys a write's tool_call row and a read's result cache entry.
func argsDigest(args json.RawMessage) string {
	sum := sha256.Sum256(canonicalArgs(args))
	return hex.EncodeToString(sum[:])
}

// canonicalArgs returns a call's arguments as canonical JSON: object keys
// sorted, no insignificant whitespace, numbers kept as written (so ids past
// 2^53 stay apart; 1 and 1.0 differ), strings as encoding/json escapes
// them. Arguments that are not one JSON value are returned as sent.
func canonicalArgs(args json.RawMessage) []byte {
	d := json.NewDecoder(bytes.NewReader(args))
	d.UseNumber()
	var v any
	if d.Decode(&v) == nil && d.Decode(new(any)) == io.EOF {
		if c, err := json.Marshal(v); err == nil {
			return c
		}
	}
	return args
}
