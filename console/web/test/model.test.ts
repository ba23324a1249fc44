// Unit tests of the pure parts: the run model folded from events, and the
// formatting helpers. Run by test.mjs (make console) with node's test runner.

import { test } from "node:test";
import assert from "node:assert/strict";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import {
  HedgeAttempt,
  RunEventSchema,
  RunSchema,
  RunSpecSchema,
  RunState,
  RunStateSchema,
  TaskStatus,
  type RunEvent,
} from "../src/gen/fanout/v1/run_pb";
import { applyEvent, newRunView, seedFromRun } from "../src/model";
import { enumName, enumText } from "../src/enums";
import { addDecimal } from "../src/format";

const T0 = Date.UTC(2026, 0, 1, 12, 0, 0);
let seq = 0n;

function ev(ms: number, event: MessageInitShape<typeof RunEventSchema>["event"]): RunEvent {
  seq += 1n;
  return create(RunEventSchema, { sequence: seq, runId: "r1", time: timestampFromMs(T0 + ms), event });
}

function started(): RunEvent {
  const spec = create(RunSpecSchema, { tasks: [{ id: "a" }, { id: "b" }] });
  return ev(0, { case: "runStarted", value: { run: create(RunSchema, { runId: "r1", state: RunState.RUNNING, spec }) } });
}

test("a run's events fold into its tasks' states, iterations, tokens and attempts", () => {
  seq = 0n;
  const v = newRunView("r1");
  for (const e of [
    started(),
    ev(1, { case: "taskQueued", value: { taskId: "a", dispatchIndex: 0 } }),
    ev(2, { case: "taskStarted", value: { taskId: "a", worker: "w1", forecastTokens: 900n } }),
    ev(3, { case: "taskIteration", value: { taskId: "a", iteration: 1, tokensSpent: 100n, toolCalls: 1 } }),
    ev(4, { case: "taskIteration", value: { taskId: "a", iteration: 2, tokensSpent: 250n, toolCalls: 0 } }),
    ev(5, { case: "taskFinished", value: { outcome: { taskId: "a", status: TaskStatus.SUCCEEDED, tokensSpent: 260n, worker: "w1", summary: { iterations: 2, status: TaskStatus.SUCCEEDED } } } }),
    ev(6, { case: "taskFinished", value: { outcome: { taskId: "b", dispatchIndex: 1, status: TaskStatus.NOT_STARTED } } }),
    ev(7, { case: "runFinished", value: { state: RunState.BUDGET_EXHAUSTED, cancelCause: "budget exhausted: 1 of 2 tasks not started, by forecast" } }),
  ]) {
    applyEvent(v, e);
  }
  const [a, b] = v.tasks;
  assert.equal(a?.id, "a");
  assert.equal(a?.status, TaskStatus.SUCCEEDED);
  assert.equal(a?.iterations, 2);
  assert.equal(a?.tokens, 260n);
  assert.equal(a?.attempts, 1);
  assert.equal(a?.worker, "w1");
  assert.equal(a?.segments.length, 2);
  assert.equal(a?.segments[0]?.toolCalls, 1);
  assert.equal(b?.status, TaskStatus.NOT_STARTED);
  assert.equal(v.state, RunState.BUDGET_EXHAUSTED);
  assert.ok(v.finished);
  assert.equal(v.lastSequence, 8n);
  // No BudgetExhausted event: the model does not derive the moment from a
  // task not started or the run's end (the engine sends the event for
  // every run whose budget ran out).
  assert.equal(v.exhaustedAt, undefined);
});

test("BudgetExhausted alone places the marker, and a replayed event counts once", () => {
  seq = 0n;
  const v = newRunView("r1");
  const events = [
    started(),
    ev(2, { case: "taskStarted", value: { taskId: "a", worker: "w1" } }),
    ev(3, { case: "taskIteration", value: { taskId: "a", iteration: 1, tokensSpent: 100n } }),
    ev(4, { case: "budgetUpdate", value: { budget: { limitTokens: 1000n, spentTokens: 800n, exhausted: true } } }),
    ev(5, { case: "taskFinished", value: { outcome: { taskId: "b", status: TaskStatus.NOT_STARTED } } }),
    ev(6, { case: "budgetExhausted", value: { budget: { limitTokens: 1000n, spentTokens: 900n, exhausted: true } } }),
    ev(7, { case: "runFinished", value: { state: RunState.BUDGET_EXHAUSTED } }),
  ];
  for (const e of events) applyEvent(v, e);
  applyEvent(v, events[2]!); // a duplicate after a resume
  applyEvent(v, events[5]!);
  assert.equal(v.tasks[0]?.segments.length, 1);
  // Not the snapshot that said exhausted, nor the task not started: the event.
  assert.equal(v.exhaustedAt?.getTime(), T0 + 6);
  assert.equal(v.budget?.spentTokens, 900n);
});

test("a re-dispatched task counts its attempts and restarts its iterations", () => {
  seq = 0n;
  const v = newRunView("r1");
  for (const e of [
    started(),
    ev(1, { case: "taskStarted", value: { taskId: "a", worker: "w1" } }),
    ev(2, { case: "taskIteration", value: { taskId: "a", iteration: 1, tokensSpent: 100n } }),
    ev(3, { case: "runAdopted", value: { adoptions: 1, resumedTaskIds: ["a", "b"] } }),
    ev(4, { case: "taskStarted", value: { taskId: "a", worker: "w2" } }),
  ]) {
    applyEvent(v, e);
  }
  assert.equal(v.tasks[0]?.attempts, 2);
  assert.equal(v.tasks[0]?.worker, "w2");
  assert.equal(v.tasks[0]?.iterations, 0);
  assert.equal(v.tasks[0]?.status, TaskStatus.RUNNING);
  assert.equal(v.adoptions, 1);
  assert.equal(v.exhaustedAt, undefined);
});

