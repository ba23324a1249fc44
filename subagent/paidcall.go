package subagent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fanout/fanout/budget"
	"github.com/fanout/fanout/subagent/llm"
)

// paidCall is one model call the loop pays for: an iteration's or the
// compression call. paid reserves for it, calls and settles.
type paidCall struct {
	name       string // in errors: "iteration 3", "compression"
	key        string // its reservation's name within the task's attempt: "i3", "compress"
	iteration  int    // llm.Meta.Iteration
	input      int64  // upper bound of the request's input tokens (llm.Estimator)
	output     int64  // output allowance, reserved on top of input: the most MaxTokens can be
	least      int64  // the smallest grant worth calling with
	tools      []llm.ToolDef
	outputType string // the chat span's gen_ai.output.type, if the call asks for one
	// do makes the call for req, whose MaxTokens is what the grant leaves
	// after input. It runs once per paid call, each billed retry included.
	do func(ctx context.Context, req llm.Request) (llm.Response, error)
	// shown, if set, returns req as do sends it, for the chat span.
	shown func(req llm.Request) llm.Request
	// windDown, if set, is called when the grant says the run winds down
	// (Reservation.WindDown), before the request is built: the call is
	// then made without tools. Its input bound must cover what windDown
	// adds.
	windDown func()
}

// paid makes c under the ledger's discipline: reserve input bound plus
// output allowance (at least c.least) on the task account; call under a
// lease renewed while the call runs; settle exactly once, with the reported
// usage or, if the call failed (usage unknown), at the whole reservation,
// flagged estimated. A grant is voided only when no call was made with it.
//
// A call that failed after it may have been billed (llm.ErrMaybeBilled: a
// 5xx not in the provider's error shape) has been settled at its whole
// reservation; it is made again under a new reservation (key "i3r1",
// "i3r2", ...) after a backoff, as BilledRetry allows.
//
// started reports whether any call was made: an error without one means c
// was skipped (ctx or the run ended, or the ledger did not grant enough).
func (r *taskAttempt) paid(ctx context.Context, c paidCall) (resp llm.Response, started bool, err error) {
	key := c.key
	var slept time.Duration
	for n := 1; ; n++ {
		asked := time.Now() // the grant's lease starts no earlier (see renewLease)
		res, err := r.grant(ctx, c, key)
		if err != nil {
			return llm.Response{}, n > 1, err
		}
		r.granted = res.Amount
		r.sum.Peak = max(r.sum.Peak, r.sum.TokensSpent+res.Amount)
		resp, billed, err := r.callAndPay(ctx, c, res, asked)
		if billed == nil {
			return resp, true, err
		}
		delay, err := r.retryBilled(ctx, &c, key, n, slept, billed, err)
		if err != nil {
			return llm.Response{}, true, err
		}
		slept += delay
		key = fmt.Sprintf("%sr%d", c.key, n)
	}
}

// retryBilled waits before the nth call of c, made under key, is made again
// after err, a failure that may have been billed, as BilledRetry allows
// (slept so far). It returns the time it waited, or why c is not made again.
// It is apart from paid to keep paid's frame small (Loop.run).
func (r *taskAttempt) retryBilled(ctx context.Context, c *paidCall, key string, n int, slept time.Duration,
	billed *llm.StatusError, err error) (time.Duration, error) {
	delay, why := r.BilledRetry.Next(ctx, n, slept, billed.RetryAfter)
	if why != "" {
		return 0, fmt.Errorf("%w after %s: %w", llm.ErrRetriesExhausted, why, err)
	}
	r.sum.Failed = append(r.sum.Failed, fmt.Sprintf("%v; paid at its whole reservation, retried under a new one", err))
	r.Logger.WarnContext(ctx, "model call may have been billed: retried under a new reservation",
		"run_id", r.task.RunID, "task_id", r.task.TaskID, "iteration", c.iteration, "key", key,
		"status", billed.StatusCode, "call", n, "sleep", delay, "retry_after", billed.RetryAfter)
	if err := llm.Sleep(ctx, delay); err != nil {
		return 0, err
	}
	return delay, nil
}

// grant reserves for c under key. A grant that arrives after ctx ended,
// leaves no token for output, or comes once this worker knows the run ended
// is voided: no call is made with it.
func (r *taskAttempt) grant(ctx context.Context, c paidCall, key string) (budget.Reservation, error) {
	if err := context.Cause(ctx); err != nil {
		return budget.Reservation{}, err
	}
	if r.runEnded() {
		return budget.Reservation{}, r.endedErr() // under PolicyDrain: start nothing new
	}
	want := c.input + c.output
	res, err := r.reserve(ctx, want, min(c.least, want), key)
	if err != nil {
		if ctx.Err() != nil {
			return budget.Reservation{}, context.Cause(ctx)
		}
		return budget.Reservation{}, fmt.Errorf("reserve %d tokens for %s: %w", want, c.name, err)
	}
	var stop error
	switch {
	case ctx.Err() != nil:
		stop = context.Cause(ctx)
	case res.Amount-c.input < 1:
		stop = fmt.Errorf("reserve %d tokens for %s: granted %d, input alone needs %d: %w",
			want, c.name, res.Amount, c.input, budget.ErrExhausted)
	case r.runEnded():
		stop = r.endedErr() // Never start a call once this worker knows the run ended.
	}
	if stop != nil {
		r.void(ctx, res)
		return budget.Reservation{}, stop
	}
	return res, nil
}

