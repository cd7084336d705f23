"""vLLM's exceptions -> `app.errors`, by type, in one place.

`map_engine_errors()` wraps calls into vLLM only, never our own code: anything else
escaping (a built-in ValueError included) is a bug, ours or vLLM's, and reaches the
transport as an `InternalError`. The mapping is by exception type, most specific first,
never by message.
"""

from __future__ import annotations

import logging

from vllm.exceptions import (
    GracefulHTTPError,
    MaxQueuedTokensError,
    QueueOverflowError,
    VLLMClientError,
    VLLMError,
    VLLMNotFoundError,
    VLLMUnprocessableEntityError,
    VLLMValidationError,
)
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

from app.errors import (
    EngineDead,
    EngineError,
    InvalidRequest,
    NotFound,
    Overloaded,
    ResourceExhausted,
    SwitchboardError,
)


def _translated(exc: BaseException) -> SwitchboardError | None:
    """The `app.errors` form of a vLLM exception, by its type, most specific first; None
    for anything else."""
    if isinstance(exc, EngineDeadError):
        return EngineDead("The engine is not running; the server must be restarted")
    if isinstance(exc, VLLMNotFoundError):
        return NotFound(str(exc))
    if isinstance(exc, VLLMValidationError | VLLMUnprocessableEntityError):
        # str() of these appends the rejected value, which may be anything a client sent.
        return InvalidRequest(str(exc.args[0]) if exc.args else "", param=exc.parameter)
    if isinstance(exc, VLLMClientError):
        return InvalidRequest(str(exc))
    if isinstance(exc, QueueOverflowError | MaxQueuedTokensError):
        # vLLM's own admission (--max-num-queued-reqs/-tokens passed through): refused as
        # ours is (app.admission), 503 with a retry hint.
        return Overloaded(exc.message, retry_after_s=1)
    if isinstance(exc, GracefulHTTPError):  # busy now, fine later
        return ResourceExhausted(exc.message)
    if isinstance(exc, EngineGenerateError | VLLMError):
        return EngineError.withholding("The engine failed the request", exc, level=logging.ERROR)
    return None


class _EngineErrorMap:
    """The context manager `map_engine_errors` returns: stateless, so one serves every
    call (it is entered once per streamed token; a generator-based one would be built
    each time)."""

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if exc is not None and (mapped := _translated(exc)) is not None:
            raise mapped from exc


_ENGINE_ERROR_MAP = _EngineErrorMap()


def map_engine_errors() -> _EngineErrorMap:
    """Translate vLLM's exceptions into `app.errors` by their types (`_translated`).

    Wraps calls into vLLM only, never our own code: anything else escaping (a built-in
    ValueError included) is a bug, ours or vLLM's, and reaches the transport as an
    `InternalError`. vLLM has no type for a prompt over the context (it raises a plain
    `VLLMValidationError`), so `app.engine.validation.check_prompt` runs before it is
    asked and its `ContextLengthExceeded` is the only one there is.
    """
    return _ENGINE_ERROR_MAP
