"""An error in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`, the
body of an error answer and the data of a stream's `error` event, with Anthropic's
status for it.

    app.errors class                 Anthropic type           status
    PayloadTooLarge                  request_too_large        413
    UnsupportedMediaType             invalid_request_error    415
    InvalidRequest (and its kin)     invalid_request_error    400
    Unauthenticated                  authentication_error     401
    PermissionDenied                 permission_error         403
    NotFound, ModelNotFound          not_found_error          404
    ResourceExhausted                rate_limit_error         429
    Overloaded (a full queue)        overloaded_error         529 + Retry-After
    ShuttingDown (a draining server) overloaded_error         503 + Retry-After
    anything else (EngineDead, a bug of ours)  api_error      500

529 is Anthropic's status for an overloaded API, and the anthropic SDK retries it
(honouring Retry-After), as Claude Code does. A draining server answers 503 instead:
HTTP's "unavailable, retry later" is what proxies and service meshes know to retry on
another replica (529 is Anthropic's own code, which they do not know), and the SDK
retries any 5xx alike. Anthropic's other statuses (402, 504) name conditions a
self-hosted server does not have. A conflict (409) or failed precondition is the
client's request at odds with the server's state: `invalid_request_error`, 400.
"""

from __future__ import annotations

from typing import Any

from app.errors import (
    Aborted,
    FailedPrecondition,
    InvalidRequest,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    PermissionDenied,
    ResourceExhausted,
    ShuttingDown,
    SwitchboardError,
    Unauthenticated,
    UnsupportedMediaType,
)

OVERLOADED_STATUS = 529

# Most specific first.
_KINDS: tuple[tuple[type[SwitchboardError], str, int], ...] = (
    (PayloadTooLarge, "request_too_large", 413),
    (UnsupportedMediaType, "invalid_request_error", 415),
    (InvalidRequest, "invalid_request_error", 400),
    (FailedPrecondition, "invalid_request_error", 400),
    (Aborted, "invalid_request_error", 400),
    (Unauthenticated, "authentication_error", 401),
    (PermissionDenied, "permission_error", 403),
    (NotFound, "not_found_error", 404),
    (ResourceExhausted, "rate_limit_error", 429),
    (ShuttingDown, "overloaded_error", 503),
    (Overloaded, "overloaded_error", OVERLOADED_STATUS),
)


def error_kind(error: SwitchboardError) -> tuple[str, int]:
    """Anthropic's type and status for `error`."""
    for kind, name, status in _KINDS:
        if isinstance(error, kind):
            return name, status
    return "api_error", 500


def error_body(error: SwitchboardError) -> dict[str, Any]:
    name, _ = error_kind(error)
    return {"type": "error", "error": {"type": name, "message": error.message}}
