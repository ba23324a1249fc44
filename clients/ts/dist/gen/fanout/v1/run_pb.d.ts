import type { GenEnum, GenFile, GenMessage } from "@bufbuild/protobuf/codegenv2";
import type { Duration, Timestamp } from "@bufbuild/protobuf/wkt";
import type { Message } from "@bufbuild/protobuf";
/**
 * Describes the file fanout/v1/run.proto.
 */
export declare const file_fanout_v1_run: GenFile;
/**
 * RunSpec is everything a caller submits to start a run. It is stored with
 * the run and returned unchanged in Run.spec (up to 384 KiB; see Run.spec).
 *
 * @generated from message fanout.v1.RunSpec
 */
export type RunSpec = Message<"fanout.v1.RunSpec"> & {
    /**
     * Required. Caller-chosen key that makes submission idempotent within a
     * tenant: submitting a spec with a key already used by this tenant returns
     * (or joins) the existing run and never spends a second time. At most 128
     * bytes; a UUID is a good choice.
     *
     * @generated from field: string idempotency_key = 1;
     */
    idempotencyKey: string;
    /**
     * Tenant that owns and pays for the run. Empty means "default". Every read
     * (GetRun, WatchRun, ListRuns) is scoped to the tenant.
     *
     * @generated from field: string tenant_id = 2;
     */
    tenantId: string;
    /**
     * The overall goal, given to every subagent as context and to the
     * synthesis call. Free text.
     *
     * @generated from field: string goal = 3;
     */
    goal: string;
    /**
     * The tasks to fan out, one subagent each. At least one. Tasks are
     * dispatched in this order (the dispatch order) as their dependencies
     * allow; the number of tasks is capped by the server.
     *
     * @generated from field: repeated fanout.v1.TaskSpec tasks = 4;
     */
    tasks: TaskSpec[];
    /**
     * The run's token budget, shared by all its tasks and the synthesis call.
     *
     * @generated from field: fanout.v1.Budget budget = 10;
     */
    budget?: Budget | undefined;
    /**
     * Concurrency and time limits. Unset fields take server defaults.
     *
     * @generated from field: fanout.v1.Limits limits = 11;
     */
    limits?: Limits | undefined;
    /**
     * What to do with in-flight work when the budget is exhausted. Default
     * EXHAUSTION_POLICY_CANCEL.
     *
     * @generated from field: fanout.v1.ExhaustionPolicy on_exhaustion = 12;
     */
    onExhaustion: ExhaustionPolicy;
    /**
     * When to join. Default JOIN_POLICY_ALL_SETTLED.
     *
     * @generated from field: fanout.v1.JoinPolicy join_policy = 13;
     */
    joinPolicy: JoinPolicy;
    /**
     * Whether to run one budgeted synthesis call over the joined facts after
     * the join. Skipped (with a reason) if the budget cannot cover it.
     *
     * @generated from field: bool synthesize = 14;
     */
    synthesize: boolean;
    /**
     * Model used by every subagent of the run and by the synthesis call.
     *
     * @generated from field: fanout.v1.ModelSettings model = 15;
     */
    model?: ModelSettings | undefined;
    /**
     * What the run may take from the tenant's result cache instead of
     * running it again (docs/budget.md#the-result-cache). Unset: nothing.
     *
     * @generated from field: fanout.v1.CacheSettings cache = 16;
     */
    cache?: CacheSettings | undefined;
    /**
     * Whether the run's subagents may fan out themselves: a built-in tool,
     * fan_out, that starts a child run under the calling task, paid from
     * what that task has left (docs/budget.md#nested-fan-out). Unset: they
     * cannot.
     *
     * @generated from field: fanout.v1.FanOut fan_out = 17;
     */
    fanOut?: FanOut | undefined;
    /**
     * Free-form caller labels, stored with the run and copied to Run.labels.
     * Not interpreted by the server. Keys at most 63 bytes, values at most 255
     * bytes.
     *
     * @generated from field: map<string, string> labels = 20;
     */
    labels: {
        [key: string]: string;
    };
};
/**
 * Describes the message fanout.v1.RunSpec.
 * Use `create(RunSpecSchema)` to create a new message.
 */
export declare const RunSpecSchema: GenMessage<RunSpec>;
/**
 * FanOut lets a run's subagents fan out: each may call the built-in tool
 * fan_out, which starts a child run of the tasks it names under the
 * calling task and answers with the child's joined facts
 * (docs/budget.md#nested-fan-out). A child run's budget is carved from
 * what the calling task has left, never more, and what it does not spend
 * goes back; cancelling or exhausting any run above it ends it. Its
 * subagents fan out again while max_depth allows; every limit counts
 * every level of the tree under the root run.
 *
 * @generated from message fanout.v1.FanOut
 */
export type FanOut = Message<"fanout.v1.FanOut"> & {
    /**
     * Required, 1 to 4: how many levels of child runs the tree may have
     * below the root run (1: the root's subagents may fan out, their
     * children's may not). A child run's own spec says how many levels are
     * left below it.
     *
     * @generated from field: uint32 max_depth = 1;
     */
    maxDepth: number;
    /**
     * The most tasks one fan_out call may start (the child run's tasks): 0
     * means 8; at most 64.
     *
     * @generated from field: uint32 max_child_tasks = 2;
     */
    maxChildTasks: number;
    /**
     * The most tasks of the whole tree under the root run, its own tasks
     * and every level's counted: a fan_out call that would pass it is
     * refused. 0 means 256; at most 4,096.
     *
     * @generated from field: uint32 max_tree_tasks = 3;
     */
    maxTreeTasks: number;
};
/**
 * Describes the message fanout.v1.FanOut.
 * Use `create(FanOutSchema)` to create a new message.
 */
export declare const FanOutSchema: GenMessage<FanOut>;
/**
 * CacheSettings opts a run into the tenant's result cache
 * (docs/budget.md#the-result-cache). Entries are never shared between
 * tenants, and a cached result is never used for a write.
 *
 * @generated from message fanout.v1.CacheSettings
 */
export type CacheSettings = Message<"fanout.v1.CacheSettings"> & {
    /**
     * Reuse a task's facts from an earlier run of the same tenant whose task
     * had the same content (instruction, model, tools, context facts of its
     * dependencies) and SUCCEEDED no longer ago than this: the task is not
     * run (TaskOutcome.reused names the source; it spends 0). Unset or 0:
     * every task runs. At most 30 days.
     *
     * @generated from field: google.protobuf.Duration task_max_age = 1;
     */
    taskMaxAge?: Duration | undefined;
    /**
     * Let subagents use the cached results of read tools whose policy gives
     * them a TTL (cache_ttl in the MCP configuration, docs/mcp.md), keyed by
     * (tenant, server, tool, canonical arguments). Writes are never cached.
     *
     * @generated from field: bool tools = 2;
     */
    tools: boolean;
};
/**
 * Describes the message fanout.v1.CacheSettings.
 * Use `create(CacheSettingsSchema)` to create a new message.
 */
export declare const CacheSettingsSchema: GenMessage<CacheSettings>;
/**
 * TaskSpec describes one subagent's task.
 *
 * @generated from message fanout.v1.TaskSpec
 */
export type TaskSpec = Message<"fanout.v1.TaskSpec"> & {
    /**
     * Required. Identifies the task within its run; unique within the run.
     * Used by depends_on and in every task outcome and event. At most 64
     * bytes; must not start with "_" (reserved for fanout's own calls).
     *
     * @generated from field: string id = 1;
     */
    id: string;
    /**
     * Required. What this subagent must do. Free text.
     *
     * @generated from field: string instruction = 2;
     */
    instruction: string;
    /**
     * Required, > 0. The most tokens this task may spend, carved out of the
     * run budget. Unspent tokens flow back to the run when the task ends.
     *
     * @generated from field: int64 token_budget = 3;
     */
    tokenBudget: bigint;
    /**
     * The most model-call iterations the agent loop may run; the task ends
     * ITERATION_LIMIT when it is reached. 0 means the server default; the
     * server caps it.
     *
     * @generated from field: int32 max_iterations = 4;
     */
    maxIterations: number;
    /**
     * Names of the tools the subagent may call. Empty means no tools. Unknown
     * names are rejected with INVALID_ARGUMENT.
     *
     * @generated from field: repeated string allowed_tools = 5;
     */
    allowedTools: string[];
    /**
     * Ids of tasks in the same run that must succeed before this one starts;
     * their facts are passed to it as context. If any of them ends without
     * success this task is SKIPPED. Must name existing tasks and form no
     * cycle.
     *
     * @generated from field: repeated string depends_on = 6;
     */
    dependsOn: string[];
    /**
     * Wall-clock limit for this task once it starts; the task ends TIMED_OUT
     * when it runs out. Unset means the server default; never later than the
     * run's deadline.
     *
     * @generated from field: google.protobuf.Duration timeout = 7;
     */
    timeout?: Duration | undefined;
    /**
     * Set (even empty) to hedge the task: when it runs far past its peers, a
     * second attempt of it starts on another worker while the first runs on;
     * the first of the two to end with an answer is the task's outcome, the
     * other is cancelled, and both attempts' spend is the task's. Unset: the
     * task is never hedged. A task that allows a tool that may write (any
     * tool but the workers' read-only built-ins) cannot be hedged: its
     * writes are at most once. See docs/budget.md#hedged-tasks.
     *
     * @generated from field: fanout.v1.Hedge hedge = 8;
     */
    hedge?: Hedge | undefined;
};
/**
 * Describes the message fanout.v1.TaskSpec.
 * Use `create(TaskSpecSchema)` to create a new message.
 */
