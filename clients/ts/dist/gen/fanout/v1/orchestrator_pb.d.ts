import type { GenFile, GenMessage, GenService } from "@bufbuild/protobuf/codegenv2";
import type { Budget, Fact, ModelSettings, ReusedFrom, Run, RunContinued, RunEvent, RunSpec, RunState, TaskOutcome, TaskSpec } from "./run_pb.js";
import type { Timestamp } from "@bufbuild/protobuf/wkt";
import type { Message } from "@bufbuild/protobuf";
/**
 * Describes the file fanout/v1/orchestrator.proto.
 */
export declare const file_fanout_v1_orchestrator: GenFile;
/**
 * RunRequest is the request of OrchestratorService.Run.
 *
 * @generated from message fanout.v1.RunRequest
 */
export type RunRequest = Message<"fanout.v1.RunRequest"> & {
    /**
     * Required. The run to create (or join, by idempotency key).
     *
     * @generated from field: fanout.v1.RunSpec spec = 1;
     */
    spec?: RunSpec | undefined;
};
/**
 * Describes the message fanout.v1.RunRequest.
 * Use `create(RunRequestSchema)` to create a new message.
 */
export declare const RunRequestSchema: GenMessage<RunRequest>;
/**
 * RunResponse is one message of the OrchestratorService.Run stream.
 *
 * @generated from message fanout.v1.RunResponse
 */
export type RunResponse = Message<"fanout.v1.RunResponse"> & {
    /**
     * The next event of the run, in sequence order.
     *
     * @generated from field: fanout.v1.RunEvent event = 1;
     */
    event?: RunEvent | undefined;
};
/**
 * Describes the message fanout.v1.RunResponse.
 * Use `create(RunResponseSchema)` to create a new message.
 */
export declare const RunResponseSchema: GenMessage<RunResponse>;
/**
 * StartRunRequest is the request of OrchestratorService.StartRun.
 *
 * @generated from message fanout.v1.StartRunRequest
 */
export type StartRunRequest = Message<"fanout.v1.StartRunRequest"> & {
    /**
     * Required. The run to create (or return, by idempotency key).
     *
     * @generated from field: fanout.v1.RunSpec spec = 1;
     */
    spec?: RunSpec | undefined;
    /**
     * Validate the spec and quote it: nothing is written, no run starts, and
     * the response holds the quote alone (docs/budget.md#quotes).
     *
     * @generated from field: bool dry_run = 2;
     */
    dryRun: boolean;
    /**
     * Start the run only if its tenant's budget has available at least
     * min(forecast, limit) of the quote (docs/budget.md#quotes), checked when
     * the run is admitted (the forecast is not held apart from the run:
     * Quote.held is false). RESOURCE_EXHAUSTED, with the quote in the
     * details, when the tenant does not.
     *
     * @generated from field: bool reserve_quote = 3;
     */
    reserveQuote: boolean;
};
/**
 * Describes the message fanout.v1.StartRunRequest.
 * Use `create(StartRunRequestSchema)` to create a new message.
 */
export declare const StartRunRequestSchema: GenMessage<StartRunRequest>;
/**
 * StartRunResponse is the response of OrchestratorService.StartRun.
 *
 * @generated from message fanout.v1.StartRunResponse
 */
export type StartRunResponse = Message<"fanout.v1.StartRunResponse"> & {
    /**
     * Id of the created or existing run; pass it to WatchRun, GetRun or
     * CancelRun. Empty for a dry run.
     *
     * @generated from field: string run_id = 1;
     */
    runId: string;
    /**
     * The quote: set for a dry run and when reserve_quote was asked.
     *
     * @generated from field: fanout.v1.Quote quote = 2;
     */
    quote?: Quote | undefined;
};
/**
 * Describes the message fanout.v1.StartRunResponse.
 * Use `create(StartRunResponseSchema)` to create a new message.
 */
export declare const StartRunResponseSchema: GenMessage<StartRunResponse>;
/**
 * Quote is what a run (or a continuation, or a fork) will cost before it
 * runs, from the same forecast admission uses (docs/budget.md#quotes).
 *
 * @generated from message fanout.v1.Quote
 */
export type Quote = Message<"fanout.v1.Quote"> & {
    /**
     * Every task, in dispatch order: whether it will run or is reused (or,
     * for a continuation, has ended), and its forecast.
     *
     * @generated from field: repeated fanout.v1.TaskQuote tasks = 1;
     */
    tasks: TaskQuote[];
    /**
     * The sum of the forecasts of the tasks that will run.
     *
     * @generated from field: int64 tasks_tokens = 2;
     */
    tasksTokens: bigint;
    /**
     * The synthesis allowance held for the run (0 without synthesis).
     *
     * @generated from field: int64 synthesis_tokens = 3;
     */
    synthesisTokens: bigint;
    /**
     * tasks_tokens + synthesis_tokens: what the run is forecast to spend at
     * most, when every task runs to its forecast.
     *
     * @generated from field: int64 forecast_tokens = 4;
     */
    forecastTokens: bigint;
    /**
     * The run's budget (a continuation's: after the addition). A forecast
     * above it means admission will leave tasks NOT_STARTED.
     *
     * @generated from field: int64 limit_tokens = 5;
     */
    limitTokens: bigint;
    /**
     * The tasks the budget is forecast to admit, of those that will run.
     *
     * @generated from field: int32 admitted_tasks = 6;
     */
    admittedTasks: number;
    /**
     * forecast_tokens in money at the prices the operator set (fanout
     * price), one line per currency; empty when the model has no price.
     *
     * @generated from field: repeated fanout.v1.Spend cost = 7;
     */
    cost: Spend[];
    /**
     * Where the forecast comes from: "prior" (what the tenant's earlier
     * tasks of this model spent), "token_budget" (no prior yet: each task's
     * cap), or "run" (a continuation: what the run's own tasks spent).
     *
     * @generated from field: string basis = 8;
     */
    basis: string;
    /**
     * The tenant's budget, if it has one: what it has available now, and
     * whether that covers forecast_tokens (and min(forecast, limit) for
     * the run to run as forecast).
     *
     * @generated from field: bool tenant_budget = 9;
     */
    tenantBudget: boolean;
    /**
     * The tokens the tenant's budget has available now (0 without a budget).
     *
     * @generated from field: int64 tenant_available_tokens = 10;
     */
    tenantAvailableTokens: bigint;
    /**
     * Whether the tenant covers the run: no tenant budget, or one whose
     * available tokens are at least min(forecast_tokens, limit_tokens).
     *
     * @generated from field: bool tenant_covers = 11;
     */
    tenantCovers: boolean;
    /**
     * Set when the forecast is held for the run (reserve_quote).
     *
     * @generated from field: bool held = 12;
     */
    held: boolean;
};
/**
 * Describes the message fanout.v1.Quote.
 * Use `create(QuoteSchema)` to create a new message.
 */
