// Unit tests of paging a large run's rest (paging.ts) and of folding its
// pages into the run page's model (model.ts seedTasks).

import { test } from "node:test";
import assert from "node:assert/strict";
import { create } from "@bufbuild/protobuf";
import { ListRunFactsResponseSchema, ListRunTasksResponseSchema } from "../src/gen/fanout/v1/orchestrator_pb";
import { JoinedResultSchema, RunSchema, TaskStatus, type Fact, type TaskOutcome } from "../src/gen/fanout/v1/run_pb";
import { completeRun, type Pager } from "../src/paging";
import { newRunView, seedFromRun, seedTasks } from "../src/model";

const N = 2500;
const tasks: TaskOutcome[] = Array.from({ length: N }, (_, i) =>
  create(RunSchema, { tasks: [{ taskId: `t${i}`, dispatchIndex: i, status: TaskStatus.SUCCEEDED }] }).tasks[0]!,
);
const facts: Fact[] = create(JoinedResultSchema, { facts: Array.from({ length: 3 * N }, (_, i) => ({ text: `fact ${i}` })) }).facts;

// A server that pages 700 items at a time from a token holding the next index.
function server(calls: string[]): Pager {
  const page = <T>(all: T[], token: string): [T[], string] => {
    const from = Number(token);
    const next = from + 700;
    return [all.slice(from, next), next < all.length ? String(next) : ""];
  };
  return {
    async listRunTasks(req) {
      calls.push(`tasks ${req.pageToken}`);
      const [p, next] = page(tasks, req.pageToken);
      return create(ListRunTasksResponseSchema, { tasks: p, nextPageToken: next, taskCount: N });
    },
    async listRunFacts(req) {
      calls.push(`facts ${req.pageToken}`);
      const [p, next] = page(facts, req.pageToken);
      return create(ListRunFactsResponseSchema, { facts: p, nextPageToken: next, factCount: facts.length });
    },
  };
}

test("a run cut to fit is completed from its page tokens: every task and fact once, in order", async () => {
  const run = create(RunSchema, {
    runId: "r1",
    tasks: tasks.slice(0, 300),
    taskCount: N,
    tasksNextPageToken: "300",
    result: { tasks: tasks.slice(0, 100), taskCount: N, tasksNextPageToken: "100", facts: facts.slice(0, 50), factCount: facts.length, factsNextPageToken: "50" },
  });
  const calls: string[] = [];
  await completeRun(server(calls), run);
  assert.deepEqual(run.tasks.map((t) => t.dispatchIndex), tasks.map((_, i) => i));
  assert.deepEqual(run.result?.tasks.map((t) => t.taskId), tasks.map((t) => t.taskId));
  assert.deepEqual(run.result?.facts.map((f) => f.text), facts.map((f) => f.text));
  assert.equal(run.tasksNextPageToken, "");
  assert.equal(run.result?.factsNextPageToken, "");
  assert.ok(calls.includes("tasks 300") && calls.includes("facts 50"), calls.join(", "));
});

test("a whole run asks for no page", async () => {
  const run = create(RunSchema, { runId: "r1", tasks: tasks.slice(0, 3), taskCount: 3, result: { facts: facts.slice(0, 2), factCount: 2 } });
  const calls: string[] = [];
  await completeRun(server(calls), run);
  assert.deepEqual(calls, []);
  assert.equal(run.tasks.length, 3);
});

test("an empty page with a token is an error, not a loop", async () => {
  const stuck: Pager = {
    async listRunTasks() {
      return create(ListRunTasksResponseSchema, { nextPageToken: "again" });
    },
    async listRunFacts() {
      return create(ListRunFactsResponseSchema, {});
    },
  };
  let err: unknown;
  try {
    await completeRun(stuck, create(RunSchema, { runId: "r1", tasksNextPageToken: "x" }));
  } catch (e) {
    err = e;
  }
  assert.ok(err instanceof Error && /empty page/.test(err.message), String(err));
});

test("a large RunStarted's first tasks and the rest by page make every task row, in dispatch order", () => {
  const v = newRunView("r1");
  const pending = tasks.map((t) => ({ ...t, status: TaskStatus.PENDING }));
  seedFromRun(v, create(RunSchema, { runId: "r1", tasks: pending.slice(0, 300), taskCount: N }));
  assert.equal(v.tasks.length, 300);
  seedTasks(v, tasks.slice(200)); // pages overlap what it has: nothing twice
  assert.equal(v.tasks.length, N);
  assert.deepEqual(v.tasks.map((t) => t.dispatchIndex), tasks.map((_, i) => i));
  assert.equal(v.tasks[N - 1]?.status, TaskStatus.SUCCEEDED);
  assert.equal(v.tasks[0]?.status, TaskStatus.PENDING);
});