export declare const TaskSpecSchema: GenMessage<TaskSpec>;
/**
 * Hedge says when a task's second attempt starts. It starts once the
 * first attempt has run (since its worker started it) past the earlier of
 * `after` and latency_factor times the median duration of the run's tasks
 * that answered (at least min_peers of them). With neither set the factor
 * is 3. It starts only if the run's forecast affords the task's forecast
 * once more (under ADMISSION_POLICY_FORECAST), another worker is in the
 * pool, and the run is not stopping; at most one per task.
 *
 * @generated from message fanout.v1.Hedge
 */
export type Hedge = Message<"fanout.v1.Hedge"> & {
    /**
     * How far past its peers' median duration the task must run before it
     * is hedged: 0 means 3 (unless `after` alone is set); else 1.5 to 100.
     *
     * @generated from field: double latency_factor = 1;
     */
    latencyFactor: number;
    /**
     * How many of the run's other tasks must have answered before
     * latency_factor applies: 0 means 3; else 1 to the run's other tasks.
     *
     * @generated from field: int32 min_peers = 2;
     */
    minPeers: number;
    /**
     * Hedge once the first attempt has run this long, whatever its peers
     * did: 100ms or more, less than the task's timeout. Unset: only
     * latency_factor applies.
     *
     * @generated from field: google.protobuf.Duration after = 3;
     */
    after?: Duration | undefined;
};
/**
 * Describes the message fanout.v1.Hedge.
 * Use `create(HedgeSchema)` to create a new message.
 */
export declare const HedgeSchema: GenMessage<Hedge>;
/**
 * Budget is a run's token budget.
 *
 * @generated from message fanout.v1.Budget
 */
export type Budget = Message<"fanout.v1.Budget"> & {
    /**
     * Required, > 0. Total tokens the run may spend across all its tasks and
     * the synthesis call. Enforced exactly by the ledger; capped by the
     * server and by the tenant's own budget, if it has one.
     *
     * @generated from field: int64 limit_tokens = 1;
     */
    limitTokens: bigint;
    /**
     * The smallest reservation worth making, in tokens. The run counts as
     * exhausted when its available tokens fall below this, and the exhaustion
     * policy is applied. 0 means the default, 256. Must not exceed
     * limit_tokens.
     *
     * @generated from field: int64 min_reservation_tokens = 2;
     */
    minReservationTokens: bigint;
    /**
     * Tokens the run holds back for its synthesis from the start (only with
     * synthesize): no subagent can spend them (the run is exhausted for its
     * tasks at limit_tokens minus these), and the synthesis draws on them
     * after the join, also when the tasks exhausted the rest. 0 means sized by
     * the server: the synthesis's output cap (model.max_output_tokens, else
     * 1,024) plus 256 per task for the joined facts and 512 for the
     * instruction, at most a quarter of limit_tokens. At most limit_tokens -
     * min_reservation_tokens. Under a tenant budget the tenant holds them
     * too, as far as it can.
     *
     * @generated from field: int64 synthesis_tokens = 3;
     */
    synthesisTokens: bigint;
    /**
     * When a task may start. Default ADMISSION_POLICY_FORECAST.
     *
     * @generated from field: fanout.v1.AdmissionPolicy admission = 4;
     */
    admission: AdmissionPolicy;
};
/**
 * Describes the message fanout.v1.Budget.
 * Use `create(BudgetSchema)` to create a new message.
 */
export declare const BudgetSchema: GenMessage<Budget>;
/**
 * Limits bounds a run's concurrency and duration.
 *
 * @generated from message fanout.v1.Limits
 */
export type Limits = Message<"fanout.v1.Limits"> & {
    /**
     * The most tasks of this run running at once. 0 means the server default;
     * the server caps it.
     *
     * @generated from field: int32 max_concurrency = 1;
     */
    maxConcurrency: number;
    /**
     * Wall-clock limit for the whole run, from acceptance to the end of the
     * join (including synthesis); the run ends TIMED_OUT when it runs out.
     * Unset means the server default; the server caps it.
     *
     * @generated from field: google.protobuf.Duration run_timeout = 2;
     */
    runTimeout?: Duration | undefined;
};
/**
 * Describes the message fanout.v1.Limits.
 * Use `create(LimitsSchema)` to create a new message.
 */
export declare const LimitsSchema: GenMessage<Limits>;
/**
 * ModelSettings selects and tunes the model the subagents call.
 *
 * @generated from message fanout.v1.ModelSettings
 */
export type ModelSettings = Message<"fanout.v1.ModelSettings"> & {
    /**
     * Model provider: "sim" (deterministic simulator, no network), "openai"
     * (any OpenAI-compatible endpoint configured on the worker) or
     * "anthropic". Empty means the worker's default provider.
     *
     * @generated from field: string provider = 1;
     */
    provider: string;
    /**
     * Provider-specific model name, e.g. "gpt-4o-mini". Empty means the
     * provider's default configured on the worker.
     *
     * @generated from field: string model = 2;
     */
    model: string;
    /**
     * Sampling temperature, 0 to 2, sent to the provider as given (0 is a
     * real value, not "unset"). Ignored by "sim".
     *
     * @generated from field: double temperature = 3;
     */
    temperature: number;
    /**
     * Output allowance per model call, in tokens: each call reserves its input
     * estimate plus this much, and max_tokens is shrunk to what was granted.
     * 0 means the server default.
     *
     * @generated from field: int32 max_output_tokens = 4;
     */
    maxOutputTokens: number;
    /**
     * Seed for deterministic output. Honoured by "sim" (same seed, same spec
     * => same run); passed through to providers that support it.
     *
     * @generated from field: int64 seed = 5;
     */
    seed: bigint;
};
/**
 * Describes the message fanout.v1.ModelSettings.
 * Use `create(ModelSettingsSchema)` to create a new message.
 */
export declare const ModelSettingsSchema: GenMessage<ModelSettings>;
/**
 * Fact is one piece of information a subagent found.
 *
 * @generated from message fanout.v1.Fact
 */
export type Fact = Message<"fanout.v1.Fact"> & {
    /**
     * The fact, as one self-contained statement.
     *
     * @generated from field: string text = 1;
     */
    text: string;
    /**
     * Where it came from (URLs, document ids, tool call references). After a
     * join that merges duplicate facts, holds the sources of every copy, in
     * dispatch order, without duplicates.
     *
     * @generated from field: repeated string sources = 2;
     */
    sources: string[];
};
/**
 * Describes the message fanout.v1.Fact.
 * Use `create(FactSchema)` to create a new message.
 */
export declare const FactSchema: GenMessage<Fact>;
/**
 * FactSummary is what a subagent compresses its work into when it ends; it
 * is all that flows back to the orchestrator.
 *
 * @generated from message fanout.v1.FactSummary
 */
export type FactSummary = Message<"fanout.v1.FactSummary"> & {
    /**
     * Facts found, in the order found.
     *
     * @generated from field: repeated fanout.v1.Fact facts = 1;
     */
    facts: Fact[];
    /**
     * Short descriptions of what was tried (queries, tool calls, approaches).
     *
     * @generated from field: repeated string tried = 2;
     */
    tried: string[];
    /**
     * Short descriptions of what failed and why.
     *
     * @generated from field: repeated string failed = 3;
     */
    failed: string[];
    /**
     * Tokens this subagent spent (settled in the ledger, including estimated
     * settlements of cancelled calls).
     *
     * @generated from field: int64 tokens_spent = 4;
     */
    tokensSpent: bigint;
    /**
     * Model-call iterations the agent loop ran.
     *
     * @generated from field: int32 iterations = 5;
     */
    iterations: number;
    /**
     * Terminal status of the subagent (never PENDING, RUNNING or SKIPPED; a
     * NOT_STARTED task's summary only says why, in error).
     *
     * @generated from field: fanout.v1.TaskStatus status = 6;
     */
    status: TaskStatus;
    /**
     * Why it ended, if status is not SUCCEEDED. Empty on success.
     *
     * @generated from field: string error = 7;
     */
    error: string;
    /**
     * The run wound the task down (ADMISSION_POLICY_FORECAST): what was left
     * could pay only for final answers, so its last iteration was made
     * without tools (and no compression call followed), and its answer is
     * what it had found by then.
     *
     * @generated from field: bool wound_down = 8;
     */
    woundDown: boolean;
    /**
     * The most the subagent had spent and reserved at once (its spend before
     * a call plus that call's grant): what it needed of the run's budget,
     * which is more than it spent. The run's forecast rests on it.
     *
     * @generated from field: int64 peak_tokens = 9;
     */
    peakTokens: bigint;
};
/**
 * Describes the message fanout.v1.FactSummary.
 * Use `create(FactSummarySchema)` to create a new message.
 */
