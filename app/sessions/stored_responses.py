"""Responses that outlive their call: their records in the store (`ResponseRecords`) and
this process's background runs (`BackgroundRuns`), with retrieval, replay and cancel.

Tenants. Every record, run and replay is its principal's tenant's (`app.tenants.Principal`,
decided where the request entered): another tenant's id is not found, as an id never
stored, whichever of them asks (retrieval, replay, cancel, deletion, input items, a
continuation), and a tenant's writes count against its `stored_bytes`.

Records. A stored response (`store: true`, OpenAI's default) is written once it has ended,
before its terminal event goes out (`Recording`, the hooks of a call on the shared road,
`app.sessions.calls`), so a client that has seen it can continue from the response on
any replica; a store that cannot be written fails the call in the API's shape. A failed
stream's record is written as `failed`, quietly (the client knows already). A response in
a `conversation` (`app.sessions.conversations`) adds its input and output to it at the
same moment, after its record, if it completed or was cut by `max_output_tokens` (a
failed or cancelled one adds nothing).

Background runs (`background: true`) belong to this process, not to the connection that
started them: each is a task registered by response id, holding its call's admission
places, run on the shared road with its events kept (`GET /v1/responses/{id}?stream=true`
follows it live here, from any `starting_after`; elsewhere, or once it has ended, the
stored response is replayed, `events.replay`). Its record is written queued, in progress
once the engine starts it (`running`), and at its end; a run's writes go out in order,
one after the other.

Cancel wins. A run's end is decided once: a client's cancel, or the write of its last
record, which is conditional (`put(..., unless_cancelled=True)`: refused, in the store's
own transaction, when another replica has raised the cancel flag), whichever comes first.
So a cancel that arrives before the run has ended, wherever it lands and whatever the run
is doing (not started yet, waiting for the engine, generating, writing its last record),
ends it `cancelled`, and nothing is written after that:

- here: the run is marked cancelled; a task not yet started ends at its first step
  without running, a started one is cancelled (closing its engine request aborts it),
  and the cancel waits for the `cancelled` record; once the last write has begun, the
  cancel waits for it and answers the response as it ended;
- on another replica: the flag is raised in the store, which the owner reads every
  `CANCEL_POLL_S` (and its last write reads atomically), and the asker waits (up to
  `CANCEL_WAIT_S`) for the record to end.

Drain: runs hold admission places, so a drain waits for them and then cuts them like any
request (their records then say `failed`); the drain's goodbye waits for their last
writes. `close()` (the app's shutdown) ends what is left the same way.

A server that dies (SIGKILL, its machine gone) writes nothing more. So a run holds a
lease on its response (`leases`: the store's, as batches' chunks are held), taken before
its first record, renewed every third of `lease_s` while it runs, and ended only once its
last record is written. A response still queued or in progress whose lease has run out
(read again after the lease is found gone) was orphaned: whoever reads it (a
retrieval, a stream following it, a cancel, on any replica) ends it `failed`, with a
`server_error` saying so, raising its cancel flag first, so that a run that was only
slow to renew cannot write over it (its last write is refused, as a cancel's would be).
A stream following such a response ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from app.drain import Drain
from app.engine.base import Engine
from app.errors import InvalidRequest, NotFound, SwitchboardError
from app.protocols.exchange import Event
from app.protocols.openai.responses.events import Body, replay, response_error
from app.protocols.openai.responses.exchange import TERMINAL, ResponsesExchange
from app.protocols.openai.responses.record import StoredResponse
from app.sessions.calls import Call, stream_call
from app.sessions.conversations import Conversations
from app.store.base import ResponseStore
from app.store.batches import BatchStore
from app.telemetry.reports import Telemetry
from app.tenants import Principal

logger = logging.getLogger(__name__)

CANCEL_POLL_S = 0.25  # how often a background run reads its cancel flag
CANCEL_WAIT_S = 10.0  # how long a cancel waits for another replica's run to end
FOLLOW_POLL_S = 0.25  # how often a stream of another replica's run reads the record
FOLLOW_LIMIT_S = 600.0  # how long such a stream waits for the run to end
ORPHANED = "The server running this response stopped before it ended"


def not_found(response_id: str, param: str = "response_id") -> NotFound:
    return NotFound(f"Response with id '{response_id}' not found.", param=param)


def _after(event: Event, starting_after: int | None) -> bool:
    return starting_after is None or event[1]["sequence_number"] > starting_after


class ResponseRecords:
    """The store's records of responses, each its tenant's (`principal.tenant`): another
    tenant's id is not found, as an id never stored."""

    def __init__(self, store: ResponseStore) -> None:
        self.store = store

    async def load(
        self, principal: Principal, response_id: str, param: str = "response_id"
    ) -> StoredResponse:
        data = await self.store.get(principal.tenant, response_id)
        record = StoredResponse.decode(data) if data is not None else None
        if record is None:
            raise not_found(response_id, param)
        return record

    async def save(
        self,
        principal: Principal,
        exchange: ResponsesExchange,
        response: Body,
        *,
        unless_cancelled: bool = False,
    ) -> bool:
        """Write `exchange`'s record with `response`, as `principal`'s tenant (within its
        `stored_bytes`); False: refused, the run was cancelled."""
        record = StoredResponse(response, list(exchange.input_items), list(exchange.context))
        return await self.store.put(
            principal.tenant,
            exchange.id,
            record.encode(),
            quota=principal.limits.stored_bytes,
            unless_cancelled=unless_cancelled,
        )

    async def save_quietly(
        self, principal: Principal, exchange: ResponsesExchange, response: Body
    ) -> None:
        """A write whose failure changes nothing the client is told (it is told already)."""
        try:
            await self.save(principal, exchange, response)
        except SwitchboardError as exc:
            logger.warning("response %s not stored: %s", exchange.id, exc.message)

    async def input_items(
        self, principal: Principal, response_id: str, *, after: str | None, limit: int, order: str
    ) -> dict[str, Any]:
        items = list((await self.load(principal, response_id)).input_items)
        if order == "desc":
            items.reverse()
        start = 0
        if after is not None:
            ids = [item.get("id") for item in items]
            if after not in ids:
                raise InvalidRequest(f"No input item '{after}' in this response", param="after")
            start = ids.index(after) + 1
        page = items[start : start + limit]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": start + limit < len(items),
        }


