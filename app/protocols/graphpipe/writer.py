"""A forward flatbuffer writer that copies tensor payloads once.

flatbuffers' Python `Builder` writes back to front into a zero-filled bytearray that it
doubles as it grows, then copies the result out: two to three passes over every tensor
byte, plus a Python call per field. Here a message is described as a small tree
(`Table`, `Vector`, `Int64s`, `Blob`, strings as `bytes`) and laid out front to back:

    [root offset][tables, vtables, strings, shapes ... breadth first][blob][blob]...

Offsets in a flatbuffer must point forward; laying out breadth first puts every child
after its parent. Blobs (tensor `data`) are deferred to the end, so the small head is
built in a bytearray and each blob is copied exactly once, into the output.

Invariants: every scalar is aligned to its size from the buffer start, every blob
payload to `BLOB_ALIGN` (so readers may view it as any numeric dtype without copying);
strings end with the NUL the format requires.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BLOB_ALIGN = 16


@dataclass(frozen=True, slots=True)
class U8:
    value: int


@dataclass(frozen=True, slots=True)
class I64:
    value: int


@dataclass(frozen=True, slots=True)
class Int64s:
    """A vector of int64 (a shape)."""

    values: Sequence[int]


@dataclass(frozen=True, slots=True)
class Blob:
    """A vector of uint8 (tensor data): a byte buffer (format "B"), copied once at the end."""

    data: bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class Vector:
    """A vector of tables or strings."""

    items: Sequence[Node]


@dataclass(frozen=True, slots=True)
class Table:
    """Fields by slot number (the schema's field order); None leaves a field out."""

    fields: Sequence[Field | None]


Node = Table | Vector | Int64s | Blob | bytes
Field = U8 | I64 | Node

_U32 = struct.Struct("<I")


def _pad(head: bytearray, align: int, extra: int = 0) -> None:
    """Pad `head` so that what is written `extra` bytes later is `align`-aligned."""
    head.extend(bytes(-(len(head) + extra) % align))


def finish(root: Table) -> memoryview:
    """The flatbuffer whose root is `root`, as a read-only byte buffer."""
    head = bytearray(4)  # the root offset, patched below like every other offset
    blobs: list[tuple[int, Blob]] = []
    pending: deque[tuple[int, Node]] = deque([(0, root)])
    while pending:
        slot, node = pending.popleft()
        if isinstance(node, Blob):
            blobs.append((slot, node))
            continue
        position = _write(head, node, pending)
        _U32.pack_into(head, slot, position - slot)
    if not blobs:
        return memoryview(bytes(head))
    starts = []
    end = len(head)
    for slot, blob in blobs:
        start = end + 4 + (-(end + 4) % BLOB_ALIGN)
        _U32.pack_into(head, slot, start - 4 - slot)
        starts.append(start)
        end = start + len(blob.data)
    # numpy allocates large arrays on transparent huge pages: at 64 MB that halves the
    # cost of first touching the output, next to bytes.join's malloc.
    out = np.empty(end, np.uint8).data
    out[: len(head)] = head
    previous = len(head)
    for (_, blob), start in zip(blobs, starts, strict=True):
        out[previous : start - 4] = bytes(start - 4 - previous)
        _U32.pack_into(out, start - 4, len(blob.data))
        out[start : start + len(blob.data)] = blob.data
        previous = start + len(blob.data)
    return out.toreadonly()


def _write(head: bytearray, node: Node, pending: deque[tuple[int, Node]]) -> int:
    if isinstance(node, Table):
        return _write_table(head, node, pending)
    if isinstance(node, bytes):
        _pad(head, 4)
        position = len(head)
        head += _U32.pack(len(node))
        head += node
        head.append(0)
        return position
    if isinstance(node, Int64s):
        values = node.values
        _pad(head, 8, extra=4)
        position = len(head)
        head += struct.pack(f"<I{len(values)}q", len(values), *values)
        return position
    if isinstance(node, Vector):
        items = node.items
        _pad(head, 4)
        position = len(head)
        head += _U32.pack(len(items))
        pending.extend((position + 4 + 4 * i, item) for i, item in enumerate(items))
        head += bytes(4 * len(items))
        return position
    raise TypeError(f"not a flatbuffer node: {type(node).__name__}")


def _write_table(head: bytearray, table: Table, pending: deque[tuple[int, Node]]) -> int:
    # Layout after the soffset: 4-byte offsets, then bytes, then (8-aligned) int64s.
    fields = table.fields
    offsets: list[tuple[int, Node]] = []
    small: list[tuple[int, int]] = []
    longs: list[tuple[int, int]] = []
    for slot, field in enumerate(fields):
        if isinstance(field, U8):
            small.append((slot, field.value))
        elif isinstance(field, I64):
            longs.append((slot, field.value))
        elif field is not None:
            offsets.append((slot, field))
    where = [0] * len(fields)
    cursor = 4
    for slot, _ in offsets:
        where[slot] = cursor
        cursor += 4
    for slot, _ in small:
        where[slot] = cursor
        cursor += 1
    gap = -cursor % 8 if longs else 0
    cursor += gap
    for slot, _ in longs:
        where[slot] = cursor
        cursor += 8

    _pad(head, 2)
    vtable = len(head)
    head += struct.pack(f"<HH{len(fields)}H", 4 + 2 * len(fields), cursor, *where)
    _pad(head, 8)  # so that the table's int64 fields land 8-aligned
    position = len(head)
    head += struct.pack(
        f"<i{4 * len(offsets)}x{len(small)}B{gap}x{len(longs)}q",
        position - vtable,
        *(value for _, value in small),
        *(value for _, value in longs),
    )
    pending.extend((position + where[slot], node) for slot, node in offsets)
    return position
