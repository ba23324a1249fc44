"""What the sync and the asyncio clients share: settings, metadata, request
building and the retry rules. No I/O here."""

from __future__ import annotations

import ipaddress
import os
import random
import re
import uuid
from typing import Any, List, Mapping, Optional, Tuple, Union

import grpc
from google.protobuf import json_format

from fanout.errors import FanoutError
from fanout.v1 import run_pb2

DEFAULT_TARGET = "127.0.0.1:50051"
TENANT_METADATA_KEY = "fanout-tenant-id"

#: Channel options: reconnect soon after a dropped connection (the default
#: first backoff is 1 s), since the resume loops retry at once.
CHANNEL_OPTIONS: List[Tuple[str, Any]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
]

#: Bounded backoff of a unary call's retries: at most RETRIES attempts, the
#: n-th after about BASE * 2**n seconds (at most CAP), with jitter so that
#: many clients cut at once do not come back at once.
RETRIES = 8
BACKOFF_BASE = 0.05
BACKOFF_CAP = 2.0

#: A watch's resumes: at most WATCH_RETRIES attempts in a row without an
#: event, waiting WATCH_BACKOFF_BASE doubling up to WATCH_BACKOFF_CAP between
#: them, so that it outlasts about 10 to 20 s of an unreachable server (a
#: load balancer's restart), as the TypeScript client's watch does.
WATCH_RETRIES = 10
WATCH_BACKOFF_BASE = 0.1
WATCH_BACKOFF_CAP = 5.0

Spec = Union[run_pb2.RunSpec, Mapping[str, Any]]
TaskArg = Union[run_pb2.TaskSpec, Mapping[str, Any]]


def backoff(attempt: int, base: float = BACKOFF_BASE, cap: float = BACKOFF_CAP) -> float:
    """backoff is the wait before retry number attempt (0-based)."""
    return min(cap, base * 2**attempt) * random.uniform(0.5, 1.0)


def watch_backoff(attempt: int) -> float:
    """watch_backoff is the wait before a watch's resume number attempt
    (0-based)."""
    return backoff(attempt, WATCH_BACKOFF_BASE, WATCH_BACKOFF_CAP)


def is_loopback(target: str) -> bool:
    """is_loopback reports whether target (host:port, dns:///host:port,
    ipv4:..., unix:...) names this machine."""
    t = target
    for prefix in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if t.startswith(prefix):
            t = t[len(prefix):]
            break
    if t.startswith("unix:") or t.startswith("unix-abstract:"):
        return True
    if t.startswith("["):
        host = t[1:t.find("]")] if "]" in t else t[1:]
    else:
        host = t.rsplit(":", 1)[0] if t.count(":") == 1 else t
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Settings:
    """Settings are a client's resolved constructor arguments."""

    def __init__(
        self,
        target: Optional[str],
        api_key: Optional[str],
        tenant: Optional[str],
        tls: bool,
        ca_file: Optional[str],
        server_name: Optional[str],
        timeout: Optional[float],
        insecure: bool,
    ) -> None:
        self.target = target or os.environ.get("FANOUT_ADDR") or DEFAULT_TARGET
        key = api_key if api_key is not None else os.environ.get("FANOUT_API_KEY")
        # A key read from a file often ends in a newline: strip it. Any other
        # character a header cannot carry would make grpcio raise (and log)
        # "metadata was invalid" with the key in its text, so refuse it here,
        # without the key in the message.
        key = key.strip() if key else key
        if key and not re.fullmatch(r"[\x21-\x7e]+", key):
            raise ValueError("api_key: must be printable ASCII with no spaces or newlines")
        self.api_key = key or None
        self.tls = tls or ca_file is not None
        if self.api_key and not self.tls and not insecure and not is_loopback(self.target):
            # The key is never put in the text: only the target is.
            raise ValueError(
                f"target {self.target}: an API key goes to a non-loopback host only over TLS: "
                "pass tls=True or ca_file=..., or insecure=True to send it in plaintext"
            )
        self.timeout = timeout
        self.options = list(CHANNEL_OPTIONS)
        if server_name:
            self.options.append(("grpc.ssl_target_name_override", server_name))
        self.credentials: Optional[grpc.ChannelCredentials] = None
        if self.tls:
            root = None
            if ca_file is not None:
                with open(ca_file, "rb") as f:
                    root = f.read()
            self.credentials = grpc.ssl_channel_credentials(root_certificates=root)
        md: List[Tuple[str, str]] = []
        if self.api_key:
            md.append(("authorization", "Bearer " + self.api_key))
        if tenant:
            md.append((TENANT_METADATA_KEY, tenant))
        self.metadata: Tuple[Tuple[str, str], ...] = tuple(md)

    def call_timeout(self, timeout: Optional[float]) -> Optional[float]:
        """call_timeout is a call's deadline in seconds: its own, or the
        client's default."""
        return timeout if timeout is not None else self.timeout

    def __repr__(self) -> str:  # never the key
        return f"Settings(target={self.target!r}, tls={self.tls})"


def to_spec(spec: Spec) -> run_pb2.RunSpec:
    """to_spec is spec as a RunSpec: a copy of a message, or a dict in
    protojson (camelCase, as examples/research.json's "spec")."""
    out = run_pb2.RunSpec()
    if isinstance(spec, run_pb2.RunSpec):
        out.CopyFrom(spec)
    else:
        json_format.ParseDict(dict(spec), out)
    return out


def to_task(task: TaskArg) -> run_pb2.TaskSpec:
    """to_task is task as a TaskSpec (a message, or a protojson dict)."""
    if isinstance(task, run_pb2.TaskSpec):
        return task
    return json_format.ParseDict(dict(task), run_pb2.TaskSpec())


def to_state(state: Union[None, int, str]) -> int:
    """to_state is a RunState from its number, its name ("RUN_STATE_RUNNING")
    or its short name ("running")."""
    if state is None:
        return run_pb2.RUN_STATE_UNSPECIFIED
    if isinstance(state, int):
        return state
    name = state.upper()
    if not name.startswith("RUN_STATE_"):
        name = "RUN_STATE_" + name
    return run_pb2.RunState.Value(name)


def new_key() -> str:
    """new_key is an idempotency key for a call that has none, so that a
    retry of it cannot create a second run."""
    return "py-" + uuid.uuid4().hex


def retryable(err: FanoutError) -> bool:
    """retryable reports whether a call that failed with err may be made
    again: the connection was lost or refused (UNAVAILABLE), reset under an
    open stream (INTERNAL or UNKNOWN from an RST_STREAM or a closed socket),
    or a watch fell too far behind (RESOURCE_EXHAUSTED, WATCH_READER_BEHIND).
    The server's own INTERNAL ("internal error") is not retried."""
    c = err.code
    if c == grpc.StatusCode.UNAVAILABLE:
        return True
    if c == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return err.reason == "WATCH_READER_BEHIND"
    if c in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
        m = err.message.lower()
        return any(s in m for s in ("rst_stream", "connection reset", "socket closed", "stream removed", "goaway"))
    return False


def check_sequence(ev: run_pb2.RunEvent, last: int) -> bool:
    """check_sequence reports whether ev is new (its sequence past last);
    an event after a gap is DATA_LOSS, never skipped in silence."""
    if ev.sequence <= last:
        return False
    if ev.sequence != last + 1:
        raise FanoutError(
            grpc.StatusCode.DATA_LOSS,
            f"run {ev.run_id}: event sequence {ev.sequence} after {last}: a gap in the stream",
        )
    return True

