"""A websocket's text frames written as they come, from synchronous code (the engine's
loop), in order (`app.routes.send_writer`), to the server's own `send` past the
middleware stack (`app.routes.raw_send`): what a websocket transport whose frames the
engine pushes (the Responses API's websocket mode) writes with. Frames written while a
send waits go out one by one after it; `drained()` waits for them all.
"""

from __future__ import annotations

from starlette.types import Message
from starlette.websockets import WebSocket

from app.routes.raw_send import raw_send
from app.routes.send_writer import SendWriter


def text_frame(text: str) -> Message:
    """A websocket text frame."""
    return {"type": "websocket.send", "text": text}


def frame_writer(websocket: WebSocket) -> SendWriter[str]:
    """`websocket`'s text frames, written as they come."""
    return SendWriter(raw_send(websocket.scope, websocket.send), text_frame, None)
