package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// The dispatcher sends one call — a task, or a run's synthesis — to a
// worker and follows it to its outcome. Tasks and synthesis share it: the
// same attempt fencing in the ledger, the same retry of a refusal on
// another worker, the same CancelGrace before a call is cut.
//
// A call waits for a worker until its deadline: workers that are briefly
// away (a rolling restart, an orchestrator that came up first) make it
// wait, never fail. How it waits, and why so:
//
//   - Each try goes to a worker whose channel is connected (READY),
//     looking from the one in turn on (WorkerPool.Connected): with a
//     static list every worker is its own channel, and a dead one would
//     otherwise hold every call sent to it while the others are idle.
//   - When none is connected, the call waits for the one in turn to
//     connect (gRPC wait-for-ready), but at most connectWait. Waiting for
//     ever on one channel would starve the call while another worker comes
//     back first; a bound longer than the channels' reconnect backoff (capped
//     at a few seconds where node dials them) lets every wait see at least
//     one reconnect. The bound cuts the stream's context, which it shares
//     with the call: the cut can race a connection made at that very
//     moment, but no Started has arrived then, so the call had not started
//     by our one rule (callFailed), and the next try's new attempt fences
//     whatever the worker got.
//   - A refusal before the worker started (UNAVAILABLE: draining or
//     unreachable; RESOURCE_EXHAUSTED: full) sends the call on to the next
//     worker at once; after every worker of the pool refused it in turn, the
//     next round waits a jittered backoff (full jitter: uniform in
//     [0, RetryBackoff·2^n], capped at maxRetryBackoff), so that tasks told
//     no at the same moment do not come back together.
//   - A call a worker had started (it sent Started) is never sent again:
//     it may have spent.
//
// The call fails for want of a worker only when its deadline passes, and
// says so: "no worker took the task before its deadline (N attempts): last
// error: …".

// maxRetryBackoff caps the wait between two rounds of attempts to dispatch
// a call.
const maxRetryBackoff = 2 * time.Second

// connectWait bounds how long one try waits for its worker's channel to
// connect before the call goes to the next worker.
const connectWait = 3 * time.Second

// errNotConnected is the error of a try whose worker's channel did not
// connect within connectWait.
var errNotConnected = errors.New("the worker's channel did not connect")

// dispatch is one call — a task, or a run's synthesis — on its way to a
// worker: built per call by the driver with what the call needs (as River's
// job executor is built per job), it sends the call, follows it to its
// outcome and returns that. It holds no driver: what it needs of the run
// comes in as two narrow dependencies, progress (where a task's start and
// iterations are recorded) and awaitLease (the run's lease, which the
// driver keeps); the driver keeps scheduling and bookkeeping (persisting the
// outcome, the run's budget, the join).
type dispatch struct {
	req   *fanoutv1.Dispatch // its Attempt and AttemptSecret are set per try
	first Worker             // the worker in turn; the first connected one after it takes the first try

	workers *WorkerPool
	ledger  budget.Ledger // BeginAttempt, once per try
	// begun, if set, is the attempt begun for the first try already (with
	// the run: RunAccounts.Attempts); later tries begin their own.
	begun    *budget.Attempt
	sign     func(*fanoutv1.Dispatch) (*fanoutv1.ExecuteRequest, error)
	progress progress
	// awaitLease returns nil once the run's lease is held, else why it is
	// not (the run was lost, ctx ended).
	awaitLease func(context.Context) error

	log          *slog.Logger
	retryBackoff time.Duration // Config.RetryBackoff
	cancelGrace  time.Duration // Config.CancelGrace

	// tried is the address of the worker of the latest try (sentTo).
	tried atomic.Pointer[Worker]
}

// sentTo is the worker of the call's latest try, or the one in turn
// before any: a hedge goes to another one (hedge.go).
func (c *dispatch) sentTo() Worker {
	if w := c.tried.Load(); w != nil {
		return *w
	}
	return c.first
}

// newDispatch builds the dispatch of req for this run.
func (d *driver) newDispatch(first Worker, req *fanoutv1.Dispatch, p progress) *dispatch {
	cfg := d.e.cfg
	return &dispatch{req: req, first: first, workers: d.e.workers, ledger: d.e.ledger, sign: d.e.envelope,
		progress: p, awaitLease: d.awaitLease, log: cfg.Logger, retryBackoff: cfg.RetryBackoff, cancelGrace: cfg.CancelGrace}
}

