"""An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`, the body
of an error answer and of an error event inside a stream.

`type` is OpenAI's word for the kind of error (`app.errors` classes, most specific
first); `code` is the error's own code when it has one (`context_length_exceeded`,
`overloaded`, `internal_error`, ...), else the HTTP status, as `vllm serve` writes it.
"""

from __future__ import annotations

from typing import Any

from app.errors import (
    Aborted,
    FailedPrecondition,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    SwitchboardError,
    Unauthenticated,
)

_TYPES: tuple[tuple[type[SwitchboardError], str], ...] = (
    (InvalidRequest, "invalid_request_error"),
    (Unauthenticated, "authentication_error"),
    (PermissionDenied, "permission_error"),
    (NotFound, "not_found_error"),
    (FailedPrecondition, "invalid_request_error"),
    (ResourceExhausted, "rate_limit_error"),
    (Aborted, "conflict_error"),
)


def error_type(error: SwitchboardError) -> str:
    for kind, name in _TYPES:
        if isinstance(error, kind):
            return name
    return "server_error"


def error_body(error: SwitchboardError, status: int | None = None) -> dict[str, Any]:
    """`status`, when the answer's status differs from the error's own (a framework
    error), is the code of an error that has none."""
    code: str | int = error.code if error.code is not None else (status or error.http_status)
    return {
        "error": {
            "message": error.message,
            "type": error_type(error),
            "param": error.param,
            "code": code,
        }
    }
