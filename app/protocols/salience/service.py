"""The `salience.v1.Salience` service without a transport. Sans-IO.

One `Service` per process, shared by every connection of every transport (websocket and
gRPC), because sessions outlive connections. Each call runs on a `SessionStore` over the
sessions it touches (the process's own, or what it loaded of a shared store, written back
by the caller):

- `METHODS`: the RPCs by their proto names, with their request types; `Service.unary`
  dispatches the unary ones through one table (an unknown name is INVALID_ARGUMENT);
- a Generate is per-call state, `Generation`, under a claim of its own: `begin_generate`
  applies it to its session at once (so a call made after it sees its append), the
  session running it under that claim (`lifecycle`); the call's `end` (done or
  cancelled) or `abandon` (it failed) frees the session.

Cancelling is a flag plus the driver's interrupt: `Generation.cancel` marks the call and
calls the hook the driver bound while it waits on the engine (`interruptible`), so a
call cancelled before its driver runs is seen when it starts, and one cancelled while
it streams its closing events is not interrupted. Who cancels: its client, a
CloseSession of its session (whichever connection or replica makes it), the drain.
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
    """One Generate in flight: its claim, its call and whether it was cancelled. Made
    before its call (`Service.begin_generate`), so that a CloseSession of its session can
    cancel it by its claim as soon as the session is its."""

    call: GenerateCall

    def __init__(self, claim: str) -> None:
        self.claim = claim
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


Unary = Callable[[SessionStore, Message], Message]


class Service:
    def __init__(self, info: EngineInfo) -> None:
        self.info = info
        self._unary: Mapping[str, Unary] = {
            "OpenSession": self._open,
            "CloseSession": self._close,
            "ForkSession": self._fork,
            "DumpSession": self._dump,
        }
        self._stateless: Mapping[str, Callable[[Message], Message]] = {
            "GetReadoutManifest": self._manifest,
        }

    def stateless(self, method: str) -> bool:
        """True for a call that touches no session (it needs no store)."""
        return method in self._stateless

    def unary(self, store: SessionStore | None, method: str, request: Message) -> Message:
        """Run a unary RPC on `store` (None for a stateless one); its response. Raises
        `app.errors` classes."""
        stateless = self._stateless.get(method)
        if stateless is not None:
            return stateless(request)
        handler = self._unary.get(method)
        if handler is None:
            names = [*self._unary, *self._stateless]
            raise InvalidRequest(f"{method!r} is not a unary method; unary: {names}")
        assert store is not None, f"{method} needs the sessions"
        return handler(store, request)

    # -- unary calls -----------------------------------------------------------------

    def _open(self, store: SessionStore, request: Message) -> pb.OpenSessionResponse:
        assert isinstance(request, pb.OpenSessionRequest)
        session = store.open(request.model)
        return pb.OpenSessionResponse(
            session_id=session.session_id, max_model_len=store.limits.max_model_len
        )

    def _close(self, store: SessionStore, request: Message) -> pb.CloseSessionResponse:
        assert isinstance(request, pb.CloseSessionRequest)
        store.close(request.session_id)
        return pb.CloseSessionResponse()

    def _fork(self, store: SessionStore, request: Message) -> pb.ForkSessionResponse:
        assert isinstance(request, pb.ForkSessionRequest)
        session = store.fork(request.session_id, request.at_position)
        return pb.ForkSessionResponse(session_id=session.session_id)

    def _dump(self, store: SessionStore, request: Message) -> pb.DumpSessionResponse:
        assert isinstance(request, pb.DumpSessionRequest)
        return pb.DumpSessionResponse(tokens=store.get(request.session_id).tokens.tolist())

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
        self,
        store: SessionStore,
        generation: Generation,
        request: pb.GenerateRequest,
        decoded: Sequence[DecodedImage] = (),
    ) -> None:
        """Apply the Generate to its session now, under the generation's claim (also the
        engine request's id). `decoded`: its attachments' images, decoded, in
        `images.check_attachments` order."""
        generation.call = GenerateCall(
            store, request, self.info, generation.claim, decoded, claim=generation.claim
        )