export declare const QuoteSchema: GenMessage<Quote>;
/**
 * TaskQuote is one task's line of a Quote.
 *
 * @generated from message fanout.v1.TaskQuote
 */
export type TaskQuote = Message<"fanout.v1.TaskQuote"> & {
    /**
     * The task's id.
     *
     * @generated from field: string task_id = 1;
     */
    taskId: string;
    /**
     * The task's index in dispatch order.
     *
     * @generated from field: int32 dispatch_index = 2;
     */
    dispatchIndex: number;
    /**
     * Whether the task will run. False for a reused task and, in a
     * continuation, for a task that has ended.
     *
     * @generated from field: bool runs = 3;
     */
    runs: boolean;
    /**
     * What the task is forecast to cost, in tokens (0 when it does not run).
     *
     * @generated from field: int64 forecast_tokens = 4;
     */
    forecastTokens: bigint;
    /**
     * The recorded task it reuses, when it does not run because its content
     * is unchanged (fork) or cached.
     *
     * @generated from field: fanout.v1.ReusedFrom reused = 5;
     */
    reused?: ReusedFrom | undefined;
    /**
     * Why it runs or not, in words ("changed instruction", "new task",
     * "depends on a task that runs", "NOT_STARTED", "SUCCEEDED").
     *
     * @generated from field: string reason = 6;
     */
    reason: string;
};
/**
 * Describes the message fanout.v1.TaskQuote.
 * Use `create(TaskQuoteSchema)` to create a new message.
 */
export declare const TaskQuoteSchema: GenMessage<TaskQuote>;
/**
 * ContinueRunRequest is the request of OrchestratorService.ContinueRun.
 *
 * @generated from message fanout.v1.ContinueRunRequest
 */
export type ContinueRunRequest = Message<"fanout.v1.ContinueRunRequest"> & {
    /**
     * Required. The run to continue.
     *
     * @generated from field: string run_id = 1;
     */
    runId: string;
    /**
     * Required, > 0. The tokens to add to the run's budget; at most the
     * server's run budget cap less the run's budget.
     *
     * @generated from field: int64 add_tokens = 2;
     */
    addTokens: bigint;
    /**
     * Required. Makes the call idempotent: a retry with the same key returns
     * the first call's continuation and adds nothing. At most 128 bytes.
     *
     * @generated from field: string idempotency_key = 3;
     */
    idempotencyKey: string;
    /**
     * Why, in words; logged with the continuation. At most 1,024 bytes.
     *
     * @generated from field: string reason = 4;
     */
    reason: string;
    /**
     * As StartRunRequest.dry_run: quote the continuation, write nothing.
     *
     * @generated from field: bool dry_run = 5;
     */
    dryRun: boolean;
    /**
     * As StartRunRequest.reserve_quote, for the tasks the continuation
     * admits again.
     *
     * @generated from field: bool reserve_quote = 6;
     */
    reserveQuote: boolean;
};
/**
 * Describes the message fanout.v1.ContinueRunRequest.
 * Use `create(ContinueRunRequestSchema)` to create a new message.
 */
export declare const ContinueRunRequestSchema: GenMessage<ContinueRunRequest>;
/**
 * ContinueRunResponse is the response of OrchestratorService.ContinueRun.
 *
 * @generated from message fanout.v1.ContinueRunResponse
 */
export type ContinueRunResponse = Message<"fanout.v1.ContinueRunResponse"> & {
    /**
     * The run after the continuation (as it is, for a dry run).
     *
     * @generated from field: fanout.v1.Run run = 1;
     */
    run?: Run | undefined;
    /**
     * What was recorded (the first call's, for a retry). Unset for a dry run.
     *
     * @generated from field: fanout.v1.RunContinued continuation = 2;
     */
    continuation?: RunContinued | undefined;
    /**
     * The quote: set for a dry run and when reserve_quote was asked.
     *
     * @generated from field: fanout.v1.Quote quote = 3;
     */
    quote?: Quote | undefined;
};
/**
 * Describes the message fanout.v1.ContinueRunResponse.
 * Use `create(ContinueRunResponseSchema)` to create a new message.
 */
export declare const ContinueRunResponseSchema: GenMessage<ContinueRunResponse>;
/**
 * ForkRunRequest is the request of OrchestratorService.ForkRun.
 *
 * @generated from message fanout.v1.ForkRunRequest
 */
export type ForkRunRequest = Message<"fanout.v1.ForkRunRequest"> & {
    /**
     * Required. The recorded run to fork (the source), of the caller's
     * tenant. It may still be running: its tasks that SUCCEEDED so far are
     * reused.
     *
     * @generated from field: string run_id = 1;
     */
    runId: string;
    /**
     * Required. The new run's idempotency key (RunSpec.idempotency_key).
     *
     * @generated from field: string idempotency_key = 2;
     */
    idempotencyKey: string;
    /**
     * Tasks to change (the id of a source task) or add (a new id), each a
     * whole TaskSpec.
     *
     * @generated from field: repeated fanout.v1.TaskSpec tasks = 3;
     */
    tasks: TaskSpec[];
    /**
     * Ids of source tasks to leave out. A task that depends on one must be
     * changed too (INVALID_ARGUMENT otherwise).
     *
     * @generated from field: repeated string remove_task_ids = 4;
     */
    removeTaskIds: string[];
    /**
     * Replace the source's goal, budget, model or labels when set. Changing
     * the goal or the model changes every task's content: none is reused.
     *
     * @generated from field: string goal = 5;
     */
    goal: string;
    /**
     * The new run's budget (default: the source's).
     *
     * @generated from field: fanout.v1.Budget budget = 6;
     */
    budget?: Budget | undefined;
    /**
     * The new run's model (default: the source's); a change runs every task.
     *
     * @generated from field: fanout.v1.ModelSettings model = 7;
     */
    model?: ModelSettings | undefined;
    /**
     * The new run's labels (default: the source's).
     *
     * @generated from field: map<string, string> labels = 8;
     */
    labels: {
        [key: string]: string;
    };
    /**
     * As StartRunRequest.dry_run: the fork's quote, nothing written.
     *
     * @generated from field: bool dry_run = 9;
     */
    dryRun: boolean;
    /**
     * As StartRunRequest.reserve_quote.
     *
     * @generated from field: bool reserve_quote = 10;
     */
    reserveQuote: boolean;
};
/**
 * Describes the message fanout.v1.ForkRunRequest.
 * Use `create(ForkRunRequestSchema)` to create a new message.
 */
