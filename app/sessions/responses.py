"""The Responses API driven on the engine with its store, for any transport: a call's
admission and plan, its foreground run (streamed or not), background runs, retrieval,
replay, deletion and cancel.

`ResponsesRunner` is one per app (`app.routes.deps.responses_runner`). The order of a
call is the house's: admission first (a refusal before any work), then the stored
context of `previous_response_id`, then the plan in the render thread (every client
error before anything runs), then the engine.

A response in a `conversation` (the Conversations API's, `app.sessions.conversations`)
starts from its items and adds its input and output to them once it has ended, as a
stored response is written. Stored responses (`store: true`, OpenAI's default) are
written once, when the response has ended; a stream's terminal event
(`response.completed`, `.incomplete`) is sent only after that write, so a client that has
seen it can continue from the response on any replica. A store that cannot be written
fails the call in the API's shape (in a stream: `error` then `response.failed`); `store:
false` calls never touch the store.

Background runs (`background: true`) belong to this process, not to the connection that
started them: each is a task registered by response id, holding its admission ticket,
that writes the record when it is queued, when the engine starts it and when it ends.
Its events are kept while it runs, so `GET /v1/responses/{id}?stream=true` (on this
process) follows it live from any `starting_after`; elsewhere, or once it has ended, a
stored response is replayed (`events.replay`: each item's text in one delta).

Cancel works across replicas: on the owner, the task is cancelled at once (closing its
engine iterator aborts the engine request) and the record says `cancelled`; on another
replica, a cancel flag is raised in the store, which the owner reads every
`CANCEL_POLL_S`, and the caller waits (up to `CANCEL_WAIT_S`) for the record to end.

Drain: runs hold admission tickets, so a drain waits for them and then cuts them like
any request (their records then say `failed`); the drain's goodbye waits for their last
writes. `close()` (the app's shutdown) ends what is left the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from app.admission import Admission, Tickets, generate
from app.drain import Drain
from app.engine.base import Engine
from app.errors import InvalidRequest, NotFound, SwitchboardError, client_error
from app.protocols.core import Event
from app.protocols.openai.conversations import conversation_id
from app.protocols.openai.responses.core import TERMINAL, ResponsesCore
from app.protocols.openai.responses.events import replay
from app.protocols.openai.responses.items import new_id, read_input
from app.protocols.openai.responses.record import StoredResponse
from app.sessions.conversations import Conversations
from app.store.base import ResponseStore
from schemas.openai_responses import ResponsesRequest

logger = logging.getLogger(__name__)
T = TypeVar("T")
Render = Callable[[Callable[[], T]], Awaitable[T]]

PROTOCOL = "responses"  # admission's and /metrics' name for this API
CANCEL_POLL_S = 0.25  # how often a background run reads its cancel flag
CANCEL_WAIT_S = 10.0  # how long a cancel waits for another replica's run to end
FOLLOW_POLL_S = 0.25  # how often a stream of another replica's run reads the record
FOLLOW_LIMIT_S = 600.0  # how long such a stream waits for the run to end


@dataclass
class Started:
    """A call admitted and planned, not yet run."""

    core: ResponsesCore
    tickets: Tickets
    store: bool


@dataclass
class _Run:
    """A background response running in this process: its task and its events so far."""

    core: ResponsesCore
    events: list[Event] = field(default_factory=list)
    done: bool = False
    cancelled: bool = False  # by a client (not by the process stopping)
    task: asyncio.Task[None] | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def push(self, events: list[Event]) -> None:
        self.events.extend(events)
        self._changed.set()
        self._changed = asyncio.Event()

    def end(self) -> None:
        self.done = True
        self._changed.set()

    def cancel(self) -> asyncio.Task[None] | None:
        """A client's cancel (the record will say `cancelled`): the task, to wait for."""
        if self.task is not None:
            self.cancelled = True
            self.task.cancel()
        return self.task

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


def _after(event: Event, starting_after: int | None) -> bool:
    return starting_after is None or event[1]["sequence_number"] > starting_after


def not_found(response_id: str) -> NotFound:
    return NotFound(f"Response with id '{response_id}' not found.", param="response_id")