export declare const FactSummarySchema: GenMessage<FactSummary>;
/**
 * TaskOutcome is how one task of a run ended (or is doing, while running).
 *
 * @generated from message fanout.v1.TaskOutcome
 */
export type TaskOutcome = Message<"fanout.v1.TaskOutcome"> & {
    /**
     * The task's TaskSpec.id.
     *
     * @generated from field: string task_id = 1;
     */
    taskId: string;
    /**
     * Zero-based position of the task in dispatch order (its index in
     * RunSpec.tasks).
     *
     * @generated from field: int32 dispatch_index = 2;
     */
    dispatchIndex: number;
    /**
     * Current or terminal status of the task.
     *
     * @generated from field: fanout.v1.TaskStatus status = 3;
     */
    status: TaskStatus;
    /**
     * The subagent's summary. Unset while the task is pending or running, and
     * for tasks that never ran (SKIPPED, or cancelled before dispatch),
     * except NOT_STARTED, whose summary says why in error.
     *
     * @generated from field: fanout.v1.FactSummary summary = 4;
     */
    summary?: FactSummary | undefined;
    /**
     * Tokens the task spent, settled in the ledger.
     *
     * @generated from field: int64 tokens_spent = 5;
     */
    tokensSpent: bigint;
    /**
     * Address of the worker that ran the task (the last one, if it was
     * retried elsewhere). Empty if it never ran.
     *
     * @generated from field: string worker = 6;
     */
    worker: string;
    /**
     * When the task started running on a worker. Unset if it never ran.
     *
     * @generated from field: google.protobuf.Timestamp started_at = 10;
     */
    startedAt?: Timestamp | undefined;
    /**
     * When the task ended. Unset while pending or running.
     *
     * @generated from field: google.protobuf.Timestamp finished_at = 11;
     */
    finishedAt?: Timestamp | undefined;
    /**
     * What the run forecast the task would cost when it was admitted (or,
     * for NOT_STARTED, refused), in tokens; 0 under ADMISSION_POLICY_GREEDY
     * and for tasks never considered.
     *
     * @generated from field: int64 forecast_tokens = 7;
     */
    forecastTokens: bigint;
    /**
     * How the task's hedge went, if one started (TaskSpec.hedge); unset if
     * none did. tokens_spent includes both attempts.
     *
     * @generated from field: fanout.v1.HedgeReport hedge = 12;
     */
    hedge?: HedgeReport | undefined;
    /**
     * Set when the task was not run but its facts were taken from a task of
     * an earlier run with the same content (a fork, or the result cache):
     * the task made no model call, spent 0 and re-sent no write; the
     * source's writes are listed by ListToolCalls of the source run.
     *
     * @generated from field: fanout.v1.ReusedFrom reused = 13;
     */
    reused?: ReusedFrom | undefined;
};
/**
 * Describes the message fanout.v1.TaskOutcome.
 * Use `create(TaskOutcomeSchema)` to create a new message.
 */
export declare const TaskOutcomeSchema: GenMessage<TaskOutcome>;
/**
 * ReusedFrom names the recorded task whose facts a task reused.
 *
 * @generated from message fanout.v1.ReusedFrom
 */
export type ReusedFrom = Message<"fanout.v1.ReusedFrom"> & {
    /**
     * The run the facts were recorded in.
     *
     * @generated from field: string run_id = 1;
     */
    runId: string;
    /**
     * The task of that run.
     *
     * @generated from field: string task_id = 2;
     */
    taskId: string;
    /**
     * Why: "fork" (ForkRun of run_id) or "cache" (RunSpec.cache.task_max_age).
     *
     * @generated from field: string via = 3;
     */
    via: string;
    /**
     * When the source task ended.
     *
     * @generated from field: google.protobuf.Timestamp finished_at = 4;
     */
    finishedAt?: Timestamp | undefined;
    /**
     * What the source task spent, which this run did not.
     *
     * @generated from field: int64 tokens_saved = 5;
     */
    tokensSaved: bigint;
    /**
     * The source task's writes that were sent (they are not sent again).
     *
     * @generated from field: int32 writes = 6;
     */
    writes: number;
};
/**
 * Describes the message fanout.v1.ReusedFrom.
 * Use `create(ReusedFromSchema)` to create a new message.
 */
export declare const ReusedFromSchema: GenMessage<ReusedFrom>;
/**
 * HedgeReport is how a hedged task's two attempts went.
 *
 * @generated from message fanout.v1.HedgeReport
 */
export type HedgeReport = Message<"fanout.v1.HedgeReport"> & {
    /**
     * The attempt whose outcome is the task's: the first to end with an
     * answer (SUCCEEDED); UNSPECIFIED if neither did (the task's outcome is
     * then the first attempt's).
     *
     * @generated from field: fanout.v1.HedgeAttempt winner = 1;
     */
    winner: HedgeAttempt;
    /**
     * What the first attempt spent, settled in the ledger.
     *
     * @generated from field: int64 first_tokens = 2;
     */
    firstTokens: bigint;
    /**
     * What the second attempt spent, settled in the ledger (on its own
     * account, a sibling of the task's: see docs/budget.md#hedged-tasks).
     *
     * @generated from field: int64 hedge_tokens = 3;
     */
    hedgeTokens: bigint;
    /**
     * The worker the second attempt ran on.
     *
     * @generated from field: string hedge_worker = 4;
     */
    hedgeWorker: string;
    /**
     * How long the first attempt had run when the second started.
     *
     * @generated from field: google.protobuf.Duration started_after = 5;
     */
    startedAfter?: Duration | undefined;
};
/**
 * Describes the message fanout.v1.HedgeReport.
 * Use `create(HedgeReportSchema)` to create a new message.
 */
export declare const HedgeReportSchema: GenMessage<HedgeReport>;
/**
 * BudgetSnapshot is the state of a run's ledger account at one point in
 * time. limit_tokens = available_tokens + reserved_tokens + spent_tokens +
 * held_tokens.
 *
 * @generated from message fanout.v1.BudgetSnapshot
 */
export type BudgetSnapshot = Message<"fanout.v1.BudgetSnapshot"> & {
    /**
     * The run's total budget, in tokens.
     *
     * @generated from field: int64 limit_tokens = 1;
     */
    limitTokens: bigint;
    /**
     * Tokens neither reserved nor spent.
     *
     * @generated from field: int64 available_tokens = 2;
     */
    availableTokens: bigint;
    /**
     * Tokens reserved by in-flight model calls, not yet settled.
     *
     * @generated from field: int64 reserved_tokens = 3;
     */
    reservedTokens: bigint;
    /**
     * Tokens settled as spent.
     *
     * @generated from field: int64 spent_tokens = 4;
     */
    spentTokens: bigint;
    /**
     * Whether the account is exhausted (available fell below the minimum
     * reservation); once true it stays true.
     *
     * @generated from field: bool exhausted = 5;
     */
    exhausted: boolean;
    /**
     * Tokens held back for the run's synthesis: available to no task, drawn
     * on by the synthesis (Budget.synthesis_tokens).
     *
     * @generated from field: int64 held_tokens = 6;
     */
    heldTokens: bigint;
};
/**
 * Describes the message fanout.v1.BudgetSnapshot.
 * Use `create(BudgetSnapshotSchema)` to create a new message.
 */
export declare const BudgetSnapshotSchema: GenMessage<BudgetSnapshot>;
/**
 * JoinedResult is the outcome of a run's join.
 *
 * Served (in GetRun, CancelRun and RunFinished) its facts and tasks are cut
 * to the first that fit in 384 KiB each, encoded, so that the message that
 * carries it stays under 2 MiB whatever the size of the run: fact_count and
 * task_count say how many there are, and facts_next_page_token and
 * tasks_next_page_token continue with ListRunFacts and ListRunTasks.
 *
 * @generated from message fanout.v1.JoinedResult
 */
