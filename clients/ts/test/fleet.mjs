// The fleet the suite runs against (clients/README.md, "Their tests"):
// its environment, the control endpoint, the specs, and a client of it.
// Importing this file has no side effect; fleet() fails the suite with how
// to run it when the environment is missing.

import { readFileSync } from "node:fs";
import { join } from "node:path";
import { randomUUID } from "node:crypto";
import { createFanoutClient } from "../dist/index.js";

const NEEDED = [
  "FANOUT_ADDR",
  "FANOUT_HTTP_URL",
  "FANOUT_TLS_HTTP_URL",
  "FANOUT_TLS_ADDR",
  "FANOUT_TLS_CA",
  "FANOUT_API_KEY",
  "FANOUT_TEST_CONTROL",
  "FANOUT_TEST_SPECS",
];

/** fleet returns the fleet's environment, or throws saying how to get one. */
export function fleet() {
  const missing = NEEDED.filter((k) => !process.env[k]);
  if (missing.length > 0) {
    throw new Error(
      `the TypeScript client's suite runs against a fleet that a Go test starts, and ${missing.join(", ")} ` +
        "are not set: run it from the repository's root with `make ts-client-deps` (npm ci in clients/ts) once, then " +
        "`go test ./cmd/fanout -count=1 -v -run 'TestClients/typescript'`",
    );
  }
  return Object.fromEntries(NEEDED.map((k) => [k, process.env[k]]));
}

/** client is a client of o1 through the cuttable proxy, with the suite's key (FANOUT_API_KEY by default). */
export function client(extra = {}) {
  return createFanoutClient({ baseUrl: fleet().FANOUT_HTTP_URL, ...extra });
}

/** spec reads FANOUT_TEST_SPECS/name (protojson) with a unique idempotency key. */
export function spec(name) {
  const s = JSON.parse(readFileSync(join(fleet().FANOUT_TEST_SPECS, name), "utf8"));
  s.idempotencyKey = `ts-${name.replace(/\.json$/, "")}-${randomUUID()}`;
  return s;
}

/** control POSTs body to the driver's control endpoint and returns its answer's text. */
export async function control(path, body = "") {
  const res = await fetch(new URL(path, fleet().FANOUT_TEST_CONTROL), {
    method: "POST",
    body,
    signal: AbortSignal.timeout(10_000),
  });
  const text = await res.text();
  if (!res.ok) throw new Error(`POST ${path}: ${res.status} ${text}`);
  return text.trim();
}

/**
 * eventually calls fn until it returns a value other than undefined, or
 * throws after timeoutMs with what it is waiting for.
 */
export async function eventually(what, fn, timeoutMs = 10_000) {
  const deadline = Date.now() + timeoutMs;
  let last;
  for (;;) {
    try {
      const v = await fn();
      if (v !== undefined) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) {
      throw new Error(`waited ${timeoutMs} ms for ${what}${last ? `; last error: ${last.message}` : ""}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** withTimeout rejects when p is not settled within ms, naming what. */
export function withTimeout(what, p, ms) {
  let t;
  const timeout = new Promise((_, reject) => {
    t = setTimeout(() => reject(new Error(`${what} did not settle within ${ms} ms`)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(t));
}

/** collect drains an async iterable into an array. */
export async function collect(iterable) {
  const out = [];
  for await (const v of iterable) out.push(v);
  return out;
}
