package store

import (
	fanoutv1 "github.com/fanout/fanout/proto/fanout/v1"
)

// The records of run_event.event: one per kind of event (records.go says
// what a record is and how it is stored).

// eventRecord is a fanout.v1.RunEvent: run_event.event (stored without its
// sequence, run and time, which are columns). One of the members after
// Time is set, as in the event's oneof.
type eventRecord struct {
	Sequence          int64JSON                `json:"sequence,omitzero"`
	RunID             string                   `json:"run_id,omitempty"`
	Time              *timestampJSON           `json:"time,omitempty"`
	RunStarted        *runStartedRecord        `json:"run_started,omitempty"`
	TaskQueued        *taskQueuedRecord        `json:"task_queued,omitempty"`
	TaskStarted       *taskStartedRecord       `json:"task_started,omitempty"`
	TaskIteration     *taskIterationRecord     `json:"task_iteration,omitempty"`
	TaskFinished      *taskFinishedRecord      `json:"task_finished,omitempty"`
	BudgetUpdate      *budgetEventRecord       `json:"budget_update,omitempty"`
	BudgetExhausted   *budgetEventRecord       `json:"budget_exhausted,omitempty"`
	RunFinished       *runFinishedRecord       `json:"run_finished,omitempty"`
	RunAdopted        *runAdoptedRecord        `json:"run_adopted,omitempty"`
	ApprovalRequested *approvalRequestedRecord `json:"approval_requested,omitempty"`
	ApprovalDecided   *approvalDecidedRecord   `json:"approval_decided,omitempty"`
	ConcurrencyChosen *concurrencyChosenRecord `json:"concurrency_chosen,omitempty"`
	TaskHedged        *taskHedgedRecord        `json:"task_hedged,omitempty"`
	RunContinued      *runContinuedRecord      `json:"run_continued,omitempty"`
	ChildRunStarted   *childRunStartedRecord   `json:"child_run_started,omitempty"`
	ChildRunFinished  *childRunFinishedRecord  `json:"child_run_finished,omitempty"`
}

