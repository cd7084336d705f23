"""What every gRPC adapter needs: how a service is registered, and how a call ends with
an error.

`abort` is the gRPC form of the one rule for errors: a `SwitchboardError` ends the call
with its own status (`app.errors` names it per class) and message; any other exception
is a bug of ours, logged by `InternalError.wrap` under an id, and the client sees INTERNAL
with that id, never the exception's text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from fastapi import FastAPI

from app.errors import InternalError, SwitchboardError

Context = grpc.aio.ServicerContext[Any, Any]


@dataclass(frozen=True, slots=True)
class Service:
    """A protocol service: its full name, and how to add its servicer, for an app, to a
    server."""

    name: str
    add: Callable[[grpc.aio.Server, FastAPI], None]


def status_code(exc: SwitchboardError) -> grpc.StatusCode:
    return grpc.StatusCode[exc.grpc_status]


async def abort(context: Context, exc: BaseException) -> NoReturn:
    """End the call with `exc` as its status."""
    error = exc if isinstance(exc, SwitchboardError) else InternalError.wrap(exc)
    await context.abort(status_code(error), error.message)
