"""The one error hierarchy of Switchboard.

Errors are raised where they are detected, as one of the classes below, and rendered by
each transport adapter in its protocol's own shape. A class says what kind of error it
is in the terms every protocol shares, its HTTP status and its gRPC status:

    SwitchboardError                 500  INTERNAL
    ├── InvalidRequest               400  INVALID_ARGUMENT
    │   ├── ContextLengthExceeded    400  RESOURCE_EXHAUSTED
    │   ├── PayloadTooLarge          413  RESOURCE_EXHAUSTED
    │   └── UnsupportedMediaType     415  INVALID_ARGUMENT
    ├── Unauthenticated              401  UNAUTHENTICATED
    ├── PermissionDenied             403  PERMISSION_DENIED
    ├── NotFound                     404  NOT_FOUND
    │   └── ModelNotFound            404  NOT_FOUND
    ├── FailedPrecondition           409  FAILED_PRECONDITION
    ├── ResourceExhausted            429  RESOURCE_EXHAUSTED
    ├── Aborted                      409  ABORTED
    ├── Overloaded                   503  UNAVAILABLE
    │   └── ShuttingDown             503  UNAVAILABLE
    ├── Unavailable                  503  UNAVAILABLE
    ├── EngineError                  500  INTERNAL
    │   └── EngineDead               503  UNAVAILABLE
    └── InternalError                500  INTERNAL

    ConfigError                      (not a client error: the server cannot start)

Each API words them in its own vocabulary where its protocol lives, so a new API adds an
error responder, not a column here: OpenAI's error `type` (`app.protocols.openai.errors`),
Anthropic's (`app.protocols.anthropic.errors`); GraphPipe's numeric error code is the
HTTP status (GraphPipe leaves codes to the server); the Salience and gRPC status is
`grpc_status`; an Evergreen abort carries `evergreen_reason`, a short upper-case reason,
plus the message, and closes its websocket with `evergreen_close_code`.

Exceptions coming from vLLM are translated into this tree in one place:
`app.engine.vllm.errors.map_engine_errors`. Any other exception that reaches a transport
is a bug of ours, never the client's: `client_error` is the one place that decides, and
`InternalError.wrap` logs it with a fresh id; the client sees that id and a fixed
message, never the exception's text.

What only the operator may read (a file path, a store's host, a library's own words) never
goes to a client either: an error that has such a detail is made with `withholding`, which
logs the detail under a fresh error id and gives the client a plain message ending with
that id, so one line of the log explains the client's error. One mechanism for every such
error (stores, LoRA adapters, bugs).

`ConfigError` is outside the tree on purpose: a bad flag or file at start-up is the
operator's, not a client's, and is never rendered to a client.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, ClassVar, Self

from app.wire_text import well_formed

logger = logging.getLogger(__name__)


def new_error_id() -> str:
    """An id the client's error and the server's log line share."""
    return uuid.uuid4().hex[:16]


# gRPC's numeric status codes, for the names used below.
_GRPC_CODES = {
    "INVALID_ARGUMENT": 3,
    "NOT_FOUND": 5,
    "PERMISSION_DENIED": 7,
    "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9,
    "ABORTED": 10,
    "UNIMPLEMENTED": 12,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
    "UNAUTHENTICATED": 16,
}


class SwitchboardError(Exception):
    """Base of every error Switchboard reports to a client."""

    http_status: ClassVar[int] = 500
    grpc_status: ClassVar[str] = "INTERNAL"
    evergreen_reason: ClassVar[str] = "INTERNAL"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        # Messages and params quote the client's input; repaired here, once, so that
        # every protocol's encoder can carry them (see app.wire_text).
        message = well_formed(message)
        super().__init__(message)
        self.message = message
        self.param = None if param is None else well_formed(param)
        self.code = code
        self.error_id: str | None = None  # set when the log holds what the message withholds

    @classmethod
    def withholding(
        cls, message: str, detail: object, *, level: int = logging.WARNING, **kwargs: Any
    ) -> Self:
        """This error, telling the client `message` and an error id; `detail` (what only
        the operator may read: a path, a host, a library's text; an exception is logged
        with its traceback) goes to the server's log, at `level`, under that id."""
        error_id = new_error_id()
        exc_info = detail if isinstance(detail, BaseException) else None
        logger.log(level, "%s (error id %s): %s", message, error_id, detail, exc_info=exc_info)
        error = cls(f"{message} (error id {error_id})", **kwargs)
        error.error_id = error_id
        return error

    @property
    def graphpipe_code(self) -> int:
        return self.http_status

    @property
    def evergreen_close_code(self) -> int:
        """The websocket close code an Evergreen abort ends with: 4000 + gRPC code."""
        return 4000 + _GRPC_CODES[self.evergreen_reason]


class InvalidRequest(SwitchboardError):
    """The client sent something malformed or out of range."""

    http_status = 400
    grpc_status = "INVALID_ARGUMENT"
    evergreen_reason = "INVALID_ARGUMENT"


