"""One call of a call-shaped API (an `Exchange`: Completions, Chat, Responses, Messages)
on the engine, for any transport: the one road every such call takes, whatever carries
it (SSE over HTTP, JSON frames over a websocket).

In this order:

1. `start_call`: admission (`app.admission`), one unit per engine request the call will
   make, each with a bound of its prompt tokens, before any prompt work (a refusal is
   raised, for the transport to answer in the API's shape); then `build`, which makes
   the exchange: off the event loop, in a prompt thread holding the one prompt turn
   (`in_prompt_thread`), where templating, tokenizing, compiling a constraint's grammar
   and decoding images block, so that they never stall the streams. A build that fails
   gives its admission places back. Work that builds a prompt and runs nothing (the
   render routes, /tokenize, count_tokens) is admitted alike, for as long as it builds
   (`admitted_in_prompt_thread`).
2. `stream_call`: the exchange's events handed to `emit` as they come: `opening()`, then
   the events of each engine event, pushed from the engine's own loop
   (`run_generations`: the call's task waits once, for the end), then `closing()`; a
   failure after the opening goes into the stream in the API's shape
   (`Exchange.failure`). `collect_call`: each event fed to the exchange, then its body
   (`result()`); a failure is raised.

`Hooks` are what an API does around its call's end, on the same road: `ended()` is
awaited once the exchange's last events (or its body) are known and before they are
handed on, so a Responses call stores its record there and a client that has seen the terminal
event can continue from it on any replica; if it raises, the call fails in the API's
shape instead. `failed(error)` follows a stream's failure events; `running()` is told the
call's first engine event (the engine has started it).

The call's `RequestRecord` (`app.telemetry`: opened by the transport's edge) is filled
on the way: admitted (by admission), its prompt built, its first and last tokens, its
tokens and finishes counted (`Exchange.accounting`), a failure, a client gone (the call
cancelled before its end); the transport reports it.

Invariants: however the call ends (its last event, an error, the transport cancelling
it because the client left), its engine requests are closed, which aborts any still
running, and its admission places are given back; an exception inside a call becomes
what the client is told through `app.errors.client_error`, the one rule for every
transport. The transport only encodes what `emit` is given; it never reorders it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from app.admission import Admission, ProtocolName, Tickets
from app.engine.base import Engine, GenerationRequest, TokenEvent
from app.engine.turn import PROMPT_TURN
from app.errors import SwitchboardError, client_error
from app.protocols.exchange import Event
from app.sessions.generations import run_generations
from app.telemetry.record import RequestRecord
from app.tenants import Principal

T = TypeVar("T")


class Planned(Protocol):
    """What the road needs of a call's exchange to admit and run it: its engine
    requests (every `Exchange` is one; a transport with its own encoding builds one of its own)."""

    @property
    def requests(self) -> Sequence[GenerationRequest]: ...


C = TypeVar("C", bound=Planned)
Emit = Callable[[list[Event]], None]

# Prompt threads, one build at a time among them: each holds the prompt turn
# (`app.engine.turn`) while it builds, so prompts are built in arrival order and the
# tokenizer is never entered from two threads at once (HF's fast tokenizers are not
# reentrant). More than one thread so that a build waiting on another process (a big
# prompt templated in the render process, its turn given up) leaves the others a thread;
# enough for the big prompts waiting at once (each waits in the render process's queue)
# to leave the others threads; an idle thread costs nothing, a waiting one one wake-up.
PROMPT_THREADS = 16
_PROMPT_THREADS = ThreadPoolExecutor(max_workers=PROMPT_THREADS, thread_name_prefix="prompt")


def _in_turn(build: Callable[[], T]) -> T:
    with PROMPT_TURN:
        return build()


async def in_prompt_thread(build: Callable[[], T]) -> T:
    """`build()` in a prompt thread, in the prompt turn."""
    return await asyncio.get_running_loop().run_in_executor(_PROMPT_THREADS, _in_turn, build)


async def admitted_in_prompt_thread(
    admission: Admission,
    *,
    protocol: ProtocolName,
    units: Sequence[int],
    principal: Principal,
    build: Callable[[], T],
    priority: int = 0,
) -> T:
    """`build()` in the prompt thread, admitted as a call of `units` is, as `principal`'s
    (the render routes, /tokenize, count_tokens: prompt work for no engine request): it
    waits in the same queue, is refused by the same bounds, and gives its places back once
    built."""
    with admission.admit_all(protocol, list(units), priority=priority, principal=principal):
        return await in_prompt_thread(build)


class Hooks(Protocol):
    def running(self) -> None:
        """The engine has started the call (its first event)."""
        ...

    async def ended(self) -> None:
        """Before the call's last events (or its body) go out; raising fails the call."""
        ...

    async def failed(self, error: SwitchboardError) -> None:
        """After a stream's failure events (it must not raise)."""
        ...