export type JoinedResult = Message<"fanout.v1.JoinedResult"> & {
    /**
     * Facts from every task's summary, in dispatch order, with duplicates
     * merged into one fact that keeps all their sources. Served: the first
     * that fit (see above).
     *
     * @generated from field: repeated fanout.v1.Fact facts = 1;
     */
    facts: Fact[];
    /**
     * Every task's outcome in dispatch order, failed ones included. Served:
     * the first that fit (see above).
     *
     * @generated from field: repeated fanout.v1.TaskOutcome tasks = 2;
     */
    tasks: TaskOutcome[];
    /**
     * Tokens the run spent in total, tasks and synthesis.
     *
     * @generated from field: int64 total_tokens = 3;
     */
    totalTokens: bigint;
    /**
     * The synthesis call's answer. Empty if synthesis was not asked for or was
     * skipped.
     *
     * @generated from field: string synthesis = 4;
     */
    synthesis: string;
    /**
     * Why synthesis was skipped although asked for (e.g. budget exhausted, no
     * facts). Empty otherwise.
     *
     * @generated from field: string synthesis_skipped_reason = 5;
     */
    synthesisSkippedReason: string;
    /**
     * How many facts the result has, whether or not facts holds them all.
     *
     * @generated from field: int32 fact_count = 6;
     */
    factCount: number;
    /**
     * Set when facts holds fewer than fact_count: the page_token of
     * ListRunFacts for the facts after them. Empty otherwise.
     *
     * @generated from field: string facts_next_page_token = 7;
     */
    factsNextPageToken: string;
    /**
     * How many tasks the result has, whether or not tasks holds them all.
     *
     * @generated from field: int32 task_count = 8;
     */
    taskCount: number;
    /**
     * Set when tasks holds fewer than task_count: the page_token of
     * ListRunTasks for the tasks after them. Empty otherwise.
     *
     * @generated from field: string tasks_next_page_token = 9;
     */
    tasksNextPageToken: string;
};
/**
 * Describes the message fanout.v1.JoinedResult.
 * Use `create(JoinedResultSchema)` to create a new message.
 */
export declare const JoinedResultSchema: GenMessage<JoinedResult>;
/**
 * Run is a run's stored state.
 *
 * Served (GetRun, CancelRun, RunStarted, ListRuns) a run stays under 2 MiB
 * encoded whatever its size: its tasks are cut to the first that fit in
 * 384 KiB (task_count says how many there are, tasks_next_page_token
 * continues with ListRunTasks), its result as JoinedResult says, and its
 * spec as spec says.
 *
 * @generated from message fanout.v1.Run
 */
export type Run = Message<"fanout.v1.Run"> & {
    /**
     * Server-assigned run id (a UUID).
     *
     * @generated from field: string run_id = 1;
     */
    runId: string;
    /**
     * Tenant that owns the run ("default" if the spec left it empty).
     *
     * @generated from field: string tenant_id = 2;
     */
    tenantId: string;
    /**
     * The spec's idempotency key.
     *
     * @generated from field: string idempotency_key = 3;
     */
    idempotencyKey: string;
    /**
     * Current state.
     *
     * @generated from field: fanout.v1.RunState state = 4;
     */
    state: RunState;
    /**
     * Why the run was cancelled or failed (e.g. "budget exhausted", "cancelled
     * by caller: <reason>", "task t2 failed"). Empty while RUNNING and on
     * SUCCEEDED.
     *
     * @generated from field: string cancel_cause = 5;
     */
    cancelCause: string;
    /**
     * The spec as submitted, when it is at most 384 KiB encoded. A larger
     * spec is served with its tasks cut to the first that fit in 384 KiB, or
     * unset when its other fields alone pass that (a very long goal); then
     * spec_cut is true. The rest of a cut spec is not served: the caller
     * submitted it, and every task's id and outcome is in tasks and
     * ListRunTasks.
     *
     * @generated from field: fanout.v1.RunSpec spec = 10;
     */
    spec?: RunSpec | undefined;
    /**
     * The run's budget as last known.
     *
     * @generated from field: fanout.v1.BudgetSnapshot budget = 11;
     */
    budget?: BudgetSnapshot | undefined;
    /**
     * Every task's current outcome, in dispatch order. Served: the first that
     * fit (see above).
     *
     * @generated from field: repeated fanout.v1.TaskOutcome tasks = 12;
     */
    tasks: TaskOutcome[];
    /**
     * The joined result. Set once the run has ended.
     *
     * @generated from field: fanout.v1.JoinedResult result = 13;
     */
    result?: JoinedResult | undefined;
    /**
     * How many tasks the run has, whether or not tasks holds them all.
     *
     * @generated from field: int32 task_count = 14;
     */
    taskCount: number;
    /**
     * Set when tasks holds fewer than task_count: the page_token of
     * ListRunTasks for the tasks after them. Empty otherwise.
     *
     * @generated from field: string tasks_next_page_token = 15;
     */
    tasksNextPageToken: string;
    /**
     * Whether spec was cut (or left out) to fit; see spec.
     *
     * @generated from field: bool spec_cut = 16;
     */
    specCut: boolean;
    /**
     * The run's latest ConcurrencyChosen event, for a run whose concurrency
     * comes from the rate limits (limits.max_concurrency unset): how many of
     * its tasks may run at once, and why. Set by GetRun only.
     *
     * @generated from field: fanout.v1.ConcurrencyChosen concurrency = 17;
     */
    concurrency?: ConcurrencyChosen | undefined;
    /**
     * The run this one was forked from (ForkRun); empty otherwise.
     *
     * @generated from field: string forked_from = 18;
     */
    forkedFrom: string;
    /**
     * How many times the run was continued (ContinueRun), and the tokens
     * those continuations added to spec.budget.limit_tokens: the run's
     * budget is their sum (budget.limit_tokens).
     *
     * @generated from field: int32 continuations = 19;
     */
    continuations: number;
    /**
     * The tokens the continuations added.
     *
     * @generated from field: int64 added_tokens = 22;
     */
    addedTokens: bigint;
    /**
     * When the run last reopened (a ContinueRun of a run that had ended);
     * unset if it never did. Its run timeout counts from then.
     *
     * @generated from field: google.protobuf.Timestamp continued_at = 23;
     */
    continuedAt?: Timestamp | undefined;
    /**
     * For a child run (a subagent's fan_out, RunSpec.fan_out): the run
     * whose task started it. Empty for a run a caller started.
     *
     * @generated from field: string parent_run_id = 24;
     */
    parentRunId: string;
    /**
     * For a child run: the task of parent_run_id that started it.
     *
     * @generated from field: string parent_task_id = 25;
     */
    parentTaskId: string;
    /**
     * The root run of the run's tree: the run's own id for a run a caller
     * started.
     *
     * @generated from field: string root_run_id = 26;
     */
    rootRunId: string;
    /**
     * How many levels below its root the run is: 0 for a root run.
     *
     * @generated from field: int32 depth = 27;
     */
    depth: number;
    /**
     * When the run was accepted (Postgres time).
     *
     * @generated from field: google.protobuf.Timestamp created_at = 20;
     */
    createdAt?: Timestamp | undefined;
    /**
     * When the run ended (Postgres time). Unset while RUNNING, also while a
     * continued run runs again; a continued run's last end.
     *
     * @generated from field: google.protobuf.Timestamp finished_at = 21;
     */
    finishedAt?: Timestamp | undefined;
    /**
     * The spec's labels.
     *
     * @generated from field: map<string, string> labels = 30;
     */
    labels: {
        [key: string]: string;
    };
};
/**
 * Describes the message fanout.v1.Run.
 * Use `create(RunSchema)` to create a new message.
 */
export declare const RunSchema: GenMessage<Run>;
/**
 * RunEvent is one event in a run's history. Events are stored, so they can be
 * replayed from any orchestrator replica (WatchRun).
 *
 * @generated from message fanout.v1.RunEvent
 */
