// @fanout/client: a small client of fanout's OrchestratorService over
// Connect (fetch: Node.js >= 20 and browsers). Every call sends the API key
// as a bearer token, throws a FanoutError on failure, and is retried on
// UNAVAILABLE only when the server makes it safe to retry (reads, the
// IDEMPOTENT RPCs, and the runs and forks that carry an idempotency key).
// Streams resume by sequence after a dropped connection.

import { create, fromJson, isMessage, type JsonObject, type MessageInitShape } from "@bufbuild/protobuf";
import { createClient, type CallOptions, type Client, type Transport } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import {
  OrchestratorService,
  type ContinueRunResponse,
  type ForkRunRequestSchema,
  type ForkRunResponse,
  type PendingToolCall,
  type StartRunResponse,
  type ToolCallDecision,
} from "./gen/fanout/v1/orchestrator_pb.js";
import { RunSpecSchema, RunState, type Run, type RunEvent, type RunSpec } from "./gen/fanout/v1/run_pb.js";
import { FanoutError, fromConnectError, isDroppedConnection, newFanoutError } from "./errors.js";

export * from "./errors.js";
export { RunState, TaskStatus, RunSpecSchema } from "./gen/fanout/v1/run_pb.js";
export type { Run, RunEvent, RunSpec, TaskSpec, TaskOutcome, JoinedResult, Fact } from "./gen/fanout/v1/run_pb.js";
export type {
  ContinueRunResponse,
  ForkRunResponse,
  PendingToolCall,
  Quote,
  StartRunResponse,
  ToolCallDecision,
} from "./gen/fanout/v1/orchestrator_pb.js";

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
  onResume?: (info: { after: bigint; attempt: number; error: FanoutError }) => void;
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
  fork(runId: string, changes: ForkChanges, opts?: CallOpts & { idempotencyKey?: string; dryRun?: boolean }): Promise<ForkRunResponse>;
  /** listApprovals yields the writes waiting for approval, oldest first (of one run when runId is given). */
  listApprovals(opts?: CallOpts & { runId?: string; pageSize?: number }): AsyncIterable<PendingToolCall>;
  /** approve approves one waiting write. FailedPreconditionError when it was denied or expired. */
  approve(callId: string, reason?: string, opts?: CallOpts): Promise<ToolCallDecision>;
  /** deny denies one waiting write: it is never sent. */
  deny(callId: string, reason?: string, opts?: CallOpts): Promise<ToolCallDecision>;
  /** raw is the generated Connect client, for the RPCs this layer does not wrap; its calls send the same headers only if you pass them. */
  readonly raw: Client<typeof OrchestratorService>;
}

// Retries of a call found UNAVAILABLE: at most this many attempts, waiting
// RETRY_MIN_MS doubling up to RETRY_MAX_MS (with jitter) between them.
const RETRY_ATTEMPTS = 5;
const RETRY_MIN_MS = 100;
const RETRY_MAX_MS = 2_000;
// watch opens the stream again this many times in a row without an event
// before it gives up, waiting up to WATCH_MAX_MS between them: about 10 to
// 20 s of an unreachable server (a load balancer's restart).
const WATCH_ATTEMPTS = 10;
const WATCH_MAX_MS = 5_000;

/**
 * createFanoutClient makes a client of the orchestrator at opts.baseUrl
 * (Connect over fetch) or over opts.transport.
 */
