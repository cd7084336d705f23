"""The `salience.v1.Salience` service without a transport. Sans-IO.

One `Service` per process, shared by every connection of every transport (websocket
now, gRPC next), because sessions outlive connections:

- `METHODS`: the RPCs by their proto names, with their request types; `Service.unary`
  dispatches the unary ones through one table (an unknown name is INVALID_ARGUMENT);
- a Generate is per-call state, `Generation`: `begin_generate` applies it to its session
  at once (so a call made after it sees its append), the session running it
  (`lifecycle`); `finish` (the closing events) or `abandon` (the call failed) frees the
  session;
- `CloseSession` cancels the session's running Generate, whichever connection runs it
  (the lifecycle's rule).

Cancelling is a flag plus the driver's interrupt: `Generation.cancel` marks the call and
calls the hook the driver bound while it waits on the engine (`interruptible`), so a
call cancelled before its driver runs is seen when it starts, and one cancelled while
it streams its closing events is not interrupted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from google.protobuf.message import Message

from app.engine.base import DecodedImage, EngineInfo
from app.errors import InvalidRequest
from app.protocols.salience.generate import GenerateCall
from app.protocols.salience.sessions import SessionStore
from schemas import salience_pb2 as pb


@dataclass(frozen=True, slots=True)
class Method:
    name: str  # as in the proto
    request: type[Message]
    streaming: bool = False  # a server stream of GenerateEvents


METHODS: Mapping[str, Method] = {
    m.name: m
    for m in (
        Method("OpenSession", pb.OpenSessionRequest),
        Method("CloseSession", pb.CloseSessionRequest),
        Method("ForkSession", pb.ForkSessionRequest),
        Method("Generate", pb.GenerateRequest, streaming=True),
        Method("GetReadoutManifest", pb.GetReadoutManifestRequest),
        Method("DumpSession", pb.DumpSessionRequest),
    )
}


class Generation:
    """One Generate in flight: its call and whether it was cancelled. Made before its
    call (`Service.begin_generate`), which its session holds it by, to cancel it."""

    call: GenerateCall

    def __init__(self) -> None:
        self.cancelled = False
        self._interrupt: Callable[[], object] | None = None

    def cancel(self) -> None:
        """End the call early: its stream ends with FINISH_REASON_CANCELLED."""
        self.cancelled = True
        if self._interrupt is not None:
            self._interrupt()

    @contextmanager
    def interruptible(self, interrupt: Callable[[], object]) -> Iterator[None]:
        """While inside, `cancel` calls `interrupt` (the driver's way to stop waiting on
        the engine); outside, it only marks the call."""
        self._interrupt = interrupt
        try:
            yield
        finally:
            self._interrupt = None


class Service:
    def __init__(self, store: SessionStore, info: EngineInfo) -> None:
        self.store = store
        self.info = info
        self._unary: Mapping[str, Callable[[Message], Message]] = {
            "OpenSession": self._open,
            "CloseSession": self._close,
            "ForkSession": self._fork,
            "GetReadoutManifest": self._manifest,
            "DumpSession": self._dump,
        }

    def unary(self, method: str, request: Message) -> Message:
        """Run a unary RPC; its response. Raises `app.errors` classes."""
        handler = self._unary.get(method)
        if handler is None:
            raise InvalidRequest(f"{method!r} is not a unary method; unary: {list(self._unary)}")
        return handler(request)

    def running(self, session_id: str) -> Generation | None:
        running = self.store.lifecycle.running(session_id)
        assert running is None or isinstance(running, Generation)
        return running

    # -- unary calls -----------------------------------------------------------------

    def _open(self, request: Message) -> pb.OpenSessionResponse:
        assert isinstance(request, pb.OpenSessionRequest)
        session = self.store.open(request.model)
        return pb.OpenSessionResponse(
            session_id=session.session_id, max_model_len=self.store.limits.max_model_len
        )

    def _close(self, request: Message) -> pb.CloseSessionResponse:
        assert isinstance(request, pb.CloseSessionRequest)
        self.store.close(request.session_id)
        return pb.CloseSessionResponse()

    def _fork(self, request: Message) -> pb.ForkSessionResponse:
        assert isinstance(request, pb.ForkSessionRequest)
        session = self.store.fork(request.session_id, request.at_position)
        return pb.ForkSessionResponse(session_id=session.session_id)

    def _dump(self, request: Message) -> pb.DumpSessionResponse:
        assert isinstance(request, pb.DumpSessionRequest)
        return pb.DumpSessionResponse(tokens=self.store.get(request.session_id).tokens.tolist())

    def _manifest(self, request: Message) -> pb.ReadoutManifest:
        manifest = self.info.readout
        if manifest is None:
            return pb.ReadoutManifest()
        return pb.ReadoutManifest(
            concepts=manifest.concepts,
            layers=manifest.layers,
            hidden_size=manifest.hidden_size,
            dtype=manifest.dtype,
        )

    # -- Generate --------------------------------------------------------------------

    def begin_generate(
        self, request: pb.GenerateRequest, request_id: str, decoded: Sequence[DecodedImage] = ()
    ) -> Generation:
        """Apply the Generate to its session now; the call to drive. `decoded`: its
        attachments' images, decoded, in `images.check_attachments` order."""
        generation = Generation()
        generation.call = GenerateCall(
            self.store, request, self.info, request_id, decoded, running=generation
        )
        return generation

    def finish(self, generation: Generation) -> list[pb.GenerateEvent]:
        """The call's closing events (held tokens, then Done); frees its session."""
        return generation.call.done(cancelled=generation.cancelled)

    def abandon(self, generation: Generation) -> None:
        """The call failed (the client gets an error, or is gone): free its session."""
        generation.call.abandon()
