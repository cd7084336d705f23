"""Salience sessions: the token list each session holds, and every rule that changes it.

Sans-IO: no engine, no sockets, no event loop. Whether a session exists, runs or goes
(open, TTL, the session cap and the server's token bound, a tenant's quota, eviction,
close, claims and their leases, drain) is the lifecycle's (`lifecycle.py`);
`SessionStore` drives it over a table (`tables.py`: the process's sessions, or what one
call loaded of a shared store), for one caller's tenant, and holds the content rules:

- open (model: the base model's served name, or empty; `app.engine.models`, the one
  lookup), close (idempotent), fork (inherits tokens [0, at_position) and the images
  wholly inside; never splits an image block), dump;
- images: each is held, decoded, with the token range [start, end) of its vision block
  (`PromptImage`), in token order. No fork or truncation splits a block
  (FAILED_PRECONDITION); cutting at a block's start drops its image, at its end keeps it.
  A session holds at most `max_images` (the engine's limit per prompt, since every
  Generate sends the whole session);
- a Generate in two steps, with nothing between them: `check_generate` validates it
  against the session (NOT_FOUND, ABORTED "session busy", then its (offset, truncating):
  offset == length, or offset < length with truncating, the session rewinding to offset
  first; anything else is FAILED_PRECONDITION; then the session's limits) and changes
  nothing, so the caller can make its own checks (the shared prompt fit) before anything
  changes; `begin_generate` charges the call to the server's token bound (which may evict
  other sessions, or refuse), marks the session running under the call's claim and
  applies the mutation (the append). The call keeps the tokens it decodes;
  `end_generate` adds them and frees the session. A call that fails before decoding
  anything is rolled back (`rollback=True`): the client got an error, so its view of the
  session is the one from before the call; so is a session whose claim lapsed.

Tokens are held as `array('I')` (4 bytes a token).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from app.engine.base import PromptImage
from app.engine.models import resolve_model
from app.errors import FailedPrecondition, InvalidRequest, ResourceExhausted, SwitchboardError
from app.protocols.salience.lifecycle import Cause, Clock, Lifecycle, Lifetime, Quota, Table
from app.protocols.salience.tables import MemoryTable
from app.tenants import DEFAULT_TENANT


@dataclass(frozen=True, slots=True)
class Undo:
    """What one Generate's mutation replaced: enough to put the session back."""

    offset: int
    tail: array[int]
    images: list[PromptImage]


@dataclass(slots=True, eq=False)
class Session(Lifetime):
    tokens: array[int] = field(default_factory=lambda: array("I"))
    images: list[PromptImage] = field(default_factory=list)
    undo: Undo | None = None  # set while a Generate runs
    # How many leading tokens are as the table's store holds them (a shared store writes
    # back only what follows; in one process, nothing is written back).
    stored: int = 0

    def cuts_image(self, position: int) -> bool:
        """True if a cut at `position` would split an image block."""
        return any(block.start < position < block.end for block in self.images)

    def cut(self, length: int) -> None:
        """Keep the first `length` tokens (and the images wholly inside)."""
        del self.tokens[length:]
        self.stored = min(self.stored, length)
        self.images = [block for block in self.images if block.end <= length]

    def rollback(self) -> None:
        undo = self.undo
        if undo is not None:
            self.cut(undo.offset)
            self.tokens.extend(undo.tail)
            self.images.extend(undo.images)
        self.undo = None


@dataclass(frozen=True, slots=True)
class Limits:
    max_model_len: int
    ttl_s: float = 30 * 60
    max_sessions: int = 1024
    max_session_tokens: int = 1_000_000
    max_total_tokens: int = 1 << 62
    max_images: int = 1 << 31
    lease_s: float = math.inf  # a running Generate's claim, unrenewed (lifecycle.py)


@dataclass(frozen=True, slots=True)
class Mutation:
    """One Generate's change to its session, checked (`check_generate`)."""

    session: Session
    offset: int
    append: Sequence[int]
    max_tokens: int
    images: Sequence[PromptImage]