export declare const ForkRunRequestSchema: GenMessage<ForkRunRequest>;
/**
 * ForkRunResponse is the response of OrchestratorService.ForkRun.
 *
 * @generated from message fanout.v1.ForkRunResponse
 */
export type ForkRunResponse = Message<"fanout.v1.ForkRunResponse"> & {
    /**
     * The new run's id (empty for a dry run).
     *
     * @generated from field: string run_id = 1;
     */
    runId: string;
    /**
     * The source tasks the new run reuses, in dispatch order.
     *
     * @generated from field: repeated string reused_task_ids = 2;
     */
    reusedTaskIds: string[];
    /**
     * The quote: set for a dry run and when reserve_quote was asked.
     *
     * @generated from field: fanout.v1.Quote quote = 3;
     */
    quote?: Quote | undefined;
};
/**
 * Describes the message fanout.v1.ForkRunResponse.
 * Use `create(ForkRunResponseSchema)` to create a new message.
 */
export declare const ForkRunResponseSchema: GenMessage<ForkRunResponse>;
/**
 * WatchRunRequest is the request of OrchestratorService.WatchRun.
 *
 * @generated from message fanout.v1.WatchRunRequest
 */
export type WatchRunRequest = Message<"fanout.v1.WatchRunRequest"> & {
    /**
     * Required. The run to watch.
     *
     * @generated from field: string run_id = 1;
     */
    runId: string;
    /**
     * Stream only events with a sequence greater than this. 0 streams the
     * whole history; pass the last sequence seen to resume after a dropped
     * stream. Must be >= 0.
     *
     * @generated from field: int64 after_sequence = 2;
     */
    afterSequence: bigint;
};
/**
 * Describes the message fanout.v1.WatchRunRequest.
 * Use `create(WatchRunRequestSchema)` to create a new message.
 */
export declare const WatchRunRequestSchema: GenMessage<WatchRunRequest>;
/**
 * WatchRunResponse is one message of the OrchestratorService.WatchRun stream.
 *
 * @generated from message fanout.v1.WatchRunResponse
 */
export type WatchRunResponse = Message<"fanout.v1.WatchRunResponse"> & {
    /**
     * The next event of the run, in sequence order.
     *
     * @generated from field: fanout.v1.RunEvent event = 1;
     */
    event?: RunEvent | undefined;
};
/**
 * Describes the message fanout.v1.WatchRunResponse.
 * Use `create(WatchRunResponseSchema)` to create a new message.
 */
export declare const WatchRunResponseSchema: GenMessage<WatchRunResponse>;
/**
 * GetRunRequest is the request of OrchestratorService.GetRun.
 *
 * @generated from message fanout.v1.GetRunRequest
 */
export type GetRunRequest = Message<"fanout.v1.GetRunRequest"> & {
    /**
     * Required. The run to return.
     *
     * @generated from field: string run_id = 1;
     */
    runId: string;
};
/**
 * Describes the message fanout.v1.GetRunRequest.
 * Use `create(GetRunRequestSchema)` to create a new message.
 */
export declare const GetRunRequestSchema: GenMessage<GetRunRequest>;
/**
 * GetRunResponse is the response of OrchestratorService.GetRun.
 *
 * @generated from message fanout.v1.GetRunResponse
 */
export type GetRunResponse = Message<"fanout.v1.GetRunResponse"> & {
    /**
     * The run's current state.
     *
     * @generated from field: fanout.v1.Run run = 1;
     */
    run?: Run | undefined;
};
/**
 * Describes the message fanout.v1.GetRunResponse.
 * Use `create(GetRunResponseSchema)` to create a new message.
 */
export declare const GetRunResponseSchema: GenMessage<GetRunResponse>;
/**
 * CancelRunRequest is the request of OrchestratorService.CancelRun.
 *
 * @generated from message fanout.v1.CancelRunRequest
 */
export type CancelRunRequest = Message<"fanout.v1.CancelRunRequest"> & {
    /**
     * Required. The run to cancel.
     *
     * @generated from field: string run_id = 1;
     */
    runId: string;
    /**
     * Why the caller cancels it; recorded in Run.cancel_cause. Optional, at
     * most 1024 bytes.
     *
     * @generated from field: string reason = 2;
     */
    reason: string;
};
/**
 * Describes the message fanout.v1.CancelRunRequest.
 * Use `create(CancelRunRequestSchema)` to create a new message.
 */
export declare const CancelRunRequestSchema: GenMessage<CancelRunRequest>;
/**
 * CancelRunResponse is the response of OrchestratorService.CancelRun.
 *
 * @generated from message fanout.v1.CancelRunResponse
 */
export type CancelRunResponse = Message<"fanout.v1.CancelRunResponse"> & {
    /**
     * The run after the cancel was recorded. Its state may still be RUNNING
     * for a moment while in-flight subagents settle; watch it, or poll
     * GetRun, for the terminal state.
     *
     * @generated from field: fanout.v1.Run run = 1;
     */
    run?: Run | undefined;
};
/**
 * Describes the message fanout.v1.CancelRunResponse.
 * Use `create(CancelRunResponseSchema)` to create a new message.
 */
export declare const CancelRunResponseSchema: GenMessage<CancelRunResponse>;
/**
 * ListRunsRequest is the request of OrchestratorService.ListRuns.
 *
 * @generated from message fanout.v1.ListRunsRequest
 */
export type ListRunsRequest = Message<"fanout.v1.ListRunsRequest"> & {
    /**
     * Tenant whose runs to list. Empty means "default".
     *
     * @generated from field: string tenant_id = 1;
     */
    tenantId: string;
    /**
     * The most runs to return. 0 means the server default (50); values above
     * the server maximum (100) are lowered to it. Must be >= 0. A page may
     * hold fewer runs than asked, when its encoded size would pass the
     * server's cap (2 MiB); follow next_page_token for the rest.
     *
     * @generated from field: int32 page_size = 2;
     */
    pageSize: number;
    /**
     * Token from a previous ListRunsResponse.next_page_token to continue that
     * listing; empty for the first page. All other fields must match the call
     * that produced the token.
     *
     * @generated from field: string page_token = 3;
     */
    pageToken: string;
    /**
     * Only list runs in this state. RUN_STATE_UNSPECIFIED lists runs in any
     * state.
     *
     * @generated from field: fanout.v1.RunState state = 4;
     */
    state: RunState;
};
/**
 * Describes the message fanout.v1.ListRunsRequest.
 * Use `create(ListRunsRequestSchema)` to create a new message.
 */
export declare const ListRunsRequestSchema: GenMessage<ListRunsRequest>;
/**
 * ListRunsResponse is the response of OrchestratorService.ListRuns.
 *
 * @generated from message fanout.v1.ListRunsResponse
 */
