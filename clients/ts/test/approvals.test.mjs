// Approval runs: a watch cut mid-stream resumes by sequence, the approvals
// flow, and cancelling a run that waits for approval.

import { test } from "node:test";
import assert from "node:assert/strict";
import { toBinary } from "@bufbuild/protobuf";
import { RunEventSchema } from "../dist/gen/fanout/v1/run_pb.js";
import { FailedPreconditionError, RunState } from "../dist/index.js";
import { client, collect, control, eventually, fleet, spec, withTimeout } from "./fleet.mjs";

fleet();

test("a watch cut mid-stream resumes after the last sequence: no event lost or repeated", async () => {
  const c = client();
  const { runId } = await c.startRun(spec("approval.json"));
  const seen = [];
  const resumes = [];
  let cut = -1;
  let firstApproval = 0n;
  let approved = 0;
  await withTimeout(
    "the approval run's watch",
    (async () => {
      for await (const ev of c.watch(runId, { onResume: (r) => resumes.push(r) })) {
        seen.push(ev);
        if (ev.event.case !== "approvalRequested") continue;
        if (cut < 0) {
          firstApproval = ev.sequence;
          cut = Number(await control("/cut"));
        }
        await c.approve(ev.event.value.callId, "ts suite");
        approved++;
      }
    })(),
    40_000,
  );
  assert.ok(cut >= 1, `POST /cut cut ${cut} connections (the watch's at least)`);
  assert.ok(resumes.length >= 1, "the cut watch was opened again");
  assert.equal(resumes[0].error.code, "UNAVAILABLE", `the cut is the network, not the server: ${resumes[0].error.message}`);
  assert.ok(resumes[0].after >= firstApproval, `resumed after ${resumes[0].after}, at or past ${firstApproval}`);
  assert.equal(approved, 3, "three writes asked for approval");
  const last = seen.at(-1);
  assert.equal(last.event.case, "runFinished");
  assert.equal(last.event.value.state, RunState.SUCCEEDED);

  const full = await withTimeout("a full watch of the ended run", collect(c.watch(runId, { after: 0 })), 20_000);
  assert.deepEqual(
    seen.map((e) => e.sequence),
    full.map((e) => e.sequence),
    "the resumed watch saw the sequences of a full watch",
  );
  for (let i = 0; i < full.length; i++) {
    assert.deepEqual(toBinary(RunEventSchema, seen[i]), toBinary(RunEventSchema, full[i]), `event ${full[i].sequence}`);
  }
});

test("approvals: list the waiting writes, approve, deny", async () => {
  const c = client();
  const { runId } = await c.startRun(spec("approval.json"));
  const decided = new Map();
  const waiting = () =>
    eventually("a write waiting for approval", async () => {
      const calls = await collect(c.listApprovals({ runId, pageSize: 1 }));
      return calls.find((p) => !decided.has(p.callId));
    });

  const first = await waiting();
  assert.equal(first.runId, runId);
  assert.match(first.tool, /create_entities/);
  const yes = await c.approve(first.callId, "ts suite: yes");
  assert.equal(yes.approved, true);
  assert.equal(yes.callId, first.callId);
  decided.set(first.callId, true);
  assert.equal((await c.approve(first.callId)).approved, true, "approving again returns the recorded decision");

  const second = await waiting();
  const no = await c.deny(second.callId, "ts suite: no");
  assert.equal(no.approved, false);
  decided.set(second.callId, false);
  await assert.rejects(c.approve(second.callId), FailedPreconditionError, "a denied write cannot be approved");

  // After a denial the task may ask for its last write or not (the sim
  // model goes on without it); any further write is approved as it comes.
  const events = await withTimeout(
    "the approval run's end",
    (async () => {
      const out = [];
      for await (const ev of c.watch(runId)) {
        out.push(ev);
        if (ev.event.case === "approvalRequested" && !decided.has(ev.event.value.callId)) {
          assert.equal((await c.approve(ev.event.value.callId)).approved, true);
          decided.set(ev.event.value.callId, true);
        }
      }
      return out;
    })(),
    30_000,
  );
  const decisions = events.filter((e) => e.event.case === "approvalDecided").map((e) => e.event.value);
  assert.deepEqual(
    new Map(decisions.map((d) => [d.callId, d.approved])),
    decided,
    "the run's ApprovalDecided events are the decisions taken",
  );
  assert.equal(events.at(-1).event.case, "runFinished");
  assert.equal(events.at(-1).event.value.state, RunState.SUCCEEDED, "a denied write is the task's failure to reckon with, not the run's");
  assert.deepEqual(await collect(c.listApprovals({ runId })), [], "nothing waits once the run ended");
});

test("cancel ends a run that waits for approval", async () => {
  const c = client();
  const { runId } = await c.startRun(spec("approval.json"));
  await eventually("the run to wait for approval", async () => (await collect(c.listApprovals({ runId })))[0]);
  assert.equal((await c.get(runId)).state, RunState.RUNNING);

  await c.cancel(runId, "ts suite: cancel");
  const run = await eventually("the run to end CANCELLED", async () => {
    const r = await c.get(runId);
    return r.state === RunState.RUNNING ? undefined : r;
  });
  assert.equal(run.state, RunState.CANCELLED);
  assert.match(run.cancelCause, /ts suite: cancel/);
  const last = (await withTimeout("the cancelled run's watch", collect(c.watch(runId)), 20_000)).at(-1);
  assert.equal(last.event.case, "runFinished");
  assert.equal(last.event.value.state, RunState.CANCELLED);
  // Cancelling an ended run changes nothing.
  assert.equal((await c.cancel(runId, "again")).state, RunState.CANCELLED);
});
