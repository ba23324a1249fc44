"""The sync client against the test fleet (conftest.py)."""

from __future__ import annotations

import socket
import time
from typing import Any, Iterator, List, Set

import grpc
import pytest

import fanout
from fanout.v1 import run_pb2

from conftest import Fleet, poll

SUCCEEDED = run_pb2.RUN_STATE_SUCCEEDED
CANCELLED = run_pb2.RUN_STATE_CANCELLED


def until(events: Iterator[run_pb2.RunEvent], kind: str) -> run_pb2.RunEvent:
    """until consumes events up to the first of kind ("approval_requested")."""
    for ev in events:
        if ev.WhichOneof("event") == kind:
            return ev
    pytest.fail(f"the stream ended before a {kind} event")


def assert_whole(events: List[run_pb2.RunEvent]) -> None:
    """assert_whole checks events are a run's whole history: 1, 2, ... n,
    RunStarted first, RunFinished last."""
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    assert events[0].WhichOneof("event") == "run_started"
    assert events[-1].WhichOneof("event") == "run_finished"


def wire(events: List[run_pb2.RunEvent]) -> List[bytes]:
    return [e.SerializeToString(deterministic=True) for e in events]


def test_start_watch_get(fleet: Fleet, client: fanout.Client) -> None:
    spec = fleet.spec("quick")
    started = client.start_run(spec)
    assert started.run_id
    # The same key again is the same run (StartRun is idempotent by key).
    assert client.start_run(spec).run_id == started.run_id
    events = list(client.watch(started.run_id, timeout=30))
    assert_whole(events)
    run = client.get(started.run_id)
    assert run.run_id == started.run_id and run.state == SUCCEEDED
    assert run.idempotency_key == spec["idempotencyKey"]
    assert len(list(client.tasks(started.run_id, page_size=1))) == 3
    # after= resumes by sequence.
    assert wire(list(client.watch(started.run_id, after=2))) == wire(events[2:])


def test_run_streams_to_the_end(fleet: Fleet, client: fanout.Client) -> None:
    events = list(client.run(fleet.spec("quick")))
    assert_whole(events)
    assert events[-1].run_finished.state == SUCCEEDED


def test_watch_resumes_after_a_cut(fleet: Fleet, client: fanout.Client) -> None:
    run_id = client.start_run(fleet.spec("approval")).run_id
    seen: List[run_pb2.RunEvent] = []
    approved: Set[str] = set()
    cut = 0
    for ev in client.watch(run_id, timeout=45):
        seen.append(ev)
        if ev.WhichOneof("event") != "approval_requested":
            continue
        if not cut:
            # Reset every connection under the open stream: the events
            # after this one come from a WatchRun resumed by sequence.
            cut = int(fleet.control("/cut"))
            assert cut >= 1, "the cut found no connection to reset"
        call_id = ev.approval_requested.call_id
        if call_id not in approved:  # reported again after a re-dispatch
            client.approve(call_id, reason="py test")
            approved.add(call_id)
    assert len(approved) == 3
    assert_whole(seen)
    assert wire(seen) == wire(list(client.watch(run_id, timeout=20)))
    assert client.get(run_id).state == SUCCEEDED


def test_list_follows_page_tokens(fleet: Fleet, client: fanout.Client) -> None:
    ids = [client.start_run(fleet.spec("quick")).run_id for _ in range(3)]
    for run_id in ids:
        list(client.watch(run_id, timeout=30))
    # Newest first, one run a page: the three are the three newest of this
    # suite's runs only if no other test starts one meanwhile, so look them
    # up among the first pages instead.
    found: List[str] = []
    for i, run in enumerate(client.list(page_size=1)):
        if run.run_id in ids:
            found.append(run.run_id)
        if len(found) == 3 or i > 200:
            break
    assert found == list(reversed(ids))
    succeeded = [r for _, r in zip(range(5), client.list(page_size=2, state="succeeded"))]
    assert succeeded and all(r.state == SUCCEEDED for r in succeeded)


def test_cancel_a_waiting_run(fleet: Fleet, client: fanout.Client) -> None:
    run_id = client.start_run(fleet.spec("approval")).run_id
    events = client.watch(run_id, timeout=30)
    until(events, "approval_requested")  # it waits: it stays RUNNING
    client.cancel(run_id, reason="py test cancels")
    finished = until(events, "run_finished")
    assert finished.run_finished.state == CANCELLED
    run = client.get(run_id)
    assert run.state == CANCELLED and "py test cancels" in run.cancel_cause
    # Cancelling an ended run changes nothing.
    assert client.cancel(run_id).state == CANCELLED


def test_bad_input_names_the_field(fleet: Fleet, client: fanout.Client) -> None:
    spec = fleet.spec("quick")
    spec["tasks"][0]["tokenBudget"] = 0
    with pytest.raises(fanout.InvalidArgument) as info:
        client.start_run(spec)
    err = info.value
    assert isinstance(err, fanout.FanoutError) and err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "spec.tasks[0].token_budget" in [field for field, _ in err.field_violations]
    with pytest.raises(fanout.NotFound):
        client.get("00000000-0000-0000-0000-000000000000")


