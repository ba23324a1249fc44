"""fanout is the Python client of the fanout orchestrator: fanout.Client
(blocking, grpcio) and fanout.aio.Client (asyncio), typed errors
(fanout.FanoutError and one subclass per gRPC code), and the generated
messages under fanout.v1 (RunSpec, Run, RunEvent, ...)."""

from fanout._sync import Client
from fanout.errors import (
    Aborted,
    AlreadyExists,
    Cancelled,
    DataLoss,
    DeadlineExceeded,
    FailedPrecondition,
    FanoutError,
    Internal,
    InvalidArgument,
    NotFound,
    OutOfRange,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    Unknown,
)
from fanout.v1.orchestrator_pb2 import PendingToolCall, ToolCallDecision
from fanout.v1.run_pb2 import Run, RunEvent, RunSpec, RunState, TaskOutcome, TaskSpec

__all__ = [
    "Client", "FanoutError", "Aborted", "AlreadyExists", "Cancelled", "DataLoss", "DeadlineExceeded",
    "FailedPrecondition", "Internal", "InvalidArgument", "NotFound", "OutOfRange", "PermissionDenied",
    "ResourceExhausted", "Unauthenticated", "Unavailable", "Unimplemented", "Unknown",
    "PendingToolCall", "ToolCallDecision", "Run", "RunEvent", "RunSpec", "RunState", "TaskOutcome", "TaskSpec",
]
