"""Every error answer of the HTTP routes, in its protocol's shape.

Paths under `/graphpipe` answer a GraphPipe `InferResponse` flatbuffer carrying one
`Error` whose code is the HTTP status (the spec's error shape); every other path answers
OpenAI's `{"error": {"message", "type", "param", "code"}}`. An `Overloaded` refusal
(admission's bound, or a draining server) carries its retry hint as `Retry-After` in
both shapes. Whatever the error:

- a `SwitchboardError` raised by a route or a dependency (the API key check);
- FastAPI's and Starlette's own: `RequestValidationError`, `HTTPException` (404 for an
  unknown path, 405 for a wrong method, with its `Allow` header kept);
- any other exception before the response has started: a bug of ours, logged by
  `InternalError.wrap` and answered by `LastResortMiddleware`.

The last one cannot be left to Starlette: its `ServerErrorMiddleware` re-raises after
sending its plain 500, and uvicorn then closes the connection, so a client's next request
on a kept-alive connection is reset. `LastResortMiddleware` ends the exchange itself and
the connection stays usable. After the first byte of a response nothing can be said in
HTTP any more: streams put their errors in-band (see `app.routes.http.sse`), and an exception
escaping one still ends the connection, as it must (the response is incomplete).
"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
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
from app.protocols.graphpipe.encode import encode_errors
from app.routes.http.bodies import describe_errors
from app.routes.http.json import OrjsonResponse

GRAPHPIPE_PREFIX = "/graphpipe"
OCTET_STREAM = "application/octet-stream"


def is_graphpipe(path: str) -> bool:
    return path == GRAPHPIPE_PREFIX or path.startswith(GRAPHPIPE_PREFIX + "/")


def _headers(exc: SwitchboardError, headers: Mapping[str, str] | None) -> Mapping[str, str] | None:
    if isinstance(exc, Overloaded):
        return {**(headers or {}), "Retry-After": str(exc.retry_after_s)}
    return headers


def graphpipe_error(
    exc: SwitchboardError, status: int | None = None, headers: Mapping[str, str] | None = None
) -> Response:
    """An `InferResponse` holding only `exc` as its one `Error`; code = HTTP status."""
    status = status or exc.graphpipe_code
    body = encode_errors([(status, exc.message)])
    return Response(
        body, status_code=status, media_type=OCTET_STREAM, headers=_headers(exc, headers)
    )


def openai_error(
    exc: SwitchboardError, status: int | None = None, headers: Mapping[str, str] | None = None
) -> Response:
    body = exc.openai_body()
    if status is not None and exc.code is None:
        body["error"]["code"] = status  # type: ignore[index]
    return OrjsonResponse(
        body, status_code=status or exc.http_status, headers=_headers(exc, headers)
    )


def error_response(
    path: str,
    exc: SwitchboardError,
    status: int | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """`exc` in the shape of the protocol served at `path`; `status` overrides its own."""
    render = graphpipe_error if is_graphpipe(path) else openai_error
    return render(exc, status, headers)


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


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(SwitchboardError)
    async def _switchboard_error(request: Request, exc: SwitchboardError) -> Response:
        return error_response(request.url.path, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        return error_response(request.url.path, describe_errors(exc.errors(), sourced=True))

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> Response:
        error = _from_http(request, exc)
        return error_response(request.url.path, error, exc.status_code, exc.headers)

    app.add_middleware(LastResortMiddleware)


class LastResortMiddleware:
    """Answers, in the protocol's shape, an exception no handler took, if no byte of the
    response has been sent yet; the connection stays open for the client's next request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

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
            response = error_response(scope["path"], InternalError.wrap(exc))
            await response(scope, receive, send)
