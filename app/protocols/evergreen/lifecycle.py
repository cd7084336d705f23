"""The Evergreen session's lifetime, and how it ends on the wire. Sans-IO.

One session is one stream of `SessionMessage`s both ways (a websocket, or a gRPC
`StartSession` call). `Lifecycle` wraps the node state machine (`session.Session`) with
the session's phase; `LIFECYCLE[(phase, cause)]` says where each cause leads. Every pair
is in the table: a cause that changes nothing (a second failure, anything once ended)
maps a phase to itself, so the first failure is the one reported.

    OPEN      takes messages and starts the actions they make ready
    DRAINING  the client sent its last message (a gRPC half-close): running actions go on
              and may start others; the session ends when none is running
    FAILING   a rule was broken or an action failed: nothing more is taken, started or
              streamed; the transport cancels the running actions (aborting their engine
              requests), then stops the session
    ABORTED   over, and the client is told why: the final ABORT message, then the close
    ENDED     over, nothing to tell (the client left, or the session ran to its end)

Leaving OPEN or DRAINING for any other phase drops the session's nodes at once, so an
action still running can neither read nor emit.

The abort on the wire: a final `SessionMessage` holding one action named `ABORT`, whose
one config is a `google.protobuf.Struct` `{"code": <gRPC status name>, "message": ...}`,
plus `"retry_after_s"` when the server refused for overload or shutdown
(`abort_message`); a websocket then closes with 4000 + the gRPC status code and the
message cut to the 123 bytes a close frame holds (`close_code`, `close_reason`), a gRPC
call ends with the status itself.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Generic

from google.protobuf import struct_pb2

from app.errors import Overloaded, SwitchboardError
from app.protocols.evergreen.session import P, Ready, Session
from schemas import evergreen_pb2 as pb
from schemas import evergreen_service_pb2 as service_pb

ABORT_ACTION = "ABORT"
_CLOSE_REASON_BYTES = 123


class Phase(enum.Enum):
    OPEN = "open"
    DRAINING = "draining"
    FAILING = "failing"
    ABORTED = "aborted"
    ENDED = "ended"


class Cause(enum.Enum):
    FAILED = "failed"  # a rule broken, an action failed (the first failure is kept)
    CLIENT_LEFT = "client left"  # the connection is gone: nobody to answer
    INPUT_ENDED = "input ended"  # the client will send nothing more, and still listens
    IDLE = "idle"  # no action is running
    STOPPED = "stopped"  # the transport stops serving the session (before cancelling)


_P, _C = Phase, Cause
LIFECYCLE: Mapping[tuple[Phase, Cause], Phase] = {
    (_P.OPEN, _C.FAILED): _P.FAILING,
    (_P.OPEN, _C.CLIENT_LEFT): _P.ENDED,
    (_P.OPEN, _C.INPUT_ENDED): _P.DRAINING,
    (_P.OPEN, _C.IDLE): _P.OPEN,  # actions may still wait for inputs to come
    (_P.OPEN, _C.STOPPED): _P.ENDED,
    (_P.DRAINING, _C.FAILED): _P.FAILING,
    (_P.DRAINING, _C.CLIENT_LEFT): _P.ENDED,
    (_P.DRAINING, _C.INPUT_ENDED): _P.DRAINING,
    (_P.DRAINING, _C.IDLE): _P.ENDED,  # what still waits can never run: no input comes
    (_P.DRAINING, _C.STOPPED): _P.ENDED,
    (_P.FAILING, _C.FAILED): _P.FAILING,
    (_P.FAILING, _C.CLIENT_LEFT): _P.ENDED,
    (_P.FAILING, _C.INPUT_ENDED): _P.FAILING,
    (_P.FAILING, _C.IDLE): _P.FAILING,
    (_P.FAILING, _C.STOPPED): _P.ABORTED,
    **{(_P.ABORTED, cause): _P.ABORTED for cause in Cause},
    **{(_P.ENDED, cause): _P.ENDED for cause in Cause},
}
_LIVE = frozenset({Phase.OPEN, Phase.DRAINING})


class Lifecycle(Generic[P]):
    """A session and its phase. The transport feeds it messages and causes, runs the
    actions it hands out, and asks `abort` what to tell the client once it is over."""

    def __init__(self, session: Session[P]) -> None:
        self.session = session
        self.phase = Phase.OPEN
        self._failure: SwitchboardError | None = None

    def step(self, cause: Cause, failure: SwitchboardError | None = None) -> bool:
        """Apply `cause` (with the failure, for FAILED); True if the phase changed."""
        before = self.phase
        self.phase = LIFECYCLE[(before, cause)]
        if self.phase is before:
            return False
        if self.phase is Phase.FAILING:
            self._failure = failure
        if before in _LIVE and self.phase not in _LIVE:
            self.session.end(self._failure)
        return True

    def fail(self, failure: SwitchboardError) -> bool:
        return self.step(Cause.FAILED, failure)

    @property
    def takes_messages(self) -> bool:
        return self.phase is Phase.OPEN

    @property
    def starts_actions(self) -> bool:
        return self.phase in _LIVE

    @property
    def abort(self) -> SwitchboardError | None:
        """Once ABORTED: the failure to tell the client."""
        return self._failure if self.phase is Phase.ABORTED else None

    def receive(self, message: service_pb.SessionMessage) -> list[Ready[P]]:
        """The client's message; the actions to start now. A broken rule fails the
        session (nothing is raised); a message after the session stopped taking them
        is dropped."""
        if not self.takes_messages:
            return []
        try:
            return self.session.receive(message)
        except SwitchboardError as exc:
            self.fail(exc)
            return []

    def finish(self, index: int) -> list[Ready[P]]:
        """Action `index` is done; the actions to start now (none once the session is
        no longer live)."""
        if not self.starts_actions:
            return []
        try:
            return self.session.finish(index)
        except SwitchboardError as exc:
            self.fail(exc)
            return []


def abort_message(exc: SwitchboardError) -> service_pb.SessionMessage:
    """The final message of an aborted session."""
    status = struct_pb2.Struct()
    status.update({"code": exc.evergreen_reason, "message": exc.message})
    if isinstance(exc, Overloaded):  # the server's queue is full, or it is shutting down
        status.update({"retry_after_s": exc.retry_after_s})
    action = pb.Action(name=ABORT_ACTION)
    action.configs.add().Pack(status)
    return service_pb.SessionMessage(actions=[action])


def close_code(exc: SwitchboardError) -> int:
    """The websocket close code of an abort: 4000 + the gRPC status code."""
    return exc.evergreen_close_code


def close_reason(exc: SwitchboardError) -> str:
    """The websocket close reason of an abort: the message, cut to what a close frame
    holds, never inside a UTF-8 sequence."""
    return exc.message.encode()[:_CLOSE_REASON_BYTES].decode(errors="ignore")
