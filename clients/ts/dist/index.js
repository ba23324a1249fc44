// @fanout/client: a small client of fanout's OrchestratorService over
// Connect (fetch: Node.js >= 20 and browsers). Every call sends the API key
// as a bearer token, throws a FanoutError on failure, and is retried on
// UNAVAILABLE only when the server makes it safe to retry (reads, the
// IDEMPOTENT RPCs, and the runs and forks that carry an idempotency key).
// Streams resume by sequence after a dropped connection.
import { create, fromJson, isMessage } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { OrchestratorService, } from "./gen/fanout/v1/orchestrator_pb.js";
import { RunSpecSchema, RunState } from "./gen/fanout/v1/run_pb.js";
import { FanoutError, fromConnectError, isDroppedConnection, newFanoutError } from "./errors.js";
export * from "./errors.js";
export { RunState, TaskStatus, RunSpecSchema } from "./gen/fanout/v1/run_pb.js";
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
export function createFanoutClient(opts) {
    if (!opts.transport && !opts.baseUrl)
        throw new TypeError("createFanoutClient: baseUrl or transport is required");
    // The key stays in this closure: not a property a log of the client prints.
    const apiKey = opts.apiKey ?? envApiKey();
    if (apiKey && !opts.transport && !opts.insecure && plaintextRemote(opts.baseUrl)) {
        throw new TypeError(`createFanoutClient: baseUrl ${opts.baseUrl} is http:// to a host that is not loopback, where the API key ` +
            "would cross the network in plaintext: use https://, or insecure: true for a proxy on that host that ends TLS");
    }
    const transport = opts.transport ?? createConnectTransport({ baseUrl: opts.baseUrl });
    const raw = createClient(OrchestratorService, transport);
    const secrets = apiKey ? [apiKey] : [];
    const headers = {};
    if (apiKey)
        headers["authorization"] = `Bearer ${apiKey}`;
    if (opts.tenant)
        headers["fanout-tenant-id"] = opts.tenant;
    // unary runs fn with the call's deadline and signal, retrying it on
    // UNAVAILABLE (the callers pass only calls that are safe to retry).
    async function unary(fn, o = {}) {
        const timeoutMs = o.timeoutMs ?? opts.timeoutMs;
        const deadline = timeoutMs === undefined ? undefined : Date.now() + timeoutMs;
        for (let attempt = 1;; attempt++) {
            const left = deadline === undefined ? undefined : deadline - Date.now();
            if (left !== undefined && left <= 0)
                throw newFanoutError("DEADLINE_EXCEEDED", `the call's ${timeoutMs} ms passed`);
            try {
                return await fn({ headers, signal: o.signal, timeoutMs: left });
            }
            catch (err) {
                const e = fromConnectError(err, secrets);
                if (e.code !== "UNAVAILABLE" || attempt >= RETRY_ATTEMPTS || o.signal?.aborted)
                    throw e;
                // A wait that would end past the deadline ends the call with its
                // cause, not with a DEADLINE_EXCEEDED that hides it.
                const wait = backoff(attempt);
                if (deadline !== undefined && Date.now() + wait >= deadline)
                    throw e;
                await sleep(wait, o.signal);
            }
        }
    }
    async function startRun(spec, o = {}) {
        const s = toRunSpec(spec);
        if (o.idempotencyKey)
            s.idempotencyKey = o.idempotencyKey;
        if (!s.idempotencyKey && !o.dryRun)
            s.idempotencyKey = newKey();
        return unary((c) => raw.startRun({ spec: s, dryRun: o.dryRun ?? false }, c), o);
    }
    async function* watch(runId, o = {}) {
        let after = BigInt(o.after ?? 0);
        for (let failures = 0;;) {
            try {
                const stream = raw.watchRun({ runId, afterSequence: after }, { headers, signal: o.signal });
                for await (const res of stream) {
                    const ev = res.event;
                    // The server sends no duplicate; this guards a resumed stream anyway.
                    if (!ev || ev.sequence <= after)
                        continue;
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
            }
            catch (err) {
                const e = fromConnectError(err, secrets);
                if (o.signal?.aborted || !resumable(e) || ++failures >= WATCH_ATTEMPTS)
                    throw e;
                o.onResume?.({ after, attempt: failures, error: e });
                await sleep(backoff(failures, WATCH_MAX_MS), o.signal);
            }
        }
    }
    async function* run(spec, o = {}) {
        const started = await startRun(spec, { ...o, dryRun: false });
        yield* watch(started.runId, { ...(o.signal ? { signal: o.signal } : {}), ...(o.onResume ? { onResume: o.onResume } : {}) });
    }
    async function* list(o = {}) {
        const state = runState(o.state);
        let pageToken = "";
        do {
            const res = await unary((c) => raw.listRuns({ pageSize: o.pageSize ?? 0, pageToken, state }, c), o);
            yield* res.runs;
            pageToken = res.nextPageToken;
        } while (pageToken);
    }
    async function* listApprovals(o = {}) {
        let pageToken = "";
        do {
            const res = await unary((c) => raw.listApprovals({ runId: o.runId ?? "", pageSize: o.pageSize ?? 0, pageToken }, c), o);
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
function envApiKey() {
    const p = globalThis.process;
    return p?.env?.["FANOUT_API_KEY"] || undefined;
}
// plaintextRemote reports whether baseUrl is http:// to a host other than
// loopback (127.0.0.0/8, ::1, localhost). A relative baseUrl (a browser's
// "/api") is read against the page's address.
function plaintextRemote(baseUrl) {
    const page = globalThis.location?.href;
    let u;
    try {
        u = new URL(baseUrl, page);
    }
    catch {
        return false; // not a URL: the transport's own error says so, without the key
    }
    if (u.protocol !== "http:")
        return false;
    const host = u.hostname.toLowerCase();
    return !(host === "localhost" || host === "[::1]" || /^127\.\d+\.\d+\.\d+$/.test(host));
}
// toRunSpec makes a RunSpec message of any RunSpecInput: a message is
// copied, a value with only JSON in it is read as protojson (the shape of
// examples/research.json), anything else (bigints, messages) as an init.
function toRunSpec(spec) {
    if (isMessage(spec, RunSpecSchema))
        return create(RunSpecSchema, spec);
    if (!isJson(spec))
        return create(RunSpecSchema, spec);
    try {
        return fromJson(RunSpecSchema, spec);
    }
    catch (err) {
        const why = err instanceof Error ? err.message : String(err);
        throw newFanoutError("INVALID_ARGUMENT", `spec is not a RunSpec in protojson: ${why}`, {
            fieldViolations: [{ field: "spec", description: why }],
        });
    }
}
// isJson reports whether v holds only what JSON.parse makes.
function isJson(v) {
    if (v === null || typeof v === "string" || typeof v === "boolean")
        return true;
    if (typeof v === "number")
        return Number.isFinite(v);
    if (Array.isArray(v))
        return v.every(isJson);
    if (typeof v !== "object" || Object.getPrototypeOf(v) !== Object.prototype)
        return false;
    if ("$typeName" in v)
        return false;
    return Object.values(v).every(isJson);
}
// runState reads a RunState given as the enum, "RUNNING" or "RUN_STATE_RUNNING".
function runState(s) {
    if (s === undefined || typeof s === "number")
        return s ?? RunState.UNSPECIFIED;
    const name = s.toUpperCase().replace(/^RUN_STATE_/, "");
    const v = RunState[name];
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
function resumable(e) {
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
function must(v, rpc, field) {
    if (v === undefined)
        throw newFanoutError("INTERNAL", `${rpc} answered without ${field}`);
    return v;
}
// newKey makes an idempotency key: 36 characters, under the 128 bytes allowed.
function newKey() {
    const c = globalThis.crypto;
    if (typeof c.randomUUID === "function")
        return c.randomUUID();
    const b = c.getRandomValues(new Uint8Array(16));
    return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}
// backoff is the wait before attempt+1: RETRY_MIN_MS doubling, capped, with
// half of it random so that clients cut together do not retry together.
function backoff(attempt, maxMs = RETRY_MAX_MS) {
    const ms = Math.min(RETRY_MIN_MS * 2 ** (attempt - 1), maxMs);
    return ms / 2 + Math.random() * (ms / 2);
}
// sleep waits ms, or rejects with a CANCELLED FanoutError when signal aborts.
function sleep(ms, signal) {
    return new Promise((resolve, reject) => {
        if (signal?.aborted)
            return reject(newFanoutError("CANCELLED", "the call's signal aborted"));
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