class ResponsesRunner:
    def __init__(
        self,
        engine: Engine,
        admission: Admission,
        store: ResponseStore,
        render: Render[Any],
        drain: Drain | None = None,
        conversations: Conversations | None = None,
    ) -> None:
        self.engine = engine
        self.admission = admission
        self.store = store
        self.conversations = conversations
        self._render = render
        self._runs: dict[str, _Run] = {}
        if drain is not None:
            drain.subscribe(self._settle_runs)

    # -- a call ----------------------------------------------------------------------

    async def start(self, body: ResponsesRequest, *, model: str, bound: int) -> Started:
        """Admit (one unit, `bound` prompt tokens at most), read the stored context, plan."""
        tickets = self.admission.admit_all(PROTOCOL, [bound], priority=body.priority)
        try:
            context: list[Any] = []
            if body.previous_response_id is not None:
                previous = await self._load(body.previous_response_id, "previous_response_id")
                if previous.status not in TERMINAL:
                    raise InvalidRequest(
                        f"Response '{previous.id}' is still {previous.status}; continue from "
                        "it once it has ended",
                        param="previous_response_id",
                    )
                context = previous.context()
            elif body.conversation is not None and self.conversations is not None:
                context = await self.conversations.context(conversation_id(body.conversation))
            info, tokenizer = self.engine.info, self.engine.tokenizer
            core = await self._render(
                lambda: ResponsesCore(
                    body,
                    info,
                    tokenizer,
                    response_id=new_id("resp"),
                    created_at=int(time.time()),
                    model=model,
                    context=context,
                    input_items=read_input(body.input),
                )
            )
        except BaseException:
            tickets.release()
            raise
        return Started(core, tickets, body.store)

    async def stream(self, started: Started) -> AsyncGenerator[Event, None]:
        """A foreground stream: every event, the record written before the last one."""
        core = started.core
        try:
            for event in core.opening():
                yield event
            async with aclosing(generate(self.engine, core.requests[0], started.tickets[0])) as run:
                async for token_event in run:
                    for event in core.events(0, token_event):
                        yield event
            for event in core.settle():
                yield event
            terminal, response = core.terminal()
            await self._ended(core, response, store=started.store)
            yield terminal
        except Exception as exc:  # the stream has started: the error goes in it
            error = client_error(exc)
            for event in core.failure(error):
                yield event
            if started.store:
                await self._save_quietly(core, core.response("failed", error=error))

    async def collect(self, started: Started) -> dict[str, Any]:
        """A foreground call, not streamed: the response object, stored first."""
        core = started.core
        async with aclosing(generate(self.engine, core.requests[0], started.tickets[0])) as run:
            async for token_event in run:
                core.feed(0, token_event)
        response = core.result()
        await self._ended(core, response, store=started.store)
        return response

    # -- background runs -------------------------------------------------------------

    async def background(self, started: Started) -> dict[str, Any]:
        """Start a background run (it owns `started.tickets` from here); the response
        object as queued."""
        core = started.core
        queued = core.response("queued", with_usage=False)
        await self._save(core, queued)
        run = _Run(core)
        run.push(core.opening("queued"))
        self._runs[core.id] = run
        run.task = asyncio.create_task(self._run(run, started.tickets), name=f"response {core.id}")
        return queued

    async def _run(self, run: _Run, tickets: Tickets) -> None:
        core = run.core
        watcher = asyncio.create_task(self._watch_cancel(run))
        try:
            async with aclosing(generate(self.engine, core.requests[0], tickets[0])) as events:
                async for token_event in events:
                    if token_event.prompt_token_ids is not None:
                        run.push([core.in_progress()])
                        await self._save_quietly(core, core.response("in_progress"))
                    run.push(core.events(0, token_event))
            run.push(core.settle())
            terminal, response = core.terminal()
            await self._ended(core, response, store=True)
            run.push([terminal])
        except asyncio.CancelledError:
            core.fail()
            if run.cancelled:
                await self._save_quietly(core, core.response("cancelled"))
            else:  # the process is stopping
                stopped = SwitchboardError("The server stopped before the response ended")
                await self._save_quietly(core, core.response("failed", error=stopped))
                raise
        except Exception as exc:
            error = client_error(exc)
            run.push(core.failure(error))
            await self._save_quietly(core, core.response("failed", error=error))
        finally:
            watcher.cancel()
            tickets.release()
            run.end()
            self._runs.pop(core.id, None)

    async def _watch_cancel(self, run: _Run) -> None:
        while True:
            await asyncio.sleep(CANCEL_POLL_S)
            try:
                flagged = await self.store.cancel_requested(run.core.id)
            except SwitchboardError:
                continue  # the store is down: the owner still cancels what it is asked here
            if flagged and run.cancel() is not None:
                return

    async def cancel(self, response_id: str) -> dict[str, Any]:
        run = self._runs.get(response_id)
        if run is not None and (task := run.cancel()) is not None:
            await asyncio.wait([task])
            return (await self._load(response_id, "response_id")).response
        record = await self._load(response_id, "response_id")
        if not record.response.get("background"):
            raise InvalidRequest("Only background responses can be cancelled", param="response_id")
        if record.status in TERMINAL:
            return record.response
        await self.store.request_cancel(response_id)
        return (await self._until_ended(record, CANCEL_WAIT_S, CANCEL_POLL_S)).response

    # -- the store -------------------------------------------------------------------

    async def retrieve(self, response_id: str) -> dict[str, Any]:
        return (await self._load(response_id, "response_id")).response

    async def replay(
        self, response_id: str, starting_after: int | None
    ) -> AsyncGenerator[Event, None]:
        """The response's events: live while it runs here, else replayed from the store
        once it has ended (waiting up to `FOLLOW_LIMIT_S` for another replica's run)."""
        run = self._runs.get(response_id)
        record = await self._load(response_id, "response_id")
        return self._replay(run, record, starting_after)

    async def _replay(
        self,
        run: _Run | None,
        record: StoredResponse,
        starting_after: int | None,
    ) -> AsyncGenerator[Event, None]:
        if run is not None:
            async for event in run.follow(starting_after):
                yield event
            return
        record = await self._until_ended(record, FOLLOW_LIMIT_S, FOLLOW_POLL_S)
        for event in replay(record.response):
            if _after(event, starting_after):
                yield event

    async def delete(self, response_id: str) -> dict[str, Any]:
        run = self._runs.get(response_id)
        if run is not None and (task := run.cancel()) is not None:
            await asyncio.wait([task])
        if not await self.store.delete(response_id):
            raise not_found(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    async def input_items(
        self, response_id: str, *, after: str | None, limit: int, order: str
    ) -> dict[str, Any]:
        items = list((await self._load(response_id, "response_id")).input_items)
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

    async def _until_ended(
        self, record: StoredResponse, limit_s: float, poll_s: float
    ) -> StoredResponse:
        """`record`, read again every `poll_s` until another replica's run has ended it
        or `limit_s` have passed."""
        deadline = time.monotonic() + limit_s
        while record.status not in TERMINAL and time.monotonic() < deadline:
            await asyncio.sleep(poll_s)
            record = await self._load(record.id, "response_id")
        return record

    async def _load(self, response_id: str, param: str) -> StoredResponse:
        data = await self.store.get(response_id)
        record = StoredResponse.decode(data) if data is not None else None
        if record is None:
            error = not_found(response_id)
            error.param = param
            raise error
        return record

    async def _ended(self, core: ResponsesCore, response: dict[str, Any], *, store: bool) -> None:
        """What a response does once it has ended, before its terminal event: its record
        written (`store`), its input and output added to its conversation (if in one)."""
        if store:
            await self._save(core, response)
        ended = response["status"] in ("completed", "incomplete")
        if core.conversation is not None and self.conversations is not None and ended:
            await self.conversations.extend(
                core.conversation, [*core.input_items, *response["output"]]
            )

    async def _save(self, core: ResponsesCore, response: dict[str, Any]) -> None:
        record = StoredResponse(response, list(core.input_items), list(core.context))
        await self.store.put(core.id, record.encode())

    async def _save_quietly(self, core: ResponsesCore, response: dict[str, Any]) -> None:
        """A write whose failure changes nothing the client is told (it is told already)."""
        try:
            await self._save(core, response)
        except SwitchboardError as exc:
            logger.warning("response %s not stored: %s", core.id, exc.message)

    # -- the process's end -----------------------------------------------------------

    async def _settle_runs(self) -> None:
        """The drain's goodbye: the runs it cut write their last records."""
        tasks = [run.task for run in self._runs.values() if run.task is not None]
        if tasks:
            await asyncio.wait(tasks)

    async def close(self) -> None:
        """End every run still going (their records say `failed`), then the store."""
        tasks = [run.task for run in self._runs.values() if run.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        with contextlib.suppress(Exception):
            await self.store.close()
