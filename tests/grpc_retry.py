"""The retry hint of a refused gRPC call, as a client reads it: the rich status
(`grpc-status-details-bin`: a `google.rpc.Status` whose details hold a
`google.rpc.RetryInfo`) and `grpc-retry-pushback-ms`, which must agree."""

from __future__ import annotations

from typing import Any

from google.rpc import error_details_pb2, status_pb2


def retry_after_s(error: Any) -> int | None:
    """Seconds the refusal `error` (a grpc.RpcError or a finished aio call's trailers and
    status) asks the client to wait; None if it carries no retry info."""
    trailers = dict(error.trailing_metadata() or ())
    details = trailers.get("grpc-status-details-bin")
    if details is None:
        return None
    status = status_pb2.Status.FromString(details)
    assert status.code == error.code().value[0], (status.code, error.code())
    assert status.message == error.details()
    hints = []
    for detail in status.details:
        retry = error_details_pb2.RetryInfo()
        if detail.Unpack(retry):
            hints.append(retry.retry_delay.seconds)
    if len(hints) != 1:
        return None
    assert trailers.get("grpc-retry-pushback-ms") == str(hints[0] * 1000), trailers
    return int(hints[0])