// progress hears how a dispatched call goes. A task records its start and
// iterations in the store and as run events; synthesis records nothing.
type progress interface {
	started(ctx context.Context, worker string)
	iteration(ctx context.Context, it *fanoutv1.SubagentIteration)
	approval(ctx context.Context, a *fanoutv1.SubagentApproval)
	// fanOut hears a fan_out call of the attempt: it opens the child run,
	// or answers the call with why not.
	fanOut(ctx context.Context, attempt int32, f *fanoutv1.SubagentFanOut)
}

// run sends the call to a worker, first (or the first connected worker
// after it) and, while workers refuse it or cannot be reached before they
// start it, to the next ones, until one takes it or ctx — the call's
// deadline — ends. Each try is a new attempt in the ledger on the call's
// account, so only the latest can reserve. The outcome has no summary when
// the call ended before a worker took it, except a failure for want of a
// worker.
func (c *dispatch) run(ctx context.Context) *fanoutv1.TaskOutcome {
	req, pool := c.req, c.workers
	backoff := c.retryBackoff
	next := c.first
	var lastErr error
	refused := 0 // refusals since the last backoff
	lost := 0    // workers lost while they ran it
	for attempt := 1; ; attempt++ {
		if ctx.Err() != nil {
			return c.noWorker(ctx, req.GetTask().GetId(), attempt-1, lastErr)
		}
		if err := c.awaitLease(ctx); err != nil {
			return unstarted(err) // it never ran
		}
		w, _ := pool.Connected(next)
		c.tried.Store(&w)
		r := proto.CloneOf(req)
		a, err := c.attempt(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return c.noWorker(ctx, req.GetTask().GetId(), attempt-1, lastErr)
			}
			return c.attemptRefused(ctx, req.GetTask().GetId(), err)
		}
		r.Attempt, r.AttemptSecret = int32(min(a.N, math.MaxInt32)), a.Secret
		o, retry, err := c.execute(ctx, w, r)
		if retry && errors.Is(err, errWorkerLost) {
			// Its worker died with it: dispatch it again, as the next
			// attempt (the ledger fences the lost one; its writes are
			// recorded, so none is sent again), a bounded number of times.
			if lost++; lost > maxWorkerLosses {
				return o
			}
			c.log.WarnContext(ctx, "worker lost while it ran the task; dispatching it again", "run_id", req.GetRunId(),
				"task_id", req.GetTask().GetId(), "worker", w.Addr, "attempt", attempt, "err", err)
		}
		if !retry {
			return o
		}
		lastErr = err
		next = pool.After(w)
		if ctx.Err() != nil {
			continue // the loop's top ends it
		}
		c.log.InfoContext(ctx, "worker did not take the call; sending it elsewhere", "run_id", req.GetRunId(),
			"task_id", req.GetTask().GetId(), "worker", w.Addr, "attempt", attempt, "err", err)
		if errors.Is(err, errNotConnected) {
			refused = 0 // it has waited connectWait already
			continue
		}
		if refused++; refused < pool.Len() {
			continue // the next worker may take it at once
		}
		refused = 0
		sleep(ctx, rand.N(backoff)+time.Millisecond)
		backoff = min(2*backoff, maxRetryBackoff)
	}
}

// noWorker is the outcome of a call whose context ended before a worker
// took it, after attempts tries, the last of which failed with lastErr.
// When its deadline passed (the task's or the run's) while workers refused
// it or could not be reached, it failed for want of a worker, and says so;
// otherwise (a cancel, the budget, or no try yet) its cause stopped it.
func (c *dispatch) noWorker(ctx context.Context, taskID string, attempts int, lastErr error) *fanoutv1.TaskOutcome {
	cause := context.Cause(ctx)
	deadline := errors.Is(cause, errTaskTimeout) || errors.Is(cause, errRunTimeout)
	if lastErr == nil || !deadline {
		return c.notStarted(ctx, taskID, lastErr)
	}
	c.log.WarnContext(ctx, "no worker took the task before its deadline", "run_id", c.req.GetRunId(),
		"task_id", taskID, "attempts", attempts, "cause", cause, "last_worker_error", lastErr)
	tries := "attempts"
	if attempts == 1 {
		tries = "attempt"
	}
	return failedOutcome(fmt.Sprintf("no worker took the task before its deadline (%d %s): last error: %v",
		attempts, tries, lastErr))
}

// sleep waits d or until ctx ends, and reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// failedOutcome is a FAILED outcome whose summary says why.
func failedOutcome(msg string) *fanoutv1.TaskOutcome {
	return &fanoutv1.TaskOutcome{Status: fanoutv1.TaskStatus_TASK_STATUS_FAILED,
		Summary: &fanoutv1.FactSummary{Status: fanoutv1.TaskStatus_TASK_STATUS_FAILED, Error: msg}}
}

