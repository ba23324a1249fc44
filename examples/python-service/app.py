"""A research service on fanout: POST /research {"question": ...} starts a
fan-out (examples/research.json with the question as its goal) and streams
its progress as NDJSON, one event a line, ending with the joined result.

    uvicorn app:app    # FANOUT_ADDR, FANOUT_API_KEY (or FANOUT_TENANT for fanout dev)
"""

import json
import os
from pathlib import Path
from typing import Any, AsyncIterator, Dict

from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

import fanout.aio
import fanout.v1.run_pb2

TEMPLATE: Dict[str, Any] = json.loads((Path(__file__).parent / "../research.json").read_text())["spec"]
app = FastAPI(title="research")
client: fanout.aio.Client


class Research(BaseModel):
    question: str


@app.on_event("startup")
async def connect() -> None:
    global client  # made in the server's event loop, as grpc.aio needs
    client = fanout.aio.Client(tenant=os.environ.get("FANOUT_TENANT"))


@app.on_event("shutdown")
async def disconnect() -> None:
    await client.close()


@app.post("/research")
async def research(body: Research) -> StreamingResponse:
    spec = dict(TEMPLATE, goal=body.question)
    spec.pop("idempotencyKey")  # a new run per request: start_run makes a key
    # The template's budget is cut short to show a run that runs out; a
    # service gives its questions room for all eight tasks.
    spec["budget"] = dict(TEMPLATE["budget"], limitTokens=int(os.environ.get("RESEARCH_TOKENS", "80000")))
    run_id = (await client.start_run(spec)).run_id  # errors here are the HTTP 500, before streaming

    async def progress() -> AsyncIterator[str]:
        async for ev in client.watch(run_id):  # resumes by sequence if the connection drops
            kind = ev.WhichOneof("event")
            line: Dict[str, Any] = {"sequence": ev.sequence, "event": kind}
            body = getattr(ev, kind)
            task = body.outcome.task_id if kind == "task_finished" else getattr(body, "task_id", "")
            if task:
                line["task"] = task
            if kind == "task_finished":
                line["status"] = fanout.v1.run_pb2.TaskStatus.Name(body.outcome.status)
            if kind == "run_finished":  # the joined result, its facts paged in whole
                fin = ev.run_finished
                line["state"] = fanout.RunState.Name(fin.state)
                line["totalTokens"] = fin.result.total_tokens
                line["synthesis"] = fin.result.synthesis
                line["facts"] = [f.text async for f in client.facts(run_id)]
            yield json.dumps(line) + "\n"

    return StreamingResponse(progress(), media_type="application/x-ndjson", headers={"fanout-run-id": run_id})
