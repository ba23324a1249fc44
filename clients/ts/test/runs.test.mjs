// Starting, streaming, reading and listing runs; bad input; deadlines.

import { test } from "node:test";
import assert from "node:assert/strict";
import {
  DeadlineExceededError,
  FanoutError,
  InvalidArgumentError,
  NotFoundError,
  RunState,
} from "../dist/index.js";
import { createConnectTransport } from "@connectrpc/connect-web";
import { createFanoutClient } from "../dist/index.js";
import { client, collect, fleet, spec, withTimeout } from "./fleet.mjs";

const env = fleet();

test("run starts a run and streams it to its RunFinished; get reads it", async () => {
  const c = client();
  const events = await withTimeout("run(quick.json)", collect(c.run(spec("quick.json"))), 20_000);
  assert.equal(events[0].event.case, "runStarted");
  const last = events.at(-1);
  assert.equal(last.event.case, "runFinished");
  assert.equal(last.event.value.state, RunState.SUCCEEDED);
  for (let i = 1; i < events.length; i++) {
    assert.equal(events[i].sequence, events[i - 1].sequence + 1n, `event ${i} follows event ${i - 1}`);
  }
  const run = await c.get(last.runId);
  assert.equal(run.runId, last.runId);
  assert.equal(run.state, RunState.SUCCEEDED);
  assert.equal(run.taskCount, 3);
  assert.ok(run.result && run.result.facts.length > 0, "the run's result has facts");
});

test("startRun is idempotent by key, and makes a key when the spec has none", async () => {
  const c = client();
  const s = spec("quick.json");
  const a = await c.startRun(s);
  const b = await c.startRun(s);
  assert.ok(a.runId);
  assert.equal(b.runId, a.runId, "the same idempotency key joins the same run");

  const keyless = spec("quick.json");
  delete keyless.idempotencyKey;
  const k = await c.startRun(keyless);
  const run = await c.get(k.runId);
  assert.match(run.idempotencyKey, /^[0-9a-f-]{36}$/, "a generated idempotency key");

  const dry = await c.startRun(spec("quick.json"), { dryRun: true });
  assert.equal(dry.runId, "", "a dry run starts nothing");
  assert.ok(dry.quote && dry.quote.tasks.length === 3, "a dry run is quoted");
});

test("startRun retries a lost answer with its generated idempotency key, joining the run the first try started", async () => {
  const keys = [];
  let firstRunId = "";
  // A fetch that delivers the first StartRun to the server, then loses
  // its answer as a dropped connection does.
  const lossy = async (url, init) => {
    if (!String(url).endsWith("/StartRun")) return fetch(url, init);
    const body = typeof init.body === "string" ? init.body : new TextDecoder().decode(init.body);
    keys.push(JSON.parse(body).spec.idempotencyKey);
    if (keys.length > 1) return fetch(url, init);
    firstRunId = (await (await fetch(url, init)).json()).runId;
    throw new TypeError("fetch failed");
  };
  const c = createFanoutClient({ transport: createConnectTransport({ baseUrl: env.FANOUT_HTTP_URL, fetch: lossy }) });
  const s = spec("quick.json");
  delete s.idempotencyKey;
  const started = await c.startRun(s);
  assert.equal(keys.length, 2, "one retry");
  assert.ok(keys[0], "a key was made");
  assert.equal(keys[1], keys[0], "the retry sent the same key");
  assert.ok(firstRunId, "the first try started a run");
  assert.equal(started.runId, firstRunId, "the retry joined the run the first try started");
});

test("list follows page tokens across several runs, newest first, filtered by state", async () => {
  const c = client();
  const ids = [];
  for (let i = 0; i < 3; i++) ids.push((await c.startRun(spec("quick.json"))).runId);
  for (const id of ids) await withTimeout(`run ${id} to end`, collect(c.watch(id)), 20_000);

  const seen = [];
  for await (const run of c.list({ pageSize: 2, state: "SUCCEEDED" })) {
    assert.equal(run.state, RunState.SUCCEEDED, `run ${run.runId} is SUCCEEDED`);
    seen.push(run.runId);
    if (ids.every((id) => seen.includes(id))) break;
  }
  assert.deepEqual(
    ids.filter((id) => !seen.includes(id)),
    [],
    "every run started is listed (pages of 2 hold them only if the iterator follows page tokens)",
  );
  assert.equal(new Set(seen).size, seen.length, "no run is listed twice");
  // Newest first: the last started is listed before the first.
  assert.ok(seen.indexOf(ids[2]) < seen.indexOf(ids[0]), "newest first");
});

test("bad input is an InvalidArgumentError naming the field", async () => {
  const c = client();
  const s = spec("quick.json");
  s.tasks[0].tokenBudget = "0";
  const err = await c.startRun(s).then(
    () => assert.fail("a task with tokenBudget 0 was accepted"),
    (e) => e,
  );
  assert.ok(err instanceof InvalidArgumentError, `${err}`);
  assert.ok(err instanceof FanoutError);
  assert.equal(err.code, "INVALID_ARGUMENT");
  assert.ok(
    err.fieldViolations.some((v) => v.field === "spec.tasks[0].token_budget" && v.description),
    `field violations name spec.tasks[0].token_budget: ${JSON.stringify(err.fieldViolations)}`,
  );
  assert.ok(!err.message.includes(env.FANOUT_API_KEY), "the message does not hold the key");

  await assert.rejects(c.get("no-such-run"), NotFoundError);
});

test("a call past its deadline is a DeadlineExceededError", async () => {
  const c = client();
  const { runId } = await c.startRun(spec("quick.json"));
  await assert.rejects(c.get(runId, { timeoutMs: 1 }), (e) => {
    assert.ok(e instanceof DeadlineExceededError, `${e}`);
    assert.equal(e.code, "DEADLINE_EXCEEDED");
    return true;
  });
  // The client's default deadline applies to every unary call.
  const hasty = client({ timeoutMs: 1 });
  await assert.rejects(hasty.get(runId), DeadlineExceededError);
  // A deadline that leaves room is met.
  assert.equal((await c.get(runId, { timeoutMs: 10_000 })).runId, runId);
});