class SessionStore:
    def __init__(
        self,
        model: str,
        limits: Limits,
        clock: Clock,
        table: Table[Session] | None = None,
        *,
        refusal: Callable[[], SwitchboardError] | None = None,
        tenant: str = DEFAULT_TENANT,
        quota: Quota | None = None,
    ) -> None:
        self._model = model
        self._limits = limits
        self.table: Table[Session] = MemoryTable() if table is None else table
        self.lifecycle: Lifecycle[Session] = Lifecycle(
            self.table,
            clock,
            ttl_s=limits.ttl_s,
            max_sessions=limits.max_sessions,
            max_total_tokens=limits.max_total_tokens,
            lease_s=limits.lease_s,
            refusal=refusal,
            tenant=tenant,
            quota=quota,
        )

    @property
    def limits(self) -> Limits:
        return self._limits

    def __len__(self) -> int:
        return len(self.lifecycle)

    # -- sessions ------------------------------------------------------------------

    def expire(self) -> list[str]:
        return self.lifecycle.expire()

    def get(self, session_id: str) -> Session:
        return self.lifecycle.use(session_id)

    def open(self, model: str) -> Session:
        # Sessions run on the base model: no adapter is a model here.
        resolve_model(model, self._model, lambda name: False)
        return self.lifecycle.open(Session)

    def close(self, session_id: str) -> None:
        self.lifecycle.close(session_id)

    def fork(self, session_id: str, at_position: int) -> Session:
        source = self.get(session_id)
        if at_position > len(source.tokens):
            raise FailedPrecondition(
                f"at_position {at_position} is past the session's length {len(source.tokens)}"
            )
        if source.cuts_image(at_position):
            raise FailedPrecondition(f"at_position {at_position} falls inside an image block")
        tokens = source.tokens[:at_position]
        images = [block for block in source.images if block.end <= at_position]
        return self.lifecycle.open(
            lambda session_id: Session(session_id, tokens=tokens, images=images),
            len(tokens),
            keep=source,
        )

    # -- generation ----------------------------------------------------------------

    def check_generate(
        self,
        session_id: str,
        *,
        offset: int,
        truncating: bool,
        append: Sequence[int],
        max_tokens: int,
        images: Sequence[PromptImage] = (),
    ) -> Mutation:
        """Validate one Generate against its session; nothing changes.

        `max_tokens` is what the engine may add to the context: the caller passes at
        least 1 whenever it will run the engine, since vLLM samples a token even to score.
        """
        session = self.get(session_id)
        self.lifecycle.check(session, Cause.BEGIN)
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
        return Mutation(session, offset, append, max_tokens, images)

    def begin_generate(self, mutation: Mutation, claim: str) -> Session:
        """Apply a checked Generate (at once: nothing may run between the check and
        this); the session runs under `claim` until `end_generate`. RESOURCE_EXHAUSTED if
        the server's token bound has no room for the call, even with idle sessions
        evicted."""
        session, offset = mutation.session, mutation.offset
        tail = session.tokens[offset:]
        charge = offset + len(mutation.append) + mutation.max_tokens + len(tail)
        self.lifecycle.begin(session, charge, claim)
        session.undo = Undo(offset, tail, [b for b in session.images if b.end > offset])
        session.cut(offset)
        session.tokens.extend(mutation.append)
        session.images.extend(mutation.images)
        self.table.changed(session)
        return session

    def end_generate(
        self, session_id: str, claim: str, decoded: Sequence[int], *, rollback: bool = False
    ) -> None:
        """Free the session `claim` runs on, which keeps the `decoded` tokens, or with
        `rollback` is put back as before the call. Nothing if the session has gone (it
        was closed: the call was cancelled); ABORTED if the claim lapsed and the session
        was taken back."""
        session = self.lifecycle.claimed(session_id, claim)
        if session is None:
            return
        if rollback:
            session.rollback()
        else:
            session.tokens.extend(decoded)
            session.undo = None
        self.lifecycle.end(session, len(session.tokens))

    def renew(self, session_id: str, claim: str) -> bool:
        """Extend the lease of a running Generate; False once its session has gone."""
        return self.lifecycle.renew(session_id, claim)
