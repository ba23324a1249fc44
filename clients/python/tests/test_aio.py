"""The asyncio client against the test fleet: each test runs its coroutine
with asyncio.run (no pytest plugin needed)."""

from __future__ import annotations

import asyncio
from typing import List, Set

import grpc
import pytest

import fanout
import fanout.aio
from fanout.v1 import run_pb2

from conftest import Fleet
from test_client import assert_whole, wire


def test_aio_watch_resumes_after_a_cut(fleet: Fleet) -> None:
    async def main() -> None:
        async with fanout.aio.Client(timeout=15) as client:
            run_id = (await client.start_run(fleet.spec("approval"))).run_id
            seen: List[run_pb2.RunEvent] = []
            approved: Set[str] = set()
            cut = 0
            async for ev in client.watch(run_id, timeout=45):
                seen.append(ev)
                if ev.WhichOneof("event") != "approval_requested":
                    continue
                if not cut:
                    cut = int(await asyncio.to_thread(fleet.control, "/cut"))
                    assert cut >= 1, "the cut found no connection to reset"
                call_id = ev.approval_requested.call_id
                if call_id not in approved:
                    await client.approve(call_id, reason="py aio test")
                    approved.add(call_id)
            assert len(approved) == 3
            assert_whole(seen)
            assert wire(seen) == wire([e async for e in client.watch(run_id, timeout=20)])
            assert (await client.get(run_id)).state == run_pb2.RUN_STATE_SUCCEEDED

    asyncio.run(main())


def test_aio_run_get_list(fleet: Fleet) -> None:
    async def main() -> None:
        async with fanout.aio.Client(timeout=15) as client:
            events = [e async for e in client.run(fleet.spec("quick"))]
            assert_whole(events)
            run_id = events[0].run_id
            assert (await client.get(run_id)).state == run_pb2.RUN_STATE_SUCCEEDED
            other = (await client.start_run(fleet.spec("quick"))).run_id
            found = []
            async for run in client.list(page_size=1):
                found.append(run.run_id)
                if run_id in found:
                    break
            assert other in found and found.index(other) < found.index(run_id)
            await client.cancel(other, reason="py aio test")

    asyncio.run(main())


def test_aio_errors(fleet: Fleet) -> None:
    async def main() -> None:
        async with fanout.aio.Client(timeout=15) as client:
            spec = fleet.spec("quick")
            spec["tasks"][0]["tokenBudget"] = 0
            with pytest.raises(fanout.InvalidArgument) as info:
                await client.start_run(spec)
            assert "spec.tasks[0].token_budget" in [f for f, _ in info.value.field_violations]
            with pytest.raises(fanout.NotFound):
                await client.get("00000000-0000-0000-0000-000000000000")
            with pytest.raises(fanout.DeadlineExceeded) as late:
                await client.get("00000000-0000-0000-0000-000000000000", timeout=1e-6)
            assert late.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        token = await asyncio.to_thread(fleet.control, "/key", "read")
        await asyncio.to_thread(fleet.control, "/revoke", token)
        async with fanout.aio.Client(api_key=token, timeout=15) as revoked:
            deadline = asyncio.get_running_loop().time() + 10
            while True:
                try:
                    await revoked.get("00000000-0000-0000-0000-000000000000")
                except fanout.Unauthenticated as e:
                    assert token not in str(e)
                    break
                except fanout.NotFound:  # not revoked on this replica yet
                    pass
                assert asyncio.get_running_loop().time() < deadline, "the revoked key still works after 10s"
                await asyncio.sleep(0.05)

    asyncio.run(main())