export type RunEvent = Message<"fanout.v1.RunEvent"> & {
    /**
     * Position of the event in the run's history: 1 for the first event,
     * increasing by 1 with no gaps.
     *
     * @generated from field: int64 sequence = 1;
     */
    sequence: bigint;
    /**
     * The run the event belongs to.
     *
     * @generated from field: string run_id = 2;
     */
    runId: string;
    /**
     * When the event was recorded.
     *
     * @generated from field: google.protobuf.Timestamp time = 3;
     */
    time?: Timestamp | undefined;
    /**
     * The event itself. Exactly one is set.
     *
     * @generated from oneof fanout.v1.RunEvent.event
     */
    event: {
        /**
         * The run was accepted. Always the first event (sequence 1).
         *
         * @generated from field: fanout.v1.RunStarted run_started = 10;
         */
        value: RunStarted;
        case: "runStarted";
    } | {
        /**
         * A task was queued for dispatch.
         *
         * @generated from field: fanout.v1.TaskQueued task_queued = 11;
         */
        value: TaskQueued;
        case: "taskQueued";
    } | {
        /**
         * A task started running on a worker.
         *
         * @generated from field: fanout.v1.TaskStarted task_started = 12;
         */
        value: TaskStarted;
        case: "taskStarted";
    } | {
        /**
         * A task finished one iteration of its agent loop.
         *
         * @generated from field: fanout.v1.TaskIteration task_iteration = 13;
         */
        value: TaskIteration;
        case: "taskIteration";
    } | {
        /**
         * A task ended.
         *
         * @generated from field: fanout.v1.TaskFinished task_finished = 14;
         */
        value: TaskFinished;
        case: "taskFinished";
    } | {
        /**
         * The run's budget changed. Updates may be coalesced: not every
         * reservation or settlement produces one.
         *
         * @generated from field: fanout.v1.BudgetUpdate budget_update = 15;
         */
        value: BudgetUpdate;
        case: "budgetUpdate";
    } | {
        /**
         * The run's budget ran out. Sent exactly once for every end of a run
         * whose budget ran out, whatever the path, before that end's
         * RunFinished: the one event that marks when it did (see
         * BudgetExhausted).
         *
         * @generated from field: fanout.v1.BudgetExhausted budget_exhausted = 16;
         */
        value: BudgetExhausted;
        case: "budgetExhausted";
    } | {
        /**
         * The run ended. The last event, unless a ContinueRun reopened the run
         * (a RunContinued follows, then the run's events up to its next
         * RunFinished: one per end); a watch ends after a RunFinished with
         * nothing after it.
         *
         * @generated from field: fanout.v1.RunFinished run_finished = 17;
         */
        value: RunFinished;
        case: "runFinished";
    } | {
        /**
         * The run changed hands: its orchestrator was lost and another one
         * adopted the run and drives it on.
         *
         * @generated from field: fanout.v1.RunAdopted run_adopted = 18;
         */
        value: RunAdopted;
        case: "runAdopted";
    } | {
        /**
         * A task's write waits for a person's approval (ApproveToolCall or
         * DenyToolCall). Reported again, with the same call_id, when a
         * re-dispatched attempt of the task takes up the same call.
         *
         * @generated from field: fanout.v1.ApprovalRequested approval_requested = 19;
         */
        value: ApprovalRequested;
        case: "approvalRequested";
    } | {
        /**
         * A decision on a write that waited for approval was recorded.
         *
         * @generated from field: fanout.v1.ApprovalDecided approval_decided = 20;
         */
        value: ApprovalDecided;
        case: "approvalDecided";
    } | {
        /**
         * The run's concurrency was chosen from the providers' rate limits
         * (a run that leaves limits.max_concurrency unset): when it is first
         * chosen and whenever it changes.
         *
         * @generated from field: fanout.v1.ConcurrencyChosen concurrency_chosen = 21;
         */
        value: ConcurrencyChosen;
        case: "concurrencyChosen";
    } | {
        /**
         * A task ran past its hedge threshold and a second attempt of it
         * started on another worker (TaskSpec.hedge). Which attempt won is in
         * its TaskFinished (TaskOutcome.hedge).
         *
         * @generated from field: fanout.v1.TaskHedged task_hedged = 22;
         */
        value: TaskHedged;
        case: "taskHedged";
    } | {
        /**
         * The run was continued with more budget (ContinueRun). A run that
         * had ended runs again: this event follows its RunFinished, and a
         * second RunFinished ends the continuation (docs/budget.md#continue).
         *
         * @generated from field: fanout.v1.RunContinued run_continued = 23;
         */
        value: RunContinued;
        case: "runContinued";
    } | {
        /**
         * A task of the run fanned out: a child run started under it
         * (RunSpec.fan_out). Watch the child run by its id for its own events.
         *
         * @generated from field: fanout.v1.ChildRunStarted child_run_started = 24;
         */
        value: ChildRunStarted;
        case: "childRunStarted";
    } | {
        /**
         * A child run of one of the run's tasks ended; its joined facts went
         * back to the task as its fan_out call's result.
         *
         * @generated from field: fanout.v1.ChildRunFinished child_run_finished = 25;
         */
        value: ChildRunFinished;
        case: "childRunFinished";
    } | {
        case: undefined;
        value?: undefined;
    };
};
/**
 * Describes the message fanout.v1.RunEvent.
 * Use `create(RunEventSchema)` to create a new message.
 */
export declare const RunEventSchema: GenMessage<RunEvent>;
/**
 * ChildRunStarted reports a child run started under one of the run's
 * tasks (a subagent's fan_out call).
 *
 * @generated from message fanout.v1.ChildRunStarted
 */
export type ChildRunStarted = Message<"fanout.v1.ChildRunStarted"> & {
    /**
     * The task that fanned out.
     *
     * @generated from field: string task_id = 1;
     */
    taskId: string;
    /**
     * The child run's id.
     *
     * @generated from field: string child_run_id = 2;
     */
    childRunId: string;
    /**
     * How many tasks the child run has.
     *
     * @generated from field: int32 task_count = 3;
     */
    taskCount: number;
    /**
     * The child's budget: what the ledger carved from the task's remainder.
     *
     * @generated from field: int64 limit_tokens = 4;
     */
    limitTokens: bigint;
    /**
     * The child run's level below the root (1 for the root's children).
     *
     * @generated from field: int32 depth = 5;
     */
    depth: number;
};
/**
 * Describes the message fanout.v1.ChildRunStarted.
 * Use `create(ChildRunStartedSchema)` to create a new message.
 */
export declare const ChildRunStartedSchema: GenMessage<ChildRunStarted>;
/**
 * ChildRunFinished reports a child run of one of the run's tasks ended.
 *
 * @generated from message fanout.v1.ChildRunFinished
 */
export type ChildRunFinished = Message<"fanout.v1.ChildRunFinished"> & {
    /**
     * The task that fanned out.
     *
     * @generated from field: string task_id = 1;
     */
    taskId: string;
    /**
     * The child run's id.
     *
     * @generated from field: string child_run_id = 2;
     */
    childRunId: string;
    /**
     * How the child run ended.
     *
     * @generated from field: fanout.v1.RunState state = 3;
     */
    state: RunState;
    /**
     * What the child run spent, its own children's spend included: the
     * task's spend.
     *
     * @generated from field: int64 spent_tokens = 4;
     */
    spentTokens: bigint;
    /**
     * How many facts the child joined.
     *
     * @generated from field: int32 fact_count = 5;
     */
    factCount: number;
};
/**
 * Describes the message fanout.v1.ChildRunFinished.
 * Use `create(ChildRunFinishedSchema)` to create a new message.
 */
export declare const ChildRunFinishedSchema: GenMessage<ChildRunFinished>;
/**
 * RunContinued reports a ContinueRun: tokens added to the run's budget
 * and, for a run that had ended, the tasks admitted again.
 *
 * @generated from message fanout.v1.RunContinued
 */
export type RunContinued = Message<"fanout.v1.RunContinued"> & {
    /**
     * 1 for the run's first continuation.
     *
     * @generated from field: int32 continuation = 1;
     */
    continuation: number;
    /**
     * The tokens added.
     *
     * @generated from field: int64 added_tokens = 2;
     */
    addedTokens: bigint;
    /**
     * The run's budget after the addition.
     *
     * @generated from field: int64 limit_tokens = 3;
     */
    limitTokens: bigint;
    /**
     * What the run had spent when it was continued.
     *
     * @generated from field: int64 spent_before = 4;
     */
    spentBefore: bigint;
    /**
     * Whether the run had ended and runs again (false: a top-up of a run
     * still running).
     *
     * @generated from field: bool reopened = 5;
     */
    reopened: boolean;
    /**
     * The tasks admitted again (NOT_STARTED, and the tasks SKIPPED for
     * them), in dispatch order.
     *
     * @generated from field: repeated string task_ids = 6;
     */
    taskIds: string[];
    /**
     * Who continued it (key:ID).
     *
     * @generated from field: string actor = 7;
     */
    actor: string;
    /**
     * Why, as the caller said (ContinueRunRequest.reason).
     *
     * @generated from field: string reason = 8;
     */
    reason: string;
};
/**
 * Describes the message fanout.v1.RunContinued.
 * Use `create(RunContinuedSchema)` to create a new message.
 */
export declare const RunContinuedSchema: GenMessage<RunContinued>;
/**
 * ConcurrencyChosen reports how many of a run's tasks may run at once, and
 * why, for a run that left limits.max_concurrency unset: the orchestrator
 * sizes it from the rate limits the providers state for the run's
 * provider and model, the headroom, the run's observed seconds and tokens
 * per model call, and the runs of the fleet that share the limit, and
 * recomputes it while the run goes (docs/operations.md, "Concurrency from
 * the rate limits"). Appended when it is first chosen and whenever it
 * changes.
 *
 * @generated from message fanout.v1.ConcurrencyChosen
 */
