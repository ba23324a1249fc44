"""The typed errors, from a status's trailer (no fleet needed)."""

from __future__ import annotations

import grpc

import fanout
from fanout._rpc import status_pb2
from fanout.errors import make_error


def test_the_key_is_redacted_from_every_part() -> None:
    key = "sekrit-123"
    st = status_pb2.Status(code=grpc.StatusCode.INVALID_ARGUMENT.value[0], message="bad " + key)
    br = status_pb2.BadRequest()
    br.field_violations.add(field="spec.goal", description="echoes " + key)
    info = status_pb2.ErrorInfo(reason="BAD", metadata={"token": "Bearer " + key})
    # The client's copy of the protos has its own package: the type URLs are
    # google.rpc's, as the server sends them.
    st.details.add(type_url="type.googleapis.com/google.rpc.BadRequest", value=br.SerializeToString())
    st.details.add(type_url="type.googleapis.com/google.rpc.ErrorInfo", value=info.SerializeToString())
    trailers = (("grpc-status-details-bin", st.SerializeToString()),)
    err = make_error(grpc.StatusCode.INVALID_ARGUMENT, "bad " + key, trailers, key)
    assert isinstance(err, fanout.InvalidArgument)
    assert err.field_violations == [("spec.goal", "echoes [redacted]")]
    assert (err.reason, err.metadata) == ("BAD", {"token": "Bearer [redacted]"})
    assert key not in str(err) and key not in repr(err) and key not in err.message