// callAndPay makes c's call under res, which was asked for at asked, and
// settles res (see pay). If the call failed after it may have been billed
// and ctx has not ended, it returns the call's error as billed too, for
// paid to retry.
func (r *taskAttempt) callAndPay(ctx context.Context, c paidCall, res budget.Reservation, asked time.Time) (llm.Response, *llm.StatusError, error) {
	if res.WindDown && c.windDown != nil {
		c.windDown()
		c.windDown, c.tools = nil, nil
	}
	req := llm.Request{
		Model:       r.task.ModelName,
		Messages:    r.msgs,
		Tools:       c.tools,
		MaxTokens:   int(min(res.Amount-c.input, c.output)),
		InputBound:  c.input,
		Temperature: r.task.Temperature,
		Seed:        r.task.Seed,
		Meta: llm.Meta{RunID: r.task.RunID, TenantID: r.task.TenantID, TaskID: r.task.TaskID, Iteration: c.iteration,
			ReservationID: int64(res.ID)},
	}
	shown := req
	if c.shown != nil {
		shown = c.shown(req)
	}
	resp, callErr := r.call(ctx, res, asked, shown, c.outputType, func(ctx context.Context) (llm.Response, error) {
		return c.do(ctx, req)
	})
	if err := r.pay(ctx, res, resp, callErr); err != nil {
		return llm.Response{}, nil, errors.Join(callErr, err)
	}
	if callErr == nil {
		return resp, nil, nil
	}
	billed, err := r.callFailed(ctx, c.name, callErr)
	return llm.Response{}, billed, err
}

// callFailed is the error of the call named name that failed with callErr,
// and callErr's status if the call may have been billed (callAndPay). It is
// apart from callAndPay to keep callAndPay's frame small (Loop.run).
func (r *taskAttempt) callFailed(ctx context.Context, name string, callErr error) (*llm.StatusError, error) {
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	err := fmt.Errorf("call model %s in %s: %w", r.task.Model.Name(), name, callErr)
	var se *llm.StatusError
	if errors.As(callErr, &se) && se.MaybeBilled() {
		return se, err
	}
	return nil, err
}

// reserve asks the task account for a grant of want tokens (at least least).
// key names the call within the task's attempt ("i3", "compress").
func (r *taskAttempt) reserve(ctx context.Context, want, least int64, key string) (budget.Reservation, error) {
	// Not on ctx: a reserve cut short by ctx may commit with its reply lost,
	// leaving a grant held (and later counted as spent) for a call never
	// made. It is one short statement; callers void a grant that arrives
	// after ctx ended.
	// Given up to ledgerPatience while the task lives: a slow database
	// does not fail the task.
	pctx, done := patient(ctx, ledgerPatience)
	defer done()
	return r.Ledger.Reserve(pctx, budget.ReserveParams{
		Account:  r.task.Account,
		RunID:    r.task.RunID,
		TenantID: r.task.TenantID,
		Attempt:  int64(r.task.Attempt),
		Secret:   r.task.AttemptSecret,
		Want:     want,
		Min:      least,
		Holder:   r.Holder,
		TTL:      r.LeaseTTL,
		Key:      fmt.Sprintf("%s/%s/a%d/%s", r.task.RunID, r.task.TaskID, r.task.Attempt, key),
		Model:    requestModel(r.task.Model, llm.Request{Model: r.task.ModelName}),
		FromHeld: r.task.FromHeld,
	})
}

// pay settles res after its call: with the reported usage, or, if the call
// failed (usage unknown), with the whole reservation, flagged estimated.
// A call the provider refused in its own error shape (a 429, a 400, a 5xx
// it owns to) ran nothing and is settled at 0, exactly: that is proof it
// is unspent (docs/ledger.md#reservation-states). Usage past the
// reservation is reported (see reportOverrun) and settled as it is: the
// ledger records the overrun.
func (r *taskAttempt) pay(ctx context.Context, res budget.Reservation, resp llm.Response, callErr error) error {
	actual, estimated := resp.Usage.Total(), false
	if callErr != nil {
		actual, estimated = res.Amount, true
		if refused(callErr) {
			actual, estimated = 0, false
		}
	}
	if actual > res.Amount {
		r.reportOverrun(ctx, res, resp.Usage)
	}
	usage := resp.Usage
	if estimated {
		usage = llm.Usage{} // no split of a guess
	}
	settled, err := r.settle(ctx, res, actual, usage, estimated)
	if err != nil {
		return err
	}
	r.sum.TokensSpent += settled.Spent
	return nil
}