test("enum text is the name without its prefix, as the CLI prints it", () => {
  assert.equal(enumText(RunStateSchema, RunState.BUDGET_EXHAUSTED), "BUDGET_EXHAUSTED");
  assert.equal(enumName(RunStateSchema, RunState.BUDGET_EXHAUSTED), "RUN_STATE_BUDGET_EXHAUSTED");
  assert.equal(enumText(RunStateSchema, 99), "99");
});

test("costs add exactly", () => {
  assert.equal(addDecimal("0.10", "0.2"), "0.30");
  assert.equal(addDecimal("0", "0.000001"), "0.000001");
  assert.equal(addDecimal("12", "3"), "15");
  assert.equal(addDecimal("0.999", "0.001"), "1.000");
});

test("the concurrency chosen from the rate limits is the latest ConcurrencyChosen, seeded by GetRun", () => {
  seq = 0n;
  const v = newRunView("r1");
  applyEvent(v, started());
  assert.equal(v.concurrency, undefined);
  applyEvent(v, ev(1, { case: "concurrencyChosen", value: { concurrency: 14, reason: "14 = 600 RPM × 0.7 ÷ 60 s × 2.00 s per call (starting point) ÷ 1 run sharing the limit" } }));
  applyEvent(v, ev(2, { case: "concurrencyChosen", value: { concurrency: 7, previous: 14, runsSharing: 2, reason: "7 = 600 RPM × 0.7 ÷ 60 s × 2.00 s per call ÷ 2 runs sharing the limit" } }));
  assert.equal(v.concurrency?.concurrency, 7);
  assert.equal(v.concurrency?.previous, 14);
  assert.ok((v.concurrency?.reason ?? "").includes("2 runs sharing"));
  assert.equal(v.concurrencyChanges, 2);
  const fromGet = newRunView("r1");
  seedFromRun(fromGet, create(RunSchema, { runId: "r1", concurrency: { concurrency: 3, reason: "why" } }));
  assert.equal(fromGet.concurrency?.concurrency, 3);
});

test("a hedged task's TaskHedged and its outcome's hedge report fold into its view", () => {
  seq = 0n;
  const v = newRunView("r1");
  for (const e of [
    started(),
    ev(2, { case: "taskStarted", value: { taskId: "a", worker: "slow" } }),
    ev(500, {
      case: "taskHedged",
      value: { taskId: "a", worker: "10.0.0.2:7001", after: { seconds: 0n, nanos: 450_000_000 }, reason: "3 × the median 150ms of 3 tasks that answered" },
    }),
    ev(700, {
      case: "taskFinished",
      value: {
        outcome: {
          taskId: "a",
          status: TaskStatus.SUCCEEDED,
          tokensSpent: 390n,
          worker: "fast",
          hedge: { winner: HedgeAttempt.HEDGE, firstTokens: 267n, hedgeTokens: 123n, hedgeWorker: "fast" },
        },
      },
    }),
  ]) {
    applyEvent(v, e);
  }
  const a = v.tasks[0];
  assert.equal(a?.hedgedAt?.getTime(), T0 + 500);
  assert.equal(a?.hedged?.worker, "10.0.0.2:7001");
  assert.equal(a?.tokens, 390n);
  assert.equal(a?.outcome?.hedge?.winner, HedgeAttempt.HEDGE);
  assert.equal(a?.attempts, 1, "a hedge is not a re-dispatch: TaskStarted counts the attempts");
});

test("a RunContinued that reopens the run makes it run again for the tasks it names; the first exhaustion keeps its marker", () => {
  seq = 0n;
  const v = newRunView("r1");
  const events = [
    started(),
    ev(2, { case: "taskFinished", value: { outcome: { taskId: "a", status: TaskStatus.SUCCEEDED, tokensSpent: 500n } } }),
    ev(3, { case: "budgetExhausted", value: { budget: { limitTokens: 1000n, spentTokens: 500n } } }),
    ev(4, { case: "taskFinished", value: { outcome: { taskId: "b", status: TaskStatus.NOT_STARTED } } }),
    ev(5, { case: "runFinished", value: { state: RunState.BUDGET_EXHAUSTED, cancelCause: "by forecast" } }),
    ev(6, { case: "runContinued", value: { continuation: 1, addedTokens: 2000n, reopened: true, taskIds: ["b"] } }),
  ];
  for (const e of events) applyEvent(v, e);
  assert.equal(v.state, RunState.RUNNING);
  assert.ok(!v.finished);
  assert.equal(v.cause, "");
  assert.equal(v.continuations, 1);
  assert.equal(v.tasks.find((t) => t.id === "a")?.status, TaskStatus.SUCCEEDED);
  assert.equal(v.tasks.find((t) => t.id === "b")?.status, TaskStatus.PENDING);
  assert.equal(v.exhaustedAt?.getTime(), T0 + 3);
  applyEvent(v, ev(7, { case: "runFinished", value: { state: RunState.SUCCEEDED } }));
  assert.ok(v.finished);
  assert.equal(v.state, RunState.SUCCEEDED);
  // A top-up changes no state.
  const w = newRunView("r1");
  seq = 0n;
  applyEvent(w, started());
  applyEvent(w, ev(1, { case: "runContinued", value: { continuation: 1, addedTokens: 10n } }));
  assert.ok(!w.finished);
  assert.equal(w.state, RunState.RUNNING);
});