@dataclass(slots=True)
class Call(Generic[C]):
    """A call admitted and built, not yet run: its exchange, its admission places and its
    record."""

    exchange: C
    tickets: Tickets
    record: RequestRecord

    def handed_to(self, record: RequestRecord) -> Call[C]:
        """The call, reported by `record` from now on (its tickets tell it too)."""
        for ticket in self.tickets.tickets:
            ticket.record = record
        return Call(self.exchange, self.tickets, record)


async def start_call(
    admission: Admission,
    record: RequestRecord,
    *,
    protocol: ProtocolName,
    units: Sequence[int],
    priority: int,
    principal: Principal,
    build: Callable[[], Awaitable[C]],
) -> Call[C]:
    """Admit a call of `len(units)` engine requests (`units[i]`: a bound of request i's
    prompt tokens) as `principal`'s (its tenant's limits; its priority no more urgent than
    its ceiling), then `build()` its exchange (awaited: the prompt thread, and whatever the
    API reads first, a stored conversation say)."""
    tickets = admission.admit_all(
        protocol, list(units), priority=priority, record=record, principal=principal
    )
    try:
        exchange = await build()
    except BaseException:
        tickets.release()
        raise
    record.built_now()
    return Call(exchange, tickets, record)


async def stream_call(
    engine: Engine, call: Call[Any], emit: Emit, hooks: Hooks | None = None
) -> None:
    """Run `call`, every event of its stream handed to `emit` in order (errors included:
    this returns once the stream has ended, however it ended)."""
    exchange = call.exchange

    def on_event(index: int, event: TokenEvent) -> None:
        events = exchange.events(index, event)
        if events:
            emit(events)

    receive = on_event if hooks is None else _first_told(on_event, hooks)
    record = call.record
    with call.tickets:
        try:
            emit(exchange.opening())
            await run_generations(engine, exchange.requests, call.tickets, receive)
            record.last_token_now()
            closing = exchange.closing()
            if hooks is not None:
                await hooks.ended()
            emit(closing)
        except Exception as exc:  # the stream has started: the error goes in it
            error = client_error(exc)
            record.failed(error)
            emit(exchange.failure(error))
            if hooks is not None:
                await hooks.failed(error)
        except asyncio.CancelledError:  # the client has gone
            record.cancelled = True
            raise
        finally:
            record.count(exchange.accounting)


async def collect_call(engine: Engine, call: Call[Any], hooks: Hooks | None = None) -> Any:
    """Run `call` to its end, feeding the exchange every event; its body (a failure is
    raised as the client's error)."""
    exchange = call.exchange
    receive = exchange.feed if hooks is None else _first_told(exchange.feed, hooks)
    record = call.record
    with call.tickets:
        try:
            await run_generations(engine, exchange.requests, call.tickets, receive)
            record.last_token_now()
            body = exchange.result()
            if hooks is not None:
                await hooks.ended()
        except Exception as exc:
            error = client_error(exc)
            record.failed(error)
            raise error from exc
        except asyncio.CancelledError:  # the client has gone
            record.cancelled = True
            raise
        finally:
            record.count(exchange.accounting)
    return body


def _first_told(
    receive: Callable[[int, TokenEvent], None], hooks: Hooks
) -> Callable[[int, TokenEvent], None]:
    """`receive`, telling `hooks.running()` once, before the first event."""
    told = False

    def first(index: int, event: TokenEvent) -> None:
        nonlocal told
        if not told:
            told = True
            hooks.running()
        receive(index, event)

    return first