// refused reports whether err is a provider's refusal in its own error
// shape, after which it billed nothing (llm.StatusError, not MaybeBilled).
func refused(err error) bool {
	var se *llm.StatusError
	return errors.As(err, &se) && !se.MaybeBilled()
}

// call runs do, one model call for req, in a chat span while renewing the
// lease of res, asked for at asked (renewLease). If a renewal fails the
// call is cancelled, so it stops before the lease ends. outputType is the
// span's gen_ai.output.type, if the call asks for one.
func (r *taskAttempt) call(ctx context.Context, res budget.Reservation, asked time.Time, req llm.Request, outputType string,
	do func(context.Context) (llm.Response, error)) (resp llm.Response, err error) {
	start := time.Now()
	spanCtx, span, common := r.startChatSpan(ctx, res, req, outputType)
	defer func() { r.endChatSpan(ctx, span, common, start, resp, err) }()
	callCtx, cancel := context.WithCancelCause(spanCtx)
	defer cancel(nil)
	stopRenewing := r.renewLease(callCtx, cancel, res, asked)
	resp, err = do(callCtx)
	if err != nil && ctx.Err() == nil && callCtx.Err() != nil {
		err = context.Cause(callCtx) // the lease renewal failed
	}
	cancel(nil)
	stopRenewing()
	return resp, err
}

// renewLease renews res's lease every LeaseTTL/3 until callCtx ends or stop
// is called, and cancels the call (with the reason as cause) if a renewal
// fails or would come too late. asked is when the reserve that granted res
// was sent. It runs on two timers, not on a goroutine of its own: a call
// waiting on its model holds no goroutine for its lease (a renewal runs on
// its timer's, while it runs). stop stops the timers and waits for a
// renewal in flight.
func (r *taskAttempt) renewLease(callCtx context.Context, cancel context.CancelCauseFunc, res budget.Reservation, asked time.Time) (stop func()) {
	// The database started the lease when it granted it: after the reserve
	// was sent, but possibly well before the grant arrived (a slow reply, a
	// batch that waited on locks), so the lease is timed from asked, and
	// each renewal from when it was sent. Only this node's monotonic clock
	// is used (never compared with the database's). The call stops a
	// margin before the lease could end: a renewal is given TTL/3 to
	// answer, and never past that point.
	margin := r.LeaseTTL / 10
	l := &leaseTimers{leaseEnd: asked.Add(r.LeaseTTL)}
	l.mu.Lock() // the timers are set before either callback reads them
	defer l.mu.Unlock()
	l.expire = time.AfterFunc(time.Until(l.leaseEnd)-margin, func() {
		// A renewal in flight answers (or fails) before the point this
		// timer marks: its deadline is never past it.
		if !l.enter(callCtx, true) {
			return
		}
		defer l.busy.Done()
		cancel(fmt.Errorf("lease of reservation %d would end before a renewal came through", res.ID))
	})
	l.renew = time.AfterFunc(time.Until(asked.Add(r.LeaseTTL/3)), func() {
		if !l.enter(callCtx, false) {
			return
		}
		defer l.busy.Done()
		sent := time.Now()
		deadline := sent.Add(r.LeaseTTL / 3)
		if last := l.end().Add(-margin); last.Before(deadline) {
			deadline = last
		}
		rctx, rcancel := context.WithDeadline(callCtx, deadline)
		_, err := r.Ledger.Renew(rctx, res.ID, res.Lease.Generation, r.LeaseTTL, r.task.AttemptSecret)
		ranOut := err != nil && errors.Is(err, context.DeadlineExceeded) && rctx.Err() != nil
		rcancel()
		if ranOut && callCtx.Err() == nil && time.Now().Before(l.end().Add(-margin)) {
			// A slow database, not a refusal: a renewal repeated does no
			// harm (it moves the lease's end again), so it is tried again
			// at once while the lease still has time left; its deadline
			// is never past the point the expiry marks.
			r.Logger.WarnContext(callCtx, "lease renewal ran out of time; trying again", "reservation", res.ID,
				"run_id", r.task.RunID, "task_id", r.task.TaskID, "err", err)
			l.mu.Lock()
			defer l.mu.Unlock()
			l.renewing = false
			if !l.done {
				l.renew.Reset(0)
			}
			return
		}
		if err != nil {
			l.giveUp()
			if callCtx.Err() == nil {
				cancel(fmt.Errorf("renew lease of reservation %d: %w", res.ID, err))
			}
			return
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		l.renewing = false
		if l.done {
			return // stopped meanwhile
		}
		l.leaseEnd = sent.Add(r.LeaseTTL)
		l.expire.Reset(time.Until(l.leaseEnd) - margin)
		l.renew.Reset(time.Until(sent.Add(r.LeaseTTL / 3)))
	})
	return l.stop
}

// leaseTimers is the state of one call's lease renewal (renewLease): its
// two timers and what their callbacks share.
type leaseTimers struct {
	mu            sync.Mutex
	expire, renew *time.Timer
	leaseEnd      time.Time
	done          bool           // stopped, or the lease given up (expired, a renewal failed)
	renewing      bool           // a renewal is in flight
	busy          sync.WaitGroup // the callbacks running
}

// enter starts a callback, expiry or renewal, and reports whether it is to
// act: not after stop or the lease given up, nor once callCtx has ended;
// the expiry not while a renewal is in flight. The expiry gives the lease
// up. A callback that acts calls busy.Done when it returns.
func (l *leaseTimers) enter(callCtx context.Context, expiry bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done || callCtx.Err() != nil || (expiry && l.renewing) {
		return false
	}
	if expiry {
		l.done = true
	} else {
		l.renewing = true
	}
	l.busy.Add(1)
	return true
}

// end is when the lease ends, as of the last renewal.
func (l *leaseTimers) end() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leaseEnd
}

