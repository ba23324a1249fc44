// Events the unit tests feed the run page's modules.

import { create } from "@bufbuild/protobuf";
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import { RunEventSchema, type RunEvent } from "../src/gen/fanout/v1/run_pb";

/** iteration is task a's iteration number sequence, as event sequence, 10 tokens an iteration. */
export function iteration(sequence: bigint): RunEvent {
  return create(RunEventSchema, {
    sequence,
    runId: "r1",
    time: timestampFromMs(Number(sequence)),
    event: { case: "taskIteration", value: { taskId: "a", iteration: Number(sequence), tokensSpent: 10n * sequence } },
  });
}