export function createFanoutClient(opts: FanoutClientOptions): FanoutClient {
  if (!opts.transport && !opts.baseUrl) throw new TypeError("createFanoutClient: baseUrl or transport is required");
  // The key stays in this closure: not a property a log of the client prints.
  const apiKey = opts.apiKey ?? envApiKey();
  if (apiKey && !opts.transport && !opts.insecure && plaintextRemote(opts.baseUrl!)) {
    throw new TypeError(
      `createFanoutClient: baseUrl ${opts.baseUrl} is http:// to a host that is not loopback, where the API key ` +
        "would cross the network in plaintext: use https://, or insecure: true for a proxy on that host that ends TLS",
    );
  }
  const transport = opts.transport ?? createConnectTransport({ baseUrl: opts.baseUrl! });
  const raw = createClient(OrchestratorService, transport);
  const secrets = apiKey ? [apiKey] : [];
  const headers: Record<string, string> = {};
  if (apiKey) headers["authorization"] = `Bearer ${apiKey}`;
  if (opts.tenant) headers["fanout-tenant-id"] = opts.tenant;

  // unary runs fn with the call's deadline and signal, retrying it on
  // UNAVAILABLE (the callers pass only calls that are safe to retry).
  async function unary<T>(fn: (o: CallOptions) => Promise<T>, o: CallOpts = {}): Promise<T> {
    const timeoutMs = o.timeoutMs ?? opts.timeoutMs;
    const deadline = timeoutMs === undefined ? undefined : Date.now() + timeoutMs;
    for (let attempt = 1; ; attempt++) {
      const left = deadline === undefined ? undefined : deadline - Date.now();
      if (left !== undefined && left <= 0) throw newFanoutError("DEADLINE_EXCEEDED", `the call's ${timeoutMs} ms passed`);
      try {
        return await fn({ headers, signal: o.signal, timeoutMs: left });
      } catch (err) {
        const e = fromConnectError(err, secrets);
        if (e.code !== "UNAVAILABLE" || attempt >= RETRY_ATTEMPTS || o.signal?.aborted) throw e;
        // A wait that would end past the deadline ends the call with its
        // cause, not with a DEADLINE_EXCEEDED that hides it.
        const wait = backoff(attempt);
        if (deadline !== undefined && Date.now() + wait >= deadline) throw e;
        await sleep(wait, o.signal);
      }
    }
  }

  async function startRun(spec: RunSpecInput, o: StartRunOpts = {}): Promise<StartRunResponse> {
    const s = toRunSpec(spec);
    if (o.idempotencyKey) s.idempotencyKey = o.idempotencyKey;
    if (!s.idempotencyKey && !o.dryRun) s.idempotencyKey = newKey();
    return unary((c) => raw.startRun({ spec: s, dryRun: o.dryRun ?? false }, c), o);
  }

  async function* watch(runId: string, o: WatchOpts = {}): AsyncGenerator<RunEvent> {
    let after = BigInt(o.after ?? 0);
    for (let failures = 0; ; ) {
      try {
        const stream = raw.watchRun({ runId, afterSequence: after }, { headers, signal: o.signal });
        for await (const res of stream) {
          const ev = res.event;
          // The server sends no duplicate; this guards a resumed stream anyway.
          if (!ev || ev.sequence <= after) continue;
          // Sequences are consecutive: a jump means events were lost, which
          // the caller must hear of rather than read on past.
          if (ev.sequence !== after + 1n) {
            throw newFanoutError("DATA_LOSS", `run ${runId}: event sequence ${ev.sequence} after ${after}: a gap in the stream`);
          }
          after = ev.sequence;
          failures = 0;
          yield ev;
        }
        return;
      } catch (err) {
        const e = fromConnectError(err, secrets);
        if (o.signal?.aborted || !resumable(e) || ++failures >= WATCH_ATTEMPTS) throw e;
        o.onResume?.({ after, attempt: failures, error: e });
        await sleep(backoff(failures, WATCH_MAX_MS), o.signal);
      }
    }
  }

  async function* run(spec: RunSpecInput, o: StartRunOpts & Pick<WatchOpts, "onResume"> = {}): AsyncGenerator<RunEvent> {
    const started = await startRun(spec, { ...o, dryRun: false });
    yield* watch(started.runId, { ...(o.signal ? { signal: o.signal } : {}), ...(o.onResume ? { onResume: o.onResume } : {}) });
  }

  async function* list(o: ListOpts = {}): AsyncGenerator<Run> {
    const state = runState(o.state);
    let pageToken = "";
    do {
      const res = await unary((c) => raw.listRuns({ pageSize: o.pageSize ?? 0, pageToken, state }, c), o);
      yield* res.runs;
      pageToken = res.nextPageToken;
    } while (pageToken);
  }

  async function* listApprovals(o: CallOpts & { runId?: string; pageSize?: number } = {}): AsyncGenerator<PendingToolCall> {
    let pageToken = "";
    do {
      const res = await unary(
        (c) => raw.listApprovals({ runId: o.runId ?? "", pageSize: o.pageSize ?? 0, pageToken }, c),
        o,
      );
      yield* res.calls;
      pageToken = res.nextPageToken;
    } while (pageToken);
  }

  return {
    startRun,
    run,
    watch,
    list,
    listApprovals,
    raw,
    async get(runId, o) {
      return must((await unary((c) => raw.getRun({ runId }, c), o)).run, "GetRun", "run");
    },
    async cancel(runId, reason, o) {
      return must((await unary((c) => raw.cancelRun({ runId, reason }, c), o)).run, "CancelRun", "run");
    },
    async continueRun(runId, addTokens, o = {}) {
      const req = {
        runId,
        addTokens: BigInt(addTokens),
        idempotencyKey: o.idempotencyKey || newKey(),
        reason: o.reason ?? "",
        dryRun: o.dryRun ?? false,
      };
      return unary((c) => raw.continueRun(req, c), o);
    },
    async fork(runId, changes, o = {}) {
      const req = { ...changes, runId, idempotencyKey: o.idempotencyKey || newKey(), dryRun: o.dryRun ?? changes.dryRun ?? false };
      return unary((c) => raw.forkRun(req, c), o);
    },
    async approve(callId, reason = "", o) {
      return must((await unary((c) => raw.approveToolCall({ callId, reason }, c), o)).decision, "ApproveToolCall", "decision");
    },
    async deny(callId, reason = "", o) {
      return must((await unary((c) => raw.denyToolCall({ callId, reason }, c), o)).decision, "DenyToolCall", "decision");
    },
  };
}