class ContextLengthExceeded(InvalidRequest):
    """The prompt (plus requested output) does not fit in the model's context."""

    grpc_status = "RESOURCE_EXHAUSTED"
    evergreen_reason = "RESOURCE_EXHAUSTED"


class PayloadTooLarge(InvalidRequest):
    """A body, frame or message is over what the server takes, or would decode to more
    (`app.limits`): the client's to make smaller, never to retry as it is."""

    http_status = 413
    grpc_status = "RESOURCE_EXHAUSTED"
    evergreen_reason = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message, param=param, code="request_too_large")


class UnsupportedMediaType(InvalidRequest):
    """A body whose declared Content-Type the route does not take (a JSON API's body
    must be declared JSON: a web page can send any other type without asking)."""

    http_status = 415

    def __init__(self, message: str) -> None:
        super().__init__(message, code="unsupported_media_type")


class Unauthenticated(SwitchboardError):
    """A credential is configured and the client's is missing or wrong."""

    http_status = 401
    grpc_status = "UNAUTHENTICATED"
    evergreen_reason = "UNAUTHENTICATED"


class PermissionDenied(SwitchboardError):
    """The key is good, but its role may not do this (a tenant's key on a route that
    changes the server, a control plane's key on the data plane: `app.tenants`). Never
    for another tenant's stored thing, which is `NotFound`."""

    http_status = 403
    grpc_status = "PERMISSION_DENIED"
    evergreen_reason = "PERMISSION_DENIED"


class NotFound(SwitchboardError):
    """A named thing (session, node, adapter) does not exist."""

    http_status = 404
    grpc_status = "NOT_FOUND"
    evergreen_reason = "NOT_FOUND"


class ModelNotFound(NotFound):
    """The `model` (base model or LoRA adapter name) is not served here."""


class FailedPrecondition(SwitchboardError):
    """The request is well formed but the state it assumes is not the server's."""

    http_status = 409
    grpc_status = "FAILED_PRECONDITION"
    evergreen_reason = "FAILED_PRECONDITION"


class ResourceExhausted(SwitchboardError):
    """A configured limit (sessions, tokens, nodes, bytes) would be exceeded."""

    http_status = 429
    grpc_status = "RESOURCE_EXHAUSTED"
    evergreen_reason = "RESOURCE_EXHAUSTED"


class Aborted(SwitchboardError):
    """The operation collided with another one (e.g. a busy session)."""

    http_status = 409
    grpc_status = "ABORTED"
    evergreen_reason = "ABORTED"


class Overloaded(SwitchboardError):
    """Admission refused the request: the queue is at its bound, or the server is
    draining. `retry_after_s` is the hint each protocol passes on (HTTP Retry-After)."""

    http_status = 503
    grpc_status = "UNAVAILABLE"
    evergreen_reason = "UNAVAILABLE"

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message, code="overloaded")
        self.retry_after_s = retry_after_s


class ShuttingDown(Overloaded):
    """The refusal of a draining server (`app.drain`): the same refusal as a full queue in
    every protocol, except where a protocol words the two apart (Anthropic's 529
    `overloaded_error` is for a full queue only)."""


class Unimplemented(SwitchboardError):
    """The method exists in a protocol this server speaks, and this server does not serve
    it (an embedding call to a generation model, say)."""

    http_status = 501
    grpc_status = "UNIMPLEMENTED"
    evergreen_reason = "UNIMPLEMENTED"


class Unavailable(SwitchboardError):
    """A service the request needs besides the engine (the response store) cannot be
    reached; requests that do not need it are served as usual."""

    http_status = 503
    grpc_status = "UNAVAILABLE"
    evergreen_reason = "UNAVAILABLE"


class EngineError(SwitchboardError):
    """The engine failed while serving a valid request."""


class EngineDead(EngineError):
    """The engine process is gone; nothing can be served until restart."""

    http_status = 503
    grpc_status = "UNAVAILABLE"
    evergreen_reason = "UNAVAILABLE"


class InternalError(SwitchboardError):
    """A bug of ours reached a transport. The client sees only `error_id` and a fixed
    message; the exception itself is in the server's log under the same id."""

    def __init__(self, error_id: str) -> None:
        super().__init__(f"Internal server error (error id {error_id})", code="internal_error")
        self.error_id = error_id

    @classmethod
    def wrap(cls, exc: BaseException) -> InternalError:
        """Log `exc` (with its traceback) under a fresh id; the error to send instead."""
        error_id = new_error_id()
        logger.error("internal error %s", error_id, exc_info=(type(exc), exc, exc.__traceback__))
        return cls(error_id)


class ConfigError(Exception):
    """A setting, flag or file given at start-up cannot work; the server does not start."""


def client_error(exc: BaseException) -> SwitchboardError:
    """What the client is told of `exc`, for every transport: a `SwitchboardError` as
    it is; anything else is a bug of ours, logged under an id (`InternalError.wrap`)."""
    return exc if isinstance(exc, SwitchboardError) else InternalError.wrap(exc)