// giveUp ends a renewal that failed: the lease is given up.
func (l *leaseTimers) giveUp() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.renewing, l.done = false, true
}

// stop stops the timers and waits for a callback in flight.
func (l *leaseTimers) stop() {
	l.mu.Lock()
	l.done = true
	l.expire.Stop()
	l.renew.Stop()
	l.mu.Unlock()
	l.busy.Wait()
}

// settle posts actual (split by usage, when the provider reported it) as
// the spend of res, with the model the call was made to.
func (r *taskAttempt) settle(ctx context.Context, res budget.Reservation, actual int64, usage llm.Usage, estimated bool) (budget.Reservation, error) {
	p := budget.SettleParams{
		Reservation: res.ID, Generation: res.Lease.Generation, Secret: r.task.AttemptSecret,
		Actual: actual, Estimated: estimated,
		Model:       requestModel(r.task.Model, llm.Request{Model: r.task.ModelName}),
		InputTokens: usage.InputTokens, OutputTokens: usage.OutputTokens,
	}
	// Given up to ledgerPatience while the task lives, but no longer than
	// the lease (past its end the sweeper posts the reservation whole), and
	// ledgerTry once the task ended (a cancel, I7): a slow database does
	// not fail the task.
	pctx, done := patient(ctx, min(ledgerPatience, r.LeaseTTL))
	defer done()
	settled, err := r.Ledger.Settle(pctx, p)
	if err != nil {
		return settled, fmt.Errorf("settle reservation %d with %d tokens: %w", res.ID, actual, err)
	}
	return settled, nil
}

func (r *taskAttempt) void(ctx context.Context, res budget.Reservation) {
	vctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer cancel()
	if _, err := r.Ledger.Void(vctx, res.ID, res.Lease.Generation, r.task.AttemptSecret); err != nil {
		// The sweeper will count it as spent when its lease runs out.
		r.Logger.WarnContext(ctx, "void reservation", "reservation", res.ID, "run_id", r.task.RunID, "task_id", r.task.TaskID, "err", err)
		r.sum.Failed = append(r.sum.Failed, fmt.Sprintf("void reservation %d: %v", res.ID, err))
	}
}

// ledgerTry bounds a reserve or a settle once its task's context has
// ended (settleTimeout); a variable for the tests.
var ledgerTry = settleTimeout

// ledgerPatience bounds a reserve or a settle while its task lives: a
// database slowed down for seconds (a deep group-commit queue, row locks,
// a loaded machine: issue 44) must not fail a task whose budget is fine.
// It is the longest a group commit's batch may take (store's batchTimeout).
const ledgerPatience = 30 * time.Second

// patient returns the context a reserve or a settle runs on: detached
// from ctx's values' end (a reserve or a settle cut short may commit with
// its reply lost), ending patience from now, or ledgerTry after ctx ends if
// that comes first; done releases it. The call gets one try, not several
// shorter ones: a try that gave up would lose its place in the group
// commit's queue and wait behind every call that came since. A function
// that returns, not one that calls: the worker's Execute goroutine waits
// on the model at the bottom of this path, and every frame on it counts
// toward its stack (docs/operations.md "Memory per running subagent").
func patient(ctx context.Context, patience time.Duration) (_ context.Context, done func()) {
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), patience)
	stop := context.AfterFunc(ctx, func() {
		t := time.NewTimer(ledgerTry)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-pctx.Done():
		}
	})
	return pctx, func() { stop(); cancel() }
}