async def add_to_conversation(
    conversations: Conversations | None, principal: Principal, exchange: ResponsesExchange
) -> None:
    """A response that ended in a conversation adds its input and output to it."""
    ended = exchange.ended
    if conversations is None or exchange.conversation is None or ended is None:
        return
    if ended["status"] in ("completed", "incomplete"):
        items = [*exchange.input_items, *ended["output"]]
        await conversations.extend(principal, exchange.conversation, items)


@dataclass
class Recording:
    """The hooks of a call on the shared road (`app.sessions.calls.Hooks`) that leaves a
    trace: its record written (`store`) and its conversation extended before its terminal
    event; its record written as `failed` after a stream's failure."""

    records: ResponseRecords
    principal: Principal
    exchange: ResponsesExchange
    store: bool
    conversations: Conversations | None

    def running(self) -> None:
        pass

    async def ended(self) -> None:
        assert self.exchange.ended is not None
        if self.store:
            await self.records.save(self.principal, self.exchange, self.exchange.ended)
        await add_to_conversation(self.conversations, self.principal, self.exchange)

    async def failed(self, error: SwitchboardError) -> None:
        if self.store:
            failed = self.exchange.response("failed", error=error)
            await self.records.save_quietly(self.principal, self.exchange, failed)


class _Cancelled(BaseException):
    """A run's last write found its cancel flag raised: it ends cancelled (not an
    `Exception`, so that the shared road does not answer it as a failure)."""


@dataclass
class _Run:
    """A background response of this process: its principal, its task, its events so far,
    its writes."""

    principal: Principal
    call: Call[ResponsesExchange]
    events: list[Event] = field(default_factory=list)
    cancelled: bool = False  # by a client (not by the process stopping)
    deciding: bool = False  # its last write has begun: the end is decided there
    done: bool = False
    task: asyncio.Task[None] | None = None  # the whole run, its records included
    engine_part: asyncio.Future[None] | None = None  # the call on the engine, once started
    _writing: asyncio.Future[None] | None = None  # the last write issued
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def exchange(self) -> ResponsesExchange:
        return self.call.exchange

    def push(self, events: list[Event]) -> None:
        self.events.extend(events)
        self._changed.set()
        self._changed = asyncio.Event()

    def end(self) -> None:
        self.done = True
        self._changed.set()

    def cancel(self) -> None:
        """A client's cancel, unless the last write is deciding the end already. The
        run's own task is never cancelled by it (it writes the `cancelled` record): only
        its engine part, if started; a run not started yet sees the mark first."""
        if self.deciding or self.cancelled:
            return
        self.cancelled = True
        if self.engine_part is not None:
            self.engine_part.cancel()

    async def follow(self, starting_after: int | None) -> AsyncIterator[Event]:
        seen = 0
        while True:
            changed = self._changed
            while seen < len(self.events):
                event = self.events[seen]
                seen += 1
                if _after(event, starting_after):
                    yield event
            if self.done:
                return
            await changed.wait()


