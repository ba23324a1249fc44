from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

ADMISSION_POLICY_FORECAST: AdmissionPolicy
ADMISSION_POLICY_GREEDY: AdmissionPolicy
ADMISSION_POLICY_UNSPECIFIED: AdmissionPolicy
DESCRIPTOR: _descriptor.FileDescriptor
EXHAUSTION_POLICY_CANCEL: ExhaustionPolicy
EXHAUSTION_POLICY_DRAIN: ExhaustionPolicy
EXHAUSTION_POLICY_UNSPECIFIED: ExhaustionPolicy
HEDGE_ATTEMPT_FIRST: HedgeAttempt
HEDGE_ATTEMPT_HEDGE: HedgeAttempt
HEDGE_ATTEMPT_UNSPECIFIED: HedgeAttempt
JOIN_POLICY_ALL_SETTLED: JoinPolicy
JOIN_POLICY_FAIL_FAST: JoinPolicy
JOIN_POLICY_FIRST_SUCCESS: JoinPolicy
JOIN_POLICY_UNSPECIFIED: JoinPolicy
RUN_STATE_BUDGET_EXHAUSTED: RunState
RUN_STATE_CANCELLED: RunState
RUN_STATE_FAILED: RunState
RUN_STATE_RUNNING: RunState
RUN_STATE_SUCCEEDED: RunState
RUN_STATE_TIMED_OUT: RunState
RUN_STATE_UNSPECIFIED: RunState
TASK_STATUS_BUDGET_EXHAUSTED: TaskStatus
TASK_STATUS_CANCELLED: TaskStatus
TASK_STATUS_FAILED: TaskStatus
TASK_STATUS_ITERATION_LIMIT: TaskStatus
TASK_STATUS_NOT_STARTED: TaskStatus
TASK_STATUS_PENDING: TaskStatus
TASK_STATUS_RUNNING: TaskStatus
TASK_STATUS_SKIPPED: TaskStatus
TASK_STATUS_SUCCEEDED: TaskStatus
TASK_STATUS_TIMED_OUT: TaskStatus
TASK_STATUS_UNSPECIFIED: TaskStatus

