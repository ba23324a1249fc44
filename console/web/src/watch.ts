// The run page's live updates: WatchRun from sequence 0, opened again after
// the last sequence folded when the stream drops or closes before the run
// ends (backoff 0.5 s doubling to 10 s, back to 0.5 s once an event
// arrives), until the event that finishes the run. No DOM: the page says
// what to do with each event and status.

import { Code, ConnectError } from "@connectrpc/connect";
import type { WatchRunResponse } from "./gen/fanout/v1/orchestrator_pb";
import type { RunEvent } from "./gen/fanout/v1/run_pb";
import { duration } from "./format";

export const BACKOFF_MIN_MS = 500;
export const BACKOFF_MAX_MS = 10_000;

// Errors after which watching again cannot help.
const FINAL_CODES = new Set([Code.Unauthenticated, Code.PermissionDenied, Code.NotFound, Code.InvalidArgument]);

/** WatchStatus is the stream's state: open after a sequence, or dropped and waiting to reopen. */
export type WatchStatus = { kind: "watching"; after: bigint } | { kind: "dropped"; after: bigint; retryMs: number };

/** WatchEnd is why watch returned: the run finished, the signal aborted, or an error no retry can fix. */
export type WatchEnd = { kind: "finished" } | { kind: "aborted" } | { kind: "stopped"; error: ConnectError };

/** WatchParams are what watch follows a run with. */
export interface WatchParams {
  /** open opens WatchRun for the events after a sequence (0: from the start). */
  open(afterSequence: bigint, signal: AbortSignal): AsyncIterable<WatchRunResponse>;
  /** after is the last sequence folded: where a reopened stream resumes. */
  after(): bigint;
  /** event folds one event. */
  event(ev: RunEvent): void;
  /** finished reports whether the events folded so far end the run. */
  finished(): boolean;
  /** status is told each time the stream opens or drops. */
  status(s: WatchStatus): void;
  signal: AbortSignal;
  /** sleep waits between attempts, returning early when signal aborts (tests pass their own). */
  sleep?: (ms: number, signal: AbortSignal) => Promise<void>;
}

/** sleep waits ms, or until signal aborts. */
export function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(t);
      resolve();
    });
  });
}

/** statusText is a WatchStatus in the words #watch-status shows. */
export function statusText(s: WatchStatus): string {
  if (s.kind === "dropped") return `Stream dropped; resuming after event ${s.after} in ${duration(s.retryMs)}.`;
  return s.after > 0n ? `Resumed after event ${s.after}.` : "Watching…";
}

/**
 * watch follows a run until it finishes, p.signal aborts, or an error
 * after which watching again cannot help (unauthenticated, permission
 * denied, not found, invalid argument). Any other error, RESOURCE_EXHAUSTED
 * (a reader left behind) included, and a stream that closes before the run
 * ends, are resumed after the last event seen.
 */
export async function watch(p: WatchParams): Promise<WatchEnd> {
  const wait = p.sleep ?? sleep;
  let backoff = BACKOFF_MIN_MS;
  while (!p.signal.aborted) {
    try {
      p.status({ kind: "watching", after: p.after() });
      for await (const res of p.open(p.after(), p.signal)) {
        if (!res.event) continue;
        p.event(res.event);
        backoff = BACKOFF_MIN_MS;
      }
      // The server ends the stream at a RunFinished with nothing after it
      // (a continued run's earlier ends are followed by a RunContinued).
      if (p.finished()) return { kind: "finished" };
    } catch (err) {
      const e = ConnectError.from(err);
      if (p.signal.aborted || e.code === Code.Canceled) return { kind: "aborted" };
      if (FINAL_CODES.has(e.code)) return { kind: "stopped", error: e };
    }
    p.status({ kind: "dropped", after: p.after(), retryMs: backoff });
    await wait(backoff, p.signal);
    backoff = Math.min(backoff * 2, BACKOFF_MAX_MS);
  }
  return { kind: "aborted" };
}
