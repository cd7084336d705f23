"""The Responses API's websocket mode: `GET /v1/responses`, upgraded (OpenAI's, and the
Open Responses spec's `x-openresponses-websocket`; the Codex CLI asks for it with
`OpenAI-Beta: responses_websockets=2026-02-06`, which changes nothing here).

One connection carries many responses, one after the other. The client sends
`response.create` frames: the body of `POST /v1/responses` plus `"type":
"response.create"` (`stream` is implied and ignored; `background` is refused: a
background run belongs to HTTP). Each is answered with the events its SSE stream would
carry, in the same order, each as one JSON text frame; frames that arrive while a
response runs wait their turn (up to `MAX_WAITING`, past which one is refused). A frame
is parsed as an HTTP body is (`app.routes.body_worker`: over 256 KiB in a child process,
off the event loop, once the pace for big bodies took it in: `app.routes.body_pace`).
`generate: false` plans the response (every check) and completes it with no output,
without the engine: a warm-up to continue from. A turn continues the last with
`previous_response_id` and only its new input, from the connection's own responses
(`store: false` ones included, up to `--responses-ws-kept` of them) or the store.

Errors before a response starts (a frame that is not a `response.create`, a bad body, an
unknown model or `previous_response_id`, admission's refusal) are the spec's
`WebSocketErrorEvent`: `{"type": "error", "status", "error": {"type", "code", "message",
"param"}}` (a refusal's `Retry-After` in `error.headers`), and the connection stays
usable; one that fails after it started ends as its SSE stream would (`error`, then
`response.failed`). A client that closes the socket cancels what is running (its engine
request is aborted) and what waits.

The same auth as HTTP (`Authorization: Bearer`, or `?token=`): a refused client, and any
client of a draining server, is answered at the handshake with OpenAI's error body and
status (401, 503 with Retry-After) where the server can send one, else with the error
event and close code 1008 or 1001. The drain's goodbye to an open connection, once its
work has ended: the error event (503, the server is shutting down), then close code 1001
(going away), which clients read as "reconnect" (the openai SDK's `responses.connect`
retries on it; the Codex CLI opens a new connection for its next turn).

Each response is a request of its own to telemetry (`app.telemetry`): its record, span
(under the upgrade's `traceparent`) and access-log line, its id the connection's
`x-request-id` and its number on the connection (`<id>.1`, `<id>.2`, ...), reported
once its last frame has been written.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect

from app.errors import InvalidRequest, ResourceExhausted, SwitchboardError, client_error
from app.protocols.bodies import validate
from app.protocols.exchange import Event
from app.protocols.openai.errors import error_body
from app.routes.body_worker import IN_CHILD_BYTES, client_of
from app.routes.deps import get_drain, get_engine, get_objects, get_settings
from app.routes.http.errors import retry_headers
from app.routes.http.json import OrjsonResponse, dump_json
from app.routes.ws.frame_writer import frame_writer
from app.routes.ws.opening import GOING_AWAY, caller, refusal_close_code
from app.routes.ws.pump import WebSocketPump
from app.sessions.calls import stream_call
from app.sessions.lifetime import SessionLifetime
from app.sessions.responses import ConnectionResponses, Responses
from app.telemetry.http import caller_of
from app.telemetry.logs import logging_as
from app.telemetry.record import RequestRecord
from app.telemetry.reports import Telemetry
from app.tenants import Principal
from schemas.openai_responses import ResponsesRequest

router = APIRouter()
MAX_WAITING = 16  # response.create frames held while one runs
CREATE = "response.create"


def error_event(error: SwitchboardError) -> dict[str, Any]:
    """`error` as the spec's `WebSocketErrorEvent`."""
    payload = error_body(error)["error"]
    payload["code"] = str(payload["code"])
    headers = retry_headers(error)
    if headers:
        payload["headers"] = {name.lower(): value for name, value in headers.items()}
    return {"type": "error", "status": error.http_status, "error": payload}


def read_create(data: Any) -> tuple[ResponsesRequest, bool]:
    """A `response.create` frame's body (parsed), and whether to generate."""
    if not isinstance(data, dict) or data.get("type") != CREATE:
        raise InvalidRequest(
            f"Each client event is a JSON object with type {CREATE!r}", param="type"
        )
    generate = data.pop("generate", True)
    if not isinstance(generate, bool):
        raise InvalidRequest("generate is true or false", param="generate")
    if data.get("background"):
        raise InvalidRequest(
            "background responses are not run over the websocket; create them over HTTP",
            param="background",
        )
    del data["type"]
    data.pop("stream", None)
    return validate(ResponsesRequest, data), generate


