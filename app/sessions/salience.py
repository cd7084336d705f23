"""The Salience service driven on the engine, over any transport.

One `SalienceRunner` per process (sessions outlive connections), shared by every
connection of every transport. For each RPC a transport calls:

- `unary(method, request) -> response` for OpenSession, CloseSession, ForkSession,
  GetReadoutManifest, DumpSession (CloseSession cancels the session's running Generate,
  whichever connection runs it);
- `start_generate(request) -> Generation`: checks the image attachments, decodes them in
  a worker thread (never on the event loop), then applies the call to its session. A
  transport that promises frame order (the websocket: a DumpSession sent after a
  Generate sees its append) awaits this before it reads the next call;
- `run_generate(generation, emit)`: streams the call's `GenerateEvent`s through `emit`,
  ending with Done. `generation.cancel()` (a cancel frame, CloseSession from anywhere)
  aborts the engine request and ends the stream with Done FINISH_REASON_CANCELLED. If the
  task running it is cancelled from outside (the client went away, a gRPC deadline) the
  engine request is aborted, the session keeps what was decoded, and the cancellation
  propagates. A failed call raises its error (`client_error` says what to tell the
  client); its session is rolled back as the core says.

Each Generate is one unit of admission (`app.admission`), asked in `start_generate`
before any image is decoded or the session touched (bounded by its appended tokens; the
real prompt, the whole session, replaces the bound once known); a refusal raises
`Overloaded`. The ticket is released when `run_generate` ends, or at once if the call
fails before it.

Whether a session exists, runs or goes (TTL, the session cap and the server's token
bound with their evictions, close, the drain's refusal) is the core's rule
(`app.protocols.salience.lifecycle`); this layer only drives it.

Every method raises `app.errors` classes for the client's mistakes.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence

from google.protobuf.message import Message

from app.admission import Admission, Ticket, generate
from app.config import Settings
from app.drain import Drain
from app.engine.base import DecodedImage, Engine, VisionInfo
from app.protocols.salience.images import (
    Attachment,
    check_attachments,
    decode_attachment,
)
from app.protocols.salience.lifecycle import Lifecycle
from app.protocols.salience.service import Generation, Service
from app.protocols.salience.sessions import Limits, Session, SessionStore
from schemas import salience_pb2 as pb

Emit = Callable[[pb.GenerateEvent], Awaitable[None]]


class SalienceRunner:
    def __init__(self, engine: Engine, admission: Admission, service: Service) -> None:
        self.engine = engine
        self.admission = admission
        self.service = service
        self._tickets: dict[Generation, Ticket] = {}

    @classmethod
    def from_settings(
        cls, engine: Engine, admission: Admission, drain: Drain, settings: Settings
    ) -> SalienceRunner:
        """The runner under the configured limits; once `drain` begins, its sessions
        stop opening (the lifecycle's rule), on every transport."""
        info = engine.info
        limits = Limits(
            max_model_len=info.max_model_len,
            ttl_s=settings.salience_session_ttl_s,
            max_sessions=settings.salience_max_sessions,
            max_session_tokens=settings.salience_max_session_tokens,
            max_total_tokens=settings.salience_max_total_tokens,
            max_images=info.vision.max_images if info.vision else 0,
        )
        store = SessionStore(info.model_name, limits, time.monotonic)
        drain.on_begin(lambda: store.lifecycle.drain(drain.refusal))
        return cls(engine, admission, Service(store, info))

    @property
    def lifecycle(self) -> Lifecycle[Session]:
        """The sessions' lifetimes (what /metrics reads)."""
        return self.service.store.lifecycle

    def unary(self, method: str, request: Message) -> Message:
        return self.service.unary(method, request)

    async def start_generate(self, request: pb.GenerateRequest) -> Generation:
        ticket = self.admission.admit("salience", tokens=len(request.append_tokens))
        try:
            decoded = await self._decode(request) if request.images else []
            generation = self.service.begin_generate(request, f"sal-{uuid.uuid4().hex}", decoded)
        except BaseException:
            ticket.release()
            raise
        self._tickets[generation] = ticket
        return generation

    async def _decode(self, request: pb.GenerateRequest) -> list[DecodedImage]:
        """The attachments' images, decoded in a worker thread once the cheap checks
        have passed (the core checks them again, and places them)."""
        info = self.engine.info
        attachments = check_attachments(
            request.images, request.append_tokens, int(request.offset), info
        )
        assert info.vision is not None  # check_attachments refuses images otherwise
        return await asyncio.to_thread(_decode_all, attachments, info.vision)

    async def run_generate(self, generation: Generation, emit: Emit) -> None:
        task = asyncio.current_task()
        assert task is not None
        call = generation.call
        ticket = self._tickets.pop(generation)
        try:
            with ticket, generation.interruptible(task.cancel):
                if call.engine_request is not None and not generation.cancelled:
                    stream = generate(self.engine, call.engine_request, ticket)
                    try:
                        async for event in stream:
                            for out in call.on_event(event):
                                await emit(out)
                    finally:
                        await stream.aclose()
        except asyncio.CancelledError:
            if not generation.cancelled:  # from outside: nobody is listening any more
                generation.cancelled = True
                self.service.finish(generation)
                raise
            task.uncancel()  # our own interrupt, consumed here
        except BaseException:
            self.service.abandon(generation)
            raise
        for out in self.service.finish(generation):
            await emit(out)


def _decode_all(attachments: Sequence[Attachment], vision: VisionInfo) -> list[DecodedImage]:
    return [decode_attachment(attachment, vision) for attachment in attachments]
