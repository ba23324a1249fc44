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

test("only fetch's own failures are UNAVAILABLE (and retried); a TypeError of another kind and a server's text keep UNKNOWN", async () => {
  const cases = [
    [new TypeError("fetch failed", { cause: socketError("ECONNREFUSED") }), "UNAVAILABLE", 2],
    [new TypeError("terminated", { cause: socketError("UND_ERR_SOCKET") }), "UNAVAILABLE", 2],
    [new Error("read", { cause: socketError("ECONNRESET") }), "UNAVAILABLE", 2],
    [new TypeError('Headers.append: "a\nb" is an invalid header value.'), "UNKNOWN", 1],
    [new ConnectError("network socket terminated by the upstream", Code.Unknown), "UNKNOWN", 1],
    [new ConnectError("internal error", Code.Internal), "INTERNAL", 1],
  ];
  for (const [thrown, code, attempts] of cases) {
    const { transport, calls } = fakeTransport({
      unary: (n) => {
        if (n === 1) throw thrown;
        return create(GetRunResponseSchema, { run: { runId: "r1" } });
      },
    });
    const c = createFanoutClient({ transport, apiKey: KEY });
    const got = await c.get("r1").then(
      () => "UNAVAILABLE",
      (e) => e.code,
    );
    assert.equal(got, code, `${thrown.message}`);
    assert.equal(calls.unary, attempts, `${thrown.message}: attempts`);
  }
});

test("a backoff that would end past the deadline ends the call with its cause, UNAVAILABLE", async () => {
  const { transport, calls } = fakeTransport({
    unary: () => {
      throw new TypeError("fetch failed", { cause: socketError("ECONNREFUSED") });
    },
  });
  const c = createFanoutClient({ transport, apiKey: KEY });
  // The first backoff is 50 to 100 ms: past a 40 ms deadline.
  await assert.rejects(c.get("r1", { timeoutMs: 40 }), (e) => {
    assert.equal(e.code, "UNAVAILABLE", e.message);
    return true;
  });
  assert.equal(calls.unary, 1);
});

test("watch skips a duplicate, and a gap in the sequence is DATA_LOSS", async () => {
  const { transport } = fakeTransport({
    stream: async function* () {
      yield event(1);
      yield event(1);
      yield event(2);
      yield event(4);
    },
  });
  const c = createFanoutClient({ transport });
  const seen = [];
  await assert.rejects(
    (async () => {
      for await (const ev of c.watch("r1")) seen.push(ev.sequence);
    })(),
    (e) => {
      assert.ok(e instanceof FanoutError, `${e}`);
      assert.equal(e.code, "DATA_LOSS");
      assert.equal(e.rawMessage, "run r1: event sequence 4 after 2: a gap in the stream");
      return true;
    },
  );
  assert.deepEqual(seen, [1n, 2n]);
});

test("watch resumes a dropped connection after the last sequence, and never a server's INTERNAL", async () => {
  const dropping = fakeTransport({
    stream: async function* (n) {
      if (n === 1) {
        yield event(1);
        throw new TypeError("terminated", { cause: socketError("UND_ERR_SOCKET") });
      }
      yield event(2);
    },
  });
  const resumes = [];
  const seen = [];
  for await (const ev of createFanoutClient({ transport: dropping.transport }).watch("r1", { onResume: (r) => resumes.push(r) })) {
    seen.push(ev.sequence);
  }
  assert.deepEqual(seen, [1n, 2n]);
  assert.equal(resumes.length, 1);
  assert.equal(resumes[0].after, 1n);
  assert.equal(resumes[0].error.code, "UNAVAILABLE");

  const failing = fakeTransport({
    stream: async function* () {
      yield event(1);
      throw new ConnectError("internal error", Code.Internal);
    },
  });
  const none = [];
  await assert.rejects(
    (async () => {
      for await (const _ of createFanoutClient({ transport: failing.transport }).watch("r1", { onResume: (r) => none.push(r) }));
    })(),
    (e) => e.code === "INTERNAL",
  );
  assert.equal(none.length, 0, "a server's INTERNAL is not resumed");
  assert.equal(failing.calls.stream, 1);
});

test("the key is redacted from the message, the violations and ErrorInfo", async () => {
  const { transport } = fakeTransport({
    unary: () => {
      throw new ConnectError(`bad key ${KEY}`, Code.InvalidArgument, undefined, [
        { desc: BadRequestSchema, value: { fieldViolations: [{ field: "authorization", description: `got ${KEY}` }] } },
        { desc: QuotaFailureSchema, value: { violations: [{ subject: `key ${KEY}`, description: `over for ${KEY}` }] } },
        { desc: ErrorInfoSchema, value: { reason: "BAD_KEY", domain: "fanout", metadata: { key: KEY } } },
      ]);
    },
  });
  const c = createFanoutClient({ transport, apiKey: KEY });
  await assert.rejects(c.get("r1"), (e) => {
    assert.equal(e.code, "INVALID_ARGUMENT");
    const all = JSON.stringify({ m: e.message, f: e.fieldViolations, q: e.quotaViolations, r: e.reason });
    assert.ok(!all.includes(KEY), `the key is in ${all}`);
    assert.equal(e.fieldViolations[0].description, "got [redacted]");
    assert.equal(e.quotaViolations[0].description, "over for [redacted]");
    assert.equal(e.reason.metadata.key, "[redacted]");
    return true;
  });
});