@router.websocket("/v1/responses")
async def responses_socket(websocket: WebSocket) -> None:
    lifetime = SessionLifetime(get_drain(websocket))
    try:
        principal = lifetime.open(lambda: caller(websocket))
    except SwitchboardError as refused:
        await _refuse(websocket, refused)
        return
    connection = _Connection(websocket, get_objects(websocket.app).responses, principal)
    await websocket.accept()
    async with lifetime.serving(connection.goodbye):
        await connection.serve()


async def _refuse(websocket: WebSocket, error: SwitchboardError) -> None:
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(
            OrjsonResponse(error_body(error), error.http_status, headers=retry_headers(error))
        )
        return
    await websocket.accept()
    await websocket.send_text(dump_json(error_event(error)).decode())
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        await websocket.close(refusal_close_code(error))


class _Connection:
    """One socket, of one principal: its frames read as they come, its responses run one
    at a time."""

    def __init__(self, websocket: WebSocket, responses: Responses, principal: Principal) -> None:
        self.pump = WebSocketPump(websocket)
        self.pump.on_frame_too_large(lambda error: dump_json(error_event(error)).decode())
        self.responses = responses
        self.principal = principal
        self.engine = get_engine(websocket)
        self.kept = ConnectionResponses(get_settings(websocket).responses_ws_kept)
        self.writer = frame_writer(websocket)
        self.waiting: asyncio.Queue[bytes | str] = asyncio.Queue()
        self.caller = caller_of(websocket)
        self.telemetry: Telemetry = websocket.app.state.telemetry
        self.body_worker = get_objects(websocket.app).body_worker
        self.body_pace = get_objects(websocket.app).body_pace
        peer = websocket.client.host if websocket.client is not None else None
        self.client = client_of(principal, peer)  # whose turn its big frames are parsed in

    def emit(self, events: list[Event]) -> None:
        if self.pump.open:
            for _, body in events:
                self.writer.write(dump_json(body).decode())

    def refuse(self, error: SwitchboardError) -> None:
        if self.pump.open:
            self.writer.write(dump_json(error_event(error)).decode())

    async def serve(self) -> None:
        worker = asyncio.create_task(self._answer_all())
        try:
            async for frame in self.pump.frames():
                if self.waiting.qsize() >= MAX_WAITING:
                    self.refuse(
                        ResourceExhausted(
                            f"At most {MAX_WAITING} responses wait on one connection; "
                            "send the next once one has ended",
                            code="too_many_waiting",
                        )
                    )
                    continue
                self.waiting.put_nowait(frame)
        finally:  # the client left (or the drain closed it): nothing more runs
            self.pump.open = False
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
            with contextlib.suppress(Exception):
                await self.writer.drained()

    async def _answer_all(self) -> None:
        while True:
            frame = await self.waiting.get()
            record = self.telemetry.open_call(self.caller, name=CREATE, api="responses")
            try:
                with logging_as(record.request_id):
                    await self._answer(frame, record)
                    # Its last frames out before the next response starts.
                    await self.writer.drained()
            finally:
                self.telemetry.close(record)

    async def _answer(self, frame: bytes | str, record: RequestRecord) -> None:
        try:
            # A frame is parsed as an HTTP body is (the body worker's rule: a big one
            # in a child, off the event loop), a big one once the pace took it in.
            if len(frame) > IN_CHILD_BYTES:
                await self.body_pace.pay(self.client, len(frame))
            data = await self.body_worker.parse("json", frame, client=self.client)
            body, generate = read_create(data)
            call = await self.responses.start(
                self.principal, body, record, kept=self.kept, generate=generate
            )
        except Exception as exc:
            error = client_error(exc)
            record.failed(error)
            self.refuse(error)
            return
        hooks = self.responses.hooks(self.principal, call, body, self.kept)
        await stream_call(self.engine, call, self.emit, hooks)

    async def goodbye(self, refusal: SwitchboardError) -> None:
        """The drain's: once what runs has ended, the error event and 1001."""
        self.refuse(refusal)
        with contextlib.suppress(Exception):
            await self.writer.drained()
        await self.pump.close(GOING_AWAY)
