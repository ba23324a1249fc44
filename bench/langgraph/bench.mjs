// The LangGraph.js side of `make bench-compare` (bench/README.md).
//
// One long-lived process, driven by bench/compare over stdin/stdout, one JSON
// object a line each way:
//
//   in:  {"n": 100, "checkpointer": "postgres" | "none"[, "calls": 3, "latency_ms": 500]}
//   out: {"wall_ms": 712.4, "results": 100}   or   {"error": "..."}
//
// Each request invokes a graph that fans out n parallel nodes with the Send
// API (map-reduce), each awaiting one timer of SIM_LATENCY_MS (the "sim
// call"), joined by a reducer into one list, then a join node. With calls >
// 1, each task is an agent loop of that many sim calls of latency_ms
// (default SIM_LATENCY_MS): a task node that makes one call and sends
// itself the next (a Command whose goto is a Send), so that each call is a
// step of its own, checkpointed like any other, until the last goes to the
// join. "postgres"
// checkpoints every superstep to BENCH_PG_URL with PostgresSaver and
// durability "sync" (each step's checkpoint is written before the next step
// starts); "none" runs the same graph without a checkpointer.
import readline from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";
import { performance } from "node:perf_hooks";

import pg from "pg";
import { Annotation, Command, END, START, Send, StateGraph } from "@langchain/langgraph";
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
  calls: Annotation(),
  latencyMs: Annotation(),
  // Every task's result, concatenated by the reducer (the join).
  results: Annotation({ reducer: (a, b) => a.concat(b), default: () => [] }),
  joined: Annotation(),
});

// task is one subagent: one sim call.
async function task(input) {
  await sleep(latencyMs);
  return { results: [`fact of task ${input.id}`] };
}

// agentTask is one call of a subagent that makes input.calls in a row: it
// sends itself the next one, or, after the last, goes to the join.
async function agentTask(input) {
  await sleep(input.latencyMs);
  if (input.call < input.calls) {
    return new Command({ goto: new Send("task", { ...input, call: input.call + 1 }) });
  }
  return new Command({ update: { results: [`fact of task ${input.id}`] }, goto: "join" });
}

function buildAgents(checkpointer) {
  return new StateGraph(State)
    .addNode("task", agentTask, { ends: ["task", "join"] })
    .addNode("join", (s) => ({ joined: s.results.length }))
    .addConditionalEdges(
      START,
      (s) => Array.from({ length: s.n }, (_, id) => new Send("task", { id, call: 1, calls: s.calls, latencyMs: s.latencyMs })),
      ["task"],
    )
    .addEdge("join", END)
    .compile(checkpointer ? { checkpointer } : {});
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
const agentGraphs = { postgres: buildAgents(saver), none: buildAgents(null) };

let runs = 0;
async function handle(req) {
  const calls = req.calls ?? 1;
  const graph = (calls > 1 ? agentGraphs : graphs)[req.checkpointer];
  if (!graph) throw new Error(`unknown checkpointer ${JSON.stringify(req.checkpointer)}`);
  const n = req.n;
  const config = {
    configurable: { thread_id: `bench-${process.pid}-${++runs}` },
    maxConcurrency: n,
    durability: "sync",
    recursionLimit: 25 + calls,
  };
  const start = performance.now();
  const input = calls > 1 ? { n, calls, latencyMs: req.latency_ms ?? latencyMs } : { n };
  const out = await graph.invoke(input, config);
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
