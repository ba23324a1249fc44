// Unit tests of the run page's live updates (watch.ts): WatchRun resumed
// after the last sequence folded, with its backoff, until the run finishes
// or an error no retry can fix; the streams are scripted and the waits
// recorded, not slept.

import { test } from "node:test";
import assert from "node:assert/strict";
import { create } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import { WatchRunResponseSchema, type WatchRunResponse } from "../src/gen/fanout/v1/orchestrator_pb";
import { RunEventSchema, RunState, type RunEvent } from "../src/gen/fanout/v1/run_pb";
import { createRunStore } from "../src/runstore";
import { statusText, watch, type WatchEnd, type WatchStatus } from "../src/watch";
import { iteration } from "./events";

function continued(sequence: bigint): RunEvent {
  return create(RunEventSchema, {
    sequence,
    runId: "r1",
    time: timestampFromMs(Number(sequence)),
    event: { case: "runContinued", value: { continuation: 1, addedTokens: 100n, reopened: true, taskIds: ["t1"] } },
  });
}

function finished(sequence: bigint): RunEvent {
  return create(RunEventSchema, {
    sequence,
    runId: "r1",
    time: timestampFromMs(Number(sequence)),
    event: { case: "runFinished", value: { state: RunState.SUCCEEDED } },
  });
}

// A scripted stream: its events (undefined: a message without one), then
// the error it fails with, or a clean close.
interface Script {
  events: (RunEvent | undefined)[];
  fails?: Code;
}

async function* stream(s: Script): AsyncIterable<WatchRunResponse> {
  for (const e of s.events) yield create(WatchRunResponseSchema, e ? { event: e } : {});
  if (s.fails !== undefined) throw new ConnectError("scripted", s.fails);
}

interface Followed {
  end: WatchEnd;
  opened: bigint[]; // afterSequence of each open
  slept: number[]; // each backoff waited
  statuses: WatchStatus[];
  lastSequence: bigint;
  iterations: number;
}

// follow watches a run through the scripts, one per open, with a real
// store folding the events; onSleep runs at each wait (to abort in it).
async function follow(scripts: Script[], ctl = new AbortController(), onSleep?: () => void): Promise<Followed> {
  const store = createRunStore("r1", ctl.signal, () => undefined);
  const opened: bigint[] = [];
  const slept: number[] = [];
  const statuses: WatchStatus[] = [];
  const end = await watch({
    open: (after) => {
      opened.push(after);
      // Opened more often than scripted: leave (the end is "aborted").
      const s = scripts.shift();
      if (!s) ctl.abort();
      return stream(s ?? { events: [], fails: Code.Canceled });
    },
    after: () => store.view.lastSequence,
    event: (ev) => store.apply(ev),
    finished: () => store.view.finished,
    status: (s) => statuses.push(s),
    signal: ctl.signal,
    sleep: async (ms) => {
      slept.push(ms);
      onSleep?.();
    },
  });
  return { end, opened, slept, statuses, lastSequence: store.view.lastSequence, iterations: store.view.tasks[0]?.iterations ?? 0 };
}

test("a dropped or closed stream resumes after the last event folded; an event resets the backoff", async () => {
  const f = await follow([
    { events: [iteration(1n), undefined, iteration(2n)], fails: Code.Unavailable },
    { events: [], fails: Code.ResourceExhausted }, // a reader left behind
    { events: [] }, // closed before the run ended
    { events: [iteration(3n)], fails: Code.Internal },
    // A continued run: its first end, the continuation that reopened it,
    // its second end; the server ends the stream after the last.
    { events: [iteration(4n), finished(5n), continued(6n), iteration(7n), finished(8n)] },
  ]);
  assert.deepEqual(f.end, { kind: "finished" });
  assert.deepEqual(f.opened, [0n, 2n, 2n, 2n, 3n]);
  assert.deepEqual(f.slept, [500, 1000, 2000, 500]);
  assert.equal(f.lastSequence, 8n, "the stream is read to its end: a RunFinished followed by a RunContinued is not the last end");
  assert.equal(f.iterations, 7);
  assert.deepEqual(f.statuses.map(statusText), [
    "Watching…",
    "Stream dropped; resuming after event 2 in 500 ms.",
    "Resumed after event 2.",
    "Stream dropped; resuming after event 2 in 1.0 s.",
    "Resumed after event 2.",
    "Stream dropped; resuming after event 2 in 2.0 s.",
    "Resumed after event 2.",
    "Stream dropped; resuming after event 3 in 500 ms.",
    "Resumed after event 3.",
  ]);
});

test("the backoff doubles to 10 s; an error no retry can fix stops watching", async () => {
  const drops: Script[] = Array.from({ length: 7 }, () => ({ events: [], fails: Code.Unavailable }));
  const f = await follow([...drops, { events: [], fails: Code.NotFound }]);
  assert.deepEqual(f.slept, [500, 1000, 2000, 4000, 8000, 10_000, 10_000]);
  assert.equal(f.end.kind, "stopped");
  assert.equal(f.end.kind === "stopped" && f.end.error.code, Code.NotFound);
});

test("unauthenticated, permission denied, not found and invalid argument are final; others are retried", async () => {
  for (const code of [Code.Unauthenticated, Code.PermissionDenied, Code.NotFound, Code.InvalidArgument]) {
    const f = await follow([{ events: [iteration(1n)], fails: code }]);
    assert.equal(f.end.kind === "stopped" && f.end.error.code, code, Code[code]);
    assert.deepEqual(f.slept, [], Code[code]);
  }
  for (const code of [Code.Unavailable, Code.ResourceExhausted, Code.Internal, Code.Unknown, Code.DeadlineExceeded]) {
    const f = await follow([{ events: [], fails: code }, { events: [finished(1n)] }]);
    assert.deepEqual(f.end, { kind: "finished" }, Code[code]);
    assert.deepEqual(f.opened, [0n, 0n], Code[code]);
  }
});

test("leaving the page ends watching: while waiting, and on the stream's cancellation", async () => {
  const ctl = new AbortController();
  const waiting = await follow([{ events: [], fails: Code.Unavailable }], ctl, () => ctl.abort());
  assert.deepEqual(waiting.end, { kind: "aborted" });
  assert.deepEqual(waiting.opened, [0n]);
  const cancelled = await follow([{ events: [iteration(1n)], fails: Code.Canceled }]);
  assert.deepEqual(cancelled.end, { kind: "aborted" });
  assert.deepEqual(cancelled.slept, []);
});