// envelope signs d for a worker: the worker runs exactly the bytes signed.
func (e *Engine) envelope(d *fanoutv1.Dispatch) (*fanoutv1.ExecuteRequest, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("encode dispatch of task %s: %w", d.GetTask().GetId(), err)
	}
	return &fanoutv1.ExecuteRequest{Dispatch: b, Signature: e.signer.SignDispatch(b), KeyId: e.signer.KeyID()}, nil
}

// attempt is this try's attempt: the one begun with the run for the first
// try, if there is one, else a new one (beginAttempt).
func (c *dispatch) attempt(ctx context.Context) (budget.Attempt, error) {
	if a := c.begun; a != nil {
		c.begun = nil
		return *a, nil
	}
	return c.beginAttempt(ctx, budget.AccountID(c.req.GetTaskAccountId()))
}

// beginAttempt records a new dispatch of the task (or synthesis) whose
// ledger account is acct and returns its number and secret: from now on
// only that attempt can reserve on it (an earlier one is fenced). A transient
// database error is retried with backoff until ctx (the call's deadline)
// ends; a refusal (the run ended, the account is not the run's) is not.
func (c *dispatch) beginAttempt(ctx context.Context, acct budget.AccountID) (budget.Attempt, error) {
	backoff := c.retryBackoff
	for {
		actx, cancel := context.WithTimeout(ctx, cleanupTimeout)
		a, err := c.ledger.BeginAttempt(actx, acct, c.req.GetRunId(), c.req.GetTenantId())
		cancel()
		switch {
		case err == nil:
			return a, nil
		case errors.Is(err, budget.ErrExhausted), errors.Is(err, budget.ErrDenied), errors.Is(err, budget.ErrNotFound):
			return budget.Attempt{}, err
		}
		c.log.WarnContext(ctx, "begin task attempt; retrying", "run_id", c.req.GetRunId(), "account", acct,
			"backoff", backoff, "err", err)
		if !sleep(ctx, backoff) {
			return budget.Attempt{}, err
		}
		backoff = min(2*backoff, maxRetryBackoff)
	}
}

// attemptRefused is the outcome of a call the ledger would not let start:
// its run ended (exhausted, cancelled) before the dispatch, its context
// ended while the ledger could not be reached, or the ledger refused it.
func (c *dispatch) attemptRefused(ctx context.Context, taskID string, err error) *fanoutv1.TaskOutcome {
	var ex *budget.ExhaustedError
	switch {
	case errors.As(err, &ex):
		return unstarted(ex) // it never ran
	case ctx.Err() != nil:
		return c.notStarted(ctx, taskID, err)
	}
	c.log.ErrorContext(ctx, "begin task attempt", "run_id", c.req.GetRunId(), "task_id", taskID, "err", err)
	return failedOutcome("internal error: the ledger refused to record the dispatch (see the orchestrator's log)")
}

// notStarted is the outcome of a call whose context ended before a worker
// started it.
func (c *dispatch) notStarted(ctx context.Context, taskID string, lastErr error) *fanoutv1.TaskOutcome {
	if lastErr != nil {
		c.log.InfoContext(ctx, "task ended before a worker took it", "run_id", c.req.GetRunId(),
			"task_id", taskID, "cause", context.Cause(ctx), "last_worker_error", lastErr)
	}
	return unstarted(context.Cause(ctx)) // it never ran
}