// The members of an event; each is its API message of the same name, but
// budgetEventRecord, which is BudgetUpdate and BudgetExhausted alike.
type (
	runStartedRecord struct {
		Run *runRecord `json:"run,omitempty"`
	}
	taskQueuedRecord struct {
		TaskID        string `json:"task_id,omitempty"`
		DispatchIndex int32  `json:"dispatch_index,omitempty"`
	}
	taskStartedRecord struct {
		TaskID         string    `json:"task_id,omitempty"`
		Worker         string    `json:"worker,omitempty"`
		ForecastTokens int64JSON `json:"forecast_tokens,omitzero"`
	}
	taskIterationRecord struct {
		TaskID      string    `json:"task_id,omitempty"`
		Iteration   int32     `json:"iteration,omitempty"`
		TokensSpent int64JSON `json:"tokens_spent,omitzero"`
		ToolCalls   int32     `json:"tool_calls,omitempty"`
		// CachedToolCalls: of ToolCalls, reads answered from the result cache.
		CachedToolCalls int32 `json:"cached_tool_calls,omitempty"`
	}
	taskFinishedRecord struct {
		Outcome *outcomeRecord `json:"outcome,omitempty"`
	}
	budgetEventRecord struct {
		Budget *snapshotRecord `json:"budget,omitempty"`
	}
	runFinishedRecord struct {
		State       runStateJSON  `json:"state,omitzero"`
		CancelCause string        `json:"cancel_cause,omitempty"`
		Result      *resultRecord `json:"result,omitempty"`
	}
	runAdoptedRecord struct {
		PreviousOwner  string   `json:"previous_owner,omitempty"`
		Owner          string   `json:"owner,omitempty"`
		Adoptions      int32    `json:"adoptions,omitempty"`
		ResumedTaskIDs []string `json:"resumed_task_ids,omitempty"`
	}
	approvalRequestedRecord struct {
		TaskID   string         `json:"task_id,omitempty"`
		CallID   string         `json:"call_id,omitempty"`
		Tool     string         `json:"tool,omitempty"`
		Preview  string         `json:"preview,omitempty"`
		Deadline *timestampJSON `json:"deadline,omitempty"`
	}
	taskHedgedRecord struct {
		TaskID    string        `json:"task_id,omitempty"`
		Worker    string        `json:"worker,omitempty"`
		After     *durationJSON `json:"after,omitempty"`
		Threshold *durationJSON `json:"threshold,omitempty"`
		Reason    string        `json:"reason,omitempty"`
	}
	childRunStartedRecord struct {
		TaskID      string    `json:"task_id,omitempty"`
		ChildRunID  string    `json:"child_run_id,omitempty"`
		TaskCount   int32     `json:"task_count,omitempty"`
		LimitTokens int64JSON `json:"limit_tokens,omitzero"`
		Depth       int32     `json:"depth,omitempty"`
	}
	childRunFinishedRecord struct {
		TaskID      string       `json:"task_id,omitempty"`
		ChildRunID  string       `json:"child_run_id,omitempty"`
		State       runStateJSON `json:"state,omitzero"`
		SpentTokens int64JSON    `json:"spent_tokens,omitzero"`
		FactCount   int32        `json:"fact_count,omitempty"`
	}
	runContinuedRecord struct {
		Continuation int32     `json:"continuation,omitempty"`
		AddedTokens  int64JSON `json:"added_tokens,omitzero"`
		LimitTokens  int64JSON `json:"limit_tokens,omitzero"`
		SpentBefore  int64JSON `json:"spent_before,omitzero"`
		Reopened     bool      `json:"reopened,omitempty"`
		TaskIDs      []string  `json:"task_ids,omitempty"`
		Actor        string    `json:"actor,omitempty"`
		Reason       string    `json:"reason,omitempty"`
	}
	approvalDecidedRecord struct {
		CallID    string         `json:"call_id,omitempty"`
		TaskID    string         `json:"task_id,omitempty"`
		Tool      string         `json:"tool,omitempty"`
		Approved  bool           `json:"approved,omitempty"`
		Reason    string         `json:"reason,omitempty"`
		Actor     string         `json:"actor,omitempty"`
		DecidedAt *timestampJSON `json:"decided_at,omitempty"`
	}
	concurrencyChosenRecord struct {
		Concurrency    int32      `json:"concurrency,omitempty"`
		Previous       int32      `json:"previous,omitempty"`
		Reason         string     `json:"reason,omitempty"`
		LimitRequests  int64JSON  `json:"limit_requests,omitzero"`
		LimitTokens    int64JSON  `json:"limit_tokens,omitzero"`
		Headroom       doubleJSON `json:"headroom,omitzero"`
		SecondsPerCall doubleJSON `json:"seconds_per_call,omitzero"`
		TokensPerCall  doubleJSON `json:"tokens_per_call,omitzero"`
		CallsPerTask   doubleJSON `json:"calls_per_task,omitzero"`
		ObservedCalls  int32      `json:"observed_calls,omitempty"`
		RunsSharing    int32      `json:"runs_sharing,omitempty"`
		Throttled      int64JSON  `json:"throttled,omitzero"`
		ThrottleCap    int32      `json:"throttle_cap,omitempty"`
	}
)