class BackgroundRuns:
    """This process's background runs, by response id."""

    def __init__(
        self,
        engine: Engine,
        records: ResponseRecords,
        drain: Drain | None,
        conversations: Conversations | None,
        telemetry: Telemetry | None = None,
        leases: BatchStore | None = None,
        lease_s: float = 10.0,
    ) -> None:
        self.engine = engine
        self.records = records
        self.conversations = conversations
        self.telemetry = telemetry
        self.leases = leases
        self.lease_s = lease_s
        self.owner = uuid.uuid4().hex
        self._runs: dict[str, _Run] = {}
        if drain is not None:
            drain.subscribe(self._settle)

    def _run_of(self, principal: Principal, response_id: str) -> _Run | None:
        """This process's run of `response_id`, if it is `principal`'s tenant's."""
        run = self._runs.get(response_id)
        return run if run is not None and run.principal.tenant == principal.tenant else None

    async def start(self, principal: Principal, call: Call[ResponsesExchange]) -> Body:
        """Start `call` in the background for `principal` (the run owns its admission places
        from here, or gives them back if this fails; with `telemetry`, it is reported as a
        request of its own, once it ends); the response object as queued."""
        exchange = call.exchange
        try:
            queued = exchange.response("queued", with_usage=False)
            await self._hold(exchange.id)
            await self.records.save(principal, exchange, queued)
        except BaseException:
            call.tickets.release()
            raise
        if self.telemetry is not None:
            call = call.handed_to(
                self.telemetry.hand_off(call.record, name="background response", api="responses")
            )
        run = _Run(principal, call)
        run.push(exchange.queued())
        self._runs[exchange.id] = run
        run.task = asyncio.create_task(self._run(run), name=f"response {exchange.id}")
        return queued

    async def _run(self, run: _Run) -> None:
        exchange = run.exchange
        watcher = asyncio.create_task(self._watch_cancel(run))
        try:
            if run.cancelled:  # before it began: it never reaches the engine
                run.call.tickets.release()
            else:
                hooks = _RunHooks(self, run)
                run.engine_part = asyncio.ensure_future(
                    stream_call(self.engine, run.call, run.push, hooks)
                )
                with contextlib.suppress(asyncio.CancelledError, _Cancelled):
                    await run.engine_part
                if _stopping():
                    raise asyncio.CancelledError
            if run.cancelled:
                run.push(exchange.cancelled())
                assert exchange.ended is not None
                await self._write(run, exchange.ended)
        except asyncio.CancelledError:  # the process is stopping
            exchange.fail()
            stopped = SwitchboardError("The server stopped before the response ended")
            await self._write(run, exchange.response("failed", error=stopped))
            raise
        finally:
            watcher.cancel()
            run.end()
            self._runs.pop(exchange.id, None)
            if self.telemetry is not None:
                self.telemetry.close(run.call.record)
            if self.leases is not None:
                with contextlib.suppress(SwitchboardError):
                    await asyncio.shield(
                        self.leases.unlease(_lease_key(exchange.id), owner=self.owner)
                    )

    def _chain(self, run: _Run, response: Body) -> asyncio.Future[None]:
        """The run's record to be written with `response`, after its earlier writes,
        quietly (the write goes on if its caller is cancelled)."""
        previous = run._writing

        async def write() -> None:
            if previous is not None:
                await asyncio.wait([previous])
            await self.records.save_quietly(run.principal, run.exchange, response)

        run._writing = asyncio.ensure_future(write())
        return run._writing

    async def _write(self, run: _Run, response: Body) -> None:
        await asyncio.shield(self._chain(run, response))

    async def _watch_cancel(self, run: _Run) -> None:
        """Reads the run's cancel flag every `CANCEL_POLL_S`, renews its lease every
        third of `lease_s`."""
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(CANCEL_POLL_S)
            try:
                if time.monotonic() - renewed > self.lease_s / 3:
                    renewed = time.monotonic()
                    await self._hold(run.exchange.id)
                flagged = await self.records.store.cancel_requested(run.exchange.id)
            except SwitchboardError:
                continue  # the store is down: the owner still cancels what it is asked here
            if flagged:
                run.cancel()
                return

    async def _hold(self, response_id: str) -> None:
        if self.leases is not None:
            now = time.time()
            await self.leases.lease(
                _lease_key(response_id), owner=self.owner, now=now, until=now + self.lease_s
            )

    async def current(self, principal: Principal, response_id: str) -> StoredResponse:
        """`principal`'s stored response; an orphaned one (its server died mid-run) ended
        first."""
        return await self._unorphaned(principal, await self.records.load(principal, response_id))

    async def _unorphaned(self, principal: Principal, record: StoredResponse) -> StoredResponse:
        if (
            self.leases is None
            or record.status in TERMINAL
            or record.id in self._runs
            or await self.leases.leased(_lease_key(record.id), time.time())
        ):
            return record
        # A run writes its last record before it lets go of its lease, so the record is
        # read again: the one in hand may predate that write (the owner ended between the
        # read and the look at the lease), and declaring that run dead would write `failed`
        # over how it ended.
        record = await self.records.load(principal, record.id)
        if record.status in TERMINAL:
            return record
        await self.records.store.request_cancel(record.id)
        failed = {
            **record.response,
            "status": "failed",
            "error": response_error(SwitchboardError(ORPHANED)),
        }
        ended = StoredResponse(failed, record.input_items, record.history)
        await self.records.store.put(
            principal.tenant, record.id, ended.encode(), quota=principal.limits.stored_bytes
        )
        logger.warning("response %s ended failed: its server stopped", record.id)
        return ended

    async def _until_ended(
        self, principal: Principal, record: StoredResponse, limit_s: float
    ) -> StoredResponse:
        """`record`, read again every `FOLLOW_POLL_S` until another replica's run has
        ended it (or it is found orphaned), or `limit_s` have passed."""
        deadline = time.monotonic() + limit_s
        record = await self._unorphaned(principal, record)
        while record.status not in TERMINAL and time.monotonic() < deadline:
            await asyncio.sleep(FOLLOW_POLL_S)
            record = await self.current(principal, record.id)
        return record

    async def cancel(self, principal: Principal, response_id: str) -> Body:
        run = self._run_of(principal, response_id)
        if run is not None and run.task is not None:
            run.cancel()
            await asyncio.wait([run.task])
            return (await self.records.load(principal, response_id)).response
        record = await self.current(principal, response_id)
        if not record.response.get("background"):
            raise InvalidRequest("Only background responses can be cancelled", param="response_id")
        if record.status in TERMINAL:
            return record.response
        await self.records.store.request_cancel(response_id)
        return (await self._until_ended(principal, record, CANCEL_WAIT_S)).response

    async def stop(self, principal: Principal, response_id: str) -> None:
        """End the run of `response_id` here, if there is one of `principal`'s tenant (before
        its deletion)."""
        run = self._run_of(principal, response_id)
        if run is not None and run.task is not None:
            run.cancel()
            await asyncio.wait([run.task])

    async def replay(
        self, principal: Principal, response_id: str, starting_after: int | None
    ) -> AsyncGenerator[Event, None]:
        """The response's events: live while it runs here, else replayed from the store
        once it has ended (waiting up to `FOLLOW_LIMIT_S` for another replica's run)."""
        run = self._run_of(principal, response_id)
        record = await self.records.load(principal, response_id)
        return self._replay(principal, run, record, starting_after)

    async def _replay(
        self,
        principal: Principal,
        run: _Run | None,
        record: StoredResponse,
        starting_after: int | None,
    ) -> AsyncGenerator[Event, None]:
        if run is not None:
            async for event in run.follow(starting_after):
                yield event
            return
        record = await self._until_ended(principal, record, FOLLOW_LIMIT_S)
        for event in replay(record.response):
            if _after(event, starting_after):
                yield event

    async def _settle(self) -> None:
        """The drain's goodbye: the runs it cut write their last records."""
        tasks = [run.task for run in self._runs.values() if run.task is not None]
        if tasks:
            await asyncio.wait(tasks)

    async def close(self) -> None:
        """End every run still going (their records say `failed`)."""
        tasks = [run.task for run in self._runs.values() if run.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)


def _lease_key(response_id: str) -> str:
    return f"response:{response_id}"


def _stopping() -> bool:
    """This task is being cancelled (the process stops), not only its engine part."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


@dataclass
class _RunHooks:
    """A background run's records: in progress when the engine starts it; its end
    decided by its last write, refused when another replica's cancel came first (the run
    then ends cancelled), then its conversation extended; `failed` after a failure."""

    runs: BackgroundRuns
    run: _Run

    def running(self) -> None:
        run = self.run
        run.push([run.exchange.in_progress()])
        self.runs._chain(run, run.exchange.response("in_progress"))

    async def ended(self) -> None:
        run, exchange = self.run, self.run.exchange
        run.deciding = True
        if run._writing is not None:
            await asyncio.wait([run._writing])
        assert exchange.ended is not None
        if not await self.runs.records.save(
            run.principal, exchange, exchange.ended, unless_cancelled=True
        ):
            run.cancelled = True
            raise _Cancelled
        await add_to_conversation(self.runs.conversations, run.principal, exchange)

    async def failed(self, error: SwitchboardError) -> None:
        await self.runs._write(self.run, self.run.exchange.response("failed", error=error))