// execute runs req on worker w. retry reports that the call did not
// start: the worker refused it or could not be reached (within
// connectWait), or ctx ended first.
func (c *dispatch) execute(ctx context.Context, w Worker, req *fanoutv1.Dispatch) (o *fanoutv1.TaskOutcome, retry bool, err error) {
	callCtx, release := c.callContext(ctx)
	defer release()
	env, err := c.sign(req)
	if err != nil {
		return c.callFailed(ctx, callCtx, w, false, err)
	}
	// The stream's context: callCtx, cut by the connect bound too.
	streamCtx, cutStream := context.WithCancelCause(callCtx)
	defer cutStream(nil)
	connecting := time.AfterFunc(connectWait, func() { cutStream(errNotConnected) })
	stream, err := w.Client.Execute(streamCtx, env, grpc.WaitForReady(true))
	if !connecting.Stop() && callCtx.Err() == nil {
		// Cut while it waited for the channel (or at the moment it was
		// sent: see the comment at the top of the file).
		if err == nil {
			return nil, true, fmt.Errorf("%w within %v", errNotConnected, connectWait)
		}
		return nil, true, fmt.Errorf("%w within %v: %w", errNotConnected, connectWait, err)
	}
	if err != nil {
		return c.callFailed(ctx, callCtx, w, false, err)
	}
	worker := ""
	for {
		msg, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("worker closed the stream without a summary")
			}
			o, retry, err := c.callFailed(ctx, callCtx, w, worker != "", err)
			if o != nil { // nil: refused before it started, to be sent elsewhere
				o.Worker = worker
			}
			return o, retry, err
		}
		switch ev := msg.GetEvent().(type) {
		case *fanoutv1.ExecuteResponse_Started:
			worker = cmpOr(ev.Started.GetWorker(), w.Addr)
			c.progress.started(ctx, worker)
		case *fanoutv1.ExecuteResponse_Iteration:
			c.progress.iteration(ctx, ev.Iteration)
		case *fanoutv1.ExecuteResponse_Approval:
			c.progress.approval(ctx, ev.Approval)
		case *fanoutv1.ExecuteResponse_FanOut:
			c.progress.fanOut(ctx, req.GetAttempt(), ev.FanOut)
		case *fanoutv1.ExecuteResponse_Summary:
			s := ev.Summary
			if !terminalStatus(s.GetStatus()) {
				s.Error = fmt.Sprintf("worker reported non-terminal status %s; %s", s.GetStatus(), s.GetError())
				s.Status = fanoutv1.TaskStatus_TASK_STATUS_FAILED
			}
			return &fanoutv1.TaskOutcome{Status: s.GetStatus(), Summary: s, TokensSpent: s.GetTokensSpent(),
				Worker: cmpOr(worker, w.Addr)}, false, nil
		}
	}
}

// callContext is the context of one worker call. It outlives ctx by up to
// CancelGrace when the worker hears ctx's cause by itself, so that its
// summary (what it found before it stopped) still arrives; then it is cut
// with that cause. release must be called when the call has ended.
func (c *dispatch) callContext(ctx context.Context) (callCtx context.Context, release func()) {
	grace := c.cancelGrace
	callCtx, cutCall := context.WithCancelCause(context.WithoutCancel(ctx))
	streamDone := make(chan struct{})
	afterDone := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(afterDone)
		cause := context.Cause(ctx)
		if workerHears(cause) && grace > 0 {
			t := time.NewTimer(grace)
			defer t.Stop()
			select {
			case <-streamDone:
			case <-t.C:
			}
		}
		cutCall(cause)
	})
	return callCtx, func() {
		close(streamDone)
		if !stop() {
			<-afterDone
		}
		cutCall(nil)
	}
}

// callFailed maps a failed Execute call to an outcome; retry reports a
// refusal before the worker started, which another worker may take, or a
// started call whose worker was lost (errWorkerLost; o is its outcome if
// it is not sent again).
func (c *dispatch) callFailed(ctx, callCtx context.Context, w Worker, started bool, err error) (o *fanoutv1.TaskOutcome, retry bool, _ error) {
	if callCtx.Err() != nil {
		// We cut the call: its context ended.
		if !started {
			return nil, true, err // dispatch ends it (noWorker)
		}
		return &fanoutv1.TaskOutcome{Status: stoppedStatus(context.Cause(callCtx), true)}, false, err
	}
	code := status.Code(err)
	if !started && (code == codes.ResourceExhausted || code == codes.Unavailable) {
		return nil, true, err
	}
	if !started {
		return failedOutcome(fmt.Sprintf("worker %s refused the task: %v", w.Addr, err)), false, err
	}
	o = failedOutcome(fmt.Sprintf("worker %s failed: %v", w.Addr, err))
	if code == codes.Unavailable { // the connection broke: the worker is gone, not the task
		return o, true, fmt.Errorf("%w: %w", errWorkerLost, err)
	}
	return o, false, err
}

// errWorkerLost is a started call's error when its worker's connection
// broke (the process died, its node went away): the task is dispatched
// again, at most maxWorkerLosses times, and then fails with o.
var errWorkerLost = errors.New("worker lost")

// maxWorkerLosses bounds how many times one task is dispatched again after
// the worker running it was lost: a task that kills its workers fails.
const maxWorkerLosses = 2

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// noProgress is the progress of a call that records none (synthesis).
type noProgress struct{}

func (noProgress) started(context.Context, string)                        {}
func (noProgress) iteration(context.Context, *fanoutv1.SubagentIteration) {}
func (noProgress) approval(context.Context, *fanoutv1.SubagentApproval)   {}

// fanOut: a synthesis is offered no fan_out (its dispatch has no allowance).
func (noProgress) fanOut(context.Context, int32, *fanoutv1.SubagentFanOut) {}
