"""Bounds-checked reading of flatbuffer tables, vectors and strings.

Python's flatbuffers runtime trusts its input: a bad offset in a client's buffer makes the
generated accessors read garbage or raise `IndexError`/`struct.error` from deep inside.
This reader checks every offset, vtable, vector and string against the buffer before it
reads it, and reports the first problem as `InvalidRequest` naming the field's path
(`InferRequest.input_tensors[1].shape`). It checks what the C++ verifier checks that
matters to a reader (bounds, vtable sizes, string terminators) and not alignment, which
Python reads do not need.

Invariants: nothing here copies a vector's payload; `vector` returns where it lies, so
callers can make zero-copy numpy views of it.
"""

from __future__ import annotations

import struct

from app.errors import InvalidRequest

Buffer = bytes | bytearray | memoryview

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_OFFSET = 4


def malformed(path: str, problem: str) -> InvalidRequest:
    return InvalidRequest(f"Not a valid GraphPipe flatbuffer: {path}: {problem}")


class Table:
    """One table of a buffer: its fields by slot number (the schema's field order)."""

    __slots__ = ("_size", "_tsize", "_vtable", "_vtsize", "buf", "path", "pos")

    def __init__(self, buf: Buffer, pos: int, path: str) -> None:
        size = len(buf)
        if pos < 0 or pos + 4 > size:
            raise malformed(path, f"table at byte {pos} is outside the {size}-byte buffer")
        vtable = pos - _I32.unpack_from(buf, pos)[0]
        if vtable < 0 or vtable + 4 > size:
            raise malformed(path, f"vtable at byte {vtable} is outside the buffer")
        vtsize, tsize = struct.unpack_from("<HH", buf, vtable)
        if vtsize < 4 or vtsize % 2 or vtable + vtsize > size:
            raise malformed(path, f"vtable size {vtsize} is invalid")
        if tsize < 4 or pos + tsize > size:
            raise malformed(path, f"table size {tsize} runs past the buffer")
        self.buf = buf
        self._size = size
        self._vtable = vtable
        self._vtsize = vtsize
        self._tsize = tsize
        self.pos = pos
        self.path = path

    def _field(self, slot: int, width: int, name: str) -> int | None:
        """Absolute position of field `slot`, or None when the buffer leaves it out."""
        entry = 4 + 2 * slot
        if entry >= self._vtsize:
            return None
        offset: int = _U16.unpack_from(self.buf, self._vtable + entry)[0]
        if offset == 0:
            return None
        if offset + width > self._tsize:
            raise malformed(f"{self.path}.{name}", "field lies outside its table")
        return self.pos + offset

    def _target(self, slot: int, name: str) -> int | None:
        """Where the offset field `slot` points, checked to leave room for a length."""
        field = self._field(slot, _OFFSET, name)
        if field is None:
            return None
        target: int = field + _U32.unpack_from(self.buf, field)[0]
        if target + 4 > self._size:
            raise malformed(f"{self.path}.{name}", f"offset points past the buffer ({target})")
        return target

    def u8(self, slot: int, name: str) -> int:
        field = self._field(slot, 1, name)
        return 0 if field is None else int(_U8.unpack_from(self.buf, field)[0])

    def i64(self, slot: int, name: str) -> int:
        field = self._field(slot, 8, name)
        return 0 if field is None else int(_I64.unpack_from(self.buf, field)[0])

    def table(self, slot: int, name: str, path: str | None = None) -> Table | None:
        """The table field `slot`; `path` names it in errors (default: parent.name)."""
        target = self._target(slot, name)
        if target is None:
            return None
        return Table(self.buf, target, path or f"{self.path}.{name}")

    def vector(self, slot: int, width: int, name: str) -> tuple[int, int] | None:
        """(start of the first element, element count) of a vector field, or None."""
        target = self._target(slot, name)
        if target is None:
            return None
        return _vector_at(self.buf, target, width, f"{self.path}.{name}")

    def string(self, slot: int, name: str) -> bytes | None:
        target = self._target(slot, name)
        if target is None:
            return None
        return _string_at(self.buf, target, f"{self.path}.{name}")

    def strings(self, slot: int, name: str) -> list[bytes]:
        """A vector of strings; an absent vector reads as empty."""
        return [
            _string_at(self.buf, target, f"{self.path}.{name}[{i}]")
            for i, target in enumerate(self._offsets(slot, name))
        ]

    def tables(self, slot: int, name: str) -> list[Table]:
        """A vector of tables; an absent vector reads as empty."""
        return [
            Table(self.buf, target, f"{self.path}.{name}[{i}]")
            for i, target in enumerate(self._offsets(slot, name))
        ]

    def int64s(self, slot: int, name: str) -> tuple[int, ...]:
        """A vector of int64; an absent vector reads as empty."""
        found = self.vector(slot, 8, name)
        if found is None:
            return ()
        start, count = found
        return struct.unpack_from(f"<{count}q", self.buf, start)

    def _offsets(self, slot: int, name: str) -> list[int]:
        found = self.vector(slot, _OFFSET, name)
        if found is None:
            return []
        start, count = found
        relative = struct.unpack_from(f"<{count}I", self.buf, start)
        return [start + 4 * i + off for i, off in enumerate(relative)]


def root(buf: Buffer, path: str) -> Table:
    if len(buf) < 8:
        raise malformed(path, f"{len(buf)} bytes is too short for a flatbuffer")
    return Table(buf, _U32.unpack_from(buf, 0)[0], path)


def _vector_at(buf: Buffer, target: int, width: int, path: str) -> tuple[int, int]:
    count: int = _U32.unpack_from(buf, target)[0]
    start = target + 4
    if start + count * width > len(buf):
        raise malformed(path, f"vector of {count} elements runs past the buffer")
    return start, count


def _string_at(buf: Buffer, target: int, path: str) -> bytes:
    if target + 4 > len(buf):
        raise malformed(path, f"string at byte {target} is outside the buffer")
    start, count = _vector_at(buf, target, 1, path)
    # A flatbuffer string is followed by a NUL that is not part of it.
    if start + count >= len(buf) or buf[start + count] != 0:
        raise malformed(path, "string is not NUL-terminated inside the buffer")
    return bytes(buf[start : start + count])