export type ListRunsResponse = Message<"fanout.v1.ListRunsResponse"> & {
    /**
     * The runs of this page, newest first, as summaries: state, cause, budget,
     * labels, times and each task's status, spend and worker, but no spec, no
     * result and no task summaries. GetRun returns a run with all of these
     * (cut to its size, "Sizes" above). A summary's tasks are cut as GetRun's
     * are (Run.task_count, Run.tasks_next_page_token).
     *
     * @generated from field: repeated fanout.v1.Run runs = 1;
     */
    runs: Run[];
    /**
     * Token for the next page; empty when there are no more runs.
     *
     * @generated from field: string next_page_token = 2;
     */
    nextPageToken: string;
};
/**
 * Describes the message fanout.v1.ListRunsResponse.
 * Use `create(ListRunsResponseSchema)` to create a new message.
 */
export declare const ListRunsResponseSchema: GenMessage<ListRunsResponse>;
/**
 * ListRunTasksRequest is the request of OrchestratorService.ListRunTasks.
 *
 * @generated from message fanout.v1.ListRunTasksRequest
 */
export type ListRunTasksRequest = Message<"fanout.v1.ListRunTasksRequest"> & {
    /**
     * Required. The run whose tasks to list.
     *
     * @generated from field: string run_id = 1;
     */
    runId: string;
    /**
     * The most tasks to return. 0 means the server default (100); values
     * above the server maximum (1,000) are lowered to it. Must be >= 0. A
     * page may hold fewer tasks than asked, when its encoded size would pass
     * 2 MiB; follow next_page_token for the rest.
     *
     * @generated from field: int32 page_size = 2;
     */
    pageSize: number;
    /**
     * Token from a previous ListRunTasksResponse.next_page_token, or from
     * Run.tasks_next_page_token or JoinedResult.tasks_next_page_token, to
     * continue that listing; empty for the first page (the run's first
     * task). run_id must match the call that produced it.
     *
     * @generated from field: string page_token = 3;
     */
    pageToken: string;
};
/**
 * Describes the message fanout.v1.ListRunTasksRequest.
 * Use `create(ListRunTasksRequestSchema)` to create a new message.
 */
export declare const ListRunTasksRequestSchema: GenMessage<ListRunTasksRequest>;
/**
 * ListRunTasksResponse is the response of OrchestratorService.ListRunTasks.
 *
 * @generated from message fanout.v1.ListRunTasksResponse
 */
export type ListRunTasksResponse = Message<"fanout.v1.ListRunTasksResponse"> & {
    /**
     * The tasks of this page, in dispatch order.
     *
     * @generated from field: repeated fanout.v1.TaskOutcome tasks = 1;
     */
    tasks: TaskOutcome[];
    /**
     * Token for the next page; empty when there are no more tasks.
     *
     * @generated from field: string next_page_token = 2;
     */
    nextPageToken: string;
    /**
     * How many tasks the run has.
     *
     * @generated from field: int32 task_count = 3;
     */
    taskCount: number;
};
/**
 * Describes the message fanout.v1.ListRunTasksResponse.
 * Use `create(ListRunTasksResponseSchema)` to create a new message.
 */
export declare const ListRunTasksResponseSchema: GenMessage<ListRunTasksResponse>;
/**
 * ListRunFactsRequest is the request of OrchestratorService.ListRunFacts.
 *
 * @generated from message fanout.v1.ListRunFactsRequest
 */
export type ListRunFactsRequest = Message<"fanout.v1.ListRunFactsRequest"> & {
    /**
     * Required. The run whose joined facts to list.
     *
     * @generated from field: string run_id = 1;
     */
    runId: string;
    /**
     * The most facts to return. 0 means the server default (100); values
     * above the server maximum (1,000) are lowered to it. Must be >= 0. A
     * page may hold fewer facts than asked, when its encoded size would pass
     * 2 MiB; follow next_page_token for the rest.
     *
     * @generated from field: int32 page_size = 2;
     */
    pageSize: number;
    /**
     * Token from a previous ListRunFactsResponse.next_page_token, or from
     * JoinedResult.facts_next_page_token, to continue that listing; empty for
     * the first page. run_id must match the call that produced it.
     *
     * @generated from field: string page_token = 3;
     */
    pageToken: string;
};
/**
 * Describes the message fanout.v1.ListRunFactsRequest.
 * Use `create(ListRunFactsRequestSchema)` to create a new message.
 */
export declare const ListRunFactsRequestSchema: GenMessage<ListRunFactsRequest>;
/**
 * ListRunFactsResponse is the response of OrchestratorService.ListRunFacts.
 *
 * @generated from message fanout.v1.ListRunFactsResponse
 */
export type ListRunFactsResponse = Message<"fanout.v1.ListRunFactsResponse"> & {
    /**
     * The facts of this page, in the joined result's order.
     *
     * @generated from field: repeated fanout.v1.Fact facts = 1;
     */
    facts: Fact[];
    /**
     * Token for the next page; empty when there are no more facts.
     *
     * @generated from field: string next_page_token = 2;
     */
    nextPageToken: string;
    /**
     * How many facts the joined result has (0 while the run is running).
     *
     * @generated from field: int32 fact_count = 3;
     */
    factCount: number;
};
/**
 * Describes the message fanout.v1.ListRunFactsResponse.
 * Use `create(ListRunFactsResponseSchema)` to create a new message.
 */
export declare const ListRunFactsResponseSchema: GenMessage<ListRunFactsResponse>;
/**
 * PendingToolCall is a write that waits for approval.
 *
 * @generated from message fanout.v1.PendingToolCall
 */
export type PendingToolCall = Message<"fanout.v1.PendingToolCall"> & {
    /**
     * The call's id.
     *
     * @generated from field: string call_id = 1;
     */
    callId: string;
    /**
     * The run whose write it is.
     *
     * @generated from field: string run_id = 2;
     */
    runId: string;
    /**
     * The task whose write it is.
     *
     * @generated from field: string task_id = 3;
     */
    taskId: string;
    /**
     * The tool's model-facing name.
     *
     * @generated from field: string tool = 4;
     */
    tool: string;
    /**
     * The arguments as JSON, cut at 1,024 bytes, secret-looking values
     * redacted.
     *
     * @generated from field: string preview = 5;
     */
    preview: string;
    /**
     * When it was asked for (Postgres time).
     *
     * @generated from field: google.protobuf.Timestamp requested_at = 6;
     */
    requestedAt?: Timestamp | undefined;
    /**
     * When it is denied as expired unless approved first (Postgres time).
     *
     * @generated from field: google.protobuf.Timestamp deadline = 7;
     */
    deadline?: Timestamp | undefined;
};
/**
 * Describes the message fanout.v1.PendingToolCall.
 * Use `create(PendingToolCallSchema)` to create a new message.
 */
