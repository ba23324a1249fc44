// Unit tests of the run page's store (runstore.ts): a burst of changes is
// drawn once, by the schedule; nothing is drawn after the page is left.

import { test } from "node:test";
import assert from "node:assert/strict";
import { create } from "@bufbuild/protobuf";
import { RunSchema, RunState, TaskStatus } from "../src/gen/fanout/v1/run_pb";
import type { RunView } from "../src/model";
import { createRunStore } from "../src/runstore";
import { iteration } from "./events";

// manual is a schedule that draws only when the test says.
function manual(): { schedule: (draw: () => void) => void; pending: () => number; run: () => void } {
  const queue: (() => void)[] = [];
  return {
    schedule: (draw) => void queue.push(draw),
    pending: () => queue.length,
    run: () => queue.splice(0).forEach((draw) => draw()),
  };
}

test("a burst of changes is folded at once and drawn once, in the order subscribed", () => {
  const m = manual();
  const store = createRunStore("r1", new AbortController().signal, m.schedule);
  const drawn: string[] = [];
  store.subscribe((v) => drawn.push(`first@${v.lastSequence}`));
  store.subscribe((v) => drawn.push(`second@${v.lastSequence}`));
  store.apply(iteration(1n));
  store.apply(iteration(2n));
  store.update((v) => {
    v.cause = "by hand";
  });
  assert.equal(store.view.lastSequence, 2n, "folded before it is drawn");
  assert.equal(store.view.tasks[0]?.tokens, 20n);
  assert.equal(store.view.cause, "by hand");
  assert.deepEqual(drawn, [], "drawn only when the schedule runs");
  assert.equal(m.pending(), 1, "one draw scheduled for the burst");
  m.run();
  assert.deepEqual(drawn, ["first@2", "second@2"]);
  store.changed();
  assert.equal(m.pending(), 1, "a change after a draw schedules another");
  m.run();
  assert.equal(drawn.length, 4);
});

test("seed fills the view from GetRun, flush draws at once, and an unsubscribed view is not drawn", () => {
  const m = manual();
  const store = createRunStore("r1", new AbortController().signal, m.schedule);
  const views: RunView[] = [];
  const stop = store.subscribe((v) => views.push(v));
  store.flush();
  assert.equal(views.length, 1, "flush draws without the schedule");
  store.seed(
    create(RunSchema, {
      runId: "r1",
      state: RunState.SUCCEEDED,
      tasks: [{ taskId: "a", status: TaskStatus.SUCCEEDED, tokensSpent: 5n }],
      result: { synthesis: "done" },
    }),
  );
  m.run();
  assert.equal(views.length, 2);
  assert.equal(views[1]?.state, RunState.SUCCEEDED);
  assert.ok(views[1]?.finished);
  assert.equal(views[1]?.result?.synthesis, "done");
  stop();
  store.changed();
  m.run();
  assert.equal(views.length, 2, "not drawn after unsubscribing");
});

test("nothing is drawn once the page's signal aborts", () => {
  const m = manual();
  const left = new AbortController();
  const store = createRunStore("r1", left.signal, m.schedule);
  let draws = 0;
  store.subscribe(() => draws++);
  store.apply(iteration(1n));
  left.abort();
  m.run();
  store.flush();
  assert.equal(draws, 0);
  assert.equal(store.view.lastSequence, 1n, "the view still folds");
});
