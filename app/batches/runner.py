"""A replica's batch runner: it advances every active batch on the shared store, answering
their requests in the lane, so that any replica (and every replica at once) works on any
batch, and a replica's death or restart loses none of it.

Each replica runs one, from the app's start to its end. Every `POLL_S` (or when woken: a
batch created or cancelled here) it reads the active batches, oldest first, and moves
each on by what the store says, whoever wrote it:

- `validating` (OpenAI's): under the batch's own lease, its input file is read from the
  store in parts, each line checked (`app.protocols.openai.batches.InputReader`, in the
  batch thread: never on the event loop), and its requests copied to the batch in
  chunks of `CHUNK` requests; then `in_progress`, or `failed` with its errors.
- `in_progress`: chunks are claimed (`BatchStore.claim`: each under a lease this replica
  renews every third of `lease_s` while it holds it) while the lane could use more work;
  each request of a chunk without a result yet is queued here, and started when the lane
  has room (`app.batches.lane`); its answer (`app.batches.requests`) is written as its
  result, the first written winning, and a chunk whose every request has its result is
  finished. Once every chunk has been handed out and finished: `finalizing`, the output
  and error files made (OpenAI's), `completed`.
- past its completion window, or `cancelling`: this replica drops its work of the batch
  (queued requests forgotten, running ones taken off the engine, chunks given back), and
  once no replica holds a live lease on a chunk, the one that takes the batch's lease
  writes every request still without a result as `expired` (or `cancelled`), makes the
  files, and ends it `expired` (or `cancelled`).

Exactly once: a request's result is written once, whoever ran it (a lease that ran out
while its replica was slow may have it run twice; the second result is not kept), and
every change of a batch's status is a swap of the record it read (`BatchStore.swap`), so
a cancel and a runner racing never lose each other's change; the output files read the
results in the order of the requests.

A request that could not be answered for the server's own reason (`Retry`: a full queue,
a drain, the engine or a store out of reach) is queued again, after a pause. A drain
takes every batch request off the engine at once and gives its chunks back (another
replica, or this one restarted, takes them over); `close` does the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, TypeVar

from app.batches.files import Files
from app.batches.lane import Lane
from app.batches.requests import Answer, Endpoints, Retry
from app.drain import Drain
from app.engine.base import OPEN_REQUESTS, OpenRequests
from app.errors import NotFound, SwitchboardError
from app.protocols.anthropic import batches as anthropic
from app.protocols.batches import (
    CANCELLED,
    ERRORED,
    EXPIRED,
    SUCCEEDED,
    BatchRecord,
    Status,
    chunk_range,
)
from app.protocols.openai import batches as openai
from app.store.batches import BatchStore

logger = logging.getLogger(__name__)

T = TypeVar("T")
ACTIVE = "active"  # the store's index of the batches still running
CHUNK = 16  # requests per chunk: what a replica claims at once
POLL_S = 0.5  # how often the active batches are read
# How often the lane is looked at while there is batch work here (its width changes with
# time and with interactive traffic); a request leaving it wakes the feed at once.
_TICK_S = 0.02
STARTED_PER_TURN = 8  # batch requests started in one turn of the event loop (`_fill`)
_RETRY_PAUSE_S = 1.0  # after a request the server could not answer

# One thread for a batch's blocking work (checking an input file's lines): never the
# event loop's, never the prompt thread interactive calls wait for.
_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch")


async def in_batch_thread(work: Callable[[], T]) -> T:
    return await asyncio.get_running_loop().run_in_executor(_THREAD, work)


@dataclass(eq=False)
class _Item:
    """One request of a chunk this replica holds, queued or running."""

    record: BatchRecord
    chunk: int
    index: int
    line: bytes
    task: asyncio.Task[None] | None = None
    started: int = 0  # the order it last started in
    requeue: bool = False  # taken off the engine to run again, not dropped
    # Taken off to make room (`_take_off`): out of the lane's count at once, while its
    # task unwinds.
    off: bool = False
    # Its engine requests while it runs: their aborts leave at its take-off, ahead of
    # its task's cancel.
    requests: OpenRequests = field(default_factory=OpenRequests)


@dataclass(eq=False)
class _Held:
    """A chunk this replica holds: its requests still without their result here."""

    left: set[int] = field(default_factory=set)


def _request_of(record: BatchRecord, line: bytes) -> tuple[str, Any]:
    if record.api == "anthropic":
        return anthropic.request_of(line)
    return openai.request_of(line)


def answer_line(record: BatchRecord, index: int, custom_id: str, answer: Answer) -> bytes:
    if record.api == "anthropic":
        return anthropic.answer_line(custom_id, answer.status, answer.body)
    return openai.answer_line(record.id, index, custom_id, answer.status, answer.body)


def unrun_line(record: BatchRecord, index: int, custom_id: str, outcome: str) -> bytes:
    if record.api == "anthropic":
        line = anthropic.expired_line if outcome == EXPIRED else anthropic.cancelled_line
        return line(custom_id)
    unrun = openai.expired_line if outcome == EXPIRED else openai.cancelled_line
    return unrun(record.id, index, custom_id)


def output_file_ids(record: BatchRecord) -> tuple[str, str]:
    """The ids a batch's output and error files get (the same whoever makes them)."""
    suffix = record.id.removeprefix("batch_")
    return f"file-{suffix}-output", f"file-{suffix}-errors"


