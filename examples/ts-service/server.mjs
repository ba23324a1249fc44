// A research service on top of fanout: POST /research {"question": "..."}
// fans the question out to three subagents and streams their progress as
// NDJSON, one JSON object a line, ending with the joined result.
//
//   FANOUT_HTTP_URL  the orchestrator's HTTP listener (default http://127.0.0.1:8080, fanout dev's)
//   FANOUT_API_KEY   its API key (read by the client; none with fanout dev)
//   FANOUT_TENANT    the tenant, for a server with --auth none (fanout dev)
//   PORT             this service's port (default 3000)

import http from "node:http";
import { createFanoutClient, RunState, TaskStatus } from "@fanout/client";

const fanout = createFanoutClient({
  baseUrl: process.env.FANOUT_HTTP_URL ?? "http://127.0.0.1:8080",
  tenant: process.env.FANOUT_TENANT,
  timeoutMs: 10_000, // each unary call; the stream has no deadline
});

// One task per angle on the question, a shared budget, and a synthesis.
const ANGLES = ["background", "evidence", "counterarguments"];
function researchSpec(question) {
  return {
    goal: question,
    tasks: ANGLES.map((id) => ({ id, instruction: `${id}: ${question}`, tokenBudget: 4000, maxIterations: 3, allowedTools: ["search"] })),
    budget: { limitTokens: 15000 },
    synthesize: true,
    labels: { via: "ts-service" },
  };
}

// readJson reads a request's JSON body, at most 16 KiB.
async function readJson(req) {
  let body = "";
  for await (const chunk of req) {
    body += chunk;
    if (body.length > 16 << 10) throw new Error("body: at most 16 KiB");
  }
  return JSON.parse(body);
}

const server = http.createServer(async (req, res) => {
  if (req.method !== "POST" || req.url !== "/research") {
    res.writeHead(404, { "content-type": "application/json" }).end('{"error":"POST /research"}\n');
    return;
  }
  let question;
  try {
    question = (await readJson(req)).question;
  } catch (e) {
    res.writeHead(400, { "content-type": "application/json" }).end(JSON.stringify({ error: e.message }) + "\n");
    return;
  }
  if (typeof question !== "string" || question.trim() === "") {
    res.writeHead(400, { "content-type": "application/json" }).end('{"error":"question: a non-empty string is required"}\n');
    return;
  }

  res.writeHead(200, { "content-type": "application/x-ndjson" });
  const line = (o) => res.write(JSON.stringify(o) + "\n");
  // The caller hanging up stops the watch; the run goes on in fanout.
  const stop = new AbortController();
  res.on("close", () => stop.abort());
  try {
    for await (const ev of fanout.run(researchSpec(question), { signal: stop.signal })) {
      const v = ev.event.value;
      switch (ev.event.case) {
        case "runStarted":
          line({ event: "started", runId: ev.runId });
          break;
        case "taskStarted":
          line({ event: "task_started", task: v.taskId });
          break;
        case "taskFinished":
          line({ event: "task_finished", task: v.outcome.taskId, status: TaskStatus[v.outcome.status], tokens: Number(v.outcome.tokensSpent) });
          break;
        case "runFinished":
          line({
            event: "finished",
            state: RunState[v.state],
            synthesis: v.result?.synthesis ?? "",
            facts: v.result?.facts.map((f) => f.text) ?? [],
            tokens: Number(v.result?.totalTokens ?? 0),
          });
          break;
      }
    }
  } catch (e) {
    // A FanoutError: its code, message and field violations (never the key).
    if (!stop.signal.aborted) line({ event: "error", code: e.code, message: e.message, fieldViolations: e.fieldViolations });
  }
  res.end();
});

const port = Number(process.env.PORT ?? 3000);
server.listen(port, "127.0.0.1", () => console.log(`research service on http://127.0.0.1:${port}/research`));
