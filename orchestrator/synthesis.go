package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fanout/fanout/budget"
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
	"github.com/fanout/fanout/runs"
)

// synthesisTaskID names the synthesis call on the worker and in the ledger
// (validation keeps task ids from starting with "_", so it is never a task's).
const synthesisTaskID = "_synthesis"

// synthesisInstruction is what the synthesis subagent is asked.
const synthesisInstruction = "Synthesize the facts given above into one answer to the goal. " +
	"Keep every claim tied to its sources; say what the facts do not settle."

// synthesize runs the one synthesis call of a run whose tasks all ended
// without a cancel cause: a single-iteration subagent on a worker, paid
// from the run account itself (so from the same budget), given the joined
// facts. It returns the synthesis, or why it was skipped. It never fails
// the run: the facts stand without it. ctx bounds the whole call.
func (d *driver) synthesize(ctx context.Context, runCause error, result *fanoutv1.JoinedResult) (text, skipped string) {
	if reason := d.synthesisUnaffordable(ctx); reason != "" {
		return "", reason
	}
	if runCause != nil {
		return "", "the run did not finish its tasks: " + runCause.Error()
	}
	if len(result.GetFacts()) == 0 {
		return "", "no facts to synthesize"
	}
	acct, err := d.e.ledger.RunAccount(ctx, d.runID)
	if err != nil {
		return "", "the run's budget could not be read"
	}
	req := &fanoutv1.Dispatch{
		RunId:    d.runID,
		TenantId: d.p.tenantID,
		Task: &fanoutv1.TaskSpec{
			Id:            synthesisTaskID,
			Instruction:   synthesisInstruction,
			TokenBudget:   acct.Available(),
			MaxIterations: 1,
			Timeout:       durationpb.New(d.e.cfg.DefaultTaskTimeout),
		},
		Goal:                 d.p.spec.GetGoal(),
		TaskAccountId:        int64(acct.ID),
		MinReservationTokens: d.p.minReservation,
		Model:                d.p.spec.GetModel(),
		OnExhaustion:         d.p.spec.GetOnExhaustion(),
		ContextFacts:         result.GetFacts(),
	}
	var sum *fanoutv1.FactSummary
	w := d.e.workers.Next()
	backoff := d.e.cfg.RetryBackoff
	for attempt := 1; attempt <= max(d.e.cfg.MaxAttempts, 2*d.e.workers.Len()); attempt++ {
		if attempt > 1 {
			w = d.e.workers.After(w)
		}
		if req.Attempt, err = d.beginAttempt(ctx, acct.ID); err != nil {
			var ex *budget.ExhaustedError
			if errors.As(err, &ex) {
				return "", "the run's budget ended before the synthesis call: " + ex.Error()
			}
			d.e.cfg.Logger.ErrorContext(ctx, "begin synthesis attempt", "run_id", d.runID, "err", err)
			return "", "internal error: the ledger did not record the synthesis call"
		}
		var started bool
		sum, started, err = d.callSynthesis(ctx, w, req)
		// Only a refusal before the worker started is sent elsewhere: a
		// call that started may have spent, and is not paid for twice.
		if c := status.Code(err); err == nil || started || (c != codes.ResourceExhausted && c != codes.Unavailable) {
			break
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		if ctx.Err() != nil {
			break
		}
		backoff = min(2*backoff, maxRetryBackoff)
	}
	if err != nil {
		d.e.cfg.Logger.WarnContext(ctx, "synthesis call", "run_id", d.runID, "err", err)
		return "", "the synthesis call failed: " + status.Convert(err).Message()
	}
	var b strings.Builder
	for _, f := range sum.GetFacts() {
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(f.GetText())
		if len(f.GetSources()) > 0 {
			fmt.Fprintf(&b, " [%s]", strings.Join(f.GetSources(), ", "))
		}
	}
	if b.Len() == 0 {
		return "", fmt.Sprintf("the synthesis call ended %s without an answer: %s",
			runs.Text(sum.GetStatus()), sum.GetError())
	}
	result.TotalTokens += sum.GetTokensSpent()
	return b.String(), ""
}

// callSynthesis runs req on worker w and returns its summary, and whether
// the worker had started it.
func (d *driver) callSynthesis(ctx context.Context, w Worker, req *fanoutv1.Dispatch) (sum *fanoutv1.FactSummary, started bool, err error) {
	env, err := d.e.envelope(req)
	if err != nil {
		return nil, false, err
	}
	stream, err := w.Client.Execute(ctx, env)
	if err != nil {
		return nil, false, err
	}
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, started, errors.New("the worker ended the stream without a summary")
		}
		if err != nil {
			return nil, started, err
		}
		if m.GetStarted() != nil {
			started = true
		}
		if s := m.GetSummary(); s != nil {
			return s, true, nil
		}
	}
}

// synthesisUnaffordable says why the run's budget cannot pay for synthesis,
// or "" when it can.
func (d *driver) synthesisUnaffordable(ctx context.Context) string {
	acct, err := d.e.ledger.RunAccount(ctx, d.runID)
	switch {
	case err != nil:
		return "the run's budget could not be read"
	case acct.State == budget.StateExhausted:
		return "the run's budget was exhausted: the ledger grants it nothing more"
	case acct.State != budget.StateOpen:
		return "the run's budget was " + string(acct.State)
	case acct.Available() < d.p.minReservation:
		return fmt.Sprintf("%d tokens available, synthesis needs at least %d", acct.Available(), d.p.minReservation)
	}
	return ""
}
