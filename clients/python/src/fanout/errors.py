"""Typed errors of the fanout client: one class per gRPC status code."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple, Type

import grpc

from fanout._rpc import status_pb2

_DETAILS_KEY = "grpc-status-details-bin"
_BAD_REQUEST = "type.googleapis.com/google.rpc.BadRequest"
_ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"


class FanoutError(Exception):
    """FanoutError is a call that failed: its gRPC status code, the server's
    message, and the fields it named as invalid (google.rpc.BadRequest) as
    (field, description) pairs. Subclasses name the codes; catch FanoutError
    for all of them. The message never holds the caller's API key."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        field_violations: Sequence[Tuple[str, str]] = (),
        reason: str = "",
        metadata: Optional[Dict[str, str]] = None,
    ) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.field_violations: List[Tuple[str, str]] = list(field_violations)
        #: google.rpc.ErrorInfo's reason, e.g. "WATCH_READER_BEHIND"; "" if none.
        self.reason = reason
        #: google.rpc.ErrorInfo's metadata.
        self.metadata: Dict[str, str] = dict(metadata or {})


class Cancelled(FanoutError): ...
class Unknown(FanoutError): ...
class InvalidArgument(FanoutError): ...
class DeadlineExceeded(FanoutError): ...
class NotFound(FanoutError): ...
class AlreadyExists(FanoutError): ...
class PermissionDenied(FanoutError): ...
class ResourceExhausted(FanoutError): ...
class FailedPrecondition(FanoutError): ...
class Aborted(FanoutError): ...
class OutOfRange(FanoutError): ...
class Unimplemented(FanoutError): ...
class Internal(FanoutError): ...
class Unavailable(FanoutError): ...
class DataLoss(FanoutError): ...
class Unauthenticated(FanoutError): ...


_BY_CODE: Dict[grpc.StatusCode, Type[FanoutError]] = {
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.UNKNOWN: Unknown,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRange,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
    grpc.StatusCode.INTERNAL: Internal,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DATA_LOSS: DataLoss,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
}


def make_error(
    code: grpc.StatusCode, message: str, trailers: object = None, secret: Optional[str] = None
) -> FanoutError:
    """make_error is the typed error of a status, its details decoded from the
    grpc-status-details-bin trailer. secret (the API key) is cut out of the
    message, the field violations and the ErrorInfo metadata, should a server
    or a transport ever echo it."""
    violations: List[Tuple[str, str]] = []
    reason, meta = "", {}
    for key, value in trailers or ():  # type: ignore[attr-defined]
        if key != _DETAILS_KEY or not isinstance(value, bytes):
            continue
        st = status_pb2.Status()
        try:
            st.ParseFromString(value)
        except Exception:  # a malformed trailer must not hide the status itself
            continue
        for any_ in st.details:
            if any_.type_url == _BAD_REQUEST:
                br = status_pb2.BadRequest()
                br.ParseFromString(any_.value)
                violations += [(v.field, v.description) for v in br.field_violations]
            elif any_.type_url == _ERROR_INFO and not reason:
                info = status_pb2.ErrorInfo()
                info.ParseFromString(any_.value)
                reason, meta = info.reason, dict(info.metadata)
    if secret:
        message = message.replace(secret, "[redacted]")
        violations = [(f, d.replace(secret, "[redacted]")) for f, d in violations]
        meta = {k: v.replace(secret, "[redacted]") for k, v in meta.items()}
    cls = _BY_CODE.get(code, FanoutError)
    return cls(code, message, violations, reason, meta)


def from_rpc_error(err: grpc.RpcError, secret: Optional[str] = None) -> FanoutError:
    """from_rpc_error is the typed error of a failed grpc (or grpc.aio) call."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN  # type: ignore[attr-defined]
    details = err.details() if hasattr(err, "details") else str(err)  # type: ignore[attr-defined]
    trailers = err.trailing_metadata() if hasattr(err, "trailing_metadata") else None  # type: ignore[attr-defined]
    return make_error(code or grpc.StatusCode.UNKNOWN, details or "", trailers, secret)
