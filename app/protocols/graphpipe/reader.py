"""Bounds-checked reading of flatbuffer tables, vectors and strings.

Python's flatbuffers runtime trusts its input: a bad offset in a client's buffer makes the
generated accessors read garbage or raise `IndexError`/`struct.error` from deep inside.
This reader checks every offset, vtable, vector and string against the buffer before it
reads it, and reports the first problem as `InvalidRequest` naming the field's path
(`InferRequest.input_tensors[1].shape`). It checks what the C++ verifier checks that
matters to a reader (bounds, vtable sizes, string terminators) and not alignment, which
Python reads do not need.

Decoding is bounded by the body (`Budget`): flatbuffers lets many offsets point at one
string or table (shared strings are legal), so a small buffer could otherwise decode to
any size. Every string is charged its bytes plus 8 per reference (the offset and length
an unshared string has on the wire), every table of a vector 8 per reference and every
int64 of a vector its 8 bytes; the charges of one buffer may not exceed its size, which
a buffer without shared strings never does. A vector's count is charged before any of
its elements is read, and a caller may bound it (`limit`), so nothing is built for a
vector that would not fit.

Invariants: nothing here copies a vector's payload; `vector` returns where it lies, so
callers can make zero-copy numpy views of it.
"""

from __future__ import annotations

import struct

from app.errors import InvalidRequest, PayloadTooLarge

Buffer = bytes | bytearray | memoryview

_VTABLE_HEAD = struct.Struct("<HH")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_OFFSET = 4


def malformed(path: str, problem: str) -> InvalidRequest:
    return InvalidRequest(f"Not a valid GraphPipe flatbuffer: {path}: {problem}")


_REFERENCE = 8  # what a reference to a string or table costs on the wire at least


