"""Files on the batches' store (`app.store.batches`): uploads, and the output and error
files of batches, as OpenAI's Files API reads them.

An upload's bytes go to the store in parts of `PART_BYTES` as they are read (never the
whole file in memory), each part counted against the store's bound and against its
tenant's `quota` of uploaded bytes (a part past either refuses the upload:
`store_full`), the upload against `max_bytes` (a file past it is refused: 413); its
document (the `File` object's fields, its owner) is written last, so a file is listed
and read only whole. An upload that fails leaves nothing (its parts
are removed; if its server died, they expire).

A batch's output and error files hold no bytes of their own: each names its batch and
the outcomes whose lines it holds (`app.protocols.batches`), and its content is read
from the batch's results, in the order of the batch's requests.

Every lookup is by (tenant, id): another tenant's file is not found, never forbidden.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import orjson

from app.errors import InvalidRequest, NotFound, SwitchboardError
from app.store.batches import BatchStore

PART_BYTES = 1 << 20
DEFAULT_EXPIRY_S = 30 * 24 * 3600  # OpenAI keeps batch files 30 days by default
_RESULTS_PAGE = 512


class TooLarge(InvalidRequest):
    """A file over the bound: 413, as a body too large is."""

    http_status = 413


def _index(tenant: str, purpose: str | None = None) -> str:
    return f"files:{tenant}" if purpose is None else f"files:{tenant}:{purpose}"


def not_found(file_id: str, param: str | None = None) -> NotFound:
    return NotFound(f"No such File object: {file_id}", param=param)


class Files:
    def __init__(
        self, store: BatchStore, *, max_bytes: int, clock: Callable[[], float] = time.time
    ) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self._clock = clock

    async def upload(
        self,
        tenant: str,
        *,
        filename: str,
        purpose: str,
        expires_s: float | None,
        read: Callable[[int], Awaitable[bytes]],
        quota: int = 0,
    ) -> dict[str, Any]:
        """Store what `read(n)` gives (b"" at its end), within `tenant`'s `quota` of
        uploaded bytes (0: none of its own); the file's document."""
        file_id = f"file-{uuid.uuid4().hex}"
        size = part = 0
        try:
            while data := await read(PART_BYTES):
                size += len(data)
                if size > self.max_bytes:
                    raise TooLarge(
                        f"The file is larger than {self.max_bytes} bytes, the bound on a "
                        "batch's input",
                        param="file",
                    )
                await self.store.put_part(
                    file_id, part, data, bounded=True, owner=tenant, quota=quota
                )
                part += 1
            now = self._clock()
            doc = {
                "id": file_id,
                "tenant": tenant,
                "filename": filename,
                "purpose": purpose,
                "bytes": size,
                "created_at": now,
                "expires_at": now + (expires_s or DEFAULT_EXPIRY_S),
                "parts": part,
            }
            await self._add(doc, now)
        except BaseException:
            with contextlib.suppress(SwitchboardError):  # else it expires
                await self.store.delete(file_id)
            raise
        return doc

    async def add_output(
        self,
        tenant: str,
        file_id: str,
        *,
        batch_id: str,
        outcomes: Sequence[str],
        total: int,
        size: int,
        expires_s: float,
        now: float,
    ) -> None:
        """A batch's output (or error) file: the results of `outcomes` of its `total`
        requests, `size` bytes."""
        kind = "output" if "succeeded" in outcomes else "error"
        doc = {
            "id": file_id,
            "tenant": tenant,
            "filename": f"{batch_id}_{kind}.jsonl",
            "purpose": "batch_output",
            "bytes": size,
            "created_at": now,
            "expires_at": now + expires_s,
            "batch": batch_id,
            "outcomes": list(outcomes),
            "total": total,
        }
        await self._add(doc, now)

    async def _add(self, doc: dict[str, Any], now: float) -> None:
        indexes = {_index(doc["tenant"]): now, _index(doc["tenant"], doc["purpose"]): now}
        await self.store.create(
            doc["id"], orjson.dumps(doc), expires=doc["expires_at"], indexes=indexes
        )

    async def get(self, tenant: str, file_id: str, param: str | None = None) -> dict[str, Any]:
        data = await self.store.get(file_id)
        doc: dict[str, Any] | None = None if data is None else orjson.loads(data)
        if doc is None or doc.get("tenant") != tenant:
            raise not_found(file_id, param)
        return doc

    async def page(
        self, tenant: str, *, after: str | None, limit: int, desc: bool, purpose: str | None
    ) -> tuple[list[dict[str, Any]], bool]:
        page = await self.store.page(_index(tenant, purpose), after=after, limit=limit, desc=desc)
        if page is None:
            raise InvalidRequest(f"No file '{after}' to list after", param="after")
        docs, more = page
        return [orjson.loads(d) for d in docs], more

    async def delete(self, tenant: str, file_id: str) -> None:
        await self.get(tenant, file_id)
        if not await self.store.delete(file_id):
            raise not_found(file_id)

    async def content(self, doc: dict[str, Any]) -> AsyncIterator[bytes]:
        """The file's bytes, in parts."""
        batch = doc.get("batch")
        if batch is None:
            for part in range(doc["parts"]):
                data = await self.store.part(doc["id"], part)
                if data is None:  # deleted or expired while read
                    return
                yield data
            return
        outcomes = set(doc["outcomes"])
        for start in range(0, doc["total"], _RESULTS_PAGE):
            page = await self.store.results(batch, start, start + _RESULTS_PAGE)
            lines = [data for _, outcome, data in page if outcome in outcomes]
            if lines:
                yield b"\n".join(lines) + b"\n"
