import { type JsonObject, type MessageInitShape } from "@bufbuild/protobuf";
import { type Client, type Transport } from "@connectrpc/connect";
import { OrchestratorService, type ContinueRunResponse, type ForkRunRequestSchema, type ForkRunResponse, type PendingToolCall, type StartRunResponse, type ToolCallDecision } from "./gen/fanout/v1/orchestrator_pb.js";
import { RunSpecSchema, RunState, type Run, type RunEvent, type RunSpec } from "./gen/fanout/v1/run_pb.js";
import { FanoutError } from "./errors.js";
export * from "./errors.js";
export { RunState, TaskStatus, RunSpecSchema } from "./gen/fanout/v1/run_pb.js";
export type { Run, RunEvent, RunSpec, TaskSpec, TaskOutcome, JoinedResult, Fact } from "./gen/fanout/v1/run_pb.js";
export type { ContinueRunResponse, ForkRunResponse, PendingToolCall, Quote, StartRunResponse, ToolCallDecision, } from "./gen/fanout/v1/orchestrator_pb.js";
/** FanoutClientOptions configure createFanoutClient. */
export interface FanoutClientOptions {
    /** The orchestrator's HTTP listener (--http-listen): "http://127.0.0.1:8080". Unused when transport is given. */
    baseUrl?: string;
    /**
     * The API key, sent as "authorization: Bearer KEY". Default: the
     * environment's FANOUT_API_KEY under Node.js; none in a browser.
     */
    apiKey?: string;
    /** Sent as fanout-tenant-id: the tenant of a server with --auth none (fanout dev). */
    tenant?: string;
    /**
     * A transport of your own (createNodeTransport of @fanout/client/node for
     * a CA or gRPC). Its URL is not checked: it is yours to send a key over
     * https:// (or to loopback) only.
     */
    transport?: Transport;
    /**
     * Send the key over http:// to a host that is not loopback. Only for a
     * proxy on that host that ends TLS; without it such a baseUrl is refused
     * when there is a key, which would otherwise cross the network in plaintext.
     */
    insecure?: boolean;
    /** Default deadline of each unary call, in ms (none by default). Streams have none. */
    timeoutMs?: number;
}
/** CallOpts are what every unary call takes. */
export interface CallOpts {
    /** Aborting it ends the call with a CANCELLED FanoutError. */
    signal?: AbortSignal;
    /** This call's deadline in ms, retries included (default: the client's): DeadlineExceededError when it passes. */
    timeoutMs?: number;
}
/** RunSpecInput is a RunSpec: a message, its init shape (int64 as bigint), or protojson (examples/research.json's "spec"). */
export type RunSpecInput = RunSpec | MessageInitShape<typeof RunSpecSchema> | JsonObject;
/** StartRunOpts are startRun's options. */
export interface StartRunOpts extends CallOpts {
    /** Overrides the spec's idempotencyKey. When neither has one, a random key is made, so that a retry joins the same run. */
    idempotencyKey?: string;
    /** Validate and quote only: nothing starts (the response's quote). */
    dryRun?: boolean;
}
/** WatchOpts are watch's options. */
export interface WatchOpts {
    /** Yield the events after this sequence (default 0: from the start). */
    after?: bigint | number;
    /** Aborting it ends the iteration with a CANCELLED FanoutError. */
    signal?: AbortSignal;
    /** Told each time a dropped stream is about to be opened again after sequence after (for a status line, or a test). */
    onResume?: (info: {
        after: bigint;
        attempt: number;
        error: FanoutError;
    }) => void;
}
/** ListOpts are list's options. */
export interface ListOpts extends CallOpts {
    /** Runs per page (the server's default when 0). */
    pageSize?: number;
    /** Only runs in this state: RunState.RUNNING, "RUNNING" or "RUN_STATE_RUNNING". */
    state?: RunState | string;
}
/** ContinueOpts are continueRun's options. */
export interface ContinueOpts extends CallOpts {
    /** Makes the call idempotent; a random one is made when not given. */
    idempotencyKey?: string;
    reason?: string;
    dryRun?: boolean;
}
/** ForkChanges are a fork's changes: ForkRunRequest's fields but run_id and idempotency_key. */
export type ForkChanges = Omit<MessageInitShape<typeof ForkRunRequestSchema>, "runId" | "idempotencyKey" | "$typeName">;
/** FanoutClient is what createFanoutClient returns. */
export interface FanoutClient {
    /** startRun creates a run (or returns the one with the same idempotency key) and returns its id at once. */
    startRun(spec: RunSpecInput, opts?: StartRunOpts): Promise<StartRunResponse>;
    /**
     * run starts a run and yields its events until it ends (RunFinished
     * last). It is StartRun + watch, not the Run RPC, whose dropped
     * connection would cancel the run: here a drop is resumed by sequence.
     */
    run(spec: RunSpecInput, opts?: StartRunOpts & Pick<WatchOpts, "onResume">): AsyncIterable<RunEvent>;
    /**
     * watch yields a run's events after opts.after, in sequence order, and
     * ends when the server ends the stream (after the run's RunFinished).
     * A dropped stream is opened again after the last sequence yielded: no
     * event is yielded twice or skipped. Throws a FanoutError for an error
     * a retry cannot fix, or after 10 failed attempts in a row (10 to 20 s).
     */
    watch(runId: string, opts?: WatchOpts): AsyncIterable<RunEvent>;
    /** get returns a run's current state. NotFoundError for an unknown id. */
    get(runId: string, opts?: CallOpts): Promise<Run>;
    /** list yields the tenant's runs, newest first, page after page. */
    list(opts?: ListOpts): AsyncIterable<Run>;
    /** cancel cancels a running run (an ended one is returned as it is). */
    cancel(runId: string, reason: string, opts?: CallOpts): Promise<Run>;
    /** continueRun adds addTokens to a run's budget (a top-up, or a BUDGET_EXHAUSTED run runs again). */
    continueRun(runId: string, addTokens: bigint | number, opts?: ContinueOpts): Promise<ContinueRunResponse>;
    /** fork starts a new run from a recorded one with changes; unchanged SUCCEEDED tasks are reused. */
    fork(runId: string, changes: ForkChanges, opts?: CallOpts & {
        idempotencyKey?: string;
        dryRun?: boolean;
    }): Promise<ForkRunResponse>;
    /** listApprovals yields the writes waiting for approval, oldest first (of one run when runId is given). */
    listApprovals(opts?: CallOpts & {
        runId?: string;
        pageSize?: number;
    }): AsyncIterable<PendingToolCall>;
    /** approve approves one waiting write. FailedPreconditionError when it was denied or expired. */
    approve(callId: string, reason?: string, opts?: CallOpts): Promise<ToolCallDecision>;
    /** deny denies one waiting write: it is never sent. */
    deny(callId: string, reason?: string, opts?: CallOpts): Promise<ToolCallDecision>;
    /** raw is the generated Connect client, for the RPCs this layer does not wrap; its calls send the same headers only if you pass them. */
    readonly raw: Client<typeof OrchestratorService>;
}
/**
 * createFanoutClient makes a client of the orchestrator at opts.baseUrl
 * (Connect over fetch) or over opts.transport.
 */
export declare function createFanoutClient(opts: FanoutClientOptions): FanoutClient;
