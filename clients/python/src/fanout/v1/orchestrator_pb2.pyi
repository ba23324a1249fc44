from fanout.v1 import run_pb2 as _run_pb2
from fanout._google.api import annotations_pb2 as _annotations_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ApproveToolCallRequest(_message.Message):
    __slots__ = ["call_id", "reason"]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    reason: str
    def __init__(self, call_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ApproveToolCallResponse(_message.Message):
    __slots__ = ["decision"]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    decision: ToolCallDecision
    def __init__(self, decision: _Optional[_Union[ToolCallDecision, _Mapping]] = ...) -> None: ...

class CancelRunRequest(_message.Message):
    __slots__ = ["reason", "run_id"]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    reason: str
    run_id: str
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelRunResponse(_message.Message):
    __slots__ = ["run"]
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _run_pb2.Run
    def __init__(self, run: _Optional[_Union[_run_pb2.Run, _Mapping]] = ...) -> None: ...

class ContinueRunRequest(_message.Message):
    __slots__ = ["add_tokens", "dry_run", "idempotency_key", "reason", "reserve_quote", "run_id"]
    ADD_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RESERVE_QUOTE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    add_tokens: int
    dry_run: bool
    idempotency_key: str
    reason: str
    reserve_quote: bool
    run_id: str
    def __init__(self, run_id: _Optional[str] = ..., add_tokens: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., reason: _Optional[str] = ..., dry_run: bool = ..., reserve_quote: bool = ...) -> None: ...

class ContinueRunResponse(_message.Message):
    __slots__ = ["continuation", "quote", "run"]
    CONTINUATION_FIELD_NUMBER: _ClassVar[int]
    QUOTE_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    continuation: _run_pb2.RunContinued
    quote: Quote
    run: _run_pb2.Run
    def __init__(self, run: _Optional[_Union[_run_pb2.Run, _Mapping]] = ..., continuation: _Optional[_Union[_run_pb2.RunContinued, _Mapping]] = ..., quote: _Optional[_Union[Quote, _Mapping]] = ...) -> None: ...

class DaySpend(_message.Message):
    __slots__ = ["day", "runs", "spend"]
    DAY_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    SPEND_FIELD_NUMBER: _ClassVar[int]
    day: str
    runs: int
    spend: Spend
    def __init__(self, day: _Optional[str] = ..., spend: _Optional[_Union[Spend, _Mapping]] = ..., runs: _Optional[int] = ...) -> None: ...

class DenyToolCallRequest(_message.Message):
    __slots__ = ["call_id", "reason"]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    reason: str
    def __init__(self, call_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class DenyToolCallResponse(_message.Message):
    __slots__ = ["decision"]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    decision: ToolCallDecision
    def __init__(self, decision: _Optional[_Union[ToolCallDecision, _Mapping]] = ...) -> None: ...

class ForkRunRequest(_message.Message):
    __slots__ = ["budget", "dry_run", "goal", "idempotency_key", "labels", "model", "remove_task_ids", "reserve_quote", "run_id", "tasks"]
    class LabelsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    GOAL_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REMOVE_TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    RESERVE_QUOTE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    budget: _run_pb2.Budget
    dry_run: bool
    goal: str
    idempotency_key: str
    labels: _containers.ScalarMap[str, str]
    model: _run_pb2.ModelSettings
    remove_task_ids: _containers.RepeatedScalarFieldContainer[str]
    reserve_quote: bool
    run_id: str
    tasks: _containers.RepeatedCompositeFieldContainer[_run_pb2.TaskSpec]
    def __init__(self, run_id: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., tasks: _Optional[_Iterable[_Union[_run_pb2.TaskSpec, _Mapping]]] = ..., remove_task_ids: _Optional[_Iterable[str]] = ..., goal: _Optional[str] = ..., budget: _Optional[_Union[_run_pb2.Budget, _Mapping]] = ..., model: _Optional[_Union[_run_pb2.ModelSettings, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., dry_run: bool = ..., reserve_quote: bool = ...) -> None: ...

class ForkRunResponse(_message.Message):
    __slots__ = ["quote", "reused_task_ids", "run_id"]
    QUOTE_FIELD_NUMBER: _ClassVar[int]
    REUSED_TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    quote: Quote
    reused_task_ids: _containers.RepeatedScalarFieldContainer[str]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ..., reused_task_ids: _Optional[_Iterable[str]] = ..., quote: _Optional[_Union[Quote, _Mapping]] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ["run_id"]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class GetRunResponse(_message.Message):
    __slots__ = ["run"]
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _run_pb2.Run
    def __init__(self, run: _Optional[_Union[_run_pb2.Run, _Mapping]] = ...) -> None: ...

class GetSpendRequest(_message.Message):
    __slots__ = ["from_day", "run_ids", "tenant_id", "to_day"]
    FROM_DAY_FIELD_NUMBER: _ClassVar[int]
    RUN_IDS_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    TO_DAY_FIELD_NUMBER: _ClassVar[int]
    from_day: str
    run_ids: _containers.RepeatedScalarFieldContainer[str]
    tenant_id: str
    to_day: str
    def __init__(self, tenant_id: _Optional[str] = ..., from_day: _Optional[str] = ..., to_day: _Optional[str] = ..., run_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class GetSpendResponse(_message.Message):
    __slots__ = ["days", "from_day", "runs", "to_day"]
    DAYS_FIELD_NUMBER: _ClassVar[int]
    FROM_DAY_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    TO_DAY_FIELD_NUMBER: _ClassVar[int]
    days: _containers.RepeatedCompositeFieldContainer[DaySpend]
    from_day: str
    runs: _containers.RepeatedCompositeFieldContainer[RunSpend]
    to_day: str
    def __init__(self, days: _Optional[_Iterable[_Union[DaySpend, _Mapping]]] = ..., runs: _Optional[_Iterable[_Union[RunSpend, _Mapping]]] = ..., from_day: _Optional[str] = ..., to_day: _Optional[str] = ...) -> None: ...

class ListApprovalsRequest(_message.Message):
    __slots__ = ["page_size", "page_token", "run_id"]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    run_id: str
    def __init__(self, run_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListApprovalsResponse(_message.Message):
    __slots__ = ["calls", "next_page_token"]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedCompositeFieldContainer[PendingToolCall]
    next_page_token: str
    def __init__(self, calls: _Optional[_Iterable[_Union[PendingToolCall, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListRunFactsRequest(_message.Message):
    __slots__ = ["page_size", "page_token", "run_id"]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    run_id: str
    def __init__(self, run_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRunFactsResponse(_message.Message):
    __slots__ = ["fact_count", "facts", "next_page_token"]
    FACTS_FIELD_NUMBER: _ClassVar[int]
    FACT_COUNT_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    fact_count: int
    facts: _containers.RepeatedCompositeFieldContainer[_run_pb2.Fact]
    next_page_token: str
    def __init__(self, facts: _Optional[_Iterable[_Union[_run_pb2.Fact, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., fact_count: _Optional[int] = ...) -> None: ...

class ListRunTasksRequest(_message.Message):
    __slots__ = ["page_size", "page_token", "run_id"]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    run_id: str
    def __init__(self, run_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRunTasksResponse(_message.Message):
    __slots__ = ["next_page_token", "task_count", "tasks"]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    TASK_COUNT_FIELD_NUMBER: _ClassVar[int]
    next_page_token: str
    task_count: int
    tasks: _containers.RepeatedCompositeFieldContainer[_run_pb2.TaskOutcome]
    def __init__(self, tasks: _Optional[_Iterable[_Union[_run_pb2.TaskOutcome, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., task_count: _Optional[int] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ["page_size", "page_token", "state", "tenant_id"]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    state: _run_pb2.RunState
    tenant_id: str
    def __init__(self, tenant_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., state: _Optional[_Union[_run_pb2.RunState, str]] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ["next_page_token", "runs"]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    next_page_token: str
    runs: _containers.RepeatedCompositeFieldContainer[_run_pb2.Run]
    def __init__(self, runs: _Optional[_Iterable[_Union[_run_pb2.Run, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListToolCallsRequest(_message.Message):
    __slots__ = ["page_size", "page_token", "run_id"]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    run_id: str
    def __init__(self, run_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListToolCallsResponse(_message.Message):
    __slots__ = ["calls", "next_page_token"]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    next_page_token: str
    def __init__(self, calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class PendingToolCall(_message.Message):
    __slots__ = ["call_id", "deadline", "preview", "requested_at", "run_id", "task_id", "tool"]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    PREVIEW_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_AT_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    deadline: _timestamp_pb2.Timestamp
    preview: str
    requested_at: _timestamp_pb2.Timestamp
    run_id: str
    task_id: str
    tool: str
    def __init__(self, call_id: _Optional[str] = ..., run_id: _Optional[str] = ..., task_id: _Optional[str] = ..., tool: _Optional[str] = ..., preview: _Optional[str] = ..., requested_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., deadline: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Quote(_message.Message):
    __slots__ = ["admitted_tasks", "basis", "cost", "forecast_tokens", "held", "limit_tokens", "synthesis_tokens", "tasks", "tasks_tokens", "tenant_available_tokens", "tenant_budget", "tenant_covers"]
    ADMITTED_TASKS_FIELD_NUMBER: _ClassVar[int]
    BASIS_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    FORECAST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    LIMIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SYNTHESIS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    TASKS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TENANT_AVAILABLE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TENANT_BUDGET_FIELD_NUMBER: _ClassVar[int]
    TENANT_COVERS_FIELD_NUMBER: _ClassVar[int]
    admitted_tasks: int
    basis: str
    cost: _containers.RepeatedCompositeFieldContainer[Spend]
    forecast_tokens: int
    held: bool
    limit_tokens: int
    synthesis_tokens: int
    tasks: _containers.RepeatedCompositeFieldContainer[TaskQuote]
    tasks_tokens: int
    tenant_available_tokens: int
    tenant_budget: bool
    tenant_covers: bool
    def __init__(self, tasks: _Optional[_Iterable[_Union[TaskQuote, _Mapping]]] = ..., tasks_tokens: _Optional[int] = ..., synthesis_tokens: _Optional[int] = ..., forecast_tokens: _Optional[int] = ..., limit_tokens: _Optional[int] = ..., admitted_tasks: _Optional[int] = ..., cost: _Optional[_Iterable[_Union[Spend, _Mapping]]] = ..., basis: _Optional[str] = ..., tenant_budget: bool = ..., tenant_available_tokens: _Optional[int] = ..., tenant_covers: bool = ..., held: bool = ...) -> None: ...

class RunRequest(_message.Message):
    __slots__ = ["spec"]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: _run_pb2.RunSpec
    def __init__(self, spec: _Optional[_Union[_run_pb2.RunSpec, _Mapping]] = ...) -> None: ...

class RunResponse(_message.Message):
    __slots__ = ["event"]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: _run_pb2.RunEvent
    def __init__(self, event: _Optional[_Union[_run_pb2.RunEvent, _Mapping]] = ...) -> None: ...

class RunSpend(_message.Message):
    __slots__ = ["run_id", "spend"]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SPEND_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    spend: Spend
    def __init__(self, run_id: _Optional[str] = ..., spend: _Optional[_Union[Spend, _Mapping]] = ...) -> None: ...

class Spend(_message.Message):
    __slots__ = ["cost", "currency", "priced_tokens", "reported_cost", "unpriced_tokens", "worst_case_cost", "worst_case_tokens"]
    COST_FIELD_NUMBER: _ClassVar[int]
    CURRENCY_FIELD_NUMBER: _ClassVar[int]
    PRICED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REPORTED_COST_FIELD_NUMBER: _ClassVar[int]
    UNPRICED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    WORST_CASE_COST_FIELD_NUMBER: _ClassVar[int]
    WORST_CASE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    cost: str
    currency: str
    priced_tokens: int
    reported_cost: str
    unpriced_tokens: int
    worst_case_cost: str
    worst_case_tokens: int
    def __init__(self, currency: _Optional[str] = ..., cost: _Optional[str] = ..., reported_cost: _Optional[str] = ..., worst_case_cost: _Optional[str] = ..., priced_tokens: _Optional[int] = ..., worst_case_tokens: _Optional[int] = ..., unpriced_tokens: _Optional[int] = ...) -> None: ...

class StartRunRequest(_message.Message):
    __slots__ = ["dry_run", "reserve_quote", "spec"]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    RESERVE_QUOTE_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    dry_run: bool
    reserve_quote: bool
    spec: _run_pb2.RunSpec
    def __init__(self, spec: _Optional[_Union[_run_pb2.RunSpec, _Mapping]] = ..., dry_run: bool = ..., reserve_quote: bool = ...) -> None: ...

class StartRunResponse(_message.Message):
    __slots__ = ["quote", "run_id"]
    QUOTE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    quote: Quote
    run_id: str
    def __init__(self, run_id: _Optional[str] = ..., quote: _Optional[_Union[Quote, _Mapping]] = ...) -> None: ...

class TaskQuote(_message.Message):
    __slots__ = ["dispatch_index", "forecast_tokens", "reason", "reused", "runs", "task_id"]
    DISPATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    FORECAST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REUSED_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    dispatch_index: int
    forecast_tokens: int
    reason: str
    reused: _run_pb2.ReusedFrom
    runs: bool
    task_id: str
    def __init__(self, task_id: _Optional[str] = ..., dispatch_index: _Optional[int] = ..., runs: bool = ..., forecast_tokens: _Optional[int] = ..., reused: _Optional[_Union[_run_pb2.ReusedFrom, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ["approval_deadline", "attempt", "call_id", "call_index", "created_at", "decision", "error", "iteration", "preview", "resolved_at", "result_bytes", "server", "state", "task_id", "tool"]
    APPROVAL_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    CALL_INDEX_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    PREVIEW_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_AT_FIELD_NUMBER: _ClassVar[int]
    RESULT_BYTES_FIELD_NUMBER: _ClassVar[int]
    SERVER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    approval_deadline: _timestamp_pb2.Timestamp
    attempt: int
    call_id: str
    call_index: int
    created_at: _timestamp_pb2.Timestamp
    decision: ToolCallDecision
    error: str
    iteration: int
    preview: str
    resolved_at: _timestamp_pb2.Timestamp
    result_bytes: int
    server: str
    state: str
    task_id: str
    tool: str
    def __init__(self, call_id: _Optional[str] = ..., task_id: _Optional[str] = ..., attempt: _Optional[int] = ..., iteration: _Optional[int] = ..., call_index: _Optional[int] = ..., server: _Optional[str] = ..., tool: _Optional[str] = ..., state: _Optional[str] = ..., error: _Optional[str] = ..., preview: _Optional[str] = ..., result_bytes: _Optional[int] = ..., created_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., resolved_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., approval_deadline: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., decision: _Optional[_Union[ToolCallDecision, _Mapping]] = ...) -> None: ...

class ToolCallDecision(_message.Message):
    __slots__ = ["actor", "approved", "call_id", "decided_at", "reason", "run_id", "task_id", "tool"]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    APPROVED_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    actor: str
    approved: bool
    call_id: str
    decided_at: _timestamp_pb2.Timestamp
    reason: str
    run_id: str
    task_id: str
    tool: str
    def __init__(self, call_id: _Optional[str] = ..., run_id: _Optional[str] = ..., task_id: _Optional[str] = ..., tool: _Optional[str] = ..., approved: bool = ..., reason: _Optional[str] = ..., actor: _Optional[str] = ..., decided_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class WatchRunRequest(_message.Message):
    __slots__ = ["after_sequence", "run_id"]
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    after_sequence: int
    run_id: str
    def __init__(self, run_id: _Optional[str] = ..., after_sequence: _Optional[int] = ...) -> None: ...

class WatchRunResponse(_message.Message):
    __slots__ = ["event"]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: _run_pb2.RunEvent
    def __init__(self, event: _Optional[_Union[_run_pb2.RunEvent, _Mapping]] = ...) -> None: ...
