"""The synchronous client (grpcio)."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, TypeVar, Union

import grpc

from fanout import _common as c
from fanout.errors import FanoutError, from_rpc_error
from fanout.v1 import orchestrator_pb2 as pb
from fanout.v1 import orchestrator_pb2_grpc as pb_grpc
from fanout.v1 import run_pb2

T = TypeVar("T")


class Client:
    """Client calls a fanout orchestrator over gRPC, blocking.

    target is host:port (default: $FANOUT_ADDR, else 127.0.0.1:50051).
    api_key (default: $FANOUT_API_KEY) is sent as `authorization: Bearer`;
    it goes to a non-loopback host only over TLS (tls=True, or ca_file for
    a private CA; server_name overrides the name checked in the
    certificate) unless insecure=True. tenant sends fanout-tenant-id, for a
    server with --auth none (fanout dev). timeout is the default deadline in
    seconds of each unary call (None: none). Errors are fanout.FanoutError.
    """

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
            self._channel = grpc.secure_channel(self._s.target, self._s.credentials, self._s.options)
        else:
            self._channel = grpc.insecure_channel(self._s.target, self._s.options)
        self._stub = pb_grpc.OrchestratorServiceStub(self._channel)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """close closes the channel; open iterators end with an error."""
        self._channel.close()

    def __repr__(self) -> str:
        return f"fanout.Client({self._s.target!r})"

    def _unary(self, method: Callable[..., T], req: Any, timeout: Optional[float]) -> T:
        # Every unary call of the API may be repeated (reads, idempotent
        # writes, and StartRun and ForkRun under an idempotency key), so
        # UNAVAILABLE is retried within the call's deadline.
        t = self._s.call_timeout(timeout)
        deadline = None if t is None else time.monotonic() + t
        for attempt in range(c.RETRIES):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                return method(req, timeout=left, metadata=self._s.metadata)
            except grpc.RpcError as e:
                err = from_rpc_error(e, self._s.api_key)
            if err.code != grpc.StatusCode.UNAVAILABLE or attempt == c.RETRIES - 1:
                raise err
            pause = c.backoff(attempt)
            if deadline is not None and time.monotonic() + pause >= deadline:
                raise err
            time.sleep(pause)
        raise AssertionError("unreachable")

    def start_run(
        self,
        spec: c.Spec,
        *,
        idempotency_key: Optional[str] = None,
        dry_run: bool = False,
        reserve_quote: bool = False,
        timeout: Optional[float] = None,
    ) -> pb.StartRunResponse:
        """start_run starts a run (or returns the one with the same
        idempotency key) and returns its id (.run_id) at once; with dry_run,
        the quote (.quote) alone. A spec without a key gets a new one, so
        that retrying after a lost connection cannot start it twice."""
        s = c.to_spec(spec)
        if idempotency_key:
            s.idempotency_key = idempotency_key
        elif not s.idempotency_key and not dry_run:
            s.idempotency_key = c.new_key()
        req = pb.StartRunRequest(spec=s, dry_run=dry_run, reserve_quote=reserve_quote)
        return self._unary(self._stub.StartRun, req, timeout)

    def run(self, spec: c.Spec, *, idempotency_key: Optional[str] = None) -> Iterator[run_pb2.RunEvent]:
        """run starts a run and yields its events until it ends. It is
        StartRun + WatchRun, not the Run RPC: a dropped connection cancels
        a Run call's run, while a watch resumes where it was."""
        run_id = self.start_run(spec, idempotency_key=idempotency_key).run_id
        yield from self.watch(run_id)

    def watch(self, run_id: str, *, after: int = 0, timeout: Optional[float] = None) -> Iterator[run_pb2.RunEvent]:
        """watch yields a run's events with a sequence greater than after,
        each once and in order, until the server ends the stream (after the
        run's last RunFinished). A dropped connection is resumed from the
        last sequence seen, with bounded backoff (10 attempts in a row
        without an event, up to about 20 s); timeout (default none) bounds
        the whole watch, resumes included."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last, failures = after, 0
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            req = pb.WatchRunRequest(run_id=run_id, after_sequence=last)
            stream = self._stub.WatchRun(req, timeout=left, metadata=self._s.metadata)
            try:
                for resp in stream:
                    if c.check_sequence(resp.event, last):
                        last, failures = resp.event.sequence, 0
                        yield resp.event
                return
            except grpc.RpcError as e:
                err = from_rpc_error(e, self._s.api_key)
            finally:
                stream.cancel()  # a consumer that stops early ends the call
            if not c.retryable(err) or failures == c.WATCH_RETRIES - 1:
                raise err
            # A resume that could start only after the deadline raises the
            # error that stopped the watch, not a DeadlineExceeded later.
            pause = c.watch_backoff(failures)
            if deadline is not None and time.monotonic() + pause >= deadline:
                raise err
            time.sleep(pause)
            failures += 1

    def get(self, run_id: str, *, timeout: Optional[float] = None) -> run_pb2.Run:
        """get returns a run's current state. NotFound for an unknown id."""
        return self._unary(self._stub.GetRun, pb.GetRunRequest(run_id=run_id), timeout).run

    def list(
        self,
        *,
        page_size: int = 0,
        state: Union[None, int, str] = None,
        tenant_id: str = "",
        timeout: Optional[float] = None,
    ) -> Iterator[run_pb2.Run]:
        """list yields the tenant's runs, newest first, as summaries (no
        spec, no result: get has those), fetching page after page of
        page_size (0: the server's default). state filters by RunState
        (a number, "RUN_STATE_RUNNING" or "running")."""
        req = pb.ListRunsRequest(tenant_id=tenant_id, page_size=page_size, state=c.to_state(state))
        return self._pages(self._stub.ListRuns, req, "runs", timeout)

    def tasks(self, run_id: str, *, page_size: int = 0, timeout: Optional[float] = None) -> Iterator[run_pb2.TaskOutcome]:
        """tasks yields a run's tasks in dispatch order, all of them."""
        req = pb.ListRunTasksRequest(run_id=run_id, page_size=page_size)
        return self._pages(self._stub.ListRunTasks, req, "tasks", timeout)

    def facts(self, run_id: str, *, page_size: int = 0, timeout: Optional[float] = None) -> Iterator[run_pb2.Fact]:
        """facts yields the facts of a run's joined result, all of them."""
        req = pb.ListRunFactsRequest(run_id=run_id, page_size=page_size)
        return self._pages(self._stub.ListRunFacts, req, "facts", timeout)

    def list_approvals(
        self, *, run_id: str = "", page_size: int = 0, timeout: Optional[float] = None
    ) -> Iterator[pb.PendingToolCall]:
        """list_approvals yields the writes waiting for approval, oldest
        first (of run_id only, if given). Needs scope approve."""
        req = pb.ListApprovalsRequest(run_id=run_id, page_size=page_size)
        return self._pages(self._stub.ListApprovals, req, "calls", timeout)

    def _pages(self, method: Callable[..., Any], req: Any, field: str, timeout: Optional[float]) -> Iterator[Any]:
        while True:
            resp = self._unary(method, req, timeout)
            yield from getattr(resp, field)
            if not resp.next_page_token:
                return
            req.page_token = resp.next_page_token

    def cancel(self, run_id: str, *, reason: str = "", timeout: Optional[float] = None) -> run_pb2.Run:
        """cancel cancels a run and returns it (possibly still RUNNING for a
        moment); cancelling an ended run changes nothing."""
        return self._unary(self._stub.CancelRun, pb.CancelRunRequest(run_id=run_id, reason=reason), timeout).run

    def continue_run(
        self,
        run_id: str,
        add_tokens: int,
        *,
        idempotency_key: Optional[str] = None,
        reason: str = "",
        dry_run: bool = False,
        timeout: Optional[float] = None,
    ) -> pb.ContinueRunResponse:
        """continue_run adds add_tokens to a run's budget (a running run's
        top-up, or a BUDGET_EXHAUSTED run run again). A new idempotency key
        is made when none is given."""
        req = pb.ContinueRunRequest(
            run_id=run_id, add_tokens=add_tokens, idempotency_key=idempotency_key or c.new_key(),
            reason=reason, dry_run=dry_run,
        )
        return self._unary(self._stub.ContinueRun, req, timeout)

    def fork(
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
        """fork starts a new run from a recorded one with tasks changed or
        added (TaskSpec or protojson dicts) or removed; unchanged tasks that
        succeeded are reused. Returns the new run's id (.run_id)."""
        req = pb.ForkRunRequest(
            run_id=run_id, idempotency_key=idempotency_key or c.new_key(),
            tasks=[c.to_task(t) for t in tasks], remove_task_ids=list(remove_task_ids),
            goal=goal, labels=dict(labels or {}), dry_run=dry_run,
        )
        return self._unary(self._stub.ForkRun, req, timeout)

    def approve(self, call_id: str, *, reason: str = "", timeout: Optional[float] = None) -> pb.ToolCallDecision:
        """approve approves a write waiting for approval and returns the
        recorded decision. FailedPrecondition if it was denied or expired."""
        req = pb.ApproveToolCallRequest(call_id=call_id, reason=reason)
        return self._unary(self._stub.ApproveToolCall, req, timeout).decision

    def deny(self, call_id: str, *, reason: str = "", timeout: Optional[float] = None) -> pb.ToolCallDecision:
        """deny denies a write waiting for approval; the model is told reason."""
        req = pb.DenyToolCallRequest(call_id=call_id, reason=reason)
        return self._unary(self._stub.DenyToolCall, req, timeout).decision


__all__ = ["Client", "FanoutError"]
