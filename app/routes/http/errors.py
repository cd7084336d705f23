"""Every error answer of the HTTP routes, in the shape of the API that was called.

Each HTTP API builds its router with `api_router(respond)`: its routes carry `respond`,
the API's `ErrorResponder` (body shape, status, headers), and every error raised while
one of them handles a request is answered by it; nothing picks a shape by path. A
request no route matched (an unknown path) gets the app's default responder, given to
`install_error_handlers`. Whatever the error:

- a `SwitchboardError` raised by a route or a dependency (the API key check);
- FastAPI's and Starlette's own: `RequestValidationError`, `HTTPException` (404 for an
  unknown path, 405 for a wrong method, with its `Allow` header kept: the route that
  matched the path but not the method answers it);
- any other exception before the response has started: a bug of ours, logged by
  `InternalError.wrap` and answered by `LastResortMiddleware`.

The last one cannot be left to Starlette: its `ServerErrorMiddleware` re-raises after
sending its plain 500, and uvicorn then closes the connection, so a client's next request
on a kept-alive connection is reset. `LastResortMiddleware` ends the exchange itself and
the connection stays usable. After the first byte of a response nothing can be said in
HTTP any more: streams put their errors in-band (`app.routes.http.calls`), and an
exception escaping one still ends the connection, as it must (the response is
incomplete).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from fastapi import APIRouter, FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import (
    InternalError,
    InvalidRequest,
    NotFound,
    Overloaded,
    SwitchboardError,
    Unauthenticated,
)
from app.protocols.bodies import describe_errors
from app.telemetry.http import RECORD


class ErrorResponder(Protocol):
    def __call__(
        self,
        error: SwitchboardError,
        status: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        """`error` as the API answers it; `status` overrides the error's own (a framework
        error keeps its status), `headers` go with the answer."""
        ...


def retry_headers(
    error: SwitchboardError, headers: Mapping[str, str] | None = None
) -> Mapping[str, str] | None:
    """`headers`, plus `Retry-After` for a refusal (`Overloaded`: the queue bound, or a
    draining server), in every API's shape."""
    if isinstance(error, Overloaded):
        return {**(headers or {}), "Retry-After": str(error.retry_after_s)}
    return headers


def api_router(respond: ErrorResponder, **kwargs: Any) -> APIRouter:
    """A router whose routes answer their errors with `respond`."""
    route_class = type("Route", (APIRoute,), {"respond_error": staticmethod(respond)})
    return APIRouter(route_class=route_class, **kwargs)


def _responder(scope: Scope, default: ErrorResponder) -> ErrorResponder:
    respond: ErrorResponder | None = getattr(scope.get("route"), "respond_error", None)
    return respond if respond is not None else default


def _from_http(request: Request, exc: HTTPException) -> SwitchboardError:
    """Starlette's HTTP errors (routing, FastAPI's body parsing) as errors of our tree."""
    where = f"{request.method} {request.url.path}"
    if exc.status_code == 404:
        return NotFound(f"No route for {where}")
    if exc.status_code == 405:
        return InvalidRequest(f"Method not allowed: {where}", code="method_not_allowed")
    if exc.status_code == 401:
        return Unauthenticated(str(exc.detail))
    if exc.status_code < 500:
        return InvalidRequest(str(exc.detail))
    return SwitchboardError(str(exc.detail))


def _told(scope: Scope, error: SwitchboardError) -> SwitchboardError:
    """`error`, noted on the request's record (`app.telemetry`) as what it answered."""
    record = scope.get(RECORD)
    if record is not None:
        record.failed(error)
    return error


def install_error_handlers(app: FastAPI, default: ErrorResponder) -> None:
    """Errors answered by the responder of the route that was called, `default` where no
    route was."""

    def respond(request: Request) -> ErrorResponder:
        return _responder(request.scope, default)

    @app.exception_handler(SwitchboardError)
    async def _switchboard_error(request: Request, exc: SwitchboardError) -> Response:
        return respond(request)(_told(request.scope, exc), None, retry_headers(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        error = describe_errors(exc.errors(), sourced=True)
        return respond(request)(_told(request.scope, error))

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> Response:
        error = _told(request.scope, _from_http(request, exc))
        return respond(request)(error, exc.status_code, exc.headers)

    app.add_middleware(LastResortMiddleware, default=default)


class LastResortMiddleware:
    """Answers, in the called API's shape, an exception no handler took, if no byte of
    the response has been sent yet; the connection stays open for the client's next
    request."""

    def __init__(self, app: ASGIApp, default: ErrorResponder) -> None:
        self.app = app
        self.default = default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        except ClientDisconnect:
            return  # gone while its body was being read: nobody to answer
        except Exception as exc:
            if started:
                raise
            # The router wrote the matched route into the scope (Starlette shares it).
            error = _told(scope, InternalError.wrap(exc))
            response = _responder(scope, self.default)(error)
            await response(scope, receive, send)