class Budget:
    """What a buffer may still decode to, in bytes (see the module docstring)."""

    __slots__ = ("left", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.left = size

    def charge(self, amount: int, path: str) -> None:
        self.left -= amount
        if self.left < 0:
            raise PayloadTooLarge(
                f"GraphPipe request decodes to more than its own {self.size} bytes at {path} "
                "(a string or table shared by several offsets counts once per offset)"
            )


def _path(parent: Table | None, name: str, index: int | None = None) -> str:
    # Paths are only spelled out for an error message: building one per field read would
    # cost more than the read.
    where = name if parent is None else f"{parent.path}.{name}"
    return where if index is None else f"{where}[{index}]"


class Table:
    """One table of a buffer: its fields by slot number (the schema's field order)."""

    __slots__ = (
        "_fields",
        "_index",
        "_name",
        "_parent",
        "_size",
        "_tsize",
        "budget",
        "buf",
        "pos",
    )

    def __init__(
        self,
        buf: Buffer,
        pos: int,
        parent: Table | None,
        name: str,
        index: int | None = None,
        budget: Budget | None = None,
    ) -> None:
        size = len(buf)
        if pos < 0 or pos + 4 > size:
            raise malformed(
                _path(parent, name, index), f"table at byte {pos} is outside the {size}-byte buffer"
            )
        vtable = pos - _I32.unpack_from(buf, pos)[0]
        if vtable < 0 or vtable + 4 > size:
            raise malformed(
                _path(parent, name, index), f"vtable at byte {vtable} is outside the buffer"
            )
        vtsize, tsize = _VTABLE_HEAD.unpack_from(buf, vtable)
        if vtsize < 4 or vtsize % 2 or vtable + vtsize > size:
            raise malformed(_path(parent, name, index), f"vtable size {vtsize} is invalid")
        if tsize < 4 or pos + tsize > size:
            raise malformed(_path(parent, name, index), f"table size {tsize} runs past the buffer")
        self.buf = buf
        self.pos = pos
        if budget is None:
            budget = parent.budget if parent is not None else Budget(size)
        self.budget: Budget = budget
        self._size = size
        self._tsize = tsize
        # Each field's offset in the table (0: absent), read once for all fields.
        self._fields: tuple[int, ...] = struct.unpack_from(
            f"<{(vtsize - 4) // 2}H", buf, vtable + 4
        )
        self._parent = parent
        self._name = name
        self._index = index

    @property
    def path(self) -> str:
        return _path(self._parent, self._name, self._index)

    def _field(self, slot: int, width: int, name: str) -> int | None:
        """Absolute position of field `slot`, or None when the buffer leaves it out."""
        if slot >= len(self._fields):
            return None
        offset = self._fields[slot]
        if offset == 0:
            return None
        if offset + width > self._tsize:
            raise malformed(_path(self, name), "field lies outside its table")
        return self.pos + offset

    def _target(self, slot: int, name: str) -> int | None:
        """Where the offset field `slot` points, checked to leave room for a length."""
        field = self._field(slot, _OFFSET, name)
        if field is None:
            return None
        target: int = field + _U32.unpack_from(self.buf, field)[0]
        if target + 4 > self._size:
            raise malformed(_path(self, name), f"offset points past the buffer ({target})")
        return target

    def u8(self, slot: int, name: str) -> int:
        field = self._field(slot, 1, name)
        return 0 if field is None else int(self.buf[field])

    def table(self, slot: int, name: str, path: str | None = None) -> Table | None:
        """The table field `slot`; `path` renames it in errors (a union member by its
        type: `InferRequest` rather than `Request.req`)."""
        target = self._target(slot, name)
        if target is None:
            return None
        if path:
            return Table(self.buf, target, None, path, budget=self.budget)
        return Table(self.buf, target, self, name)

    def vector(self, slot: int, width: int, name: str) -> tuple[int, int] | None:
        """(start of the first element, element count) of a vector field, or None."""
        target = self._target(slot, name)
        if target is None:
            return None
        return _vector_at(self.buf, target, width, self, name, None)

    def string(self, slot: int, name: str) -> bytes | None:
        target = self._target(slot, name)
        return None if target is None else _string_at(self.buf, target, self, name, None)

    def strings(self, slot: int, name: str, limit: int | None = None) -> list[bytes]:
        """A vector of strings (at most `limit` of them); an absent vector reads as
        empty. Each is charged to the budget as it is read."""
        budget = self.budget
        strings = []
        for i, target in enumerate(self._offsets(slot, name, limit)):
            string = _string_at(self.buf, target, self, name, i)
            if string:
                budget.charge(len(string), _path(self, name, i))
            strings.append(string)
        return strings

    def tables(self, slot: int, name: str, limit: int | None = None) -> list[Table]:
        """A vector of tables (at most `limit` of them); an absent vector reads as empty."""
        return [
            Table(self.buf, target, self, name, i)
            for i, target in enumerate(self._offsets(slot, name, limit))
        ]

    def int64s(
        self, slot: int, name: str, limit: int | None = None, unit: str = "elements"
    ) -> tuple[int, ...]:
        """A vector of int64 (at most `limit` of them: `unit` names them in the error);
        an absent vector reads as empty."""
        found = self.vector(slot, 8, name)
        if found is None:
            return ()
        start, count = found
        self._count(count, 8, name, limit, unit)
        return struct.unpack_from(f"<{count}q", self.buf, start)

    def _offsets(self, slot: int, name: str, limit: int | None) -> list[int]:
        found = self.vector(slot, _OFFSET, name)
        if found is None:
            return []
        start, count = found
        self._count(count, _REFERENCE, name, limit)
        relative = struct.unpack_from(f"<{count}I", self.buf, start)
        return [start + 4 * i + off for i, off in enumerate(relative)]

    def _count(
        self, count: int, each: int, name: str, limit: int | None, unit: str = "elements"
    ) -> None:
        """A vector's count checked against `limit` and charged, before it is read."""
        if limit is not None and count > limit:
            raise malformed(_path(self, name), f"{count} {unit} is over the limit of {limit}")
        self.budget.charge(count * each, _path(self, name))


def root(buf: Buffer, name: str) -> Table:
    """The root table, with a decoding budget of the buffer's size."""
    if len(buf) < 8:
        raise malformed(name, f"{len(buf)} bytes is too short for a flatbuffer")
    return Table(buf, _U32.unpack_from(buf, 0)[0], None, name, budget=Budget(len(buf)))


def _vector_at(
    buf: Buffer, target: int, width: int, owner: Table, name: str, index: int | None
) -> tuple[int, int]:
    count: int = _U32.unpack_from(buf, target)[0]
    start = target + 4
    if start + count * width > len(buf):
        raise malformed(
            _path(owner, name, index), f"vector of {count} elements runs past the buffer"
        )
    return start, count


def _string_at(buf: Buffer, target: int, owner: Table, name: str, index: int | None) -> bytes:
    if target + 4 > len(buf):
        raise malformed(_path(owner, name, index), f"string at byte {target} is outside the buffer")
    start, count = _vector_at(buf, target, 1, owner, name, index)
    # A flatbuffer string is followed by a NUL that is not part of it.
    if start + count >= len(buf) or buf[start + count] != 0:
        raise malformed(_path(owner, name, index), "string is not NUL-terminated inside the buffer")
    return bytes(buf[start : start + count])
