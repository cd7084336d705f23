"""`Exchange`: what one client call of a call-shaped API is, to the road that runs it.

Every API that runs engine requests for one call and answers in one body or one stream
(OpenAI Completions, Chat Completions, Responses, Anthropic Messages) is an exchange
built from the client's body, sans-IO: the shared road (`app.sessions.calls`) admits the
call, builds its exchange off the event loop, runs `requests` on the engine (each event
handed to the exchange with its request's index), and asks the exchange what to send,
which the transport encodes (SSE, `app.routes.http.calls`; JSON frames, the Responses
websocket):

- streamed: `opening()` before any engine event, `events(index, event)` for each one,
  `closing()` once every request has ended; `failure(error)` in place of what is left
  when the call fails after the stream has started (the error in the API's own shape);
  then, if `ends_with_done`, OpenAI's terminator `data: [DONE]`;
- not streamed: `feed(index, event)` for each event, then `result()`, the body.

Either way its `accounting` counts what the call used (tokens, finishes), which the road
reads for the call's record once it ends.

Each streamed event is `(name, body)`: `name` is the SSE event's name (None: a bare
`data:` event, as OpenAI's Chat and Completions stream), `body` its JSON (a websocket
frame's whole).

Invariants: an exchange raises `app.errors` classes for the client's mistakes while it is
built (before anything runs) and never after; what it is fed is the engine's events in
each request's own order; it does no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from app.engine.base import GenerationRequest, TokenEvent
from app.errors import SwitchboardError
from app.protocols.accounting import Accounting

Event = tuple[str | None, Mapping[str, Any]]


class Exchange(Protocol):
    @property
    def requests(self) -> Sequence[GenerationRequest]: ...

    @property
    def accounting(self) -> Accounting: ...

    @property
    def ends_with_done(self) -> bool:
        """The stream ends with `data: [DONE]` (OpenAI's Chat and Completions)."""
        ...

    def opening(self) -> list[Event]: ...

    def events(self, index: int, event: TokenEvent) -> list[Event]: ...

    def closing(self) -> list[Event]: ...

    def failure(self, error: SwitchboardError) -> list[Event]: ...

    def feed(self, index: int, event: TokenEvent) -> None: ...

    def result(self) -> dict[str, Any]: ...