// eventRecordOf maps an event; a member set to a nil message is an empty
// one, as protojson wrote it. A member it does not know leaves the record
// without one (encodeEvent refuses it).
func eventRecordOf(m *fanoutv1.RunEvent) *eventRecord {
	if m == nil {
		return nil
	}
	r := &eventRecord{Sequence: int64JSON(m.GetSequence()), RunID: m.GetRunId(), Time: timestampOf(m.GetTime())}
	switch e := m.GetEvent().(type) {
	case *fanoutv1.RunEvent_RunStarted:
		r.RunStarted = &runStartedRecord{Run: runRecordOf(e.RunStarted.GetRun())}
	case *fanoutv1.RunEvent_TaskQueued:
		r.TaskQueued = &taskQueuedRecord{TaskID: e.TaskQueued.GetTaskId(), DispatchIndex: e.TaskQueued.GetDispatchIndex()}
	case *fanoutv1.RunEvent_TaskStarted:
		r.TaskStarted = &taskStartedRecord{TaskID: e.TaskStarted.GetTaskId(), Worker: e.TaskStarted.GetWorker(),
			ForecastTokens: int64JSON(e.TaskStarted.GetForecastTokens())}
	case *fanoutv1.RunEvent_TaskIteration:
		it := e.TaskIteration
		r.TaskIteration = &taskIterationRecord{TaskID: it.GetTaskId(), Iteration: it.GetIteration(),
			TokensSpent: int64JSON(it.GetTokensSpent()), ToolCalls: it.GetToolCalls(), CachedToolCalls: it.GetCachedToolCalls()}
	case *fanoutv1.RunEvent_TaskFinished:
		r.TaskFinished = &taskFinishedRecord{Outcome: outcomeRecordOf(e.TaskFinished.GetOutcome())}
	case *fanoutv1.RunEvent_BudgetUpdate:
		r.BudgetUpdate = &budgetEventRecord{Budget: snapshotRecordOf(e.BudgetUpdate.GetBudget())}
	case *fanoutv1.RunEvent_BudgetExhausted:
		r.BudgetExhausted = &budgetEventRecord{Budget: snapshotRecordOf(e.BudgetExhausted.GetBudget())}
	case *fanoutv1.RunEvent_RunFinished:
		f := e.RunFinished
		r.RunFinished = &runFinishedRecord{State: runStateJSON(f.GetState()), CancelCause: f.GetCancelCause(),
			Result: resultRecordOf(f.GetResult())}
	case *fanoutv1.RunEvent_RunAdopted:
		a := e.RunAdopted
		r.RunAdopted = &runAdoptedRecord{PreviousOwner: a.GetPreviousOwner(), Owner: a.GetOwner(),
			Adoptions: a.GetAdoptions(), ResumedTaskIDs: a.GetResumedTaskIds()}
	case *fanoutv1.RunEvent_ApprovalRequested:
		a := e.ApprovalRequested
		r.ApprovalRequested = &approvalRequestedRecord{TaskID: a.GetTaskId(), CallID: a.GetCallId(), Tool: a.GetTool(),
			Preview: a.GetPreview(), Deadline: timestampOf(a.GetDeadline())}
	case *fanoutv1.RunEvent_ApprovalDecided:
		d := e.ApprovalDecided
		r.ApprovalDecided = &approvalDecidedRecord{CallID: d.GetCallId(), TaskID: d.GetTaskId(), Tool: d.GetTool(),
			Approved: d.GetApproved(), Reason: d.GetReason(), Actor: d.GetActor(), DecidedAt: timestampOf(d.GetDecidedAt())}
	case *fanoutv1.RunEvent_ConcurrencyChosen:
		r.ConcurrencyChosen = concurrencyRecordOf(e.ConcurrencyChosen)
		if r.ConcurrencyChosen == nil {
			r.ConcurrencyChosen = &concurrencyChosenRecord{}
		}
	case *fanoutv1.RunEvent_TaskHedged:
		h := e.TaskHedged
		r.TaskHedged = &taskHedgedRecord{TaskID: h.GetTaskId(), Worker: h.GetWorker(), After: durationOf(h.GetAfter()),
			Threshold: durationOf(h.GetThreshold()), Reason: h.GetReason()}
	case *fanoutv1.RunEvent_RunContinued:
		c := e.RunContinued
		r.RunContinued = &runContinuedRecord{Continuation: c.GetContinuation(), AddedTokens: int64JSON(c.GetAddedTokens()),
			LimitTokens: int64JSON(c.GetLimitTokens()), SpentBefore: int64JSON(c.GetSpentBefore()),
			Reopened: c.GetReopened(), TaskIDs: c.GetTaskIds(), Actor: c.GetActor(), Reason: c.GetReason()}
	case *fanoutv1.RunEvent_ChildRunStarted:
		c := e.ChildRunStarted
		r.ChildRunStarted = &childRunStartedRecord{TaskID: c.GetTaskId(), ChildRunID: c.GetChildRunId(),
			TaskCount: c.GetTaskCount(), LimitTokens: int64JSON(c.GetLimitTokens()), Depth: c.GetDepth()}
	case *fanoutv1.RunEvent_ChildRunFinished:
		c := e.ChildRunFinished
		r.ChildRunFinished = &childRunFinishedRecord{TaskID: c.GetTaskId(), ChildRunID: c.GetChildRunId(),
			State: runStateJSON(c.GetState()), SpentTokens: int64JSON(c.GetSpentTokens()), FactCount: c.GetFactCount()}
	}
	return r
}