def test_revoked_key(fleet: Fleet, client: fanout.Client) -> None:
    token = fleet.control("/key", "run,read")
    with fanout.Client(api_key=token, timeout=15) as mine:
        run_id = mine.start_run(fleet.spec("approval")).run_id
        events = mine.watch(run_id, timeout=30)
        until(events, "approval_requested")  # the watch is open, the run waits
        fleet.control("/revoke", token)

        def refused() -> Any:
            try:
                mine.get(run_id)
            except fanout.Unauthenticated as e:
                return e
            return None

        err = poll("a call with the revoked key fails UNAUTHENTICATED", refused)
        assert err.code == grpc.StatusCode.UNAUTHENTICATED
        assert token not in str(err) and token not in repr(err)
        # The open watch ends: with the typed error, not at its deadline.
        with pytest.raises(fanout.FanoutError) as ended:
            for _ in events:
                pass
        assert ended.value.code == grpc.StatusCode.UNAUTHENTICATED, ended.value
    client.cancel(run_id, reason="py test: the key was revoked")


def test_approvals(fleet: Fleet, client: fanout.Client) -> None:
    run_id = client.start_run(fleet.spec("approval")).run_id
    # The decisions on the three writes, in the order they are asked: the
    # denial last, since the sim model asks for no more writes after one.
    plan = [True, True, False]
    asked: List[str] = []
    decided: List[Any] = []
    # One pass over the events: the writes may be asked for together (one
    # model reply) and a re-dispatched task asks for one again.
    for ev in client.watch(run_id, timeout=45):
        kind = ev.WhichOneof("event")
        if kind == "approval_decided":
            decided.append(ev.approval_decided)
        if kind != "approval_requested" or ev.approval_requested.call_id in asked:
            continue
        call_id = ev.approval_requested.call_id
        asked.append(call_id)
        assert call_id in [p.call_id for p in client.list_approvals(run_id=run_id, page_size=1)]
        approve = plan[len(asked) - 1]
        if approve:
            d = client.approve(call_id, reason="py yes")
        else:
            d = client.deny(call_id, reason="py no")
            with pytest.raises(fanout.FailedPrecondition):
                client.approve(call_id)  # a denied call stays denied
        assert (d.call_id, d.approved, d.run_id) == (call_id, approve, run_id)
    assert len(asked) == 3
    by_call = {d.call_id: (d.approved, d.reason) for d in decided}
    assert [by_call[c] for c in asked] == [(True, "py yes"), (True, "py yes"), (False, "py no")]
    assert [p.call_id for p in client.list_approvals(run_id=run_id)] == []


def test_tls(fleet: Fleet) -> None:
    with fanout.Client(fleet.tls_addr, ca_file=fleet.tls_ca, timeout=15) as tls:
        assert tls.get(tls.start_run(fleet.spec("quick")).run_id).run_id
    # Without the test CA the server's certificate is not trusted.
    with fanout.Client(fleet.tls_addr, tls=True, timeout=2) as untrusted:
        with pytest.raises(fanout.Unavailable):
            untrusted.get("x")


def test_no_key_in_plaintext_to_another_host() -> None:
    with pytest.raises(ValueError) as info:
        fanout.Client("10.1.2.3:50051", api_key="sekrit-123")
    assert "sekrit" not in str(info.value)
    fanout.Client("10.1.2.3:50051", api_key="sekrit-123", insecure=True).close()
    fanout.Client("localhost:50051", api_key="sekrit-123").close()


def test_fleet_repr_has_no_key(fleet: Fleet) -> None:
    # pytest prints a failing test's fixtures: the fleet's key stays out.
    assert fleet.api_key not in repr(fleet)


def test_key_a_header_cannot_carry(fleet: Fleet) -> None:
    # grpcio's own error for such a key ("metadata was invalid") holds it.
    with pytest.raises(ValueError) as info:
        fanout.Client(api_key="sekrit\n-123")
    assert str(info.value) == "api_key: must be printable ASCII with no spaces or newlines"
    assert "sekrit" not in str(info.value) and "sekrit" not in repr(info.value)
    # A trailing newline (a key read from a file) is stripped: the key works.
    with fanout.Client(api_key=fleet.api_key + "\n", timeout=15) as c:
        with pytest.raises(fanout.NotFound):  # not Unauthenticated
            c.get("00000000-0000-0000-0000-000000000000")


def test_deadline(fleet: Fleet, client: fanout.Client) -> None:
    # 1 µs: the deadline passes before any server on any link can answer
    # (0.5 ms did not: loopback answers a NotFound faster).
    with pytest.raises(fanout.DeadlineExceeded) as info:
        client.get("00000000-0000-0000-0000-000000000000", timeout=1e-6)
    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    with fanout.Client(timeout=1e-6) as hurried:  # the client's default
        with pytest.raises(fanout.DeadlineExceeded):
            list(hurried.list())
    # A watch's deadline bounds the whole watch, not each event: a run that
    # waits for approval sends nothing more. Its first approval_requested is
    # awaited with a deadline of its own (dispatch can take over 1 s on a
    # loaded machine), then a 1 s watch from there must end at its deadline.
    run_id = client.start_run(fleet.spec("approval")).run_id
    ev = until(client.watch(run_id, timeout=30), "approval_requested")
    with pytest.raises(fanout.DeadlineExceeded):
        for _ in client.watch(run_id, after=ev.sequence, timeout=1.0):
            pass
    client.cancel(run_id, reason="py test: deadline")


def test_watch_resumes_no_later_than_its_deadline() -> None:
    # A port nothing listens on: every WatchRun fails UNAVAILABLE at once.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    start = time.monotonic()
    with fanout.Client(f"127.0.0.1:{port}", tenant="default") as down:
        with pytest.raises(fanout.Unavailable):  # the cause, not DeadlineExceeded
            list(down.watch("x", timeout=2.0))
    assert time.monotonic() - start < 2.0