class ApprovalDecided(_message.Message):
    __slots__ = ["actor", "approved", "call_id", "decided_at", "reason", "task_id", "tool"]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    APPROVED_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    actor: str
    approved: bool
    call_id: str
    decided_at: _timestamp_pb2.Timestamp
    reason: str
    task_id: str
    tool: str
    def __init__(self, call_id: _Optional[str] = ..., task_id: _Optional[str] = ..., tool: _Optional[str] = ..., approved: bool = ..., reason: _Optional[str] = ..., actor: _Optional[str] = ..., decided_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ApprovalRequested(_message.Message):
    __slots__ = ["call_id", "deadline", "preview", "task_id", "tool"]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    PREVIEW_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    deadline: _timestamp_pb2.Timestamp
    preview: str
    task_id: str
    tool: str
    def __init__(self, task_id: _Optional[str] = ..., call_id: _Optional[str] = ..., tool: _Optional[str] = ..., preview: _Optional[str] = ..., deadline: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Budget(_message.Message):
    __slots__ = ["admission", "limit_tokens", "min_reservation_tokens", "synthesis_tokens"]
    ADMISSION_FIELD_NUMBER: _ClassVar[int]
    LIMIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MIN_RESERVATION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SYNTHESIS_TOKENS_FIELD_NUMBER: _ClassVar[int]
    admission: AdmissionPolicy
    limit_tokens: int
    min_reservation_tokens: int
    synthesis_tokens: int
    def __init__(self, limit_tokens: _Optional[int] = ..., min_reservation_tokens: _Optional[int] = ..., synthesis_tokens: _Optional[int] = ..., admission: _Optional[_Union[AdmissionPolicy, str]] = ...) -> None: ...

class BudgetExhausted(_message.Message):
    __slots__ = ["budget"]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    budget: BudgetSnapshot
    def __init__(self, budget: _Optional[_Union[BudgetSnapshot, _Mapping]] = ...) -> None: ...

class BudgetSnapshot(_message.Message):
    __slots__ = ["available_tokens", "exhausted", "held_tokens", "limit_tokens", "reserved_tokens", "spent_tokens"]
    AVAILABLE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    HELD_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESERVED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SPENT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    available_tokens: int
    exhausted: bool
    held_tokens: int
    limit_tokens: int
    reserved_tokens: int
    spent_tokens: int
    def __init__(self, limit_tokens: _Optional[int] = ..., available_tokens: _Optional[int] = ..., reserved_tokens: _Optional[int] = ..., spent_tokens: _Optional[int] = ..., exhausted: bool = ..., held_tokens: _Optional[int] = ...) -> None: ...

class BudgetUpdate(_message.Message):
    __slots__ = ["budget"]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    budget: BudgetSnapshot
    def __init__(self, budget: _Optional[_Union[BudgetSnapshot, _Mapping]] = ...) -> None: ...

class CacheSettings(_message.Message):
    __slots__ = ["task_max_age", "tools"]
    TASK_MAX_AGE_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    task_max_age: _duration_pb2.Duration
    tools: bool
    def __init__(self, task_max_age: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., tools: bool = ...) -> None: ...

class ChildRunFinished(_message.Message):
    __slots__ = ["child_run_id", "fact_count", "spent_tokens", "state", "task_id"]
    CHILD_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    FACT_COUNT_FIELD_NUMBER: _ClassVar[int]
    SPENT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    child_run_id: str
    fact_count: int
    spent_tokens: int
    state: RunState
    task_id: str
    def __init__(self, task_id: _Optional[str] = ..., child_run_id: _Optional[str] = ..., state: _Optional[_Union[RunState, str]] = ..., spent_tokens: _Optional[int] = ..., fact_count: _Optional[int] = ...) -> None: ...

class ChildRunStarted(_message.Message):
    __slots__ = ["child_run_id", "depth", "limit_tokens", "task_count", "task_id"]
    CHILD_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    LIMIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TASK_COUNT_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    child_run_id: str
    depth: int
    limit_tokens: int
    task_count: int
    task_id: str
    def __init__(self, task_id: _Optional[str] = ..., child_run_id: _Optional[str] = ..., task_count: _Optional[int] = ..., limit_tokens: _Optional[int] = ..., depth: _Optional[int] = ...) -> None: ...

class ConcurrencyChosen(_message.Message):
    __slots__ = ["calls_per_task", "concurrency", "headroom", "limit_requests", "limit_tokens", "observed_calls", "previous", "reason", "runs_sharing", "seconds_per_call", "throttle_cap", "throttled", "tokens_per_call"]
    CALLS_PER_TASK_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    HEADROOM_FIELD_NUMBER: _ClassVar[int]
    LIMIT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_CALLS_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RUNS_SHARING_FIELD_NUMBER: _ClassVar[int]
    SECONDS_PER_CALL_FIELD_NUMBER: _ClassVar[int]
    THROTTLED_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_CAP_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_CALL_FIELD_NUMBER: _ClassVar[int]
    calls_per_task: float
    concurrency: int
    headroom: float
    limit_requests: int
    limit_tokens: int
    observed_calls: int
    previous: int
    reason: str
    runs_sharing: int
    seconds_per_call: float
    throttle_cap: int
    throttled: int
    tokens_per_call: float
    def __init__(self, concurrency: _Optional[int] = ..., previous: _Optional[int] = ..., reason: _Optional[str] = ..., limit_requests: _Optional[int] = ..., limit_tokens: _Optional[int] = ..., headroom: _Optional[float] = ..., seconds_per_call: _Optional[float] = ..., tokens_per_call: _Optional[float] = ..., calls_per_task: _Optional[float] = ..., observed_calls: _Optional[int] = ..., runs_sharing: _Optional[int] = ..., throttled: _Optional[int] = ..., throttle_cap: _Optional[int] = ...) -> None: ...

class Fact(_message.Message):
    __slots__ = ["sources", "text"]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    sources: _containers.RepeatedScalarFieldContainer[str]
    text: str
    def __init__(self, text: _Optional[str] = ..., sources: _Optional[_Iterable[str]] = ...) -> None: ...

class FactSummary(_message.Message):
    __slots__ = ["error", "facts", "failed", "iterations", "peak_tokens", "status", "tokens_spent", "tried", "wound_down"]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FACTS_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    PEAK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_SPENT_FIELD_NUMBER: _ClassVar[int]
    TRIED_FIELD_NUMBER: _ClassVar[int]
    WOUND_DOWN_FIELD_NUMBER: _ClassVar[int]
    error: str
    facts: _containers.RepeatedCompositeFieldContainer[Fact]
    failed: _containers.RepeatedScalarFieldContainer[str]
    iterations: int
    peak_tokens: int
    status: TaskStatus
    tokens_spent: int
    tried: _containers.RepeatedScalarFieldContainer[str]
    wound_down: bool
    def __init__(self, facts: _Optional[_Iterable[_Union[Fact, _Mapping]]] = ..., tried: _Optional[_Iterable[str]] = ..., failed: _Optional[_Iterable[str]] = ..., tokens_spent: _Optional[int] = ..., iterations: _Optional[int] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., error: _Optional[str] = ..., wound_down: bool = ..., peak_tokens: _Optional[int] = ...) -> None: ...

class FanOut(_message.Message):
    __slots__ = ["max_child_tasks", "max_depth", "max_tree_tasks"]
    MAX_CHILD_TASKS_FIELD_NUMBER: _ClassVar[int]
    MAX_DEPTH_FIELD_NUMBER: _ClassVar[int]
    MAX_TREE_TASKS_FIELD_NUMBER: _ClassVar[int]
    max_child_tasks: int
    max_depth: int
    max_tree_tasks: int
    def __init__(self, max_depth: _Optional[int] = ..., max_child_tasks: _Optional[int] = ..., max_tree_tasks: _Optional[int] = ...) -> None: ...

class Hedge(_message.Message):
    __slots__ = ["after", "latency_factor", "min_peers"]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    LATENCY_FACTOR_FIELD_NUMBER: _ClassVar[int]
    MIN_PEERS_FIELD_NUMBER: _ClassVar[int]
    after: _duration_pb2.Duration
    latency_factor: float
    min_peers: int
    def __init__(self, latency_factor: _Optional[float] = ..., min_peers: _Optional[int] = ..., after: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class HedgeReport(_message.Message):
    __slots__ = ["first_tokens", "hedge_tokens", "hedge_worker", "started_after", "winner"]
    FIRST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HEDGE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HEDGE_WORKER_FIELD_NUMBER: _ClassVar[int]
    STARTED_AFTER_FIELD_NUMBER: _ClassVar[int]
    WINNER_FIELD_NUMBER: _ClassVar[int]
    first_tokens: int
    hedge_tokens: int
    hedge_worker: str
    started_after: _duration_pb2.Duration
    winner: HedgeAttempt
    def __init__(self, winner: _Optional[_Union[HedgeAttempt, str]] = ..., first_tokens: _Optional[int] = ..., hedge_tokens: _Optional[int] = ..., hedge_worker: _Optional[str] = ..., started_after: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class JoinedResult(_message.Message):
    __slots__ = ["fact_count", "facts", "facts_next_page_token", "synthesis", "synthesis_skipped_reason", "task_count", "tasks", "tasks_next_page_token", "total_tokens"]
    FACTS_FIELD_NUMBER: _ClassVar[int]
    FACTS_NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    FACT_COUNT_FIELD_NUMBER: _ClassVar[int]
    SYNTHESIS_FIELD_NUMBER: _ClassVar[int]
    SYNTHESIS_SKIPPED_REASON_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    TASKS_NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TASK_COUNT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    fact_count: int
    facts: _containers.RepeatedCompositeFieldContainer[Fact]
    facts_next_page_token: str
    synthesis: str
    synthesis_skipped_reason: str
    task_count: int
    tasks: _containers.RepeatedCompositeFieldContainer[TaskOutcome]
    tasks_next_page_token: str
    total_tokens: int
    def __init__(self, facts: _Optional[_Iterable[_Union[Fact, _Mapping]]] = ..., tasks: _Optional[_Iterable[_Union[TaskOutcome, _Mapping]]] = ..., total_tokens: _Optional[int] = ..., synthesis: _Optional[str] = ..., synthesis_skipped_reason: _Optional[str] = ..., fact_count: _Optional[int] = ..., facts_next_page_token: _Optional[str] = ..., task_count: _Optional[int] = ..., tasks_next_page_token: _Optional[str] = ...) -> None: ...

class Limits(_message.Message):
    __slots__ = ["max_concurrency", "run_timeout"]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    RUN_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    max_concurrency: int
    run_timeout: _duration_pb2.Duration
    def __init__(self, max_concurrency: _Optional[int] = ..., run_timeout: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ModelSettings(_message.Message):
    __slots__ = ["max_output_tokens", "model", "provider", "seed", "temperature"]
    MAX_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    max_output_tokens: int
    model: str
    provider: str
    seed: int
    temperature: float
    def __init__(self, provider: _Optional[str] = ..., model: _Optional[str] = ..., temperature: _Optional[float] = ..., max_output_tokens: _Optional[int] = ..., seed: _Optional[int] = ...) -> None: ...

class ReusedFrom(_message.Message):
    __slots__ = ["finished_at", "run_id", "task_id", "tokens_saved", "via", "writes"]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_SAVED_FIELD_NUMBER: _ClassVar[int]
    VIA_FIELD_NUMBER: _ClassVar[int]
    WRITES_FIELD_NUMBER: _ClassVar[int]
    finished_at: _timestamp_pb2.Timestamp
    run_id: str
    task_id: str
    tokens_saved: int
    via: str
    writes: int
    def __init__(self, run_id: _Optional[str] = ..., task_id: _Optional[str] = ..., via: _Optional[str] = ..., finished_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., tokens_saved: _Optional[int] = ..., writes: _Optional[int] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ["added_tokens", "budget", "cancel_cause", "concurrency", "continuations", "continued_at", "created_at", "depth", "finished_at", "forked_from", "idempotency_key", "labels", "parent_run_id", "parent_task_id", "result", "root_run_id", "run_id", "spec", "spec_cut", "state", "task_count", "tasks", "tasks_next_page_token", "tenant_id"]
    class LabelsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ADDED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    CANCEL_CAUSE_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    CONTINUATIONS_FIELD_NUMBER: _ClassVar[int]
    CONTINUED_AT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    FORKED_FROM_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PARENT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ROOT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_CUT_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    TASKS_NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TASK_COUNT_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    added_tokens: int
    budget: BudgetSnapshot
    cancel_cause: str
    concurrency: ConcurrencyChosen
    continuations: int
    continued_at: _timestamp_pb2.Timestamp
    created_at: _timestamp_pb2.Timestamp
    depth: int
    finished_at: _timestamp_pb2.Timestamp
    forked_from: str
    idempotency_key: str
    labels: _containers.ScalarMap[str, str]
    parent_run_id: str
    parent_task_id: str
    result: JoinedResult
    root_run_id: str
    run_id: str
    spec: RunSpec
    spec_cut: bool
    state: RunState
    task_count: int
    tasks: _containers.RepeatedCompositeFieldContainer[TaskOutcome]
    tasks_next_page_token: str
    tenant_id: str
    def __init__(self, run_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., state: _Optional[_Union[RunState, str]] = ..., cancel_cause: _Optional[str] = ..., spec: _Optional[_Union[RunSpec, _Mapping]] = ..., budget: _Optional[_Union[BudgetSnapshot, _Mapping]] = ..., tasks: _Optional[_Iterable[_Union[TaskOutcome, _Mapping]]] = ..., result: _Optional[_Union[JoinedResult, _Mapping]] = ..., task_count: _Optional[int] = ..., tasks_next_page_token: _Optional[str] = ..., spec_cut: bool = ..., concurrency: _Optional[_Union[ConcurrencyChosen, _Mapping]] = ..., forked_from: _Optional[str] = ..., continuations: _Optional[int] = ..., added_tokens: _Optional[int] = ..., continued_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., parent_run_id: _Optional[str] = ..., parent_task_id: _Optional[str] = ..., root_run_id: _Optional[str] = ..., depth: _Optional[int] = ..., created_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RunAdopted(_message.Message):
    __slots__ = ["adoptions", "owner", "previous_owner", "resumed_task_ids"]
    ADOPTIONS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_OWNER_FIELD_NUMBER: _ClassVar[int]
    RESUMED_TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    adoptions: int
    owner: str
    previous_owner: str
    resumed_task_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, previous_owner: _Optional[str] = ..., owner: _Optional[str] = ..., adoptions: _Optional[int] = ..., resumed_task_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class RunContinued(_message.Message):
    __slots__ = ["actor", "added_tokens", "continuation", "limit_tokens", "reason", "reopened", "spent_before", "task_ids"]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    ADDED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CONTINUATION_FIELD_NUMBER: _ClassVar[int]
    LIMIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REOPENED_FIELD_NUMBER: _ClassVar[int]
    SPENT_BEFORE_FIELD_NUMBER: _ClassVar[int]
    TASK_IDS_FIELD_NUMBER: _ClassVar[int]
    actor: str
    added_tokens: int
    continuation: int
    limit_tokens: int
    reason: str
    reopened: bool
    spent_before: int
    task_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, continuation: _Optional[int] = ..., added_tokens: _Optional[int] = ..., limit_tokens: _Optional[int] = ..., spent_before: _Optional[int] = ..., reopened: bool = ..., task_ids: _Optional[_Iterable[str]] = ..., actor: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RunEvent(_message.Message):
    __slots__ = ["approval_decided", "approval_requested", "budget_exhausted", "budget_update", "child_run_finished", "child_run_started", "concurrency_chosen", "run_adopted", "run_continued", "run_finished", "run_id", "run_started", "sequence", "task_finished", "task_hedged", "task_iteration", "task_queued", "task_started", "time"]
    APPROVAL_DECIDED_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    BUDGET_EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    BUDGET_UPDATE_FIELD_NUMBER: _ClassVar[int]
    CHILD_RUN_FINISHED_FIELD_NUMBER: _ClassVar[int]
    CHILD_RUN_STARTED_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_CHOSEN_FIELD_NUMBER: _ClassVar[int]
    RUN_ADOPTED_FIELD_NUMBER: _ClassVar[int]
    RUN_CONTINUED_FIELD_NUMBER: _ClassVar[int]
    RUN_FINISHED_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_STARTED_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TASK_FINISHED_FIELD_NUMBER: _ClassVar[int]
    TASK_HEDGED_FIELD_NUMBER: _ClassVar[int]
    TASK_ITERATION_FIELD_NUMBER: _ClassVar[int]
    TASK_QUEUED_FIELD_NUMBER: _ClassVar[int]
    TASK_STARTED_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    approval_decided: ApprovalDecided
    approval_requested: ApprovalRequested
    budget_exhausted: BudgetExhausted
    budget_update: BudgetUpdate
    child_run_finished: ChildRunFinished
    child_run_started: ChildRunStarted
    concurrency_chosen: ConcurrencyChosen
    run_adopted: RunAdopted
    run_continued: RunContinued
    run_finished: RunFinished
    run_id: str
    run_started: RunStarted
    sequence: int
    task_finished: TaskFinished
    task_hedged: TaskHedged
    task_iteration: TaskIteration
    task_queued: TaskQueued
    task_started: TaskStarted
    time: _timestamp_pb2.Timestamp
    def __init__(self, sequence: _Optional[int] = ..., run_id: _Optional[str] = ..., time: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., run_started: _Optional[_Union[RunStarted, _Mapping]] = ..., task_queued: _Optional[_Union[TaskQueued, _Mapping]] = ..., task_started: _Optional[_Union[TaskStarted, _Mapping]] = ..., task_iteration: _Optional[_Union[TaskIteration, _Mapping]] = ..., task_finished: _Optional[_Union[TaskFinished, _Mapping]] = ..., budget_update: _Optional[_Union[BudgetUpdate, _Mapping]] = ..., budget_exhausted: _Optional[_Union[BudgetExhausted, _Mapping]] = ..., run_finished: _Optional[_Union[RunFinished, _Mapping]] = ..., run_adopted: _Optional[_Union[RunAdopted, _Mapping]] = ..., approval_requested: _Optional[_Union[ApprovalRequested, _Mapping]] = ..., approval_decided: _Optional[_Union[ApprovalDecided, _Mapping]] = ..., concurrency_chosen: _Optional[_Union[ConcurrencyChosen, _Mapping]] = ..., task_hedged: _Optional[_Union[TaskHedged, _Mapping]] = ..., run_continued: _Optional[_Union[RunContinued, _Mapping]] = ..., child_run_started: _Optional[_Union[ChildRunStarted, _Mapping]] = ..., child_run_finished: _Optional[_Union[ChildRunFinished, _Mapping]] = ...) -> None: ...

class RunFinished(_message.Message):
    __slots__ = ["cancel_cause", "result", "state"]
    CANCEL_CAUSE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    cancel_cause: str
    result: JoinedResult
    state: RunState
    def __init__(self, state: _Optional[_Union[RunState, str]] = ..., cancel_cause: _Optional[str] = ..., result: _Optional[_Union[JoinedResult, _Mapping]] = ...) -> None: ...

class RunSpec(_message.Message):
    __slots__ = ["budget", "cache", "fan_out", "goal", "idempotency_key", "join_policy", "labels", "limits", "model", "on_exhaustion", "synthesize", "tasks", "tenant_id"]
    class LabelsEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    FAN_OUT_FIELD_NUMBER: _ClassVar[int]
    GOAL_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    JOIN_POLICY_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ON_EXHAUSTION_FIELD_NUMBER: _ClassVar[int]
    SYNTHESIZE_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    budget: Budget
    cache: CacheSettings
    fan_out: FanOut
    goal: str
    idempotency_key: str
    join_policy: JoinPolicy
    labels: _containers.ScalarMap[str, str]
    limits: Limits
    model: ModelSettings
    on_exhaustion: ExhaustionPolicy
    synthesize: bool
    tasks: _containers.RepeatedCompositeFieldContainer[TaskSpec]
    tenant_id: str
    def __init__(self, idempotency_key: _Optional[str] = ..., tenant_id: _Optional[str] = ..., goal: _Optional[str] = ..., tasks: _Optional[_Iterable[_Union[TaskSpec, _Mapping]]] = ..., budget: _Optional[_Union[Budget, _Mapping]] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., on_exhaustion: _Optional[_Union[ExhaustionPolicy, str]] = ..., join_policy: _Optional[_Union[JoinPolicy, str]] = ..., synthesize: bool = ..., model: _Optional[_Union[ModelSettings, _Mapping]] = ..., cache: _Optional[_Union[CacheSettings, _Mapping]] = ..., fan_out: _Optional[_Union[FanOut, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RunStarted(_message.Message):
    __slots__ = ["run"]
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: Run
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class TaskFinished(_message.Message):
    __slots__ = ["outcome"]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    outcome: TaskOutcome
    def __init__(self, outcome: _Optional[_Union[TaskOutcome, _Mapping]] = ...) -> None: ...

class TaskHedged(_message.Message):
    __slots__ = ["after", "reason", "task_id", "threshold", "worker"]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    after: _duration_pb2.Duration
    reason: str
    task_id: str
    threshold: _duration_pb2.Duration
    worker: str
    def __init__(self, task_id: _Optional[str] = ..., worker: _Optional[str] = ..., after: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., threshold: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class TaskIteration(_message.Message):
    __slots__ = ["cached_tool_calls", "iteration", "task_id", "tokens_spent", "tool_calls"]
    CACHED_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_SPENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    cached_tool_calls: int
    iteration: int
    task_id: str
    tokens_spent: int
    tool_calls: int
    def __init__(self, task_id: _Optional[str] = ..., iteration: _Optional[int] = ..., tokens_spent: _Optional[int] = ..., tool_calls: _Optional[int] = ..., cached_tool_calls: _Optional[int] = ...) -> None: ...

class TaskOutcome(_message.Message):
    __slots__ = ["dispatch_index", "finished_at", "forecast_tokens", "hedge", "reused", "started_at", "status", "summary", "task_id", "tokens_spent", "worker"]
    DISPATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    FORECAST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HEDGE_FIELD_NUMBER: _ClassVar[int]
    REUSED_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_SPENT_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    dispatch_index: int
    finished_at: _timestamp_pb2.Timestamp
    forecast_tokens: int
    hedge: HedgeReport
    reused: ReusedFrom
    started_at: _timestamp_pb2.Timestamp
    status: TaskStatus
    summary: FactSummary
    task_id: str
    tokens_spent: int
    worker: str
    def __init__(self, task_id: _Optional[str] = ..., dispatch_index: _Optional[int] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., summary: _Optional[_Union[FactSummary, _Mapping]] = ..., tokens_spent: _Optional[int] = ..., worker: _Optional[str] = ..., started_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[_timestamp_pb2.Timestamp, _Mapping]] = ..., forecast_tokens: _Optional[int] = ..., hedge: _Optional[_Union[HedgeReport, _Mapping]] = ..., reused: _Optional[_Union[ReusedFrom, _Mapping]] = ...) -> None: ...

class TaskQueued(_message.Message):
    __slots__ = ["dispatch_index", "task_id"]
    DISPATCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    dispatch_index: int
    task_id: str
    def __init__(self, task_id: _Optional[str] = ..., dispatch_index: _Optional[int] = ...) -> None: ...

class TaskSpec(_message.Message):
    __slots__ = ["allowed_tools", "depends_on", "hedge", "id", "instruction", "max_iterations", "timeout", "token_budget"]
    ALLOWED_TOOLS_FIELD_NUMBER: _ClassVar[int]
    DEPENDS_ON_FIELD_NUMBER: _ClassVar[int]
    HEDGE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    MAX_ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    allowed_tools: _containers.RepeatedScalarFieldContainer[str]
    depends_on: _containers.RepeatedScalarFieldContainer[str]
    hedge: Hedge
    id: str
    instruction: str
    max_iterations: int
    timeout: _duration_pb2.Duration
    token_budget: int
    def __init__(self, id: _Optional[str] = ..., instruction: _Optional[str] = ..., token_budget: _Optional[int] = ..., max_iterations: _Optional[int] = ..., allowed_tools: _Optional[_Iterable[str]] = ..., depends_on: _Optional[_Iterable[str]] = ..., timeout: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., hedge: _Optional[_Union[Hedge, _Mapping]] = ...) -> None: ...

class TaskStarted(_message.Message):
    __slots__ = ["forecast_tokens", "task_id", "worker"]
    FORECAST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    forecast_tokens: int
    task_id: str
    worker: str
    def __init__(self, task_id: _Optional[str] = ..., worker: _Optional[str] = ..., forecast_tokens: _Optional[int] = ...) -> None: ...

class ExhaustionPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class JoinPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class TaskStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class AdmissionPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class RunState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class HedgeAttempt(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