// set reports whether one of the record's members is set.
func (r *eventRecord) set() bool {
	return r.RunStarted != nil || r.TaskQueued != nil || r.TaskStarted != nil || r.TaskIteration != nil ||
		r.TaskFinished != nil || r.BudgetUpdate != nil || r.BudgetExhausted != nil || r.RunFinished != nil ||
		r.RunAdopted != nil || r.ApprovalRequested != nil || r.ApprovalDecided != nil || r.ConcurrencyChosen != nil ||
		r.TaskHedged != nil || r.RunContinued != nil || r.ChildRunStarted != nil || r.ChildRunFinished != nil
}

func (r *eventRecord) proto() *fanoutv1.RunEvent {
	if r == nil {
		return nil
	}
	m := &fanoutv1.RunEvent{Sequence: int64(r.Sequence), RunId: r.RunID, Time: r.Time.proto()}
	switch {
	case r.RunStarted != nil:
		m.Event = &fanoutv1.RunEvent_RunStarted{RunStarted: &fanoutv1.RunStarted{Run: r.RunStarted.Run.proto()}}
	case r.TaskQueued != nil:
		m.Event = &fanoutv1.RunEvent_TaskQueued{TaskQueued: &fanoutv1.TaskQueued{TaskId: r.TaskQueued.TaskID,
			DispatchIndex: r.TaskQueued.DispatchIndex}}
	case r.TaskStarted != nil:
		m.Event = &fanoutv1.RunEvent_TaskStarted{TaskStarted: &fanoutv1.TaskStarted{TaskId: r.TaskStarted.TaskID,
			Worker: r.TaskStarted.Worker, ForecastTokens: int64(r.TaskStarted.ForecastTokens)}}
	case r.TaskIteration != nil:
		it := r.TaskIteration
		m.Event = &fanoutv1.RunEvent_TaskIteration{TaskIteration: &fanoutv1.TaskIteration{TaskId: it.TaskID,
			Iteration: it.Iteration, TokensSpent: int64(it.TokensSpent), ToolCalls: it.ToolCalls,
			CachedToolCalls: it.CachedToolCalls}}
	case r.TaskFinished != nil:
		m.Event = &fanoutv1.RunEvent_TaskFinished{TaskFinished: &fanoutv1.TaskFinished{
			Outcome: r.TaskFinished.Outcome.proto()}}
	case r.BudgetUpdate != nil:
		m.Event = &fanoutv1.RunEvent_BudgetUpdate{BudgetUpdate: &fanoutv1.BudgetUpdate{
			Budget: r.BudgetUpdate.Budget.proto()}}
	case r.BudgetExhausted != nil:
		m.Event = &fanoutv1.RunEvent_BudgetExhausted{BudgetExhausted: &fanoutv1.BudgetExhausted{
			Budget: r.BudgetExhausted.Budget.proto()}}
	case r.RunFinished != nil:
		f := r.RunFinished
		m.Event = &fanoutv1.RunEvent_RunFinished{RunFinished: &fanoutv1.RunFinished{
			State: fanoutv1.RunState(f.State), CancelCause: f.CancelCause, Result: f.Result.proto()}}
	case r.RunAdopted != nil:
		a := r.RunAdopted
		m.Event = &fanoutv1.RunEvent_RunAdopted{RunAdopted: &fanoutv1.RunAdopted{PreviousOwner: a.PreviousOwner,
			Owner: a.Owner, Adoptions: a.Adoptions, ResumedTaskIds: a.ResumedTaskIDs}}
	case r.ApprovalRequested != nil:
		a := r.ApprovalRequested
		m.Event = &fanoutv1.RunEvent_ApprovalRequested{ApprovalRequested: &fanoutv1.ApprovalRequested{TaskId: a.TaskID,
			CallId: a.CallID, Tool: a.Tool, Preview: a.Preview, Deadline: a.Deadline.proto()}}
	case r.ApprovalDecided != nil:
		d := r.ApprovalDecided
		m.Event = &fanoutv1.RunEvent_ApprovalDecided{ApprovalDecided: &fanoutv1.ApprovalDecided{CallId: d.CallID,
			TaskId: d.TaskID, Tool: d.Tool, Approved: d.Approved, Reason: d.Reason, Actor: d.Actor,
			DecidedAt: d.DecidedAt.proto()}}
	case r.ConcurrencyChosen != nil:
		m.Event = &fanoutv1.RunEvent_ConcurrencyChosen{ConcurrencyChosen: r.ConcurrencyChosen.proto()}
	case r.TaskHedged != nil:
		h := r.TaskHedged
		m.Event = &fanoutv1.RunEvent_TaskHedged{TaskHedged: &fanoutv1.TaskHedged{TaskId: h.TaskID, Worker: h.Worker,
			After: h.After.proto(), Threshold: h.Threshold.proto(), Reason: h.Reason}}
	case r.RunContinued != nil:
		c := r.RunContinued
		m.Event = &fanoutv1.RunEvent_RunContinued{RunContinued: &fanoutv1.RunContinued{Continuation: c.Continuation,
			AddedTokens: int64(c.AddedTokens), LimitTokens: int64(c.LimitTokens), SpentBefore: int64(c.SpentBefore),
			Reopened: c.Reopened, TaskIds: c.TaskIDs, Actor: c.Actor, Reason: c.Reason}}
	case r.ChildRunStarted != nil:
		c := r.ChildRunStarted
		m.Event = &fanoutv1.RunEvent_ChildRunStarted{ChildRunStarted: &fanoutv1.ChildRunStarted{TaskId: c.TaskID,
			ChildRunId: c.ChildRunID, TaskCount: c.TaskCount, LimitTokens: int64(c.LimitTokens), Depth: c.Depth}}
	case r.ChildRunFinished != nil:
		c := r.ChildRunFinished
		m.Event = &fanoutv1.RunEvent_ChildRunFinished{ChildRunFinished: &fanoutv1.ChildRunFinished{TaskId: c.TaskID,
			ChildRunId: c.ChildRunID, State: fanoutv1.RunState(c.State), SpentTokens: int64(c.SpentTokens),
			FactCount: c.FactCount}}
	}
	return m
}

