"""The Salience service driven on the engine and on a session store, over any transport.

One `SalienceRunner` per process (sessions outlive connections), shared by every
connection of every transport. For each RPC a transport calls:

Every call names its principal (`app.tenants.Principal`, decided by the transport where
the call entered): it sees its tenant's sessions only (another tenant's id is NOT_FOUND)
and makes room within its tenant's quota, evicting only its tenant's idle sessions.

- `unary(method, request, principal) -> response` for OpenSession, CloseSession, ForkSession,
  GetReadoutManifest, DumpSession (CloseSession cancels the session's running Generate,
  whichever connection runs it; on another replica, when that replica next renews the
  call's lease);
- `start_generate(request, principal) -> Generation`: checks the image attachments, decodes them in
  a worker thread (never on the event loop), then applies the call to its session. A
  transport that promises frame order (the websocket: a DumpSession sent after a
  Generate sees its append) awaits this before it reads the next call;
- `run_generate(generation, emit)`: streams the call's `GenerateEvent`s through `emit`,
  ending with Done once the call has ended on its session (its decoded tokens are in the
  session when Done goes out). `generation.cancel()` (a cancel frame, CloseSession from
  anywhere) aborts the engine request and ends the stream with Done
  FINISH_REASON_CANCELLED. If the task running it is cancelled from outside (the client
  went away, a gRPC deadline) the engine request is aborted, the session keeps what was
  decoded, and the cancellation propagates. A failed call raises its error
  (`client_error` says what to tell the client); its session is rolled back as the core
  says.

Each call runs the core's rules on the session store (`app.store.sessions`: this
process's own, or a Redis that replicas share) in one transaction; a Generate runs two,
at its start and at its end, never one per token. While Generates run on a shared store,
the keeper renews their claims' leases, all in one transaction, every fifth of the lease:
a replica that dies leaves its sessions busy for at most the lease, and a CloseSession
made on another replica reaches the call within a fifth of it.

Each Generate is one unit of admission (`app.admission`), asked in `start_generate`
before any image is decoded or the session touched (bounded by its appended tokens; the
real prompt, the whole session, replaces the bound once known); a refusal raises
`Overloaded`. The ticket is released when `run_generate` ends, or at once if the call
fails before it.

Whether a session exists, runs or goes (TTL, the session cap and the server's token
bound with their evictions, close, claims and leases, the drain's refusal) is the core's
rule (`app.protocols.salience.lifecycle`); this layer only drives it. The evictions this
replica made are counted in `evicted` (/metrics).

Every method raises `app.errors` classes for the client's mistakes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from functools import partial
from typing import Any, TypeVar

from google.protobuf.message import Message

from app.admission import Admission, ProtocolName, Ticket, generate
from app.config import Settings
from app.drain import Drain
from app.engine.base import DecodedImage, Engine, ImageBudget, VisionInfo
from app.errors import SwitchboardError
from app.protocols.salience.images import (
    Attachment,
    check_attachments,
    decode_attachment,
)
from app.protocols.salience.lifecycle import Eviction, Lifecycle, Quota, Table
from app.protocols.salience.service import Generation, Service
from app.protocols.salience.sessions import Limits, Session, SessionStore
from app.store import open_sessions
from app.store.sessions import SessionBackend
from app.telemetry.record import RequestRecord
from app.tenants import DEFAULT_TENANT, Principal
from schemas import salience_pb2 as pb

logger = logging.getLogger(__name__)

T = TypeVar("T")
Emit = Callable[[pb.GenerateEvent], Awaitable[None]]
# The calls that read the totals (they make room for tokens or sessions).
_BOUNDED = ("OpenSession", "ForkSession")


class SalienceRunner:
    def __init__(
        self, engine: Engine, admission: Admission, store: SessionBackend, limits: Limits
    ) -> None:
        self.engine = engine
        self.admission = admission
        self.store = store
        self.limits = limits
        self.service = Service(engine.info)
        self.evicted: Counter[Eviction] = Counter()
        self._refusal: Callable[[], SwitchboardError] | None = None
        self._running: dict[str, Generation] = {}  # this replica's Generates, by claim
        self._tickets: dict[Generation, Ticket] = {}
        self._keeper: asyncio.Task[None] | None = None

    @classmethod
    def from_settings(
        cls, engine: Engine, admission: Admission, drain: Drain, settings: Settings
    ) -> SalienceRunner:
        """The runner under the configured limits, on the configured store; once `drain`
        begins, this replica opens no session (the lifecycle's rule), on any transport."""
        info = engine.info
        store = open_sessions(
            settings.salience_store_location(),
            ttl_s=settings.salience_session_ttl_s,
            lease_s=settings.salience_lease_s,
            vision=info.vision,
        )
        limits = Limits(
            max_model_len=info.max_model_len,
            ttl_s=settings.salience_session_ttl_s,
            max_sessions=settings.salience_max_sessions,
            max_session_tokens=settings.salience_max_session_tokens,
            max_total_tokens=settings.salience_max_total_tokens,
            max_images=info.vision.max_images if info.vision else 0,
            lease_s=store.lease_s,
        )
        runner = cls(engine, admission, store, limits)
        drain.on_begin(lambda: runner.drain(drain.refusal))
        return runner

    def drain(self, refusal: Callable[[], SwitchboardError]) -> None:
        """Open no session from now on; `refusal()` is what the client is told."""
        self._refusal = refusal

    def running(self, session_id: str) -> Generation | None:
        """This replica's Generate running on the session, if any."""
        for generation in self._running.values():
            call = getattr(generation, "call", None)
            if call is not None and call.session_id == session_id:
                return generation
        return None

    async def stats(self) -> tuple[int, int]:
        """The sessions held and the tokens charged (fleet-wide on a shared store)."""
        return await self.store.stats()

    async def close(self) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
        await self.store.close()

    # -- one transaction -------------------------------------------------------------

    async def _transact(
        self,
        decide: Callable[[SessionStore], T],
        *,
        principal: Principal | None = None,
        content: Sequence[str] = (),
        lifetimes: Sequence[str] = (),
        totals: bool = False,
    ) -> T:
        """`decide` on the sessions, as `principal`'s tenant (None: the server's own work
        on sessions it runs, by their claims), kept in one step; then what it evicted is
        counted and the Generates of the sessions it closed are cancelled."""
        tenant = DEFAULT_TENANT if principal is None else principal.tenant
        quota = None
        if principal is not None:  # 0: no quota of its own, the server's bound
            own = principal.limits
            quota = Quota(
                own.sessions or self.limits.max_sessions,
                own.session_tokens or self.limits.max_total_tokens,
            )

        def run(table: Table[Session], now: float) -> tuple[Any, Lifecycle[Session]]:
            store = SessionStore(
                self.engine.info.model_name,
                self.limits,
                lambda: now,
                table,
                refusal=self._refusal,
                tenant=tenant,
                quota=quota,
            )
            try:
                return decide(store), store.lifecycle
            except SwitchboardError as refused:  # kept as the rules left it, then raised
                return refused, store.lifecycle

        outcome, lifecycle = await self.store.transact(
            run,
            content=content,
            lifetimes=lifetimes,
            totals=totals,
            tenant=None if principal is None else tenant,
        )
        self.evicted.update(lifecycle.evicted)
        for claim in lifecycle.cancelled:
            generation = self._running.get(claim)
            if generation is not None:
                generation.cancel()
        if isinstance(outcome, SwitchboardError):
            raise outcome
        result: T = outcome
        return result

    async def unary(self, method: str, request: Message, principal: Principal) -> Message:
        """`method` as `principal` (its tenant's sessions only)."""
        if self.service.stateless(method):
            return self.service.unary(None, method, request)
        session_id = str(getattr(request, "session_id", ""))
        return await self._transact(
            lambda store: self.service.unary(store, method, request),
            principal=principal,
            content=[session_id] if session_id and method != "CloseSession" else [],
            lifetimes=[session_id] if method == "CloseSession" else [],
            totals=method in _BOUNDED,
        )

    # -- Generate ----------------------------------------------------------------------

    async def start_generate(
        self,
        request: pb.GenerateRequest,
        principal: Principal,
        record: RequestRecord | None = None,
    ) -> Generation:
        """The Generate as `principal`, on its tenant's session. (`record`: the call's,
        told of its admission, its engine request and tokens.)"""
        ticket = self.admission.admit(
            ProtocolName.SALIENCE,
            priority=int(request.priority),
            tokens=len(request.append_tokens),
            record=record,
            principal=principal,
        )
        generation = Generation(f"sal-{uuid.uuid4().hex}")
        # Known before the session is its, so that a CloseSession racing the start
        # cancels it.
        self._running[generation.claim] = generation
        try:
            decoded = await self._decode(request) if request.images else []
            await self._transact(
                lambda store: self.service.begin_generate(store, generation, request, decoded),
                principal=principal,
                content=[request.session_id],
                totals=True,
            )
        except BaseException:
            self._running.pop(generation.claim, None)
            ticket.release()
            raise
        if record is not None:  # the session's prompt, with what this Generate appends
            record.built_now()
        self._tickets[generation] = ticket
        self._keep_leases()
        return generation

    async def _decode(self, request: pb.GenerateRequest) -> list[DecodedImage]:
        """The attachments' images, decoded in a worker thread once the cheap checks
        have passed (the core checks them again, and places them), and kept in the
        store for the replicas that will need them."""
        info = self.engine.info
        attachments = check_attachments(
            request.images, request.append_tokens, int(request.offset), info
        )
        assert info.vision is not None  # check_attachments refuses images otherwise
        decoded = await asyncio.to_thread(_decode_all, attachments, info.vision)
        await self.store.keep_images(
            [(image, a.mime, a.data) for image, a in zip(decoded, attachments, strict=True)]
        )
        return decoded

    async def run_generate(self, generation: Generation, emit: Emit) -> None:
        task = asyncio.current_task()
        assert task is not None
        call = generation.call
        ticket = self._tickets.pop(generation)
        record = ticket.record
        try:
            with ticket, generation.interruptible(task.cancel):
                if call.engine_request is not None and not generation.cancelled:
                    request = await self.store.hydrate(call.engine_request)
                    stream = generate(self.engine, request, ticket)
                    try:
                        async for event in stream:
                            if record is not None:
                                record.count_event(event)
                            for out in call.on_event(event):
                                await emit(out)
                    finally:
                        await stream.aclose()
                    if record is not None:
                        record.last_token_now()
        except asyncio.CancelledError:
            if not generation.cancelled:  # from outside: nobody is listening any more
                generation.cancelled = True
                with contextlib.suppress(Exception):  # nobody to tell; its lease lapses
                    await _shielded(self._end(generation))
                raise
            task.uncancel()  # our own interrupt, consumed here
        except BaseException:
            with contextlib.suppress(Exception):  # the call's own error is the one to tell
                await _shielded(self._end(generation, failed=True))
            raise
        await self._end(generation)
        for out in call.closing(cancelled=generation.cancelled):
            await emit(out)

    async def _end(self, generation: Generation, *, failed: bool = False) -> None:
        """The call's end on its session: its decoded tokens join it (or, failed, it is
        rolled back as the core says); the claim goes."""
        call = generation.call
        try:
            await self._transact(
                lambda store: call.abandon(store) if failed else call.end(store),
                content=[call.session_id],
            )
        finally:
            self._running.pop(generation.claim, None)

    # -- leases ------------------------------------------------------------------------

    def _keep_leases(self) -> None:
        if self.store.shared and self._keeper is None:
            self._keeper = asyncio.create_task(self._renew_leases(), name="salience-leases")

    async def _renew_leases(self) -> None:
        """While this replica runs Generates, renew their leases: all in one
        transaction, every fifth of the lease. A Generate whose session was closed
        (elsewhere) is cancelled; one whose claim lapsed too (this replica stalled past
        its lease), which its end then reports."""
        try:
            while self._running:
                await asyncio.sleep(self.store.lease_s / 5)
                running = [
                    (claim, g.call.session_id)
                    for claim, g in self._running.items()
                    if hasattr(g, "call")
                ]
                if not running:
                    continue
                try:
                    lost = await self._transact(
                        partial(_renew, running=running),
                        lifetimes=[session_id for _, session_id in running],
                    )
                except SwitchboardError as exc:  # the store is down: try again next time
                    logger.warning("Salience leases not renewed: %s", exc.message)
                    continue
                for claim in lost:
                    generation = self._running.get(claim)
                    if generation is not None:
                        generation.cancel()
        finally:
            self._keeper = None


def _renew(store: SessionStore, *, running: Sequence[tuple[str, str]]) -> list[str]:
    """Renew each claim's lease; the claims that hold their session no more."""
    lost = []
    for claim, session_id in running:
        try:
            if not store.renew(session_id, claim):
                lost.append(claim)
        except SwitchboardError:
            lost.append(claim)
    return lost


_ENDING: set[asyncio.Task[None]] = set()  # ends that go on after their caller was cancelled


async def _shielded(work: Coroutine[Any, Any, None]) -> None:
    """Run `work` to its end even if the caller is cancelled meanwhile."""
    task = asyncio.ensure_future(work)
    _ENDING.add(task)
    task.add_done_callback(_ENDING.discard)
    await asyncio.shield(task)


def _decode_all(attachments: Sequence[Attachment], vision: VisionInfo) -> list[DecodedImage]:
    budget = ImageBudget(vision)  # one call's attachments: its prompt's new images
    return [decode_attachment(attachment, budget) for attachment in attachments]