export type ConcurrencyChosen = Message<"fanout.v1.ConcurrencyChosen"> & {
    /**
     * Tasks of the run that may run at once from now on.
     *
     * @generated from field: int32 concurrency = 1;
     */
    concurrency: number;
    /**
     * What it was before; 0 for the first choice.
     *
     * @generated from field: int32 previous = 2;
     */
    previous: number;
    /**
     * Why, in one sentence: "7 = 300 RPM × 0.7 ÷ 60 s × 2.00 s per call, the
     * run's share of the limit".
     *
     * @generated from field: string reason = 3;
     */
    reason: string;
    /**
     * The run's share of the requests per minute the providers state for
     * its provider and model (summed over the fleet's keys, under the
     * configured ceilings, divided evenly among the fleet's running runs on
     * them); 0: none known.
     *
     * @generated from field: int64 limit_requests = 4;
     */
    limitRequests: bigint;
    /**
     * The run's share of the tokens per minute, likewise; 0: none known.
     *
     * @generated from field: int64 limit_tokens = 5;
     */
    limitTokens: bigint;
    /**
     * The share of each limit the fleet may use (the tenant's headroom).
     *
     * @generated from field: double headroom = 6;
     */
    headroom: number;
    /**
     * Wall seconds per model call of a task in flight (each iteration of the
     * agent loop), as observed in this run; the starting point until one is.
     *
     * @generated from field: double seconds_per_call = 7;
     */
    secondsPerCall: number;
    /**
     * Tokens per model call, likewise.
     *
     * @generated from field: double tokens_per_call = 8;
     */
    tokensPerCall: number;
    /**
     * Model calls per ended task, as observed in this run (0: none ended
     * yet). It cancels out of the arithmetic (a task holds one call at a
     * time) and is reported for the reader.
     *
     * @generated from field: double calls_per_task = 9;
     */
    callsPerTask: number;
    /**
     * Calls observed in this run: 0 means seconds_per_call and
     * tokens_per_call are the starting point.
     *
     * @generated from field: int32 observed_calls = 10;
     */
    observedCalls: number;
    /**
     * Not set: how many runs of the fleet share the limit tells of other
     * tenants' runs (the orchestrator's log has it).
     *
     * @generated from field: int32 runs_sharing = 11;
     */
    runsSharing: number;
    /**
     * Not set: the fleet's 429s on the limit tell of other tenants' calls
     * (the orchestrator's log has them; throttle_cap says one held the run).
     *
     * @generated from field: int64 throttled = 12;
     */
    throttled: bigint;
    /**
     * The additive-increase, multiplicative-decrease cap that 429s set (0:
     * none applies).
     *
     * @generated from field: int32 throttle_cap = 13;
     */
    throttleCap: number;
};
/**
 * Describes the message fanout.v1.ConcurrencyChosen.
 * Use `create(ConcurrencyChosenSchema)` to create a new message.
 */
export declare const ConcurrencyChosenSchema: GenMessage<ConcurrencyChosen>;
/**
 * TaskHedged reports that a second attempt of a task started while its
 * first ran on.
 *
 * @generated from message fanout.v1.TaskHedged
 */
export type TaskHedged = Message<"fanout.v1.TaskHedged"> & {
    /**
     * The task's id.
     *
     * @generated from field: string task_id = 1;
     */
    taskId: string;
    /**
     * The worker the second attempt was sent to (the first that takes it
     * from there on, as for any dispatch).
     *
     * @generated from field: string worker = 2;
     */
    worker: string;
    /**
     * How long the first attempt had run (since its worker started it).
     *
     * @generated from field: google.protobuf.Duration after = 3;
     */
    after?: Duration | undefined;
    /**
     * The threshold it ran past, and on what it rests, e.g. "3 × the median
     * 1.2s of 5 tasks that answered" or "after 30s".
     *
     * @generated from field: google.protobuf.Duration threshold = 4;
     */
    threshold?: Duration | undefined;
    /**
     * Says the threshold in words, as above.
     *
     * @generated from field: string reason = 5;
     */
    reason: string;
};
/**
 * Describes the message fanout.v1.TaskHedged.
 * Use `create(TaskHedgedSchema)` to create a new message.
 */
export declare const TaskHedgedSchema: GenMessage<TaskHedged>;
/**
 * RunAdopted reports that the orchestrator driving the run was lost (its
 * lease in the database lapsed: a crash, a kill, a long pause) and another
 * one adopted the run and drives it on from what the database holds. Tasks
 * that had ended keep their outcomes and spend; those that had not are
 * dispatched again as new attempts (an earlier attempt can no longer
 * reserve tokens, and the new one starts once the earlier one holds none)
 * and reported queued again. Deadlines still count from the run's and the
 * task's first start.
 *
 * @generated from message fanout.v1.RunAdopted
 */
export type RunAdopted = Message<"fanout.v1.RunAdopted"> & {
    /**
     * The orchestrator that was driving the run.
     *
     * @generated from field: string previous_owner = 1;
     */
    previousOwner: string;
    /**
     * The orchestrator that drives it now.
     *
     * @generated from field: string owner = 2;
     */
    owner: string;
    /**
     * How many times the run has changed hands, this time included. A run
     * adopted more than 3 times ends FAILED instead of being resumed again.
     *
     * @generated from field: int32 adoptions = 3;
     */
    adoptions: number;
    /**
     * The tasks that had not ended, in dispatch order: each is dispatched
     * again (or for the first time, if it had not started) when it is ready,
     * unless the run stops first or a dependency failed (then it is SKIPPED).
     *
     * @generated from field: repeated string resumed_task_ids = 4;
     */
    resumedTaskIds: string[];
};
/**
 * Describes the message fanout.v1.RunAdopted.
 * Use `create(RunAdoptedSchema)` to create a new message.
 */
export declare const RunAdoptedSchema: GenMessage<RunAdopted>;
/**
 * ApprovalRequested reports that a task's write waits for a person's
 * approval. The task holds no model reservation and no tool slot while it
 * waits; its own timeout and the run's keep counting.
 *
 * @generated from message fanout.v1.ApprovalRequested
 */
export type ApprovalRequested = Message<"fanout.v1.ApprovalRequested"> & {
    /**
     * The task whose write waits.
     *
     * @generated from field: string task_id = 1;
     */
    taskId: string;
    /**
     * The call's id: pass it to ApproveToolCall or DenyToolCall. Each call
     * has its own, also the parallel writes of one model reply.
     *
     * @generated from field: string call_id = 2;
     */
    callId: string;
    /**
     * The tool's model-facing name.
     *
     * @generated from field: string tool = 3;
     */
    tool: string;
    /**
     * The call's arguments as JSON, cut at 1,024 bytes, with values whose
     * names look secret (token, password, key, ...) replaced by "[redacted]".
     *
     * @generated from field: string preview = 4;
     */
    preview: string;
    /**
     * When the call is denied as expired unless approved first (Postgres
     * time).
     *
     * @generated from field: google.protobuf.Timestamp deadline = 5;
     */
    deadline?: Timestamp | undefined;
};
/**
 * Describes the message fanout.v1.ApprovalRequested.
 * Use `create(ApprovalRequestedSchema)` to create a new message.
 */
export declare const ApprovalRequestedSchema: GenMessage<ApprovalRequested>;
/**
 * ApprovalDecided reports a decision on a write that waited for approval.
 *
 * @generated from message fanout.v1.ApprovalDecided
 */
export type ApprovalDecided = Message<"fanout.v1.ApprovalDecided"> & {
    /**
     * The call decided on.
     *
     * @generated from field: string call_id = 1;
     */
    callId: string;
    /**
     * The task whose write it is.
     *
     * @generated from field: string task_id = 2;
     */
    taskId: string;
    /**
     * The tool's model-facing name.
     *
     * @generated from field: string tool = 3;
     */
    tool: string;
    /**
     * Approved (the write is sent) or denied (the model is told).
     *
     * @generated from field: bool approved = 4;
     */
    approved: boolean;
    /**
     * Why, as the decider said.
     *
     * @generated from field: string reason = 5;
     */
    reason: string;
    /**
     * Who decided: "key:ID" of the API key that called ApproveToolCall or
     * DenyToolCall.
     *
     * @generated from field: string actor = 6;
     */
    actor: string;
    /**
     * When the decision was recorded (Postgres time).
     *
     * @generated from field: google.protobuf.Timestamp decided_at = 7;
     */
    decidedAt?: Timestamp | undefined;
};
/**
 * Describes the message fanout.v1.ApprovalDecided.
 * Use `create(ApprovalDecidedSchema)` to create a new message.
 */