func concurrencyRecordOf(c *fanoutv1.ConcurrencyChosen) *concurrencyChosenRecord {
	if c == nil {
		return nil
	}
	return &concurrencyChosenRecord{Concurrency: c.GetConcurrency(), Previous: c.GetPrevious(),
		Reason: c.GetReason(), LimitRequests: int64JSON(c.GetLimitRequests()), LimitTokens: int64JSON(c.GetLimitTokens()),
		Headroom: doubleJSON(c.GetHeadroom()), SecondsPerCall: doubleJSON(c.GetSecondsPerCall()),
		TokensPerCall: doubleJSON(c.GetTokensPerCall()), CallsPerTask: doubleJSON(c.GetCallsPerTask()),
		ObservedCalls: c.GetObservedCalls(), RunsSharing: c.GetRunsSharing(), Throttled: int64JSON(c.GetThrottled()),
		ThrottleCap: c.GetThrottleCap()}
}

func (r *concurrencyChosenRecord) proto() *fanoutv1.ConcurrencyChosen {
	if r == nil {
		return nil
	}
	return &fanoutv1.ConcurrencyChosen{Concurrency: r.Concurrency, Previous: r.Previous, Reason: r.Reason,
		LimitRequests: int64(r.LimitRequests), LimitTokens: int64(r.LimitTokens), Headroom: float64(r.Headroom),
		SecondsPerCall: float64(r.SecondsPerCall), TokensPerCall: float64(r.TokensPerCall),
		CallsPerTask: float64(r.CallsPerTask), ObservedCalls: r.ObservedCalls, RunsSharing: r.RunsSharing,
		Throttled: int64(r.Throttled), ThrottleCap: r.ThrottleCap}
}
