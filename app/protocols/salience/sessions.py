"""Salience sessions: the token list each session holds, and every rule that changes it.

Sans-IO: no engine, no sockets, no event loop; time comes from an injected clock. All the
state a session has and all its transitions live here:

- open (model: the base model's served name, or empty; `app.engine.models`, the one
  lookup; at most `max_sessions`), close (idempotent), fork (inherits tokens
  [0, at_position) and the images wholly inside; never splits an image block), dump;
- images: each is held, decoded, with the token range [start, end) of its vision block
  (`PromptImage`), in token order. No fork or truncation splits a block
  (FAILED_PRECONDITION); cutting at a block's start drops its image, at its end keeps it.
  A session holds at most `max_images` (the engine's limit per prompt, since every
  Generate sends the whole session);
- `begin_generate` validates one Generate's (offset, truncating) against the session:
  offset == length, or offset < length with truncating (the session rewinds to offset
  first); anything else is FAILED_PRECONDITION. It then appends, checks the session's
  limits, and marks the session busy (the token ids and the context are the shared
  prompt-fit check's, made by the Generate call); a second Generate while busy is
  ABORTED ("session busy").
  `append_decoded` adds the tokens the engine produced, `end_generate` frees the session.
  A call that fails before decoding anything is rolled back (`rollback=True`): the client
  got an error, so its view of the session is the one from before the call;
- sessions idle for longer than the TTL expire (a busy session never does); every
  operation, a no-op Generate included, refreshes its session's TTL.

Tokens are held as `array('I')` (4 bytes a token).
"""

from __future__ import annotations

import secrets
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from app.engine.base import PromptImage
from app.engine.models import resolve_model
from app.errors import (
    Aborted,
    FailedPrecondition,
    InvalidRequest,
    NotFound,
    ResourceExhausted,
)

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class _Undo:
    """What one Generate's mutation replaced: enough to put the session back."""

    offset: int
    tail: array[int]
    images: list[PromptImage]


@dataclass(slots=True)
class Session:
    session_id: str
    model: str
    tokens: array[int] = field(default_factory=lambda: array("I"))
    images: list[PromptImage] = field(default_factory=list)
    busy: bool = False
    last_used: float = 0.0
    undo: _Undo | None = None  # set while a Generate runs

    def cuts_image(self, position: int) -> bool:
        """True if a cut at `position` would split an image block."""
        return any(block.start < position < block.end for block in self.images)


@dataclass(frozen=True, slots=True)
class Limits:
    max_model_len: int
    ttl_s: float = 30 * 60
    max_sessions: int = 1024
    max_session_tokens: int = 1_000_000
    max_images: int = 1 << 31


class SessionStore:
    def __init__(self, model: str, limits: Limits, clock: Clock) -> None:
        self._model = model
        self._limits = limits
        self._clock = clock
        self._sessions: dict[str, Session] = {}

    @property
    def limits(self) -> Limits:
        return self._limits

    def __len__(self) -> int:
        return len(self._sessions)

    # -- lifecycle -----------------------------------------------------------------

    def expire(self) -> list[str]:
        """Drop sessions idle past the TTL; return their ids."""
        deadline = self._clock() - self._limits.ttl_s
        gone = [sid for sid, s in self._sessions.items() if not s.busy and s.last_used < deadline]
        for sid in gone:
            del self._sessions[sid]
        return gone

    def get(self, session_id: str) -> Session:
        self.expire()
        session = self._sessions.get(session_id)
        if session is None:
            raise NotFound(f"session {session_id!r} not found (closed or expired)")
        session.last_used = self._clock()
        return session

    def _new(self, tokens: array[int], images: list[PromptImage]) -> Session:
        self.expire()
        if len(self._sessions) >= self._limits.max_sessions:
            raise ResourceExhausted(
                f"too many sessions ({self._limits.max_sessions}); close some first"
            )
        session_id = secrets.token_hex(12)
        session = Session(session_id, self._model, tokens, images, last_used=self._clock())
        self._sessions[session_id] = session
        return session

    def open(self, model: str) -> Session:
        # Sessions run on the base model: no adapter is a model here.
        resolve_model(model, self._model, lambda name: False)
        return self._new(array("I"), [])

    def close(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def fork(self, session_id: str, at_position: int) -> Session:
        source = self.get(session_id)
        if at_position > len(source.tokens):
            raise FailedPrecondition(
                f"at_position {at_position} is past the session's length {len(source.tokens)}"
            )
        if source.cuts_image(at_position):
            raise FailedPrecondition(f"at_position {at_position} falls inside an image block")
        images = [block for block in source.images if block.end <= at_position]
        return self._new(source.tokens[:at_position], images)

    # -- generation ----------------------------------------------------------------

    def begin_generate(
        self,
        session_id: str,
        *,
        offset: int,
        truncating: bool,
        append: Sequence[int],
        max_tokens: int,
        images: Sequence[PromptImage] = (),
    ) -> Session:
        """Validate and apply one Generate's mutation; the session is busy afterwards.

        `max_tokens` is what the engine may add to the context: the caller passes at
        least 1 whenever it will run the engine, since vLLM samples a token even to score.
        """
        session = self.get(session_id)
        if session.busy:
            raise Aborted("session busy: one Generate at a time per session")
        length = len(session.tokens)
        if offset > length or (offset < length and not truncating):
            raise FailedPrecondition(
                f"offset {offset} does not match the session's length {length}"
                + ("" if truncating else " (set truncating to rewind)")
            )
        if offset < length and session.cuts_image(offset):
            raise FailedPrecondition(f"truncating to {offset} would split an image block")
        new_length = offset + len(append)
        if new_length + max_tokens > self._limits.max_session_tokens:
            raise ResourceExhausted(
                f"the session would hold {new_length} tokens plus max_tokens {max_tokens}; "
                f"the limit is {self._limits.max_session_tokens}"
            )
        for block in images:
            if not offset <= block.start < block.end <= new_length:
                raise InvalidRequest(
                    f"image range [{block.start}, {block.end}) is not inside the appended "
                    f"tokens [{offset}, {new_length})"
                )
        kept = sum(1 for block in session.images if block.end <= offset)
        if kept + len(images) > self._limits.max_images:
            raise ResourceExhausted(
                f"the session would hold {kept + len(images)} images; the model takes at "
                f"most {self._limits.max_images} in one prompt"
            )
        session.undo = _Undo(
            offset, session.tokens[offset:], [b for b in session.images if b.end > offset]
        )
        del session.tokens[offset:]
        session.images = [block for block in session.images if block.end <= offset]
        session.tokens.extend(append)
        session.images.extend(images)
        session.busy = True
        return session

    def append_decoded(self, session: Session, token_ids: Sequence[int]) -> None:
        session.tokens.extend(token_ids)

    def end_generate(self, session: Session, *, rollback: bool = False) -> None:
        """Free the session; with `rollback`, first undo the call's mutation."""
        undo = session.undo
        if rollback and undo is not None:
            del session.tokens[undo.offset :]
            session.tokens.extend(undo.tail)
            session.images = [b for b in session.images if b.end <= undo.offset] + undo.images
        session.undo = None
        session.busy = False
        session.last_used = self._clock()