export declare const PendingToolCallSchema: GenMessage<PendingToolCall>;
/**
 * ToolCallDecision is a recorded decision on a write.
 *
 * @generated from message fanout.v1.ToolCallDecision
 */
export type ToolCallDecision = Message<"fanout.v1.ToolCallDecision"> & {
    /**
     * The call decided on.
     *
     * @generated from field: string call_id = 1;
     */
    callId: string;
    /**
     * The run whose write it is.
     *
     * @generated from field: string run_id = 2;
     */
    runId: string;
    /**
     * The task whose write it is.
     *
     * @generated from field: string task_id = 3;
     */
    taskId: string;
    /**
     * The tool's model-facing name.
     *
     * @generated from field: string tool = 4;
     */
    tool: string;
    /**
     * Approved or denied.
     *
     * @generated from field: bool approved = 5;
     */
    approved: boolean;
    /**
     * Why, as the decider said.
     *
     * @generated from field: string reason = 6;
     */
    reason: string;
    /**
     * Who decided ("key:ID").
     *
     * @generated from field: string actor = 7;
     */
    actor: string;
    /**
     * When (Postgres time).
     *
     * @generated from field: google.protobuf.Timestamp decided_at = 8;
     */
    decidedAt?: Timestamp | undefined;
};
/**
 * Describes the message fanout.v1.ToolCallDecision.
 * Use `create(ToolCallDecisionSchema)` to create a new message.
 */
export declare const ToolCallDecisionSchema: GenMessage<ToolCallDecision>;
/**
 * ListApprovalsRequest is the request of OrchestratorService.ListApprovals.
 *
 * @generated from message fanout.v1.ListApprovalsRequest
 */
export type ListApprovalsRequest = Message<"fanout.v1.ListApprovalsRequest"> & {
    /**
     * Only this run's calls; empty lists every run's.
     *
     * @generated from field: string run_id = 1;
     */
    runId: string;
    /**
     * The most calls to return: 0 means 50; at most 200. A page may hold
     * fewer, when its encoded size would pass 2 MiB.
     *
     * @generated from field: int32 page_size = 2;
     */
    pageSize: number;
    /**
     * Token from a previous ListApprovalsResponse.next_page_token; empty for
     * the first page. run_id must match the call that produced it.
     *
     * @generated from field: string page_token = 3;
     */
    pageToken: string;
};
/**
 * Describes the message fanout.v1.ListApprovalsRequest.
 * Use `create(ListApprovalsRequestSchema)` to create a new message.
 */
export declare const ListApprovalsRequestSchema: GenMessage<ListApprovalsRequest>;
/**
 * ListApprovalsResponse is the response of OrchestratorService.ListApprovals.
 *
 * @generated from message fanout.v1.ListApprovalsResponse
 */
export type ListApprovalsResponse = Message<"fanout.v1.ListApprovalsResponse"> & {
    /**
     * The calls, oldest first.
     *
     * @generated from field: repeated fanout.v1.PendingToolCall calls = 1;
     */
    calls: PendingToolCall[];
    /**
     * Token for the next page; empty when there are no more.
     *
     * @generated from field: string next_page_token = 2;
     */
    nextPageToken: string;
};
/**
 * Describes the message fanout.v1.ListApprovalsResponse.
 * Use `create(ListApprovalsResponseSchema)` to create a new message.
 */
export declare const ListApprovalsResponseSchema: GenMessage<ListApprovalsResponse>;
/**
 * ApproveToolCallRequest is the request of OrchestratorService.ApproveToolCall.
 *
 * @generated from message fanout.v1.ApproveToolCallRequest
 */
export type ApproveToolCallRequest = Message<"fanout.v1.ApproveToolCallRequest"> & {
    /**
     * Required. The call to approve (ApprovalRequested.call_id).
     *
     * @generated from field: string call_id = 1;
     */
    callId: string;
    /**
     * Why; optional, at most 1024 bytes. Logged.
     *
     * @generated from field: string reason = 2;
     */
    reason: string;
};
/**
 * Describes the message fanout.v1.ApproveToolCallRequest.
 * Use `create(ApproveToolCallRequestSchema)` to create a new message.
 */
export declare const ApproveToolCallRequestSchema: GenMessage<ApproveToolCallRequest>;
/**
 * ApproveToolCallResponse is the response of OrchestratorService.ApproveToolCall.
 *
 * @generated from message fanout.v1.ApproveToolCallResponse
 */
export type ApproveToolCallResponse = Message<"fanout.v1.ApproveToolCallResponse"> & {
    /**
     * The decision as recorded.
     *
     * @generated from field: fanout.v1.ToolCallDecision decision = 1;
     */
    decision?: ToolCallDecision | undefined;
};
/**
 * Describes the message fanout.v1.ApproveToolCallResponse.
 * Use `create(ApproveToolCallResponseSchema)` to create a new message.
 */
export declare const ApproveToolCallResponseSchema: GenMessage<ApproveToolCallResponse>;
/**
 * DenyToolCallRequest is the request of OrchestratorService.DenyToolCall.
 *
 * @generated from message fanout.v1.DenyToolCallRequest
 */
export type DenyToolCallRequest = Message<"fanout.v1.DenyToolCallRequest"> & {
    /**
     * Required. The call to deny (ApprovalRequested.call_id).
     *
     * @generated from field: string call_id = 1;
     */
    callId: string;
    /**
     * Why; optional, at most 1024 bytes. Logged, and told to the model.
     *
     * @generated from field: string reason = 2;
     */
    reason: string;
};
/**
 * Describes the message fanout.v1.DenyToolCallRequest.
 * Use `create(DenyToolCallRequestSchema)` to create a new message.
 */
export declare const DenyToolCallRequestSchema: GenMessage<DenyToolCallRequest>;
/**
 * DenyToolCallResponse is the response of OrchestratorService.DenyToolCall.
 *
 * @generated from message fanout.v1.DenyToolCallResponse
 */
export type DenyToolCallResponse = Message<"fanout.v1.DenyToolCallResponse"> & {
    /**
     * The decision as recorded.
     *
     * @generated from field: fanout.v1.ToolCallDecision decision = 1;
     */
    decision?: ToolCallDecision | undefined;
};
/**
 * Describes the message fanout.v1.DenyToolCallResponse.
 * Use `create(DenyToolCallResponseSchema)` to create a new message.
 */
export declare const DenyToolCallResponseSchema: GenMessage<DenyToolCallResponse>;
/**
 * ListToolCallsRequest is the request of OrchestratorService.ListToolCalls.
 *
 * @generated from message fanout.v1.ListToolCallsRequest
 */
