"""The batch APIs on the store, for the routes: create, read, list, cancel, delete a batch
(OpenAI's or Anthropic's), and read its results. Nothing here runs a request: a batch
created is a record on the store, which every replica's runner (`app.batches.runner`)
advances; this side reads it back, with its tally, wherever it was created.

OpenAI's batch is created `validating` (its input file is read by a runner); Anthropic's
is checked as it is created (its requests are in the body: what Anthropic refuses then
is refused here, 400) and created `in_progress`, its requests already in the store.

Cancel: the record is swapped to `cancelling` (from any replica, racing a runner: the
swap that loses reads again), and the runners end it. Every lookup is by (tenant, id):
another tenant's batch is not found, never forbidden.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from app.admission import Admission
from app.batches.files import Files
from app.batches.lane import Lane, idle_width
from app.batches.requests import Endpoints
from app.batches.runner import ACTIVE, CHUNK, BatchRunner, in_batch_thread
from app.config import Settings
from app.drain import Drain
from app.engine.base import Engine
from app.errors import InvalidRequest, NotFound, SwitchboardError
from app.protocols.anthropic import batches as anthropic
from app.protocols.batches import BatchRecord
from app.protocols.openai import batches as openai
from app.sessions.responses import Responses
from app.store import open_batches
from app.store.batches import BatchStore, Tally
from app.telemetry.reports import Telemetry
from app.tenants import Tenants

ANTHROPIC_WINDOW_S = 24 * 3600  # Anthropic's batches end within a day
ANTHROPIC_RESULTS_S = 29 * 24 * 3600  # and keep their results 29 days after creation
_RESULTS_PAGE = 512


def _index(api: str, tenant: str) -> str:
    return f"batches:{api}:{tenant}"


def not_found(batch_id: str, api: str) -> NotFound:
    if api == "anthropic":
        return NotFound(f"No message batch with id {batch_id}")
    return NotFound(f"No such Batch object: {batch_id}", param="batch_id")


class Batches:
    def __init__(
        self,
        store: BatchStore,
        files: Files,
        runner: BatchRunner,
        *,
        max_requests: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.files = files
        self.runner = runner
        self.max_requests = max_requests
        self._clock = clock

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        engine: Engine,
        admission: Admission,
        drain: Drain | None,
        responses: Callable[[], Responses],
        tenants: Tenants,
        telemetry: Telemetry | None = None,
    ) -> Batches:
        """The batch APIs and this replica's runner, on the store `settings` name (nothing
        is opened or connected before its first use)."""
        store = open_batches(
            settings.batch_store_location(), max_bytes=settings.batch_store_max_bytes
        )
        files = Files(store, max_bytes=settings.batch_max_input_bytes)
        lane = Lane(
            admission,
            max_running=idle_width(settings.batch_max_running, engine.info.max_num_seqs),
            busy_running=settings.batch_busy_running,
            recent_running=settings.batch_recent_running,
            recent_s=settings.batch_recent_s,
        )
        runner = BatchRunner(
            store,
            files,
            Endpoints(engine, admission, responses, tenants, telemetry),
            lane,
            drain,
            lease_s=settings.batch_lease_s,
            max_requests=settings.batch_max_requests,
        )
        return cls(store, files, runner, max_requests=settings.batch_max_requests)

    def start(self) -> None:
        """The runner starts advancing the store's batches (those of before a restart
        too)."""
        self.runner.start()

    async def close(self) -> None:
        """The runner stops (its chunks given back), then the store closes."""
        await self.runner.close()
        with contextlib.suppress(Exception):
            await self.store.close()

    # -- both APIs ---------------------------------------------------------------------

    async def load(self, tenant: str, batch_id: str, api: str) -> tuple[BatchRecord, Tally]:
        data = await self.store.get(batch_id)
        record = None if data is None else BatchRecord.decode(data)
        if record is None or record.tenant != tenant or record.api != api:
            raise not_found(batch_id, api)
        return record, await self.store.tally(batch_id)

    async def page(
        self, tenant: str, api: str, *, after: str | None, limit: int, desc: bool = True
    ) -> tuple[list[tuple[BatchRecord, Tally]], bool]:
        page = await self.store.page(_index(api, tenant), after=after, limit=limit, desc=desc)
        if page is None:
            raise InvalidRequest(f"No batch '{after}' to list after", param="after")
        docs, more = page
        records = [BatchRecord.decode(d) for d in docs]
        return [(r, await self.store.tally(r.id)) for r in records], more

    async def cancel(self, tenant: str, batch_id: str, api: str) -> tuple[BatchRecord, Tally]:
        record, _ = await self.load(tenant, batch_id, api)
        while not record.terminal and record.status != "cancelling":
            data = record.encode()
            new = record.advance("cancelling", self._clock())
            if await self.store.swap(batch_id, data, new.encode()):
                self.runner.wake()
                break
            record, _ = await self.load(tenant, batch_id, api)
        if record.terminal and record.status != "cancelled" and api == "openai":
            raise InvalidRequest(
                f"Cannot cancel a batch with status '{record.status}'", param="batch_id"
            )
        return await self.load(tenant, batch_id, api)

    async def _create(self, record: BatchRecord, retain_s: float) -> None:
        indexes = {_index(record.api, record.tenant): record.created_at}
        indexes[ACTIVE] = record.created_at
        await self.store.create(
            record.id, record.encode(), expires=record.expires_at + retain_s, indexes=indexes
        )
        self.runner.wake()

    # -- OpenAI's ----------------------------------------------------------------------

    async def create_openai(self, tenant: str, body: Any) -> BatchRecord:
        fields = openai.read_create(body)
        doc = await self.files.get(tenant, fields["input_file_id"], param="input_file_id")
        if doc["purpose"] != "batch":
            raise InvalidRequest(
                f"The file {doc['id']} has purpose '{doc['purpose']}', not 'batch'",
                param="input_file_id",
            )
        now = self._clock()
        output_s = fields["output_expires_s"] or 30 * 24 * 3600.0
        record = BatchRecord(
            id=f"batch_{uuid.uuid4().hex}",
            api="openai",
            tenant=tenant,
            endpoint=fields["endpoint"],
            created_at=now,
            expires_at=now + fields["window_s"],
            window=fields["window"],
            input_file_id=doc["id"],
            metadata=fields["metadata"],
            output_expires_s=output_s,
        )
        await self._create(record, output_s)
        return record

    # -- Anthropic's -------------------------------------------------------------------

    async def create_anthropic(self, tenant: str, body: bytes) -> BatchRecord:
        """A Message Batch from its create body, checked as Anthropic checks it."""
        batch_id = f"msgbatch_{uuid.uuid4().hex}"
        reader = anthropic.RequestsReader(
            await in_batch_thread(lambda: _text(body)), self.max_requests
        )
        requests = iter(reader)
        chunks = 0
        try:
            while lines := await in_batch_thread(lambda: _take(requests, CHUNK)):
                await self.store.put_part(batch_id, chunks, b"\n".join(lines), bounded=False)
                chunks += 1
        except BaseException:
            with contextlib.suppress(SwitchboardError):  # else its parts expire
                await self.store.delete(batch_id)
            raise
        now = self._clock()
        record = BatchRecord(
            id=batch_id,
            api="anthropic",
            tenant=tenant,
            endpoint=anthropic.ENDPOINT,
            created_at=now,
            expires_at=now + ANTHROPIC_WINDOW_S,
            window="24h",
            status="in_progress",
            total=reader.count,
            chunk_size=CHUNK,
            chunks=chunks,
            model=reader.model,
            times={"in_progress": now},
        )
        await self._create(record, ANTHROPIC_RESULTS_S - ANTHROPIC_WINDOW_S)
        return record

    async def delete_anthropic(self, tenant: str, batch_id: str) -> None:
        record, _ = await self.load(tenant, batch_id, "anthropic")
        if not record.terminal:
            raise InvalidRequest(
                f"Message batch {batch_id} is still {anthropic.processing_status(record)}: "
                "cancel it, and delete it once it has ended"
            )
        await self.store.delete(batch_id)

    async def results(self, record: BatchRecord) -> AsyncIterator[bytes]:
        """Every request's result line, in the order of the requests."""
        for start in range(0, record.total, _RESULTS_PAGE):
            page = await self.store.results(record.id, start, start + _RESULTS_PAGE)
            if page:
                yield b"\n".join(data for _, _, data in page) + b"\n"


def _text(body: bytes) -> str:
    try:
        return body.decode()
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"The body is not UTF-8: {exc}") from exc


def _take(requests: Any, count: int) -> list[bytes]:
    """Up to `count` more of a reader's requests (in the batch thread)."""
    out: list[bytes] = []
    for line in requests:
        out.append(line)
        if len(out) == count:
            break
    return out
