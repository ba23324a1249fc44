// Keys (a revoked key, its open watch) and TLS to o2 with the test CA.

import { test } from "node:test";
import assert from "node:assert/strict";
import { createFanoutClient, FanoutError, PermissionDeniedError, RunState, UnauthenticatedError } from "../dist/index.js";
import { createNodeTransport } from "../dist/node.js";
import { client, collect, control, eventually, fleet, spec, withTimeout } from "./fleet.mjs";

const env = fleet();

test("a revoked key is refused UNAUTHENTICATED and its open watch ends", async () => {
  const owner = client();
  const token = await control("/key", "run,read");
  const k = client({ apiKey: token });
  const { runId } = await k.startRun(spec("approval.json"));
  try {
    await assert.rejects(k.cancel(runId, "no scope cancel"), PermissionDeniedError, "a key without scope cancel");
    const it = k.watch(runId)[Symbol.asyncIterator]();
    assert.equal((await it.next()).value.event.case, "runStarted", "the watch is open");
    const ended = (async () => {
      try {
        while (!(await it.next()).done);
        return "the stream ended with OK";
      } catch (e) {
        return e;
      }
    })();

    await control("/revoke", token);
    const refused = await eventually("the revoked key to be refused", async () => {
      try {
        await k.get(runId);
        return undefined;
      } catch (e) {
        if (e instanceof UnauthenticatedError) return e;
        throw e;
      }
    }, 5_000);
    assert.equal(refused.code, "UNAUTHENTICATED");
    assert.ok(!refused.message.includes(token) && !String(refused.stack).includes(token), "the error does not hold the key");

    const end = await withTimeout("the revoked key's open watch", ended, 10_000);
    assert.ok(end instanceof UnauthenticatedError, `the open watch ended UNAUTHENTICATED, not: ${end}`);
    assert.ok(!end.message.includes(token), "the watch's error does not hold the key");
  } finally {
    await owner.cancel(runId, "ts suite: revoked key test over");
  }
});

test("TLS to o2 with the test CA (Connect over HTTPS and gRPC), and gRPC in plaintext to o1", async () => {
  const c = createFanoutClient({
    transport: createNodeTransport({ baseUrl: env.FANOUT_TLS_HTTP_URL, caFile: env.FANOUT_TLS_CA }),
  });
  const events = await withTimeout("run(quick.json) over TLS", collect(c.run(spec("quick.json"))), 20_000);
  const last = events.at(-1);
  assert.equal(last.event.case, "runFinished");
  assert.equal(last.event.value.state, RunState.SUCCEEDED);
  assert.equal((await c.get(last.runId)).state, RunState.SUCCEEDED);

  const plain = createFanoutClient({
    transport: createNodeTransport({ baseUrl: `http://${env.FANOUT_ADDR}`, protocol: "grpc" }),
  });
  assert.equal((await plain.get(last.runId)).state, RunState.SUCCEEDED, "gRPC in plaintext to o1 through the proxy");

  const grpc = createFanoutClient({
    transport: createNodeTransport({ baseUrl: `https://${env.FANOUT_TLS_ADDR}`, caFile: env.FANOUT_TLS_CA, protocol: "grpc" }),
  });
  assert.equal((await grpc.get(last.runId)).state, RunState.SUCCEEDED);

  // Without the CA the server's certificate is not trusted.
  const untrusting = createFanoutClient({ transport: createNodeTransport({ baseUrl: env.FANOUT_TLS_HTTP_URL }) });
  await assert.rejects(untrusting.get(last.runId, { timeoutMs: 5_000 }), (e) => {
    assert.ok(e instanceof FanoutError, `${e}`);
    assert.match(e.message, /certificate|self.signed|issuer/i);
    return true;
  });
});