export type ListToolCallsRequest = Message<"fanout.v1.ListToolCallsRequest"> & {
    /**
     * Required. The run whose writes to list.
     *
     * @generated from field: string run_id = 1;
     */
    runId: string;
    /**
     * The most calls to return: 0 means 50; at most 200. A page may hold
     * fewer, when its encoded size would pass 2 MiB (a call's error may be
     * up to 1 MiB).
     *
     * @generated from field: int32 page_size = 2;
     */
    pageSize: number;
    /**
     * Token from a previous ListToolCallsResponse.next_page_token; empty for
     * the first page. run_id must match the call that produced it.
     *
     * @generated from field: string page_token = 3;
     */
    pageToken: string;
};
/**
 * Describes the message fanout.v1.ListToolCallsRequest.
 * Use `create(ListToolCallsRequestSchema)` to create a new message.
 */
export declare const ListToolCallsRequestSchema: GenMessage<ListToolCallsRequest>;
/**
 * ToolCall is one write a subagent asked for, as the write log holds it.
 *
 * @generated from message fanout.v1.ToolCall
 */
export type ToolCall = Message<"fanout.v1.ToolCall"> & {
    /**
     * The call's id (ApprovalRequested.call_id).
     *
     * @generated from field: string call_id = 1;
     */
    callId: string;
    /**
     * The task that asked for it.
     *
     * @generated from field: string task_id = 2;
     */
    taskId: string;
    /**
     * The task's attempt, iteration and the call's index in the model's
     * reply when it was asked for.
     *
     * @generated from field: int32 attempt = 3;
     */
    attempt: number;
    /**
     * The agent loop's iteration.
     *
     * @generated from field: int32 iteration = 4;
     */
    iteration: number;
    /**
     * The call's index in the model's reply.
     *
     * @generated from field: int32 call_index = 5;
     */
    callIndex: number;
    /**
     * The MCP server ("" for a built-in tool).
     *
     * @generated from field: string server = 6;
     */
    server: string;
    /**
     * The tool's model-facing name.
     *
     * @generated from field: string tool = 7;
     */
    tool: string;
    /**
     * awaiting_approval, approved, denied, issued, done, failed, unknown (cut
     * off: it may have happened) or not_sent.
     *
     * @generated from field: string state = 8;
     */
    state: string;
    /**
     * The error, for failed, unknown, not_sent and denied calls.
     *
     * @generated from field: string error = 9;
     */
    error: string;
    /**
     * The arguments as JSON, cut at 1,024 bytes, secret-looking values
     * redacted; empty for a call that did not wait for approval.
     *
     * @generated from field: string preview = 10;
     */
    preview: string;
    /**
     * The size of the tool's result, in bytes (the result itself is content
     * and is not served).
     *
     * @generated from field: int64 result_bytes = 11;
     */
    resultBytes: bigint;
    /**
     * When it was asked for and when it reached its last state (Postgres time).
     *
     * @generated from field: google.protobuf.Timestamp created_at = 12;
     */
    createdAt?: Timestamp | undefined;
    /**
     * Unset while it is not resolved.
     *
     * @generated from field: google.protobuf.Timestamp resolved_at = 13;
     */
    resolvedAt?: Timestamp | undefined;
    /**
     * When an approval it waits for expires; unset if it needs none.
     *
     * @generated from field: google.protobuf.Timestamp approval_deadline = 14;
     */
    approvalDeadline?: Timestamp | undefined;
    /**
     * The decision on it, if one was taken.
     *
     * @generated from field: fanout.v1.ToolCallDecision decision = 15;
     */
    decision?: ToolCallDecision | undefined;
};
/**
 * Describes the message fanout.v1.ToolCall.
 * Use `create(ToolCallSchema)` to create a new message.
 */
export declare const ToolCallSchema: GenMessage<ToolCall>;
/**
 * ListToolCallsResponse is the response of OrchestratorService.ListToolCalls.
 *
 * @generated from message fanout.v1.ListToolCallsResponse
 */
export type ListToolCallsResponse = Message<"fanout.v1.ListToolCallsResponse"> & {
    /**
     * The calls, oldest first.
     *
     * @generated from field: repeated fanout.v1.ToolCall calls = 1;
     */
    calls: ToolCall[];
    /**
     * Token for the next page; empty when there are no more.
     *
     * @generated from field: string next_page_token = 2;
     */
    nextPageToken: string;
};
/**
 * Describes the message fanout.v1.ListToolCallsResponse.
 * Use `create(ListToolCallsResponseSchema)` to create a new message.
 */
export declare const ListToolCallsResponseSchema: GenMessage<ListToolCallsResponse>;
/**
 * GetSpendRequest is the request of OrchestratorService.GetSpend.
 *
 * @generated from message fanout.v1.GetSpendRequest
 */
export type GetSpendRequest = Message<"fanout.v1.GetSpendRequest"> & {
    /**
     * Tenant whose spend to return. Empty means the caller's (a tenant key's
     * own tenant; "default" for callers bound to none).
     *
     * @generated from field: string tenant_id = 1;
     */
    tenantId: string;
    /**
     * First UTC day, YYYY-MM-DD. Empty: 30 days before to_day.
     *
     * @generated from field: string from_day = 2;
     */
    fromDay: string;
    /**
     * Last UTC day, YYYY-MM-DD, inclusive. Empty: today (Postgres time). At
     * most 366 days after from_day.
     *
     * @generated from field: string to_day = 3;
     */
    toDay: string;
    /**
     * Runs whose spend to return too, at most 200 (the console asks for the
     * runs of a ListRuns page).
     *
     * @generated from field: repeated string run_ids = 4;
     */
    runIds: string[];
};
/**
 * Describes the message fanout.v1.GetSpendRequest.
 * Use `create(GetSpendRequestSchema)` to create a new message.
 */
export declare const GetSpendRequestSchema: GenMessage<GetSpendRequest>;
/**
 * Spend is tokens spent and what they cost in one currency. A cost is a
 * decimal string (exact, as the database's numeric); spend of a model with
 * no price counts in unpriced_tokens and in no cost.
 *
 * @generated from message fanout.v1.Spend
 */
