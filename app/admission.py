"""Admission: one bound on queued work, decided once for every protocol.

Every unit of engine work (an OpenAI prompt or choice, a GraphPipe batch row, an Evergreen
action, a Salience Generate) asks `Admission.admit` for a `Ticket` before any prompt work
(tokenizing, templating), and gives it back with `Ticket.release` when it finishes, fails
or is aborted. A refusal is `Overloaded` (HTTP 503 + Retry-After, gRPC UNAVAILABLE), with
a retry hint.

What is bounded is the QUEUE, as vLLM's `num_requests_waiting` counts it: a ticket is
queued from admission until `Ticket.running` (the engine's first event for it: prefill
done) or its release; running requests are not counted. Both bounds, `max_requests` and
`max_tokens` (prompt tokens), are optional.

Priority (vLLM's priority scheduler runs lower values first): a client's priority is
clamped to what it may ask (`clamp_priority`: no more urgent than its ceiling, 0 by
default, so a client may make its request less urgent than the default and never more),
once, here, and the engine runs every admitted request at its ticket's priority
(`Ticket.start`), whatever its core wrote: admission's measure and the scheduler's order
cannot disagree. A request of priority `p` is measured only against queued work of
priority `<= p`, the work that would be scheduled before it or beside it. So a
higher-priority request is never refused because lower-priority requests wait, and what
a request waits behind stays bounded at every priority. (The total queue can then
exceed the bound by lower-priority work that was admitted first; it drains first-come
within a priority.)

Tokens before tokenizing: the caller passes an upper bound (a text prompt's UTF-8 length:
a byte-level tokenizer never makes more tokens than bytes, plus its few specials), counted
at most as the engine's context (`max_unit_tokens`: a longer prompt never runs), and may
correct it with `Ticket.measured` once the prompt is tokenized.

Retry hint: the median-ish recent queue wait (an exponentially weighted mean of
admission-to-running times, the batch lane's left out), at least `min_retry_after_s`.

Draining (`close`): once closed, every admission is refused as `Overloaded` (the server is
going away; another replica, or this one restarted, takes the retry), and `cut` marks the
tickets still in flight so that `generate` (or `run`) ends them as `Overloaded` once the
engine has aborted their requests (the drain does that, `app.drain`).

Per tenant (`app.tenants`): a tenant's units in flight (queued or running) are bounded
by its `concurrent` limit, when it has one; past it, its next unit is refused as the
queue bound refuses (`Overloaded`, with the same retry hint), whatever room the queue
has, so one tenant's burst cannot take every place from the others. Work of the batch
lane (`LANE_PRIORITY`, `app.batches.lane`) is neither bounded nor counted there: the
lane has a width of its own, every tenant's batches share it, and it yields to
interactive work, so a tenant's batch never takes its own interactive places.

Counters count units: a call of several units (`admit_all`) is admitted whole or refused
whole, and a refused call adds all its units to `refused`, none to `admitted`.

The rule itself does no I/O and knows no framework; single-threaded by design (the event
loop's thread), like the engine seam it guards. `generate` (events pulled) and `run`
(events pushed) are the wrappers every protocol runs an admitted request through: they
move the ticket to running on the engine's first event and release it however the
request ends.

A ticket may carry the `RequestRecord` of the request it admits (`app.telemetry`): it is
told when the request was admitted and when the engine's first event came, and the
engine runs each request as the record makes it (`RequestRecord.for_engine`: its id
after the request id, its trace context).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import AsyncGenerator, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import TracebackType
from typing import TYPE_CHECKING, Self

from app.engine.base import Engine, GenerationRequest, TokenEvent
from app.errors import Overloaded, ShuttingDown
from app.tenants import DEFAULT_TENANT, Principal

if TYPE_CHECKING:
    from app.telemetry.record import RequestRecord


class ProtocolName(StrEnum):
    """Who asks admission: the `protocol` label of its counters on /metrics, every one
    listed there (zeros included). A new API or protocol adds its name here."""

    OPENAI = "openai"  # Completions and Chat Completions
    RESPONSES = "responses"  # the Responses API (HTTP, websocket, background runs)
    ANTHROPIC = "anthropic"
    GRAPHPIPE = "graphpipe"
    EVERGREEN = "evergreen"
    SALIENCE = "salience"
    SMG = "smg"  # SMG's gRPC workers (`vllm.grpc.engine.VllmEngine`)
    TOKENS = "tokens"  # llm-d's token-in/token-out
    BATCH = "batch"  # a batch's requests, in the lane (`app.batches.lane`)


# The batch lane's priority (`app.batches.lane`): after every priority a client may ask
# for (vLLM runs lower values first).
LANE_PRIORITY = 1 << 30

# Weight of the newest sample in the queue-wait average.
_EWMA_WEIGHT = 0.2
# Special tokens a tokenizer may add around a text prompt (BOS, EOS, a few markers).
_SPECIALS_ALLOWANCE = 8

_SHUTTING_DOWN = "The server is shutting down; retry on another replica or after the restart"

# The most urgent priority a client may ask for unless its key allows more (vLLM's
# order: smaller runs first; 0 is every request's default).
DEFAULT_PRIORITY_CEILING = 0


def clamp_priority(requested: int, ceiling: int = DEFAULT_PRIORITY_CEILING) -> int:
    """The priority a client's request is admitted and run at: what it asked, but never
    more urgent than `ceiling` (the principal's: `DEFAULT_PRIORITY_CEILING` unless its key
    allows more), nor as patient as the batch lane (`LANE_PRIORITY`). A client sending
    ever smaller priorities would otherwise be measured against an empty queue and preempt
    everyone in vLLM's scheduler; one asking for the lane's would pass as batch work,
    outside its tenant's `concurrent` bound."""
    return min(max(requested, ceiling), LANE_PRIORITY - 1)