export declare const ApprovalDecidedSchema: GenMessage<ApprovalDecided>;
/**
 * RunStarted reports that a run was accepted.
 *
 * @generated from message fanout.v1.RunStarted
 */
export type RunStarted = Message<"fanout.v1.RunStarted"> & {
    /**
     * The run as accepted: state RUNNING, every task PENDING. A large run's
     * tasks and spec are cut as Run says (task_count, tasks_next_page_token).
     *
     * @generated from field: fanout.v1.Run run = 1;
     */
    run?: Run | undefined;
};
/**
 * Describes the message fanout.v1.RunStarted.
 * Use `create(RunStartedSchema)` to create a new message.
 */
export declare const RunStartedSchema: GenMessage<RunStarted>;
/**
 * TaskQueued reports that a task is waiting for a concurrency slot (its
 * dependencies, if any, have succeeded).
 *
 * @generated from message fanout.v1.TaskQueued
 */
export type TaskQueued = Message<"fanout.v1.TaskQueued"> & {
    /**
     * The task's id.
     *
     * @generated from field: string task_id = 1;
     */
    taskId: string;
    /**
     * The task's position in dispatch order.
     *
     * @generated from field: int32 dispatch_index = 2;
     */
    dispatchIndex: number;
};
/**
 * Describes the message fanout.v1.TaskQueued.
 * Use `create(TaskQueuedSchema)` to create a new message.
 */
export declare const TaskQueuedSchema: GenMessage<TaskQueued>;
/**
 * TaskStarted reports that a worker started a task.
 *
 * @generated from message fanout.v1.TaskStarted
 */
export type TaskStarted = Message<"fanout.v1.TaskStarted"> & {
    /**
     * The task's id.
     *
     * @generated from field: string task_id = 1;
     */
    taskId: string;
    /**
     * Address of the worker running it.
     *
     * @generated from field: string worker = 2;
     */
    worker: string;
    /**
     * What the run forecast the task would cost when it admitted it, in
     * tokens (0 under ADMISSION_POLICY_GREEDY).
     *
     * @generated from field: int64 forecast_tokens = 3;
     */
    forecastTokens: bigint;
};
/**
 * Describes the message fanout.v1.TaskStarted.
 * Use `create(TaskStartedSchema)` to create a new message.
 */
export declare const TaskStartedSchema: GenMessage<TaskStarted>;
/**
 * TaskIteration reports progress of a running task.
 *
 * @generated from message fanout.v1.TaskIteration
 */
export type TaskIteration = Message<"fanout.v1.TaskIteration"> & {
    /**
     * The task's id.
     *
     * @generated from field: string task_id = 1;
     */
    taskId: string;
    /**
     * The iteration just finished, starting at 1.
     *
     * @generated from field: int32 iteration = 2;
     */
    iteration: number;
    /**
     * Tokens the task has spent so far (cumulative).
     *
     * @generated from field: int64 tokens_spent = 3;
     */
    tokensSpent: bigint;
    /**
     * Tool calls the iteration made.
     *
     * @generated from field: int32 tool_calls = 4;
     */
    toolCalls: number;
    /**
     * Of those, read calls answered from the tenant's result cache
     * (RunSpec.cache.tools).
     *
     * @generated from field: int32 cached_tool_calls = 5;
     */
    cachedToolCalls: number;
};
/**
 * Describes the message fanout.v1.TaskIteration.
 * Use `create(TaskIterationSchema)` to create a new message.
 */
export declare const TaskIterationSchema: GenMessage<TaskIteration>;
/**
 * TaskFinished reports that a task ended.
 *
 * @generated from message fanout.v1.TaskFinished
 */
export type TaskFinished = Message<"fanout.v1.TaskFinished"> & {
    /**
     * The task's final outcome.
     *
     * @generated from field: fanout.v1.TaskOutcome outcome = 1;
     */
    outcome?: TaskOutcome | undefined;
};
/**
 * Describes the message fanout.v1.TaskFinished.
 * Use `create(TaskFinishedSchema)` to create a new message.
 */
export declare const TaskFinishedSchema: GenMessage<TaskFinished>;
/**
 * BudgetUpdate reports the run's budget.
 *
 * @generated from message fanout.v1.BudgetUpdate
 */
export type BudgetUpdate = Message<"fanout.v1.BudgetUpdate"> & {
    /**
     * The budget at the time of the event.
     *
     * @generated from field: fanout.v1.BudgetSnapshot budget = 1;
     */
    budget?: BudgetSnapshot | undefined;
};
/**
 * Describes the message fanout.v1.BudgetUpdate.
 * Use `create(BudgetUpdateSchema)` to create a new message.
 */
export declare const BudgetUpdateSchema: GenMessage<BudgetUpdate>;
/**
 * BudgetExhausted marks the moment the run's budget ran out. It is sent
 * exactly once for every end of a run whose budget ran out (a run
 * continued with more budget may end again), at that moment and before
 * that end's RunFinished, and is the mark readers take (fanout trace and
 * the console draw their exhaustion line at it; nothing else is): when
 * the run's available tokens, or its tenant's, fell below its minimum
 * reservation (the exhaustion policy is applied from then on), or, under
 * ADMISSION_POLICY_FORECAST, when the run declined the first task its
 * budget could not pay for (that task ends NOT_STARTED). A run that ends
 * RUN_STATE_BUDGET_EXHAUSTED always has it; a run whose budget ran out and
 * that then stopped for another reason (a CancelRun under DRAIN) has it
 * too. A run adopted by another orchestrator is marked once, by whichever
 * owner saw its budget run out first.
 *
 * @generated from message fanout.v1.BudgetExhausted
 */
export type BudgetExhausted = Message<"fanout.v1.BudgetExhausted"> & {
    /**
     * The run's budget at that moment. Its exhausted is false when the run
     * declined a task by forecast while the ledger still had tokens left.
     *
     * @generated from field: fanout.v1.BudgetSnapshot budget = 1;
     */
    budget?: BudgetSnapshot | undefined;
};
/**
 * Describes the message fanout.v1.BudgetExhausted.
 * Use `create(BudgetExhaustedSchema)` to create a new message.
 */
export declare const BudgetExhaustedSchema: GenMessage<BudgetExhausted>;
/**
 * RunFinished reports that a run ended.
 *
 * @generated from message fanout.v1.RunFinished
 */
export type RunFinished = Message<"fanout.v1.RunFinished"> & {
    /**
     * The run's terminal state.
     *
     * @generated from field: fanout.v1.RunState state = 1;
     */
    state: RunState;
    /**
     * Why it was cancelled or failed; empty on SUCCEEDED.
     *
     * @generated from field: string cancel_cause = 2;
     */
    cancelCause: string;
    /**
     * The joined result, its facts and tasks cut as JoinedResult says
     * (fact_count, facts_next_page_token, task_count, tasks_next_page_token).
     *
     * @generated from field: fanout.v1.JoinedResult result = 3;
     */
    result?: JoinedResult | undefined;
};
/**
 * Describes the message fanout.v1.RunFinished.
 * Use `create(RunFinishedSchema)` to create a new message.
 */
export declare const RunFinishedSchema: GenMessage<RunFinished>;
/**
 * ExhaustionPolicy says what happens to a run's in-flight work when its
 * budget is exhausted (available tokens fall below
 * Budget.min_reservation_tokens).
 *
 * @generated from enum fanout.v1.ExhaustionPolicy
 */
export declare enum ExhaustionPolicy {
    /**
     * Not set; treated as EXHAUSTION_POLICY_CANCEL.
     *
     * @generated from enum value: EXHAUSTION_POLICY_UNSPECIFIED = 0;
     */
    UNSPECIFIED = 0,
    /**
     * Cancel every in-flight model call and tool call of the run at once, on
     * every node. A cancelled model call whose real usage is unknown is settled
     * at its full reservation (flagged estimated in the ledger). Work already
     * settled is kept and reported.
     *
     * @generated from enum value: EXHAUSTION_POLICY_CANCEL = 1;
     */
    CANCEL = 1,
    /**
     * Start nothing new (no new tasks, no new iterations), but let calls that
     * already hold a reservation finish and settle. Their results are kept.
     *
     * @generated from enum value: EXHAUSTION_POLICY_DRAIN = 2;
     */
    DRAIN = 2
}
/**
 * Describes the enum fanout.v1.ExhaustionPolicy.
 */
export declare const ExhaustionPolicySchema: GenEnum<ExhaustionPolicy>;
/**
 * JoinPolicy says when the orchestrator stops waiting for tasks and joins
 * their results. Whatever the policy, the join lists every task's outcome in
 * dispatch order; failures are shown, never hidden.
 *
 * @generated from enum fanout.v1.JoinPolicy
 */
