"""The Responses API on the shared road (`app.sessions.calls`), for any transport: HTTP
(JSON or SSE) and the websocket mode. One `Responses` per app
(`app.objects.AppObjects`), over its store.

A call, in the house's order: admission first (a refusal before any work), then the
conversation it continues (`previous_response_id`'s, or the items of its `conversation`,
the Conversations API's), then the exchange, planned in the prompt thread (every client
error before anything runs), then the engine. What the call does around its end
(`hooks`): a stored response's record is written, and its conversation extended, before
its terminal event (`app.sessions.stored_responses`); a websocket connection keeps what
it made.

Every call names its principal (`app.tenants.Principal`): what it continues (a stored
response, a conversation) and what it stores are its tenant's.

A websocket connection's responses (`ConnectionResponses`): each response made on it,
`store: false` ones included, so that the next turn continues from it with only its new
input, as the Codex CLI does, without a store read. At most `size` of them (the least
recently used goes first); a response that fails evicts the one it continued (its client
resends the whole context, told `previous_response_not_found`, rather than building on a
turn that may be half-applied). A continuation looks there first, then in the store; a
response found in neither is `previous_response_not_found`.

Background runs, retrieval, replay, cancel and deletion are `stored_responses`'s; this
module only starts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from app.admission import Admission, ProtocolName
from app.drain import Drain
from app.engine.base import Engine
from app.engine.models import served_by
from app.errors import InvalidRequest, NotFound, SwitchboardError
from app.protocols.openai.conversations import conversation_id
from app.protocols.openai.responses.exchange import TERMINAL, ResponsesExchange
from app.protocols.openai.responses.items import Item, new_id, read_input
from app.protocols.openai.responses.record import StoredResponse
from app.protocols.openai.responses.request import prompt_bound
from app.sessions.calls import Call, Hooks, in_prompt_thread, start_call
from app.sessions.conversations import Conversations
from app.sessions.stored_responses import (
    BackgroundRuns,
    Recording,
    ResponseRecords,
    not_found,
)
from app.store.base import ResponseStore
from app.store.batches import BatchStore
from app.telemetry.record import RequestRecord
from app.telemetry.reports import Telemetry
from app.tenants import Principal
from schemas.openai_responses import ResponsesRequest

PROTOCOL = ProtocolName.RESPONSES  # admission's and /metrics' name for this API
PREVIOUS = "previous_response_id"
T = TypeVar("T")


class CallLane(NamedTuple):
    """Where a call of another lane than the API's own runs (a batch's request,
    `app.batches.requests`): admitted as `protocol` at `priority`, its prompt built
    through `building` (the lane's bound on its builds in the prompt thread). Only the
    build passes the gate: reading the response or conversation a call continues is the
    store's I/O, and a call waiting on it must not keep the lane's others from building."""

    protocol: ProtocolName
    priority: int
    building: asyncio.Semaphore

    async def built(self, build: Callable[[], T]) -> T:
        """`build()` in the prompt thread, once the lane's gate lets it through."""
        async with self.building:
            return await in_prompt_thread(build)


class ConnectionResponses:
    """The responses one websocket connection made, by id, least recently used first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._kept: OrderedDict[str, StoredResponse] = OrderedDict()

    def get(self, response_id: str) -> StoredResponse | None:
        record = self._kept.get(response_id)
        if record is not None:
            self._kept.move_to_end(response_id)
        return record

    def keep(self, record: StoredResponse) -> None:
        self._kept[record.id] = record
        self._kept.move_to_end(record.id)
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)

    def evict(self, response_id: str | None) -> None:
        if response_id is not None:
            self._kept.pop(response_id, None)


@dataclass
class _Kept:
    """The hooks of a call on a websocket: recorded first (`Recording`), then kept by the
    connection; a failure evicts the response it continued."""

    exchange: ResponsesExchange
    kept: ConnectionResponses
    recording: Recording
    previous_id: str | None

    def running(self) -> None:
        pass

    async def ended(self) -> None:
        await self.recording.ended()
        exchange = self.exchange
        assert exchange.ended is not None
        self.kept.keep(
            StoredResponse(exchange.ended, list(exchange.input_items), list(exchange.context))
        )

    async def failed(self, error: SwitchboardError) -> None:
        self.kept.evict(self.previous_id)
        await self.recording.failed(error)


class Responses:
    def __init__(
        self,
        engine: Engine,
        admission: Admission,
        store: ResponseStore,
        drain: Drain | None,
        conversations: Conversations | None = None,
        telemetry: Telemetry | None = None,
        leases: BatchStore | None = None,
        lease_s: float = 10.0,
    ) -> None:
        self.engine = engine
        self.admission = admission
        self.conversations = conversations
        self.records = ResponseRecords(store)
        self.runs = BackgroundRuns(
            engine, self.records, drain, conversations, telemetry, leases, lease_s
        )

    async def start(
        self,
        principal: Principal,
        body: ResponsesRequest,
        record: RequestRecord,
        *,
        kept: ConnectionResponses | None = None,
        generate: bool = True,
        lane: CallLane | None = None,
    ) -> Call[ResponsesExchange]:
        """Every Responses call's start, whatever carries it (HTTP, the websocket, a
        background run, compaction): the model it names (`served_by`: an unknown one is
        NOT_FOUND before anything), admission (one unit, its bound `prompt_bound`'s, at
        the body's priority no more urgent than `principal`'s ceiling), the conversation
        it continues read as `principal`'s tenant (`kept` first: a websocket connection's
        own), the exchange planned. Not to `generate` (`generate: false`): nothing for
        the engine, but planned all the same (its prompt built, so admitted as any prompt
        work is), so the call is checked and completes, with no output, to continue
        from. A batch's request is admitted in its `lane`, its prompt built through the
        lane's gate."""
        served = served_by(self.engine, body.model)

        async def build() -> ResponsesExchange:
            context = await self._context(principal, body, kept)
            info, tokenizer = self.engine.info, self.engine.tokenizer
            response_id, created_at = new_id("resp"), int(time.time())

            def exchange() -> ResponsesExchange:
                return ResponsesExchange(
                    body,
                    info,
                    tokenizer,
                    response_id=response_id,
                    created_at=created_at,
                    served=served,
                    context=context,
                    input_items=read_input(body.input),
                    generate=generate,
                )

            if lane is None:
                return await in_prompt_thread(exchange)
            return await lane.built(exchange)  # the build alone: never the context's read

        try:
            return await start_call(
                self.admission,
                record,
                protocol=PROTOCOL if lane is None else lane.protocol,
                units=[prompt_bound(body)],
                priority=body.priority if lane is None else lane.priority,
                principal=principal,
                build=build,
            )
        except BaseException:
            if kept is not None:  # a failed continuation
                kept.evict(body.previous_response_id)
            raise

    def hooks(
        self,
        principal: Principal,
        call: Call[ResponsesExchange],
        body: ResponsesRequest,
        kept: ConnectionResponses | None,
    ) -> Hooks | None:
        """What `call` does around its end: stored (as `principal`'s) if `body` asks, its
        conversation extended, kept by `kept`."""
        exchange = call.exchange
        recording = Recording(self.records, principal, exchange, body.store, self.conversations)
        if kept is not None:
            return _Kept(exchange, kept, recording, body.previous_response_id)
        return recording if body.store or exchange.conversation is not None else None

    async def _context(
        self, principal: Principal, body: ResponsesRequest, kept: ConnectionResponses | None
    ) -> list[Item]:
        previous_id = body.previous_response_id
        if previous_id is None:
            if body.conversation is not None and self.conversations is not None:
                conversation = conversation_id(body.conversation)
                return await self.conversations.context(principal, conversation)
            return []
        previous = kept.get(previous_id) if kept is not None else None
        if previous is None:
            try:
                previous = await self.records.load(principal, previous_id, PREVIOUS)
            except NotFound as exc:
                exc.code = "previous_response_not_found"
                raise
        if previous.status not in TERMINAL:
            raise InvalidRequest(
                f"Response '{previous.id}' is still {previous.status}; continue from it once "
                "it has ended",
                param=PREVIOUS,
            )
        return previous.context()

    async def delete(self, principal: Principal, response_id: str) -> dict[str, Any]:
        await self.runs.stop(principal, response_id)
        if not await self.records.store.delete(principal.tenant, response_id):
            raise not_found(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    async def close(self) -> None:
        """End every background run still going (their records say `failed`), then the
        store."""
        await self.runs.close()
        with contextlib.suppress(Exception):
            await self.records.store.close()
