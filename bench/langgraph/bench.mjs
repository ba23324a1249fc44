// The LangGraph.js side of `make bench-compare` (bench/README.md).
//
// One long-lived process, driven by bench/compare over stdin/stdout, one JSON
// object a line each way:
//
//   in:  {"n": 100, "checkpointer": "postgres" | "none"}
//   out: {"wall_ms": 712.4, "results": 100}   or   {"error": "..."}
//
// Each request invokes a graph that fans out n parallel nodes with the Send
// API (map-reduce), each awaiting one timer of SIM_LATENCY_MS (the "sim
// call"), joined by a reducer into one list, then a join node. "postgres"
// checkpoints every superstep to BENCH_PG_URL with PostgresSaver and
// durability "sync" (each step's checkpoint is written before the next step
// starts); "none" runs the same graph without a checkpointer.
import readline from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";
import { performance } from "node:perf_hooks";

import pg from "pg";
import { Annotation, END, START, Send, StateGraph } from "@langchain/langgraph";
import { PostgresSaver } from "@langchain/langgraph-checkpoint-postgres";

const latencyMs = Number(process.env.SIM_LATENCY_MS ?? "700");
const pgURL = process.env.BENCH_PG_URL;
const poolMax = Number(process.env.BENCH_PG_POOL_MAX ?? "16");
if (!pgURL) {
  console.error("bench.mjs: BENCH_PG_URL is required");
  process.exit(2);
}

const State = Annotation.Root({
  n: Annotation(),
  // Every task's result, concatenated by the reducer (the join).
  results: Annotation({ reducer: (a, b) => a.concat(b), default: () => [] }),
  joined: Annotation(),
});

// task is one subagent: one sim call.
async function task(input) {
  await sleep(latencyMs);
  return { results: [`fact of task ${input.id}`] };
}

function build(checkpointer) {
  return new StateGraph(State)
    .addNode("task", task)
    .addNode("join", (s) => ({ joined: s.results.length }))
    .addConditionalEdges(START, (s) => Array.from({ length: s.n }, (_, id) => new Send("task", { id })), ["task"])
    .addEdge("task", "join")
    .addEdge("join", END)
    .compile(checkpointer ? { checkpointer } : {});
}

const pool = new pg.Pool({ connectionString: pgURL, max: poolMax });
const saver = new PostgresSaver(pool);
await saver.setup();
const graphs = { postgres: build(saver), none: build(null) };

let runs = 0;
async function handle(req) {
  const graph = graphs[req.checkpointer];
  if (!graph) throw new Error(`unknown checkpointer ${JSON.stringify(req.checkpointer)}`);
  const n = req.n;
  const config = {
    configurable: { thread_id: `bench-${process.pid}-${++runs}` },
    maxConcurrency: n,
    durability: "sync",
    recursionLimit: 25,
  };
  const start = performance.now();
  const out = await graph.invoke({ n }, config);
  const wall = performance.now() - start;
  if (out.results.length !== n || out.joined !== n) {
    throw new Error(`joined ${out.joined} of ${out.results.length} results, want ${n}`);
  }
  return { wall_ms: wall, results: out.results.length };
}

const rl = readline.createInterface({ input: process.stdin });
process.stdout.write(JSON.stringify({ ready: true, latency_ms: latencyMs }) + "\n");
for await (const line of rl) {
  if (!line.trim()) continue;
  let reply;
  try {
    reply = await handle(JSON.parse(line));
  } catch (err) {
    reply = { error: String(err?.stack ?? err) };
  }
  process.stdout.write(JSON.stringify(reply) + "\n");
}
await pool.end();
