"""A forward flatbuffer writer that copies tensor payloads once.

flatbuffers' Python `Builder` writes back to front into a zero-filled bytearray that it
doubles as it grows, then copies the result out: two to three passes over every tensor
byte, plus a Python call per field. Here a message is described as a small tree
(`Table`, `Vector`, `Int64s`, `Blob`, strings as `bytes`) and laid out front to back:

    [root offset][tables, vtables, strings, shapes ... breadth first][blob][blob]...

Offsets in a flatbuffer must point forward; laying out breadth first puts every child
after its parent. Blobs (tensor `data`) are deferred to the end, so the small head is
built in a bytearray and `b"".join` copies each blob exactly once into the result.

Invariants: every scalar is aligned to its size from the buffer start, every blob
payload to `BLOB_ALIGN` (so readers may view it as any numeric dtype without copying);
strings end with the NUL the format requires.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

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
    """A vector of uint8 (tensor data): any C-contiguous buffer, copied once at the end."""

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


def finish(root: Table) -> bytes:
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
        return bytes(head)
    parts: list[bytes | bytearray | memoryview] = [head]
    end = len(head)
    for slot, blob in blobs:
        length = len(blob.data)
        start = end + 4 + (-(end + 4) % BLOB_ALIGN)
        _U32.pack_into(head, slot, start - 4 - slot)
        parts.append(bytes(start - 4 - end) + _U32.pack(length))
        parts.append(blob.data)
        end = start + length
    return b"".join(parts)


def _write(head: bytearray, node: Node, pending: deque[tuple[int, Node]]) -> int:
    if isinstance(node, bytes):
        _pad(head, 4)
        position = len(head)
        head += _U32.pack(len(node))
        head += node
        head.append(0)
        return position
    if isinstance(node, Int64s):
        _pad(head, 8, extra=4)
        position = len(head)
        head += struct.pack(f"<I{len(node.values)}q", len(node.values), *node.values)
        return position
    if isinstance(node, Vector):
        _pad(head, 4)
        position = len(head)
        head += _U32.pack(len(node.items))
        for i, item in enumerate(node.items):
            pending.append((position + 4 + 4 * i, item))
        head += bytes(4 * len(node.items))
        return position
    if isinstance(node, Table):
        return _write_table(head, node, pending)
    raise TypeError(f"not a flatbuffer node: {type(node).__name__}")


def _write_table(head: bytearray, table: Table, pending: deque[tuple[int, Node]]) -> int:
    # Table layout: soffset, then 4-byte offsets, then bytes, then (8-aligned) int64s.
    offsets: list[tuple[int, Node]] = []
    bytes_: list[tuple[int, int]] = []
    longs: list[tuple[int, int]] = []
    for slot, field in enumerate(table.fields):
        if field is None:
            continue
        if isinstance(field, U8):
            bytes_.append((slot, field.value))
        elif isinstance(field, I64):
            longs.append((slot, field.value))
        else:
            offsets.append((slot, field))
    where: dict[int, int] = {}
    cursor = 4
    for slot, _ in offsets:
        where[slot] = cursor
        cursor += 4
    for slot, _ in bytes_:
        where[slot] = cursor
        cursor += 1
    if longs:
        cursor += -cursor % 8
    for slot, _ in longs:
        where[slot] = cursor
        cursor += 8
    table_size = cursor
    nslots = len(table.fields)

    _pad(head, 2)
    vtable = len(head)
    head += struct.pack(
        f"<HH{nslots}H", 4 + 2 * nslots, table_size, *(where.get(s, 0) for s in range(nslots))
    )
    _pad(head, 8)  # 8, so the table's int64 fields land 8-aligned
    position = len(head)
    body = bytearray(table_size)
    struct.pack_into("<i", body, 0, position - vtable)
    for slot, value in bytes_:
        body[where[slot]] = value
    for slot, value in longs:
        struct.pack_into("<q", body, where[slot], value)
    head += body
    for slot, node in offsets:
        pending.append((position + where[slot], node))
    return position