export type Spend = Message<"fanout.v1.Spend"> & {
    /**
     * ISO 4217 code of the price's currency; empty for unpriced spend alone.
     *
     * @generated from field: string currency = 1;
     */
    currency: string;
    /**
     * Every priced token's cost.
     *
     * @generated from field: string cost = 2;
     */
    cost: string;
    /**
     * The cost of the spend the provider reported (input and output counts).
     *
     * @generated from field: string reported_cost = 3;
     */
    reportedCost: string;
    /**
     * The cost of spend posted at its worst case (an expired lease: the
     * tokens were held and not reported), at the model's higher price.
     *
     * @generated from field: string worst_case_cost = 4;
     */
    worstCaseCost: string;
    /**
     * Tokens with a price.
     *
     * @generated from field: int64 priced_tokens = 5;
     */
    pricedTokens: bigint;
    /**
     * Of those, tokens posted at their worst case.
     *
     * @generated from field: int64 worst_case_tokens = 6;
     */
    worstCaseTokens: bigint;
    /**
     * Tokens of a model with no price.
     *
     * @generated from field: int64 unpriced_tokens = 7;
     */
    unpricedTokens: bigint;
};
/**
 * Describes the message fanout.v1.Spend.
 * Use `create(SpendSchema)` to create a new message.
 */
export declare const SpendSchema: GenMessage<Spend>;
/**
 * DaySpend is a tenant's spend on one UTC day in one currency.
 *
 * @generated from message fanout.v1.DaySpend
 */
export type DaySpend = Message<"fanout.v1.DaySpend"> & {
    /**
     * The UTC day, YYYY-MM-DD.
     *
     * @generated from field: string day = 1;
     */
    day: string;
    /**
     * The spend.
     *
     * @generated from field: fanout.v1.Spend spend = 2;
     */
    spend?: Spend | undefined;
    /**
     * Runs with spend that day.
     *
     * @generated from field: int64 runs = 3;
     */
    runs: bigint;
};
/**
 * Describes the message fanout.v1.DaySpend.
 * Use `create(DaySpendSchema)` to create a new message.
 */
export declare const DaySpendSchema: GenMessage<DaySpend>;
/**
 * RunSpend is one run's spend in one currency.
 *
 * @generated from message fanout.v1.RunSpend
 */
export type RunSpend = Message<"fanout.v1.RunSpend"> & {
    /**
     * The run.
     *
     * @generated from field: string run_id = 1;
     */
    runId: string;
    /**
     * The spend.
     *
     * @generated from field: fanout.v1.Spend spend = 2;
     */
    spend?: Spend | undefined;
};
/**
 * Describes the message fanout.v1.RunSpend.
 * Use `create(RunSpendSchema)` to create a new message.
 */
export declare const RunSpendSchema: GenMessage<RunSpend>;
/**
 * GetSpendResponse is the response of OrchestratorService.GetSpend.
 *
 * @generated from message fanout.v1.GetSpendResponse
 */
export type GetSpendResponse = Message<"fanout.v1.GetSpendResponse"> & {
    /**
     * The days with spend, oldest first (one row per day and currency).
     *
     * @generated from field: repeated fanout.v1.DaySpend days = 1;
     */
    days: DaySpend[];
    /**
     * The named runs' spend (one row per run and currency; a run without
     * spend has none).
     *
     * @generated from field: repeated fanout.v1.RunSpend runs = 2;
     */
    runs: RunSpend[];
    /**
     * The range the days cover, as resolved.
     *
     * @generated from field: string from_day = 3;
     */
    fromDay: string;
    /**
     * Last day of the range.
     *
     * @generated from field: string to_day = 4;
     */
    toDay: string;
};
/**
 * Describes the message fanout.v1.GetSpendResponse.
 * Use `create(GetSpendResponseSchema)` to create a new message.
 */
export declare const GetSpendResponseSchema: GenMessage<GetSpendResponse>;
/**
 * OrchestratorService accepts runs, fans their tasks out to workers under one
 * shared token budget, joins the results, and reports run state. Any
 * orchestrator replica can serve any call for any run.
 *
 * Errors: INVALID_ARGUMENT (with google.rpc.BadRequest naming the fields) for
 * a malformed request; RESOURCE_EXHAUSTED for a spec over a server cap or a
 * budget the tenant cannot grant (with google.rpc.QuotaFailure); NOT_FOUND
 * for an unknown run id (or one owned by another tenant); ALREADY_EXISTS is
 * never returned for a reused idempotency key (the existing run is
 * returned instead) unless the spec differs from the stored one, which is
 * FAILED_PRECONDITION.
 *
 * Sizes: no response message (nor any message of a stream) grows with the
 * size of a run. Each stays under 2 MiB encoded, half of gRPC's default
 * 4 MiB receive limit, whatever the run's number of tasks and facts: a run
 * (GetRun, CancelRun, RunStarted, ListRuns) and a joined result
 * (RunFinished) carry the first tasks and facts that fit, their totals and
 * a page token for the rest, which ListRunTasks and ListRunFacts page
 * through; a list page ends early (with a next_page_token) rather than pass
 * the cap. The one exception is a single item bigger than a page's cap on
 * its own (one task's summary, one tool call's error): a page holds at
 * least one item, so that a listing always moves on.
 *
 * @generated from service fanout.v1.OrchestratorService
 */
