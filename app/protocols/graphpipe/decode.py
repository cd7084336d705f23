"""A GraphPipe `Request` flatbuffer -> `InferCall` (numpy tensors) or `MetadataCall`.

Validates before it trusts: the buffer's structure (through `reader`), the union's type,
each tensor's type id, dimensions, and the agreement between its shape and its `data` or
`string_val`. The first problem raises `InvalidRequest` (or `PayloadTooLarge` for a
buffer over the size limit, or one that decodes to more than its own size: shared
strings counted per reference, `reader.Budget`) with a message naming the field. Counts
are bounded before anything is built for them: tensors and names (`MAX_TENSORS`),
dimensions (`MAX_DIMS`), strings in a tensor (`MAX_STRINGS`).

Numeric tensors are zero-copy, read-only views of the request buffer (`np.frombuffer`):
the buffer must outlive them, and nothing may write to them. String tensors are numpy
object arrays of `bytes`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from app.errors import PayloadTooLarge
from app.protocols.graphpipe.reader import Buffer, Table, malformed, root
from app.protocols.graphpipe.tensors import NUMERIC_DTYPES, TensorType, type_name

# numpy's own limit is 64; no GraphPipe model has a use for more than a few.
MAX_DIMS = 32
# Input tensors, input names and output names a request may list (the language model
# takes one input and has three outputs).
MAX_TENSORS = 64
# Strings in one String tensor: a batch of prompts, far past what admission takes at once.
MAX_STRINGS = 65_536

# The union `Req`'s type ids, in the schema's order (0 is the union's NONE).
REQ_INFER = 1
REQ_METADATA = 2

_MAX_TYPE = max(TensorType)
_MAX_ELEMENTS = 2**59  # x 8 bytes stays inside numpy's signed 64-bit sizes


@dataclass(frozen=True, slots=True)
class MetadataCall:
    """A `MetadataRequest`: it has no fields."""


@dataclass(frozen=True, slots=True)
class InferCall:
    config: bytes  # b"" when absent
    input_names: tuple[str, ...]
    inputs: tuple[np.ndarray, ...]
    output_names: tuple[str, ...]


def check_size(size: int, limit: int, *, partial: bool = False) -> None:
    """Refuse a request of `size` bytes (`partial`: at least that many, still arriving)."""
    if size > limit:
        amount = f"at least {size}" if partial else f"{size}"
        raise PayloadTooLarge(
            f"GraphPipe request of {amount} bytes is over this server's limit of {limit} bytes"
        )


def decode_request(buf: Buffer, *, max_bytes: int) -> InferCall | MetadataCall:
    check_size(len(buf), max_bytes)
    request = root(buf, "Request")
    kind = request.u8(0, "req_type")
    if kind == REQ_METADATA:
        request.table(1, "req", path="MetadataRequest")  # checked, though it has no fields
        return MetadataCall()
    if kind != REQ_INFER:
        problem = "is NONE" if kind == 0 else f"{kind} is not a Req type"
        raise malformed(
            "Request.req_type", f"{problem}; send InferRequest (1) or MetadataRequest (2)"
        )
    body = request.table(1, "req", path="InferRequest")
    if body is None:
        raise malformed("Request.req", "req_type is InferRequest but req is missing")
    return _infer_call(body)


def _infer_call(table: Table) -> InferCall:
    return InferCall(
        config=table.string(0, "config") or b"",
        input_names=_names(table, 1, "input_names"),
        inputs=tuple(decode_tensor(t) for t in table.tables(2, "input_tensors", MAX_TENSORS)),
        output_names=_names(table, 3, "output_names"),
    )


def _names(table: Table, slot: int, field: str) -> tuple[str, ...]:
    names = []
    for i, raw in enumerate(table.strings(slot, field, MAX_TENSORS)):
        try:
            names.append(raw.decode())
        except UnicodeDecodeError:
            raise malformed(f"{table.path}.{field}[{i}]", "not valid UTF-8") from None
    return tuple(names)


def decode_tensor(table: Table) -> np.ndarray:
    type_id = table.u8(0, "type")
    shape = table.int64s(1, "shape", MAX_DIMS, "dimensions")
    data = table.vector(2, 1, "data")
    strings = table.vector(3, 4, "string_val")
    data_bytes = data[1] if data else 0
    string_count = strings[1] if strings else 0

    if type_id == TensorType.Null:
        raise malformed(
            f"{table.path}.type", "type Null (0) is not a tensor type this server accepts"
        )
    if type_id > _MAX_TYPE:
        raise malformed(f"{table.path}.type", f"unknown type id {type_id}; ids run 1..{_MAX_TYPE}")
    for axis, dim in enumerate(shape):
        if dim < 0:
            raise malformed(
                f"{table.path}.shape", f"dimension {axis} is {dim}; dimensions must be >= 0"
            )
    # numpy refuses shapes whose non-zero dimensions multiply past its index range, even
    # when another dimension is 0; no buffer under the size limit holds such a tensor.
    if math.prod(d for d in shape if d) > _MAX_ELEMENTS:
        raise malformed(f"{table.path}.shape", f"shape {list(shape)} is too large")
    if data_bytes and string_count:
        raise malformed(table.path, "both data and string_val are set; one of them must be empty")
    count = math.prod(shape)

    if type_id == TensorType.String:
        if data_bytes:
            raise malformed(
                f"{table.path}.data", "String tensors keep their elements in string_val"
            )
        if string_count != count:
            raise malformed(
                f"{table.path}.string_val",
                f"shape {list(shape)} holds {count} strings but string_val has {string_count}",
            )
        values = table.strings(3, "string_val", MAX_STRINGS)
        array = np.empty(count, dtype=object)
        array[:] = values
        return array.reshape(shape)

    if string_count:
        raise malformed(
            f"{table.path}.string_val", f"{type_name(type_id)} tensors keep their elements in data"
        )
    dtype = NUMERIC_DTYPES[type_id]  # type: ignore[index]  # an IntEnum key hashes as its int
    if data_bytes != count * dtype.itemsize:
        raise malformed(
            f"{table.path}.data",
            f"shape {list(shape)} of {type_name(type_id)} needs {count * dtype.itemsize} bytes "
            f"but data has {data_bytes}",
        )
    offset = data[0] if data else 0
    return np.frombuffer(table.buf, dtype=dtype, count=count, offset=offset).reshape(shape)
