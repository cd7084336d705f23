"""What a connection may hold before it has made a request: uvicorn's httptools protocol
with a bound on connections and on each request's head.

uvicorn bounds neither (measured: 64 connections that sent half a request head and
waited were all still open 70 s later; `limit_concurrency` only answers once a head is
complete, and a head's header lines are gathered into a list without end). So, in the
protocol class `uvicorn_config` gives uvicorn (`guarded_http`):

- connections: past `--max-connections` open at once (HTTP and websockets alike: an
  upgraded connection stays counted), a new one is answered 503 with Retry-After and
  closed before any of its bytes is read;
- a request's head (request line and headers) must arrive within
  `--header-timeout-s` of its first byte (of the connection, for its first request),
  else 408 and the connection is closed: a client that trickles a head holds nothing
  longer than that;
- a head holds at most `MAX_HEAD_BYTES` and `MAX_HEADERS` fields (431 past either, as
  h11's and vLLM's own bounds of a head).

Each refusal is an error body in the app's default shape (OpenAI's: nothing has named
an API yet), with `connection: close`; what the client sends after it is not read.
Keep-alive idleness between requests stays uvicorn's (`timeout_keep_alive`).

A websocket frame (or message) over uvicorn's `ws_max_size` (16 MiB) is refused by the
websockets library before it is read, with close code 1009 and no word in the socket's
own protocol. `GuardedWebSockets` (uvicorn's sans-IO websocket protocol) writes, just
before that close, the frame the socket's route registered for it (`on_frame_too_large`:
Salience's error, Evergreen's ABORT, the Responses API's error event), so the client is
told in its protocol why.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from starlette.types import Scope
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.exceptions import PayloadTooBig
from websockets.frames import OP_BINARY, OP_TEXT, Frame

from app.errors import InvalidRequest, Overloaded, PayloadTooLarge, SwitchboardError
from app.protocols.openai.errors import error_body
from app.routes.http.json import dump_json

# What a websocket route registers in its scope: the frame (text or binary, the socket's
# protocol and encoding) telling its client of `error`, written before the close 1009.
TooLarge = Callable[[SwitchboardError], bytes | str]
_FRAME_TOO_LARGE = "switchboard.frame_too_large"
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 256
_REASONS = {
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}


class _Refused(Exception):
    """Stops the parser once a head is refused (control flow: httptools reports it as a
    parser error, which uvicorn answers with `send_400_response`, silenced here)."""


def refusal(status: int, error: SwitchboardError) -> bytes:
    """A whole HTTP/1.1 answer that ends the connection."""
    body = dump_json(error_body(error, status))
    head = [
        b"HTTP/1.1 %d %b" % (status, _REASONS[status]),
        b"content-type: application/json",
        b"content-length: %d" % len(body),
        b"connection: close",
    ]
    if isinstance(error, Overloaded):
        head.append(b"retry-after: %d" % error.retry_after_s)
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol, bounded as the module docstring says. The bounds are
    class attributes: `guarded_http` makes the class a server runs with."""

    header_timeout_s: float = 10.0
    max_connections: int = 4096

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvicorn's signature narrows asyncio's BaseTransport
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            limit = self.max_connections
            self._refuse(
                503,
                Overloaded(
                    f"The server holds its limit of {limit} connections; retry after 1 s",
                    retry_after_s=1,
                ),
            )
            return
        self._start_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_head()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._refused:
            super().data_received(data)

    def send_400_response(self, msg: str) -> None:
        # A head refused in a parser callback surfaces to uvicorn as a parser error:
        # the refusal has been written already.
        if not self._refused:
            super().send_400_response(msg)

    # -- the head ----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        if self._head_timer is None:
            self._start_head()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value))
        if len(self.headers) >= MAX_HEADERS:
            self._refuse(431, InvalidRequest(f"The request has more than {MAX_HEADERS} headers"))
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._end_head()
        super().on_headers_complete()

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            self._refuse(431, InvalidRequest(f"The request head is over {MAX_HEAD_BYTES} bytes"))
            raise _Refused

    def _start_head(self) -> None:
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_late)

    def _end_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is being answered: its head came in time
        seconds = f"{self.header_timeout_s:g}"
        self._refuse(408, InvalidRequest(f"The request head did not arrive within {seconds} s"))

    def _refuse(self, status: int, error: SwitchboardError) -> None:
        self._refused = True
        self._end_head()
        if not self.transport.is_closing():
            self.transport.write(refusal(status, error))
            self.transport.close()


def on_frame_too_large(scope: Scope, answer: TooLarge) -> None:
    """Have a frame over the size limit answered with `answer(error)` on this socket."""
    scope[_FRAME_TOO_LARGE] = answer


class GuardedWebSockets(WebSocketsSansIOProtocol):
    """uvicorn's sans-IO websocket protocol, telling a client in its socket's protocol why
    a frame over the size limit ends it (see the module docstring). The rest of that
    message is read and dropped, not left unread: closing on unread bytes resets the
    connection, and a reset loses what was sent before it (the client's kernel drops it)."""

    _refusing = False

    def data_received(self, data: bytes) -> None:
        if not self._refusing:  # refusing: the rest of the refused message, dropped
            super().data_received(data)

    def handle_parser_exception(self) -> None:
        exc = self.conn.parser_exc
        answer = getattr(self, "scope", {}).get(_FRAME_TOO_LARGE)
        if not (isinstance(exc, PayloadTooBig) and answer is not None and self.handshake_complete):
            super().handle_parser_exception()
            return
        error = PayloadTooLarge(
            f"A websocket message of {exc.size or 'over'} bytes is over this server's "
            f"limit of {exc.max_size} bytes"
        )
        frame = answer(error)
        data = frame.encode() if isinstance(frame, str) else frame
        opcode = OP_TEXT if isinstance(frame, str) else OP_BINARY
        # The protocol's own error, then the close the library has queued (1009).
        closing = b"".join(self.conn.data_to_send())
        self.transport.write(
            Frame(opcode, data).serialize(mask=False, extensions=self.conn.extensions) + closing
        )
        self.queue.put_nowait({"type": "websocket.disconnect", "code": 1009})
        self.close_sent = True
        self._refusing = True
        if self.transport.can_write_eof():
            self.transport.write_eof()  # the client reads it all, then our end
        self.close_timer = self.loop.call_later(self.close_timeout, self.transport.close)


def guarded_http(header_timeout_s: float, max_connections: int) -> type[GuardedHttpTools]:
    """The protocol class for a server with these bounds."""
    return type(
        "GuardedHttpTools",
        (GuardedHttpTools,),
        {"header_timeout_s": header_timeout_s, "max_connections": max_connections},
    )
