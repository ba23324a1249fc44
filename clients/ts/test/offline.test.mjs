// What the client decides by itself, over a fake transport (no fleet): the
// plaintext-key check, which failures are the network, retries within the
// deadline, gaps in a watch, and redaction of the error's details.

import { test } from "node:test";
import assert from "node:assert/strict";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { createFanoutClient, FanoutError } from "../dist/index.js";
import { GetRunResponseSchema, WatchRunResponseSchema } from "../dist/gen/fanout/v1/orchestrator_pb.js";
import { RunEventSchema } from "../dist/gen/fanout/v1/run_pb.js";
import { BadRequestSchema, ErrorInfoSchema, QuotaFailureSchema } from "../dist/gen/google/rpc/error_details_pb.js";

const KEY = "fo_offline_test_key_0123456789";

// fakeTransport answers every unary call with unary() (a message, or it
// throws) and every stream with the messages stream() yields, counting the calls.
function fakeTransport({ unary, stream }) {
  const calls = { unary: 0, stream: 0 };
  const transport = {
    async unary(method) {
      calls.unary++;
      const message = await unary(calls.unary);
      return { stream: false, service: method.parent, method, header: new Headers(), trailer: new Headers(), message };
    },
    async stream(method) {
      calls.stream++;
      const message = stream(calls.stream);
      return { stream: true, service: method.parent, method, header: new Headers(), trailer: new Headers(), message };
    },
  };
  return { transport, calls };
}

// socketError is an error as undici and node's net give one: a code.
function socketError(code) {
  return Object.assign(new Error(`socket: ${code}`), { code });
}

function event(sequence) {
  return create(WatchRunResponseSchema, { event: create(RunEventSchema, { runId: "r1", sequence: BigInt(sequence) }) });
}

test("a key over http:// to a host that is not loopback is refused, naming the URL and never the key", () => {
  assert.throws(
    () => createFanoutClient({ baseUrl: "http://10.0.0.1:8080", apiKey: KEY }),
    (e) => {
      assert.ok(e instanceof TypeError, `${e}`);
      assert.match(e.message, /http:\/\/10\.0\.0\.1:8080/);
      assert.ok(!e.message.includes(KEY), "the message does not hold the key");
      return true;
    },
  );
  assert.doesNotThrow(() => createFanoutClient({ baseUrl: "http://10.0.0.1:8080", apiKey: KEY, insecure: true }));
  for (const baseUrl of ["http://127.0.0.1:8080", "http://127.3.2.1", "http://localhost:8080", "http://[::1]:8080", "https://fanout.example.com", "https://10.0.0.1:8443"]) {
    assert.doesNotThrow(() => createFanoutClient({ baseUrl, apiKey: KEY }), baseUrl);
  }
  assert.doesNotThrow(() => createFanoutClient({ baseUrl: "http://10.0.0.1:8080", apiKey: "", tenant: "t" }), "no key, nothing to leak");
});