class BatchRunner:
    def __init__(
        self,
        store: BatchStore,
        files: Files,
        endpoints: Endpoints,
        lane: Lane,
        drain: Drain | None,
        *,
        lease_s: float,
        max_requests: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.files = files
        self.endpoints = endpoints
        self.lane = lane
        self.lease_s = lease_s
        self.max_requests = max_requests
        self._clock = clock
        self.owner = uuid.uuid4().hex
        self._queue: deque[_Item] = deque()
        self._running: set[_Item] = set()
        self._held: dict[tuple[str, int], _Held] = {}
        self._validating: dict[str, asyncio.Task[None]] = {}
        self._leased: set[str] = set()  # batches whose own lease this replica holds
        self._tasks: list[asyncio.Task[None]] = []
        self._cancelling: set[asyncio.Task[None]] = set()  # take-offs under way
        self._wake = asyncio.Event()
        self._fed = asyncio.Event()
        self._left = asyncio.Event()  # a request left the lane: room, maybe
        self._pause_until = 0.0
        self._started = 0
        self._stopped = False
        self.answered: dict[str, int] = {}  # results this replica wrote, by outcome
        self.active = 0  # batches active at the last read
        lane.on_busy = lambda: self._take_off(self.lane.excess())
        if drain is not None:
            drain.on_begin(self._stop_feeding)
            drain.subscribe(self._give_back)

    # -- life ------------------------------------------------------------------------

    def start(self) -> None:
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(self._scan_loop(), name="batch-scan"),
                asyncio.create_task(self._feed_loop(), name="batch-feed"),
                asyncio.create_task(self._renew_loop(), name="batch-leases"),
            ]

    def wake(self) -> None:
        self._wake.set()

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> int:
        return len(self._running)

    def _stop_feeding(self) -> None:
        """The drain began: nothing new starts, and what runs is taken off the engine."""
        self._stopped = True
        self._queue.clear()
        for item in list(self._running):
            if item.task is not None:
                item.task.cancel()

    async def _give_back(self) -> None:
        """Every chunk held goes back to the store, for another replica to take now."""
        self._stop_feeding()
        running = [i.task for i in self._running if i.task is not None]
        if running:
            await asyncio.wait(running)
        for (batch_id, chunk), _ in list(self._held.items()):
            with contextlib.suppress(SwitchboardError):
                await self.store.release(batch_id, chunk, owner=self.owner)
        self._held.clear()
        for batch_id in list(self._leased):
            with contextlib.suppress(SwitchboardError):
                await self._unlease(batch_id)

    async def close(self) -> None:
        tasks = [*self._tasks, *self._validating.values()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        self._tasks = []
        await self._give_back()

    # -- the active batches ------------------------------------------------------------

    async def _scan_loop(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), POLL_S)
            self._wake.clear()
            try:
                await self._scan()
            except SwitchboardError as exc:  # the store is out of reach: next time
                logger.warning("batches not advanced: %s", exc.message)
            except Exception:
                logger.exception("batch runner: a scan failed")

    async def _scan(self) -> None:
        keys = await self.store.keys(ACTIVE)
        self.active = len(keys)
        for batch_id in keys:
            data = await self.store.get(batch_id)
            if data is None:
                await self.store.listed(ACTIVE, batch_id, None)
                continue
            await self._advance(BatchRecord.decode(data))

    async def _advance(self, record: BatchRecord) -> None:
        now = self._clock()
        if record.terminal:
            await self.store.listed(ACTIVE, record.id, None)
            return
        ending = record.status == "cancelling" or record.expired(now)
        if ending:
            await self._drop(record.id)
        if record.status == "validating" and not ending:
            if record.id not in self._validating and await self._lease(record.id, now):
                task = asyncio.create_task(self._validate(record), name=f"validate {record.id}")
                self._validating[record.id] = task
                task.add_done_callback(lambda _: self._validating.pop(record.id, None))
            return
        if record.status == "in_progress" and not ending and not self._stopped:
            await self._claim(record, now)
        await self._try_end(record, now)

    async def _lease(self, batch_id: str, now: float) -> bool:
        """The batch's own lease (to validate or end it), until `_unlease`."""
        until = now + self.lease_s
        if await self.store.lease(batch_id, owner=self.owner, now=now, until=until):
            self._leased.add(batch_id)
            return True
        return False

    async def _unlease(self, batch_id: str) -> None:
        self._leased.discard(batch_id)
        await self.store.unlease(batch_id, owner=self.owner)

    async def _claim(self, record: BatchRecord, now: float) -> None:
        """Claim chunks while the lane could use more than is queued here."""
        while len(self._queue) < self.lane.max_running:
            chunk = await self.store.claim(
                record.id, chunks=record.chunks, owner=self.owner, now=now, until=now + self.lease_s
            )
            if chunk is None:
                return
            indices = chunk_range(chunk, record)
            part = await self.store.part(record.id, chunk)
            if part is None:  # the batch is gone (deleted, expired) since it was read
                return
            lines = part.split(b"\n")
            done = {
                i for i, _, _ in await self.store.results(record.id, indices.start, indices.stop)
            }
            held = _Held({i for i in indices if i not in done})
            if not held.left:
                await self.store.finish(record.id, chunk, owner=self.owner)
                continue
            self._held[(record.id, chunk)] = held
            for i in sorted(held.left):
                self._queue.append(_Item(record, chunk, i, lines[i - indices.start]))
            self._fed.set()

    async def _drop(self, batch_id: str) -> None:
        """Forget this replica's work of a batch: queued requests, running ones (taken
        off the engine), the chunks (given back)."""
        self._queue = deque(i for i in self._queue if i.record.id != batch_id)
        running = [i for i in self._running if i.record.id == batch_id]
        for item in running:
            if item.task is not None:
                item.task.cancel()
        tasks = [i.task for i in running if i.task is not None]
        if tasks:
            await asyncio.wait(tasks)
        for key in [k for k in self._held if k[0] == batch_id]:
            del self._held[key]
            await self.store.release(batch_id, key[1], owner=self.owner)

    # -- validating --------------------------------------------------------------------

    async def _validate(self, record: BatchRecord) -> None:
        try:
            await self._read_input(record)
            await self._unlease(record.id)
        except SwitchboardError as exc:  # the store: the lease runs out, someone retries
            logger.warning("batch %s not validated yet: %s", record.id, exc.message)
        except Exception:
            logger.exception("batch %s: validation failed", record.id)

    async def _read_input(self, record: BatchRecord) -> None:
        reader = openai.InputReader(record.endpoint, self.max_requests)
        lines: list[bytes] = []
        chunks = 0
        try:
            doc = await self.files.get(record.tenant, record.input_file_id or "")
        except NotFound:
            reader.errors.append(
                {
                    "code": "invalid_file",
                    "message": f"The input file {record.input_file_id} is gone.",
                    "line": None,
                    "param": "input_file_id",
                }
            )
            doc = {"parts": 0}
        renewed = self._clock()
        for part in range(doc["parts"]):
            data = await self.store.part(doc["id"], part)
            if data is None:
                break
            lines += await in_batch_thread(partial(reader.feed, data))
            if reader.errors:
                break
            while len(lines) >= CHUNK:
                await self.store.put_part(
                    record.id, chunks, b"\n".join(lines[:CHUNK]), bounded=False
                )
                del lines[:CHUNK]
                chunks += 1
            if self._clock() - renewed > self.lease_s / 3:
                renewed = self._clock()
                if not await self._lease(record.id, renewed):
                    return  # another replica took it over
        if not reader.errors:
            lines += reader.end()
        if lines and not reader.errors:
            await self.store.put_part(record.id, chunks, b"\n".join(lines), bounded=False)
            chunks += 1
        fields: dict[str, Any] = {"total": reader.count, "chunks": chunks, "chunk_size": CHUNK}
        fields["model"] = reader.model
        if reader.errors:
            fields = {"errors": reader.errors}
        await self._change(record.id, lambda r: _validated(r, fields, self._clock()))
        self.wake()

    async def _change(
        self, batch_id: str, change: Callable[[BatchRecord], BatchRecord | None]
    ) -> BatchRecord | None:
        """Swap the batch's record for `change(record)` (None: leave it), read again
        while another writer changes it first; the record as it ends."""
        while True:
            data = await self.store.get(batch_id)
            if data is None:
                return None
            record = BatchRecord.decode(data)
            new = change(record)
            if new is None or new == record:
                return record
            if await self.store.swap(batch_id, data, new.encode()):
                return new

    # -- ending ------------------------------------------------------------------------

    async def _try_end(self, record: BatchRecord, now: float) -> None:
        if record.status == "cancelling":
            outcome = CANCELLED
        elif record.expired(now):
            outcome = EXPIRED
        elif record.status in ("in_progress", "finalizing"):
            outcome = SUCCEEDED
        else:
            return
        leases = await self.store.leases(record.id, now)
        if leases.live:
            return
        if outcome == SUCCEEDED and (leases.abandoned or leases.handed < record.chunks):
            return
        if not await self._lease(record.id, now):
            return
        if outcome != SUCCEEDED:
            await self._settle(record, outcome)
        await self._finish(record, outcome)
        await self._unlease(record.id)

    async def _settle(self, record: BatchRecord, outcome: str) -> None:
        """Every request without a result gets one saying it never ran (`outcome`)."""
        for chunk in range(record.chunks):
            indices = chunk_range(chunk, record)
            done = {
                i for i, _, _ in await self.store.results(record.id, indices.start, indices.stop)
            }
            if len(done) == len(indices):
                continue
            lines = (await self.store.part(record.id, chunk) or b"").split(b"\n")
            rows = []
            for i in indices:
                if i not in done:
                    custom_id, _ = _request_of(record, lines[i - indices.start])
                    rows.append((i, outcome, unrun_line(record, i, custom_id, outcome)))
            await self.store.add_results(record.id, rows)

    async def _finish(self, record: BatchRecord, outcome: str) -> None:
        now = self._clock()
        if outcome == SUCCEEDED:
            record = (
                await self._change(
                    record.id,
                    lambda r: r.advance("finalizing", now) if r.can("finalizing") else None,
                )
                or record
            )
            if record.status != "finalizing":
                return
        files: dict[str, str | None] = {"output_file_id": None, "error_file_id": None}
        if record.api == "openai":
            files = await self._make_files(record, now)
        finals: dict[str, Status] = {
            SUCCEEDED: "completed",
            EXPIRED: "expired",
            CANCELLED: "cancelled",
        }
        final = finals[outcome]
        ended = await self._change(
            record.id, lambda r: r.advance(final, now, **files) if r.can(final) else None
        )
        if ended is not None and ended.terminal:
            await self.store.listed(ACTIVE, record.id, None)
            logger.info("batch %s %s", record.id, ended.status)

    async def _make_files(self, record: BatchRecord, now: float) -> dict[str, str | None]:
        tally = await self.store.tally(record.id)
        made: dict[str, str | None] = {}
        for name, file_id, outcomes in zip(
            ("output_file_id", "error_file_id"),
            output_file_ids(record),
            (openai.OUTPUT_OUTCOMES, openai.ERROR_OUTCOMES),
            strict=True,
        ):
            count = tally.count(*outcomes)
            made[name] = file_id if count else None
            if count:
                await self.files.add_output(
                    record.tenant,
                    file_id,
                    batch_id=record.id,
                    outcomes=outcomes,
                    total=record.total,
                    size=tally.size(*outcomes) + count,
                    expires_s=record.output_expires_s,
                    now=now,
                )
        return made

    # -- feeding the lane --------------------------------------------------------------

    async def _feed_loop(self) -> None:
        while True:
            if not self._queue and not self._running:
                await self._fed.wait()
                self._fed.clear()
                continue
            await self._fill()
            self._take_off(self.lane.excess())
            # Woken by a request's end, not the next tick: a batch's requests, alike, end
            # in waves of the engine's running window, and the engine's queue in the lane
            # (half a window) refills only part of a wave's places; each tick waited
            # left the rest empty for up to `_TICK_S`, a dozen times a 1,500-request file.
            self._left.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._left.wait(), _TICK_S)

    async def _fill(self) -> None:
        """Start queued requests while the lane has room, `STARTED_PER_TURN` a turn of
        the event loop. A wave of the idle lane's requests ends in one engine step (some
        128 alike), and their places were filled in one turn, where each start's first
        step runs (its body checked against its endpoint's schema, its record and call
        opened): the loop, seen held 8-25 ms at a time while the idle lane ran, read and
        admitted an interactive request arriving then only after them. Between slices
        the loop polls its sockets, and an interactive request admitted meanwhile
        narrows the lane before the rest start (fewer to take off again)."""
        while self._queue and not self._stopped and self._clock() >= self._pause_until:
            for _ in range(min(self.lane.room(), len(self._queue), STARTED_PER_TURN)):
                self._start(self._queue.popleft())
            if not self.lane.room():
                return
            await asyncio.sleep(0)

    def _start(self, item: _Item) -> None:
        self._started += 1
        item.started = self._started
        self._running.add(item)
        self.lane.running += 1
        item.task = task = asyncio.create_task(self._run(item), name=f"batch {item.record.id}")
        # Not in `_run`'s own `finally`: a task cancelled before its first step (taken off
        # in the turn it started) never runs a line of it.
        task.add_done_callback(lambda _: self._ended(item))

    def _take_off(self, count: int) -> None:
        """The `count` newest requests running leave the engine, to run again later.
        They leave the lane's count at once: while their tasks unwind (their aborts go
        to the engine together, `app.engine.vllm.aborts`), the next admission or tick
        must not count them again and take the oldest, the ones meant to stay."""
        if count <= 0:
            return
        going = sorted((i for i in self._running if not i.off), key=lambda i: i.started)[-count:]
        # Their aborts first, in one call whose send runs before any of their unwindings
        # (`app.engine.base.OpenRequests`): the engine core hears of them sooner.
        for item in going:
            item.requests.abort()
        for item in going:
            item.requeue = item.off = True
            self.lane.running -= 1
        tasks = [i.task for i in going if i.task is not None]
        cancelling = asyncio.create_task(_cancel_in_slices(tasks), name="batch take-off")
        self._cancelling.add(cancelling)
        cancelling.add_done_callback(self._cancelling.discard)

    async def _run(self, item: _Item) -> None:
        record = item.record
        item.requests = OpenRequests()  # this run's (a run before it may have left some)
        OPEN_REQUESTS.set(item.requests)  # in this task's own context
        try:
            custom_id, body = _request_of(record, item.line)
            try:
                answer = await self.endpoints.answer(
                    record.endpoint,
                    body,
                    request_id=f"{record.id}-{item.index}",
                    tenant=record.tenant,
                )
            except Retry as exc:
                logger.info("batch %s request %d: again later (%s)", record.id, item.index, exc)
                self._pause_until = self._clock() + _RETRY_PAUSE_S
                item.requeue = True
                return
            if item.off:  # taken off before its cancel came: its answer ends with the abort
                return
            outcome = SUCCEEDED if answer.ok else ERRORED
            line = answer_line(record, item.index, custom_id, answer)
            await asyncio.shield(self._keep(item, outcome, line, answer.tokens))
        except asyncio.CancelledError:
            pass  # taken off the engine: dropped, or queued again (`_ended`)
        except SwitchboardError as exc:  # the store: the request runs again
            logger.warning("batch %s request %d: %s", record.id, item.index, exc.message)
            item.requeue = True

    def _ended(self, item: _Item) -> None:
        """A request's task has ended: out of the lane, and queued again if it is to run
        again and its chunk is still held here."""
        self._running.discard(item)
        self._left.set()
        if not item.off:
            self.lane.running -= 1
        if item.requeue and not self._stopped and (item.record.id, item.chunk) in self._held:
            item.requeue = item.off = False
            item.task = None
            self._queue.appendleft(item)

    async def _keep(self, item: _Item, outcome: str, line: bytes, tokens: tuple[int, int]) -> None:
        record = item.record
        if await self.store.add_result(record.id, item.index, outcome, line, tokens):
            self.answered[outcome] = self.answered.get(outcome, 0) + 1
        held = self._held.get((record.id, item.chunk))
        if held is None:
            return
        held.left.discard(item.index)
        if not held.left:
            del self._held[(record.id, item.chunk)]
            await self.store.finish(record.id, item.chunk, owner=self.owner)
            self.wake()

    # -- leases ------------------------------------------------------------------------

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            until = self._clock() + self.lease_s
            for (batch_id, chunk), _ in list(self._held.items()):
                try:
                    kept = await self.store.renew(batch_id, chunk, owner=self.owner, until=until)
                except SwitchboardError:
                    continue  # the store is out of reach: the lease may run out
                if not kept:  # another replica has it now, or the batch is gone
                    await self._lose(batch_id, chunk)

    async def _lose(self, batch_id: str, chunk: int) -> None:
        self._held.pop((batch_id, chunk), None)
        self._queue = deque(i for i in self._queue if (i.record.id, i.chunk) != (batch_id, chunk))
        for item in [i for i in self._running if (i.record.id, i.chunk) == (batch_id, chunk)]:
            if item.task is not None:
                item.task.cancel()


async def _cancel_in_slices(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel a take-off's tasks `STARTED_PER_TURN` a turn of the event loop. Their aborts
    are sent already, and their engine requests hand on nothing more: each waits for its
    cancel. Cancelled at once, their first steps (some 190, each thrown its cancel down
    its call's awaits, its abort awaited) all ran in the next turn: the loop was seen held
    43-52 ms after each take-off (a probe on the real engine), the interactive requests
    that made the room waiting behind it."""
    for start in range(0, len(tasks), STARTED_PER_TURN):
        if start:
            await asyncio.sleep(0)
        for task in tasks[start : start + STARTED_PER_TURN]:
            task.cancel()


def _validated(record: BatchRecord, fields: dict[str, Any], now: float) -> BatchRecord | None:
    """The record once its input is read: `in_progress` (or `failed`, with errors); a
    batch cancelled meanwhile keeps `cancelling` and learns its requests."""
    if record.status == "validating":
        status: Status = "failed" if "errors" in fields else "in_progress"
        return record.advance(status, now, **fields)
    if record.status == "cancelling" and record.total == 0 and "errors" not in fields:
        return replace(record, **fields)
    return None