// envApiKey is FANOUT_API_KEY under Node.js (never read in a browser,
// which has no process).
function envApiKey(): string | undefined {
  const p = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
  return p?.env?.["FANOUT_API_KEY"] || undefined;
}

// plaintextRemote reports whether baseUrl is http:// to a host other than
// loopback (127.0.0.0/8, ::1, localhost). A relative baseUrl (a browser's
// "/api") is read against the page's address.
function plaintextRemote(baseUrl: string): boolean {
  const page = (globalThis as { location?: { href?: string } }).location?.href;
  let u: URL;
  try {
    u = new URL(baseUrl, page);
  } catch {
    return false; // not a URL: the transport's own error says so, without the key
  }
  if (u.protocol !== "http:") return false;
  const host = u.hostname.toLowerCase();
  return !(host === "localhost" || host === "[::1]" || /^127\.\d+\.\d+\.\d+$/.test(host));
}

// toRunSpec makes a RunSpec message of any RunSpecInput: a message is
// copied, a value with only JSON in it is read as protojson (the shape of
// examples/research.json), anything else (bigints, messages) as an init.
function toRunSpec(spec: RunSpecInput): RunSpec {
  if (isMessage(spec, RunSpecSchema)) return create(RunSpecSchema, spec);
  if (!isJson(spec)) return create(RunSpecSchema, spec as MessageInitShape<typeof RunSpecSchema>);
  try {
    return fromJson(RunSpecSchema, spec as JsonObject);
  } catch (err) {
    const why = err instanceof Error ? err.message : String(err);
    throw newFanoutError("INVALID_ARGUMENT", `spec is not a RunSpec in protojson: ${why}`, {
      fieldViolations: [{ field: "spec", description: why }],
    });
  }
}

// isJson reports whether v holds only what JSON.parse makes.
function isJson(v: unknown): boolean {
  if (v === null || typeof v === "string" || typeof v === "boolean") return true;
  if (typeof v === "number") return Number.isFinite(v);
  if (Array.isArray(v)) return v.every(isJson);
  if (typeof v !== "object" || Object.getPrototypeOf(v) !== Object.prototype) return false;
  if ("$typeName" in (v as object)) return false;
  return Object.values(v as object).every(isJson);
}

// runState reads a RunState given as the enum, "RUNNING" or "RUN_STATE_RUNNING".
function runState(s: RunState | string | undefined): RunState {
  if (s === undefined || typeof s === "number") return s ?? RunState.UNSPECIFIED;
  const name = s.toUpperCase().replace(/^RUN_STATE_/, "");
  const v = (RunState as unknown as Record<string, RunState>)[name];
  if (v === undefined) {
    throw newFanoutError("INVALID_ARGUMENT", `state: no run state ${JSON.stringify(s)}`, {
      fieldViolations: [{ field: "state", description: `no run state ${JSON.stringify(s)}` }],
    });
  }
  return v;
}

// resumable reports whether watching again may help: the server could not
// be reached or the connection dropped (UNAVAILABLE), an HTTP/2 stream was
// reset under the watch (INTERNAL, isDroppedConnection), or the reader fell
// behind (RESOURCE_EXHAUSTED WATCH_READER_BEHIND). The server's own
// INTERNAL or UNKNOWN is not resumed: it would fail the same way again.
function resumable(e: FanoutError): boolean {
  switch (e.code) {
    case "UNAVAILABLE":
      return true;
    case "INTERNAL":
    case "UNKNOWN":
      return isDroppedConnection(e);
    case "RESOURCE_EXHAUSTED":
      return e.reason?.reason === "WATCH_READER_BEHIND";
    default:
      return false;
  }
}

function must<T>(v: T | undefined, rpc: string, field: string): T {
  if (v === undefined) throw newFanoutError("INTERNAL", `${rpc} answered without ${field}`);
  return v;
}

// newKey makes an idempotency key: 36 characters, under the 128 bytes allowed.
function newKey(): string {
  const c = globalThis.crypto;
  if (typeof c.randomUUID === "function") return c.randomUUID();
  const b = c.getRandomValues(new Uint8Array(16));
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

// backoff is the wait before attempt+1: RETRY_MIN_MS doubling, capped, with
// half of it random so that clients cut together do not retry together.
function backoff(attempt: number, maxMs = RETRY_MAX_MS): number {
  const ms = Math.min(RETRY_MIN_MS * 2 ** (attempt - 1), maxMs);
  return ms / 2 + Math.random() * (ms / 2);
}

// sleep waits ms, or rejects with a CANCELLED FanoutError when signal aborts.
function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(newFanoutError("CANCELLED", "the call's signal aborted"));
    const onAbort = () => {
      clearTimeout(t);
      reject(newFanoutError("CANCELLED", "the call's signal aborted"));
    };
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

