"""The asyncio client (grpc.aio): fanout.Client's methods, awaited; the ones
that yield are async iterators."""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Callable, Mapping, Optional, Sequence, Union

import grpc
import grpc.aio

from fanout import _common as c
from fanout.errors import FanoutError, from_rpc_error
from fanout.v1 import orchestrator_pb2 as pb
from fanout.v1 import orchestrator_pb2_grpc as pb_grpc
from fanout.v1 import run_pb2


class Client:
    """Client is fanout.Client for asyncio: the same constructor, the same
    methods (coroutines; run, watch and the listings are async iterators).
    Make it inside the event loop that uses it."""

    def __init__(
        self,
        target: Optional[str] = None,
        *,
        api_key: Optional[str] = None,
        tenant: Optional[str] = None,
        tls: bool = False,
        ca_file: Optional[str] = None,
        server_name: Optional[str] = None,
        timeout: Optional[float] = None,
        insecure: bool = False,
    ) -> None:
        self._s = c.Settings(target, api_key, tenant, tls, ca_file, server_name, timeout, insecure)
        if self._s.credentials is not None:
            self._channel = grpc.aio.secure_channel(self._s.target, self._s.credentials, self._s.options)
        else:
            self._channel = grpc.aio.insecure_channel(self._s.target, self._s.options)
        self._stub = pb_grpc.OrchestratorServiceStub(self._channel)

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """close closes the channel."""
        await self._channel.close()

    def __repr__(self) -> str:
        return f"fanout.aio.Client({self._s.target!r})"

    async def _unary(self, method: Callable[..., Any], req: Any, timeout: Optional[float]) -> Any:
        # As fanout.Client._unary: every unary call may be repeated.
        t = self._s.call_timeout(timeout)
        deadline = None if t is None else time.monotonic() + t
        for attempt in range(c.RETRIES):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                return await method(req, timeout=left, metadata=self._s.metadata)
            except grpc.RpcError as e:
                err = from_rpc_error(e, self._s.api_key)
            if err.code != grpc.StatusCode.UNAVAILABLE or attempt == c.RETRIES - 1:
                raise err
            pause = c.backoff(attempt)
            if deadline is not None and time.monotonic() + pause >= deadline:
                raise err
            await asyncio.sleep(pause)
        raise AssertionError("unreachable")

    async def start_run(
        self,
        spec: c.Spec,
        *,
        idempotency_key: Optional[str] = None,
        dry_run: bool = False,
        reserve_quote: bool = False,
        timeout: Optional[float] = None,
    ) -> pb.StartRunResponse:
        """As fanout.Client.start_run."""
        s = c.to_spec(spec)
        if idempotency_key:
            s.idempotency_key = idempotency_key
        elif not s.idempotency_key and not dry_run:
            s.idempotency_key = c.new_key()
        req = pb.StartRunRequest(spec=s, dry_run=dry_run, reserve_quote=reserve_quote)
        resp: pb.StartRunResponse = await self._unary(self._stub.StartRun, req, timeout)
        return resp

    async def run(self, spec: c.Spec, *, idempotency_key: Optional[str] = None) -> AsyncIterator[run_pb2.RunEvent]:
        """As fanout.Client.run."""
        run_id = (await self.start_run(spec, idempotency_key=idempotency_key)).run_id
        # aclose() of this generator closes the inner watch (and its call) at
        # once, not when the garbage collector gets to it. contextlib.aclosing
        # would do it from Python 3.10; the package supports 3.9.
        evs = self.watch(run_id)
        try:
            async for ev in evs:
                yield ev
        finally:
            await evs.aclose()

    async def watch(
        self, run_id: str, *, after: int = 0, timeout: Optional[float] = None
    ) -> AsyncIterator[run_pb2.RunEvent]:
        """As fanout.Client.watch: each event once, in order, resumed by
        sequence after a dropped connection."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last, failures = after, 0
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            req = pb.WatchRunRequest(run_id=run_id, after_sequence=last)
            call = self._stub.WatchRun(req, timeout=left, metadata=self._s.metadata)
            try:
                async for resp in call:
                    if c.check_sequence(resp.event, last):
                        last, failures = resp.event.sequence, 0
                        yield resp.event
                return
            except grpc.RpcError as e:
                err = from_rpc_error(e, self._s.api_key)
            finally:
                call.cancel()
            if not c.retryable(err) or failures == c.WATCH_RETRIES - 1:
                raise err
            # A resume that could start only after the deadline raises the
            # error that stopped the watch, not a DeadlineExceeded later.
            pause = c.watch_backoff(failures)
            if deadline is not None and time.monotonic() + pause >= deadline:
                raise err
            await asyncio.sleep(pause)
            failures += 1

    async def get(self, run_id: str, *, timeout: Optional[float] = None) -> run_pb2.Run:
        """As fanout.Client.get."""
        resp = await self._unary(self._stub.GetRun, pb.GetRunRequest(run_id=run_id), timeout)
        return resp.run  # type: ignore[no-any-return]

    def list(
        self,
        *,
        page_size: int = 0,
        state: Union[None, int, str] = None,
        tenant_id: str = "",
        timeout: Optional[float] = None,
    ) -> AsyncIterator[run_pb2.Run]:
        """As fanout.Client.list."""
        req = pb.ListRunsRequest(tenant_id=tenant_id, page_size=page_size, state=c.to_state(state))
        return self._pages(self._stub.ListRuns, req, "runs", timeout)

    def tasks(self, run_id: str, *, page_size: int = 0, timeout: Optional[float] = None) -> AsyncIterator[run_pb2.TaskOutcome]:
        """As fanout.Client.tasks."""
        req = pb.ListRunTasksRequest(run_id=run_id, page_size=page_size)
        return self._pages(self._stub.ListRunTasks, req, "tasks", timeout)

    def facts(self, run_id: str, *, page_size: int = 0, timeout: Optional[float] = None) -> AsyncIterator[run_pb2.Fact]:
        """As fanout.Client.facts."""
        req = pb.ListRunFactsRequest(run_id=run_id, page_size=page_size)
        return self._pages(self._stub.ListRunFacts, req, "facts", timeout)

    def list_approvals(
        self, *, run_id: str = "", page_size: int = 0, timeout: Optional[float] = None
    ) -> AsyncIterator[pb.PendingToolCall]:
        """As fanout.Client.list_approvals."""
        req = pb.ListApprovalsRequest(run_id=run_id, page_size=page_size)
        return self._pages(self._stub.ListApprovals, req, "calls", timeout)

    async def _pages(self, method: Callable[..., Any], req: Any, field: str, timeout: Optional[float]) -> AsyncIterator[Any]:
        while True:
            resp = await self._unary(method, req, timeout)
            for item in getattr(resp, field):
                yield item
            if not resp.next_page_token:
                return
            req.page_token = resp.next_page_token

    async def cancel(self, run_id: str, *, reason: str = "", timeout: Optional[float] = None) -> run_pb2.Run:
        """As fanout.Client.cancel."""
        resp = await self._unary(self._stub.CancelRun, pb.CancelRunRequest(run_id=run_id, reason=reason), timeout)
        return resp.run  # type: ignore[no-any-return]

    async def continue_run(
        self,
        run_id: str,
        add_tokens: int,
        *,
        idempotency_key: Optional[str] = None,
        reason: str = "",
        dry_run: bool = False,
        timeout: Optional[float] = None,
    ) -> pb.ContinueRunResponse:
        """As fanout.Client.continue_run."""
        req = pb.ContinueRunRequest(
            run_id=run_id, add_tokens=add_tokens, idempotency_key=idempotency_key or c.new_key(),
            reason=reason, dry_run=dry_run,
        )
        resp: pb.ContinueRunResponse = await self._unary(self._stub.ContinueRun, req, timeout)
        return resp

    async def fork(
        self,
        run_id: str,
        *,
        tasks: Sequence[c.TaskArg] = (),
        remove_task_ids: Sequence[str] = (),
        goal: str = "",
        labels: Optional[Mapping[str, str]] = None,
        idempotency_key: Optional[str] = None,
        dry_run: bool = False,
        timeout: Optional[float] = None,
    ) -> pb.ForkRunResponse:
        """As fanout.Client.fork."""
        req = pb.ForkRunRequest(
            run_id=run_id, idempotency_key=idempotency_key or c.new_key(),
            tasks=[c.to_task(t) for t in tasks], remove_task_ids=list(remove_task_ids),
            goal=goal, labels=dict(labels or {}), dry_run=dry_run,
        )
        resp: pb.ForkRunResponse = await self._unary(self._stub.ForkRun, req, timeout)
        return resp

    async def approve(self, call_id: str, *, reason: str = "", timeout: Optional[float] = None) -> pb.ToolCallDecision:
        """As fanout.Client.approve."""
        req = pb.ApproveToolCallRequest(call_id=call_id, reason=reason)
        return (await self._unary(self._stub.ApproveToolCall, req, timeout)).decision  # type: ignore[no-any-return]

    async def deny(self, call_id: str, *, reason: str = "", timeout: Optional[float] = None) -> pb.ToolCallDecision:
        """As fanout.Client.deny."""
        req = pb.DenyToolCallRequest(call_id=call_id, reason=reason)
        return (await self._unary(self._stub.DenyToolCall, req, timeout)).decision  # type: ignore[no-any-return]


__all__ = ["Client", "FanoutError"]