def text_tokens_bound(text: str | bytes) -> int:
    """An upper bound of the tokens `text` (or its UTF-8 bytes) makes, without tokenizing
    it: its UTF-8 length (a byte-level tokenizer never makes more tokens than bytes) plus
    a few specials."""
    if isinstance(text, bytes) or text.isascii():  # isascii is O(1) on a str: its kind
        return len(text) + _SPECIALS_ALLOWANCE
    return len(text.encode("utf-8", "surrogatepass")) + _SPECIALS_ALLOWANCE


def prompt_tokens_bound(request: GenerationRequest) -> int:
    """`text_tokens_bound` of a request's prompt, or its length when it is token ids."""
    if request.prompt_token_ids is not None:
        return len(request.prompt_token_ids)
    return text_tokens_bound(request.prompt_text or "")


class _Releasing:
    """`with` releases on the way out, however the block ends."""

    def release(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()


@dataclass(eq=False)  # identity: two tickets are never the same one
class Ticket(_Releasing):
    """One admitted unit of work; `release` it once it is over (later calls do nothing),
    or hold it in a `with` block."""

    _owner: Admission = field(repr=False)
    protocol: ProtocolName
    priority: int
    tokens: int
    admitted_at: float
    queued: bool = True
    released: bool = False
    # The engine request running it (set by `generate`), so a drain can abort it.
    request_id: str | None = None
    # Set by `Admission.cut`: the server is shutting down and this work is to end.
    cut: bool = False
    # The request it admits, told of its admission and its first event.
    record: RequestRecord | None = field(default=None, repr=False)
    # The tenant whose `concurrent` limit counts it while it is in flight (None: work of
    # the batch lane, which no tenant's limit counts).
    tenant: str | None = DEFAULT_TENANT

    def measured(self, tokens: int) -> None:
        """The prompt's real token count, once known (replaces the upper bound)."""
        if self.queued and not self.released:
            self._owner._queued_tokens += tokens - self.tokens
        self.tokens = tokens

    def start(self, request: GenerationRequest) -> GenerationRequest:
        """Before the engine is asked to run `request` on this ticket: refused if a drain
        cut it already; the prompt's real size and the engine request noted. What the
        engine runs: `request` as the ticket's record makes it, if it has one, at this
        ticket's (clamped) priority."""
        if self.cut:
            raise self._owner.shutting_down()
        if request.prompt_token_ids is not None:
            self.measured(len(request.prompt_token_ids))
        if self.record is not None:
            request = self.record.for_engine(request)
        self.request_id = request.request_id
        if request.priority != self.priority:
            return replace(request, priority=self.priority)
        return request

    def running(self) -> None:
        """The engine has started this request: it leaves the queue."""
        if self.queued and not self.released:
            self._owner._dequeue(self, waited=True)
            if self.record is not None:
                self.record.first_token_now()

    def release(self) -> None:
        if self.released:
            return
        if self.queued:
            self._owner._dequeue(self, waited=False)
        self.released = True
        self._owner._live.discard(self)
        if self.tenant is not None:
            self._owner._leaves(self.tenant)


class Tickets(_Releasing):
    """The tickets of one call (`Admission.admit_all`), in the order of its units. As a
    context manager (or with `release`) it releases whatever its units have not."""

    def __init__(self, tickets: Sequence[Ticket]) -> None:
        self.tickets = tuple(tickets)

    def __getitem__(self, index: int) -> Ticket:
        return self.tickets[index]

    def __len__(self) -> int:
        return len(self.tickets)

    def release(self) -> None:
        for ticket in self.tickets:
            ticket.release()


class Admission:
    """The bound every protocol shares."""

    def __init__(
        self,
        max_requests: int | None,
        max_tokens: int | None,
        *,
        min_retry_after_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_requests = max_requests
        self.max_tokens = max_tokens
        # The most prompt tokens one unit is counted for (the engine's context, once
        # known: `AppObjects.build_on`): a longer prompt is refused before it runs, so a
        # bound past it only overstates, and one 16 MiB prompt's bound would take every
        # place of the queue's tokens from the others while it is refused.
        self.max_unit_tokens: int | None = None
        self.min_retry_after_s = min_retry_after_s
        self._clock = clock
        self._queue: list[Ticket] = []
        self._queued_tokens = 0
        self._live: set[Ticket] = set()
        self._in_flight_of: Counter[str] = Counter()  # per tenant, queued or running
        self._closed = False
        self._wait_s = 0.0
        self.admitted: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        # Told of each ticket as it is admitted (the batch lane: `app.batches.lane`).
        self.on_admit: list[Callable[[Ticket], None]] = []

    # -- the rule ------------------------------------------------------------------

    def admit(
        self,
        protocol: ProtocolName,
        *,
        priority: int = 0,
        tokens: int = 0,
        record: RequestRecord | None = None,
        principal: Principal | None = None,
    ) -> Ticket:
        """A ticket (for `record`'s request, of `principal`'s tenant) at `priority`
        clamped to the principal's ceiling (`clamp_priority`: `limits.priority`, else
        `DEFAULT_PRIORITY_CEILING`), or `Overloaded` when the queued work this request
        would wait behind (priority <= its own) is at a bound, or its tenant's work in
        flight at its `concurrent` limit."""
        lane = protocol is ProtocolName.BATCH  # the server's own: its priority is the lane's
        if self.max_unit_tokens is not None:
            tokens = min(tokens, self.max_unit_tokens)
        if not lane:
            ceiling = DEFAULT_PRIORITY_CEILING if principal is None else principal.limits.priority
            priority = clamp_priority(priority, ceiling)
        if self._closed:
            self.refused[protocol] += 1
            raise self.shutting_down()
        tenant = DEFAULT_TENANT if principal is None else principal.tenant
        concurrent = 0 if principal is None or lane else principal.limits.concurrent
        if concurrent and self._in_flight_of[tenant] >= concurrent:
            self.refused[protocol] += 1
            retry = self.retry_after_s()
            raise Overloaded(
                f"Your tenant has {concurrent} units of work in flight, its bound; retry "
                f"after {retry} s",
                retry_after_s=retry,
            )
        unbounded = self.max_requests is None and self.max_tokens is None
        ahead = [] if unbounded else [t for t in self._queue if t.priority <= priority]
        full_requests = self.max_requests is not None and len(ahead) >= self.max_requests
        full_tokens = (
            self.max_tokens is not None
            and ahead
            and sum(t.tokens for t in ahead) + tokens > self.max_tokens
        )
        if full_requests or full_tokens:
            self.refused[protocol] += 1
            retry = self.retry_after_s()
            what = "requests" if full_requests else "prompt tokens"
            raise Overloaded(
                f"The server is at its bound of queued {what}; retry after {retry} s",
                retry_after_s=retry,
            )
        ticket = Ticket(
            self,
            protocol,
            priority,
            tokens,
            self._clock(),
            record=record,
            tenant=None if lane else tenant,
        )
        if not lane:
            self._in_flight_of[tenant] += 1
        if record is not None:
            record.admitted_now()
        self._queue.append(ticket)
        self._queued_tokens += tokens
        self._live.add(ticket)
        self.admitted[protocol] += 1
        for listener in self.on_admit:
            listener(ticket)
        return ticket

    def admit_all(
        self,
        protocol: ProtocolName,
        tokens: Iterable[int],
        *,
        priority: int = 0,
        record: RequestRecord | None = None,
        principal: Principal | None = None,
    ) -> Tickets:
        """One ticket per unit of a call (`tokens`: each unit's prompt-token bound), or
        `Overloaded` for the whole call, with nothing taken."""
        taken: list[Ticket] = []
        bounds = list(tokens)
        try:
            for bound in bounds:
                taken.append(
                    self.admit(
                        protocol,
                        priority=priority,
                        tokens=bound,
                        record=record,
                        principal=principal,
                    )
                )
        except Overloaded:
            for ticket in taken:
                ticket.release()
            self.admitted[protocol] -= len(taken)
            self.refused[protocol] += len(bounds) - 1  # `admit` counted the refused one
            raise
        return Tickets(taken)

    def retry_after_s(self) -> int:
        return max(math.ceil(self.min_retry_after_s), math.ceil(self._wait_s))

    def shutting_down(self) -> ShuttingDown:
        """What a draining server tells the work it refuses or cuts: retry soon, on
        another replica or on this one restarted."""
        return ShuttingDown(_SHUTTING_DOWN, retry_after_s=math.ceil(self.min_retry_after_s))

    # -- what /metrics and readiness read ------------------------------------------

    def queued(self) -> Counter[str]:
        """Queued tickets per protocol."""
        return Counter(t.protocol for t in self._queue)

    def in_flight_before(self, priority: int) -> int:
        """Tickets in flight (queued or running) of a priority that runs before
        `priority`: the work a lane at `priority` yields to (`app.batches.lane`)."""
        return sum(1 for t in self._live if t.priority < priority)

    @property
    def queued_tokens(self) -> int:
        return self._queued_tokens

    @property
    def in_flight(self) -> int:
        """Tickets admitted and not yet released, queued or running."""
        return len(self._live)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Refuse every admission from now on (the server is draining)."""
        self._closed = True

    def cut(self) -> list[str]:
        """Mark every ticket in flight to end (`generate` then raises `Overloaded`); the
        engine request ids among them, for the caller to abort."""
        ids = []
        for ticket in self._live:
            ticket.cut = True
            if ticket.request_id is not None:
                ids.append(ticket.request_id)
        return ids

    def saturated(self) -> bool:
        """A request of the default priority (0) would be refused now (what readiness
        reports): the queued work of priority <= 0 is at a bound, or admission is closed."""
        if self._closed:
            return True
        ahead = [t for t in self._queue if t.priority <= 0]
        at_requests = self.max_requests is not None and len(ahead) >= self.max_requests
        at_tokens = self.max_tokens is not None and sum(t.tokens for t in ahead) >= self.max_tokens
        return at_requests or at_tokens

    # -- bookkeeping ---------------------------------------------------------------

    def _leaves(self, tenant: str) -> None:
        self._in_flight_of[tenant] -= 1
        if not self._in_flight_of[tenant]:
            del self._in_flight_of[tenant]

    def _dequeue(self, ticket: Ticket, *, waited: bool) -> None:
        self._queue.remove(ticket)
        self._queued_tokens -= ticket.tokens
        ticket.queued = False
        # The lane's requests wait in the engine's queue behind every other by design
        # (`app.batches.lane`): their waits tell a refused client nothing of its own.
        if waited and ticket.priority < LANE_PRIORITY:
            wait = self._clock() - ticket.admitted_at
            self._wait_s += _EWMA_WEIGHT * (wait - self._wait_s)


async def run(
    engine: Engine,
    request: GenerationRequest,
    ticket: Ticket,
    receive: Callable[[TokenEvent], None],
) -> None:
    """`engine.run(request, receive)` on `ticket`, as `generate` runs it: running from the
    first event, released however it ends; the ticket's call `cut` by a drain ends it as
    `Overloaded` (its final "abort" event is not handed on)."""
    cut = False

    def hand_on(event: TokenEvent) -> None:
        nonlocal cut
        ticket.running()
        if ticket.cut and event.finish_reason == "abort":
            cut = True
            return
        receive(event)

    try:
        request = ticket.start(request)
        await engine.run(request, hand_on)
        if cut:
            raise ticket._owner.shutting_down()
    finally:
        ticket.release()


async def generate(
    engine: Engine, request: GenerationRequest, ticket: Ticket
) -> AsyncGenerator[TokenEvent, None]:
    """`engine.generate(request)` run on `ticket`: running from the first event, released
    however it ends; the ticket's call `cut` by a drain ends it as `Overloaded`. Closing
    this iterator closes the engine's, which aborts the request (the seam's invariant)."""
    try:
        request = ticket.start(request)
        events = engine.generate(request)
        try:
            async for event in events:
                ticket.running()
                if ticket.cut and event.finish_reason == "abort":
                    raise ticket._owner.shutting_down()
                yield event
        finally:
            await events.aclose()
    finally:
        ticket.release()
