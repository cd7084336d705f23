"""The HTTP edge of telemetry: an ASGI middleware around the app.

For every HTTP request: its id (`ids.from_headers`: the client's `x-request-id`, or a
new one) answered as `x-request-id` on the response, in the log lines written while it
is served (`logs.REQUEST_ID`), and its `RequestRecord` opened (traced: its span under the
caller's `traceparent`) and put in the scope (`record_of`) for the road to fill, then
reported once the answer's last byte has gone (the app has returned): its status, its
route (`http.route`), its tenant (the principal the route's key check left on the
connection's state: `app.routes.deps.authenticated`, its bounded label) and, for a route
of an inference API, the `api` its metrics go under. The scrapes and probes
(`/metrics`, `/health`, `/ready`) get their id but no record: they would drown the log.

For a websocket: its `Caller` (`caller_of`: its id, taken or minted the same way, its
client and trace context), its id answered on the upgrade (`x-request-id` on the accept);
each call on the socket opens a record of its own under it (`Telemetry.open_call`).
"""

from __future__ import annotations

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.telemetry.callers import Caller
from app.telemetry.ids import from_headers
from app.telemetry.logs import REQUEST_ID
from app.telemetry.record import RequestRecord
from app.telemetry.reports import Telemetry
from app.telemetry.tracing import carrier_of

RECORD = "switchboard.record"
CALLER = "switchboard.caller"
_HEADER = b"x-request-id"
_UNRECORDED = frozenset({"/metrics", "/health", "/ready"})

# The inference APIs' routes: (method, route template) -> the `api` label.
# The websockets that are session connections: path -> the `api` label.
SESSION_PATHS = {
    "/salience/ws": "salience",
    "/evergreen/ws": "evergreen",
    "/v1/responses": "responses",
}

API_ROUTES = {
    ("POST", "/v1/completions"): "completions",
    ("POST", "/v1/chat/completions"): "chat",
    ("POST", "/v1/responses"): "responses",
    ("POST", "/v1/responses/compact"): "responses",
    ("POST", "/v1/messages"): "messages",
    ("POST", "/graphpipe"): "graphpipe",
    ("POST", "/graphpipe/{model:rest}"): "graphpipe",
    ("POST", "/inference/v1/generate"): "tokens",
}


def record_of(conn: HTTPConnection) -> RequestRecord:
    """The record of the HTTP request being served."""
    record: RequestRecord = conn.scope[RECORD]
    return record


def caller_of(conn: HTTPConnection) -> Caller:
    """The caller of the websocket being served."""
    caller: Caller = conn.scope[CALLER]
    return caller


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else ""


class HttpTelemetry:
    def __init__(self, app: ASGIApp, telemetry: Telemetry) -> None:
        self.app = app
        self._telemetry = telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "websocket":
            await self._websocket(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = scope["headers"]
        request_id = from_headers(headers)
        answered_id = (_HEADER, request_id.encode())
        path, method = scope["path"], scope["method"]
        record = None
        if path not in _UNRECORDED:
            telemetry = self._telemetry
            carrier = carrier_of(headers) if telemetry.tracing is not None else None
            record = telemetry.open(
                request_id, name=f"{method} {path}", client=_client(scope), carrier=carrier
            )
            record.method = method
            scope[RECORD] = record

        async def answer(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), answered_id]
                if record is not None:
                    record.status = message["status"]
            await send(message)

        token = REQUEST_ID.set(request_id)
        try:
            await self.app(scope, receive, answer)
        finally:
            REQUEST_ID.reset(token)
            if record is not None:
                route = getattr(scope.get("route"), "path", "")
                record.route = route
                record.api = API_ROUTES.get((method, route))
                principal = scope.get("state", {}).get("principal")  # app.routes.deps'
                if principal is not None:
                    record.tenant = principal.label
                if not record.status:  # the app raised before answering
                    record.status = 500
                self._telemetry.close(record)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = scope.setdefault("state", {})
        caller = scope[CALLER] = Caller.of_headers(scope["headers"], _client(scope), state)
        request_id = caller.request_id
        answered_id = (_HEADER, request_id.encode())
        api = SESSION_PATHS.get(scope["path"])
        metrics = self._telemetry.metrics
        accepted = False

        async def answer(message: Message) -> None:
            nonlocal accepted
            if message["type"] == "websocket.accept":
                message["headers"] = [*message.get("headers", ()), answered_id]
                if api is not None:
                    accepted = True
                    metrics.connected(api, None, +1)
            await send(message)

        token = REQUEST_ID.set(request_id)
        try:
            await self.app(scope, receive, answer)
        finally:
            REQUEST_ID.reset(token)
            if accepted and api is not None:
                metrics.connected(api, None, -1)