export declare const OrchestratorService: GenService<{
    /**
     * Run creates a run, or joins the existing run with the same tenant and
     * idempotency key, and streams its events until it ends: RunStarted
     * first, RunFinished last, then the stream closes with OK. A joining
     * caller receives the run's history from the start. Cancelling this call
     * (or its deadline passing) cancels the run, with cause "caller cancelled
     * Run"; use StartRun + WatchRun for a run that outlives the connection.
     *
     * @generated from rpc fanout.v1.OrchestratorService.Run
     */
    run: {
        methodKind: "server_streaming";
        input: typeof RunRequestSchema;
        output: typeof RunResponseSchema;
    };
    /**
     * StartRun creates a run, or returns the existing run with the same tenant
     * and idempotency key, and returns its id at once without waiting for it.
     * The run continues independently of this call.
     *
     * @generated from rpc fanout.v1.OrchestratorService.StartRun
     */
    startRun: {
        methodKind: "unary";
        input: typeof StartRunRequestSchema;
        output: typeof StartRunResponseSchema;
    };
    /**
     * WatchRun streams a run's events with sequence greater than
     * after_sequence (stored history first, then live events, with no gap and
     * no duplicate) and closes with OK after a RunFinished that is the last
     * event (a run reopened by ContinueRun has a RunContinued after its
     * earlier RunFinished). Watching an ended run replays its remaining
     * history and closes. Cancelling this call does
     * not affect the run. A reader that stays more than 1,000 events behind
     * the run for 10 s is ended RESOURCE_EXHAUSTED, with an ErrorInfo (reason
     * WATCH_READER_BEHIND) whose metadata after_sequence is the last event
     * sent: watch again with that after_sequence.
     *
     * @generated from rpc fanout.v1.OrchestratorService.WatchRun
     */
    watchRun: {
        methodKind: "server_streaming";
        input: typeof WatchRunRequestSchema;
        output: typeof WatchRunResponseSchema;
    };
    /**
     * GetRun returns a run's current state. A large run's tasks, facts and
     * spec are cut to fit the response under 2 MiB (see Run and
     * JoinedResult); ListRunTasks and ListRunFacts page through the rest.
     *
     * @generated from rpc fanout.v1.OrchestratorService.GetRun
     */
    getRun: {
        methodKind: "unary";
        input: typeof GetRunRequestSchema;
        output: typeof GetRunResponseSchema;
    };
    /**
     * CancelRun cancels a running run: every in-flight subagent on every node
     * is cancelled, settled work is kept, and the run ends CANCELLED with the
     * given reason. Cancelling a run that has already ended changes nothing
     * and returns it as it is (so the call is idempotent).
     *
     * @generated from rpc fanout.v1.OrchestratorService.CancelRun
     */
    cancelRun: {
        methodKind: "unary";
        input: typeof CancelRunRequestSchema;
        output: typeof CancelRunResponseSchema;
    };
    /**
     * ListRuns lists a tenant's runs, newest first.
     *
     * @generated from rpc fanout.v1.OrchestratorService.ListRuns
     */
    listRuns: {
        methodKind: "unary";
        input: typeof ListRunsRequestSchema;
        output: typeof ListRunsResponseSchema;
    };
    /**
     * ListRunTasks lists a run's tasks' current outcomes (as Run.tasks holds
     * them, summaries included), in dispatch order: the rest of a run whose
     * tasks did not all fit in GetRun. Needs scope read, as GetRun.
     *
     * @generated from rpc fanout.v1.OrchestratorService.ListRunTasks
     */
    listRunTasks: {
        methodKind: "unary";
        input: typeof ListRunTasksRequestSchema;
        output: typeof ListRunTasksResponseSchema;
    };
    /**
     * ListRunFacts lists the facts of a run's joined result
     * (JoinedResult.facts), in their order: the rest of a result whose facts
     * did not all fit in GetRun or RunFinished. Empty while the run is
     * running (it has no result yet). Needs scope read, as GetRun.
     *
     * @generated from rpc fanout.v1.OrchestratorService.ListRunFacts
     */
    listRunFacts: {
        methodKind: "unary";
        input: typeof ListRunFactsRequestSchema;
        output: typeof ListRunFactsResponseSchema;
    };
    /**
     * ListApprovals lists the caller's tenant's writes that wait for
     * approval, oldest first. Needs scope approve.
     *
     * @generated from rpc fanout.v1.OrchestratorService.ListApprovals
     */
    listApprovals: {
        methodKind: "unary";
        input: typeof ListApprovalsRequestSchema;
        output: typeof ListApprovalsResponseSchema;
    };
    /**
     * ApproveToolCall approves one write that waits for approval: the task
     * sends it (once) when it sees the decision, also if it was re-dispatched
     * meanwhile. Needs scope approve; the decision is logged with the
     * caller's key (the tool_call_decisions view). Approving an approved call
     * again returns the recorded decision. FAILED_PRECONDITION when the call
     * was denied, its deadline passed, its run ended, or it never waited for
     * approval; NOT_FOUND for a call the caller's tenant does not have.
     *
     * @generated from rpc fanout.v1.OrchestratorService.ApproveToolCall
     */
    approveToolCall: {
        methodKind: "unary";
        input: typeof ApproveToolCallRequestSchema;
        output: typeof ApproveToolCallResponseSchema;
    };
    /**
     * DenyToolCall denies one write that waits for approval: it is never
     * sent, and the model is told "denied by key:ID: reason" as that call's
     * failure. As ApproveToolCall otherwise.
     *
     * @generated from rpc fanout.v1.OrchestratorService.DenyToolCall
     */
    denyToolCall: {
        methodKind: "unary";
        input: typeof DenyToolCallRequestSchema;
        output: typeof DenyToolCallResponseSchema;
    };
    /**
     * ListToolCalls lists the writes a run's subagents asked for (MCP tools
     * and the built-in note), oldest first: their states (waiting for
     * approval, approved, denied, sent, done, failed, unknown, not sent), the
     * decisions on them and their previews. Needs scope read, as WatchRun.
     *
     * @generated from rpc fanout.v1.OrchestratorService.ListToolCalls
     */
    listToolCalls: {
        methodKind: "unary";
        input: typeof ListToolCallsRequestSchema;
        output: typeof ListToolCallsResponseSchema;
    };
    /**
     * ContinueRun adds tokens to a run's budget, through the ledger, under
     * the tenant's budget, logged and idempotent by key. A run still running
     * goes on with the larger budget (a top-up); a run that ended
     * BUDGET_EXHAUSTED runs again: its NOT_STARTED tasks are admitted again
     * by forecast, the tasks that ended keep their outcomes and are never
     * run again, and the synthesis is made again over all facts (its
     * allowance held again). Its events go on after its RunFinished with a
     * RunContinued, and a second RunFinished ends it (docs/budget.md#continue).
     * A run that was cancelled, failed, timed out or succeeded is
     * FAILED_PRECONDITION (fork it instead). With dry_run nothing is written:
     * the response's quote says what the continuation would admit and cost.
     * Needs scope run.
     *
     * @generated from rpc fanout.v1.OrchestratorService.ContinueRun
     */
    continueRun: {
        methodKind: "unary";
        input: typeof ContinueRunRequestSchema;
        output: typeof ContinueRunResponseSchema;
    };
    /**
     * ForkRun starts a new run (its own id, budget and ledger accounts,
     * Run.forked_from) from a recorded run with tasks changed, added or
     * removed. A task whose content (instruction, model, tools, and the
     * facts of its dependencies) is unchanged and that SUCCEEDED in the
     * source reuses its recorded facts without a model call
     * (TaskOutcome.reused, spend 0); the others run. A reused task's writes
     * are never sent again. With dry_run nothing is written: the quote says
     * which tasks would run and what they would cost. Idempotent by
     * idempotency_key, as StartRun. Needs scope run.
     *
     * @generated from rpc fanout.v1.OrchestratorService.ForkRun
     */
    forkRun: {
        methodKind: "unary";
        input: typeof ForkRunRequestSchema;
        output: typeof ForkRunResponseSchema;
    };
    /**
     * GetSpend returns the caller's tenant's spend in tokens and in money, at
     * the prices the operator set (fanout price), per UTC day and, for the
     * runs named, per run: what the tenant_spend_money_daily and
     * run_spend_money views hold. Needs scope audit.
     *
     * @generated from rpc fanout.v1.OrchestratorService.GetSpend
     */
    getSpend: {
        methodKind: "unary";
        input: typeof GetSpendRequestSchema;
        output: typeof GetSpendResponseSchema;
    };
}>;