export declare enum JoinPolicy {
    /**
     * Not set; treated as JOIN_POLICY_ALL_SETTLED.
     *
     * @generated from enum value: JOIN_POLICY_UNSPECIFIED = 0;
     */
    UNSPECIFIED = 0,
    /**
     * Wait until every task has ended (succeeded or not), then join. One
     * task's failure does not affect its siblings (except tasks that depend on
     * it, which are SKIPPED).
     *
     * @generated from enum value: JOIN_POLICY_ALL_SETTLED = 1;
     */
    ALL_SETTLED = 1,
    /**
     * On the first task that ends in any status other than SUCCEEDED, cancel
     * the remaining tasks and end the run as FAILED.
     *
     * @generated from enum value: JOIN_POLICY_FAIL_FAST = 2;
     */
    FAIL_FAST = 2,
    /**
     * On the first task that ends SUCCEEDED, cancel the remaining tasks and
     * join. The run fails only if every task ends without success.
     *
     * @generated from enum value: JOIN_POLICY_FIRST_SUCCESS = 3;
     */
    FIRST_SUCCESS = 3
}
/**
 * Describes the enum fanout.v1.JoinPolicy.
 */
export declare const JoinPolicySchema: GenEnum<JoinPolicy>;
/**
 * TaskStatus is the state of one task (one subagent) in a run. PENDING and
 * RUNNING are transient; every other value except UNSPECIFIED is terminal.
 *
 * @generated from enum fanout.v1.TaskStatus
 */
export declare enum TaskStatus {
    /**
     * Not set. Never reported by a server.
     *
     * @generated from enum value: TASK_STATUS_UNSPECIFIED = 0;
     */
    UNSPECIFIED = 0,
    /**
     * Accepted and waiting for its dependencies or for a concurrency slot.
     *
     * @generated from enum value: TASK_STATUS_PENDING = 1;
     */
    PENDING = 1,
    /**
     * Dispatched to a worker and running.
     *
     * @generated from enum value: TASK_STATUS_RUNNING = 2;
     */
    RUNNING = 2,
    /**
     * Finished its work and produced a fact summary.
     *
     * @generated from enum value: TASK_STATUS_SUCCEEDED = 3;
     */
    SUCCEEDED = 3,
    /**
     * Ended with an error (model, tool or worker failure); see
     * FactSummary.error.
     *
     * @generated from enum value: TASK_STATUS_FAILED = 4;
     */
    FAILED = 4,
    /**
     * Ran past TaskSpec.timeout (or the run's deadline).
     *
     * @generated from enum value: TASK_STATUS_TIMED_OUT = 5;
     */
    TIMED_OUT = 5,
    /**
     * Cancelled by the caller (CancelRun or a cancelled Run call) or by the
     * join policy.
     *
     * @generated from enum value: TASK_STATUS_CANCELLED = 6;
     */
    CANCELLED = 6,
    /**
     * The task's own token budget or the run's budget could not grant the
     * minimum reservation for its next model call.
     *
     * @generated from enum value: TASK_STATUS_BUDGET_EXHAUSTED = 7;
     */
    BUDGET_EXHAUSTED = 7,
    /**
     * Reached TaskSpec.max_iterations without finishing.
     *
     * @generated from enum value: TASK_STATUS_ITERATION_LIMIT = 8;
     */
    ITERATION_LIMIT = 8,
    /**
     * Never started because a task it depends on did not succeed.
     *
     * @generated from enum value: TASK_STATUS_SKIPPED = 9;
     */
    SKIPPED = 9,
    /**
     * Never started for want of budget: the run could not afford it to its
     * end (ADMISSION_POLICY_FORECAST: what the run had left, less what it
     * holds for its synthesis and what its tasks in flight were forecast to
     * still need, was below this task's forecast), or, under either policy,
     * the budget ran out before a worker started it. FactSummary.error says
     * which, with the figures. Unlike BUDGET_EXHAUSTED, nothing was spent on
     * it.
     *
     * @generated from enum value: TASK_STATUS_NOT_STARTED = 10;
     */
    NOT_STARTED = 10
}
/**
 * Describes the enum fanout.v1.TaskStatus.
 */
export declare const TaskStatusSchema: GenEnum<TaskStatus>;
/**
 * AdmissionPolicy says when the orchestrator starts a task of a run whose
 * budget may not pay for all of them.
 *
 * @generated from enum fanout.v1.AdmissionPolicy
 */
export declare enum AdmissionPolicy {
    /**
     * Not set; treated as ADMISSION_POLICY_FORECAST.
     *
     * @generated from enum value: ADMISSION_POLICY_UNSPECIFIED = 0;
     */
    UNSPECIFIED = 0,
    /**
     * Start a task only when the run can afford it to its end by forecast:
     * what the run has left, less what it holds for its synthesis and what
     * its tasks in flight are forecast to still spend, must cover the
     * task's forecast. A task's forecast is what the run's tasks that ran to
     * an answer needed of the budget on average (their spend plus their
     * largest grant outstanding at once: FactSummary.peak_tokens), capped at
     * the task's token_budget; before any has, its token_budget, or for a
     * task without one an even share of the run's budget. A task that cannot be afforded waits while tasks
     * are in flight (they may cost less than forecast) and is not started
     * (NOT_STARTED) once none is. When what is left can pay only for final
     * answers, the tasks in flight are wound down: their next iteration is
     * their last, without tools (FactSummary.wound_down), and no task starts
     * until they have ended.
     *
     * @generated from enum value: ADMISSION_POLICY_FORECAST = 1;
     */
    FORECAST = 1,
    /**
     * Start every task as soon as a concurrency slot is free; the budget
     * stops them when it runs out (the exhaustion policy), possibly in
     * flight.
     *
     * @generated from enum value: ADMISSION_POLICY_GREEDY = 2;
     */
    GREEDY = 2
}
/**
 * Describes the enum fanout.v1.AdmissionPolicy.
 */
export declare const AdmissionPolicySchema: GenEnum<AdmissionPolicy>;
/**
 * RunState is the state of a run. RUNNING is the only non-terminal state.
 *
 * @generated from enum fanout.v1.RunState
 */
export declare enum RunState {
    /**
     * Not set. In ListRunsRequest it means "any state".
     *
     * @generated from enum value: RUN_STATE_UNSPECIFIED = 0;
     */
    UNSPECIFIED = 0,
    /**
     * Accepted; tasks are pending or running.
     *
     * @generated from enum value: RUN_STATE_RUNNING = 1;
     */
    RUNNING = 1,
    /**
     * Every task has ended and the run finished its join according to its
     * join policy. Individual tasks may still have failed; see
     * JoinedResult.tasks.
     *
     * @generated from enum value: RUN_STATE_SUCCEEDED = 2;
     */
    SUCCEEDED = 2,
    /**
     * The run could not complete its join (for example JOIN_POLICY_FAIL_FAST
     * saw a failure, or an internal error occurred); see Run.cancel_cause.
     *
     * @generated from enum value: RUN_STATE_FAILED = 3;
     */
    FAILED = 3,
    /**
     * Cancelled by the caller (CancelRun, or cancelling the Run call that
     * created it); see Run.cancel_cause.
     *
     * @generated from enum value: RUN_STATE_CANCELLED = 4;
     */
    CANCELLED = 4,
    /**
     * The run's budget fell below Budget.min_reservation_tokens and the
     * exhaustion policy ended the run.
     *
     * @generated from enum value: RUN_STATE_BUDGET_EXHAUSTED = 5;
     */
    BUDGET_EXHAUSTED = 5,
    /**
     * The run exceeded Limits.run_timeout.
     *
     * @generated from enum value: RUN_STATE_TIMED_OUT = 6;
     */
    TIMED_OUT = 6
}
/**
 * Describes the enum fanout.v1.RunState.
 */
export declare const RunStateSchema: GenEnum<RunState>;
/**
 * HedgeAttempt names one of a hedged task's two attempts.
 *
 * @generated from enum fanout.v1.HedgeAttempt
 */
export declare enum HedgeAttempt {
    /**
     * No attempt answered.
     *
     * @generated from enum value: HEDGE_ATTEMPT_UNSPECIFIED = 0;
     */
    UNSPECIFIED = 0,
    /**
     * The attempt dispatched first.
     *
     * @generated from enum value: HEDGE_ATTEMPT_FIRST = 1;
     */
    FIRST = 1,
    /**
     * The second attempt, started when the first ran past its threshold.
     *
     * @generated from enum value: HEDGE_ATTEMPT_HEDGE = 2;
     */
    HEDGE = 2
}
/**
 * Describes the enum fanout.v1.HedgeAttempt.
 */
export declare const HedgeAttemptSchema: GenEnum<HedgeAttempt>;
