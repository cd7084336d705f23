"""Which web pages may drive this server: its own (the playground), the origins the
operator allows (`--allowed-origins`, vLLM's flag, which also drives CORS with
`--allowed-methods` and `--allowed-headers`, as in vLLM), and no other.

A browser sends `Origin` with every websocket upgrade and every request but a plain GET
or HEAD, and lets any page send some of them without asking the server first: a
websocket to any host (no CORS applies to websockets: cross-site websocket hijacking), a
form or `text/plain` POST. So `OriginGuard`, around the whole app, refuses an upgrade or
a request that can change something (any method but GET, HEAD and OPTIONS) whose
`Origin` is neither the server's own (the scheme and host the request was sent to: the
`Host` header, as a browser on the playground's page sends it) nor allowed: a websocket
is refused before it is accepted (uvicorn answers 403), a request 403 in the default
error shape. A client that sends no `Origin` (every SDK, agent, router, gRPC stub,
curl) is never affected. `--allowed-origins '["*"]'` allows every page, as it does for
CORS. Reads (GET, HEAD) and CORS preflights (OPTIONS) pass: CORS decides whether a page
may read an answer (`install_origins` adds Starlette's CORS middleware when origins are allowed;
with none, a page gets no CORS header, as from `vllm serve`).
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from app.errors import PermissionDenied
from app.protocols.openai.errors import error_body
from app.routes.http.json import dump_json

_READS = frozenset({"GET", "HEAD", "OPTIONS"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin_of(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an origin, None when it is not one (`null`, garbage)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    return parts.scheme, parts.hostname.lower(), port or _DEFAULT_PORTS[parts.scheme]


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


class OriginGuard:
    """Refuses what a foreign page sends (see the module docstring)."""

    def __init__(self, app: ASGIApp, allowed: Sequence[str]) -> None:
        self.app = app
        self.any = "*" in allowed
        self.allowed = frozenset(allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "websocket" or (kind == "http" and scope["method"] not in _READS):
            origin = _header(scope, b"origin")
            if origin is not None and not self.allows(origin, scope):
                await self._refuse(scope, send, origin)
                return
        await self.app(scope, receive, send)

    def allows(self, origin: str, scope: Scope) -> bool:
        if self.any or origin in self.allowed:
            return True
        page = _origin_of(origin)
        host = _header(scope, b"host")
        if page is None or host is None:
            return False
        # The scheme the client reached this server with, as a page's origin spells it.
        scheme = "https" if scope.get("scheme") in ("https", "wss") else "http"
        return page == _origin_of(f"{scheme}://{host}")

    async def _refuse(self, scope: Scope, send: Send, origin: str) -> None:
        if scope["type"] == "websocket":
            # Before the accept, a close is uvicorn's 403 to the upgrade.
            await send({"type": "websocket.close", "code": 1008})
            return
        error = PermissionDenied(
            f"Requests from the web page at {origin} are not allowed here "
            "(the server's --allowed-origins)"
        )
        body = dump_json(error_body(error))
        await send(
            {
                "type": "http.response.start",
                "status": 403,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def install_origins(
    app: Starlette, origins: Sequence[str], methods: Sequence[str], headers: Sequence[str]
) -> None:
    """The origin guard around `app`, outermost, and Starlette's CORS middleware inside it
    (as `vllm serve` adds it) when any origin is allowed."""
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(origins),
            allow_methods=list(methods),
            allow_headers=list(headers),
        )
    app.add_middleware(OriginGuard, allowed=list(origins))
