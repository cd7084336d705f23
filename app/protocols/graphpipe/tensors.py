"""GraphPipe's tensor element types and their numpy dtypes.

`TensorType` repeats the ids of the schema's `enum Type:uint8` (fbs/graphpipe.fbs; a unit
test checks them against the flatc-generated `fbs.graphpipe.Type`). Numeric data is
little-endian on the wire whatever the host, so every dtype here is spelled with `<`.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np


class TensorType(IntEnum):
    Null = 0
    Uint8 = 1
    Int8 = 2
    Uint16 = 3
    Int16 = 4
    Uint32 = 5
    Int32 = 6
    Uint64 = 7
    Int64 = 8
    Float16 = 9
    Float32 = 10
    Float64 = 11
    String = 12


NUMERIC_DTYPES: dict[TensorType, np.dtype[np.generic]] = {
    TensorType.Uint8: np.dtype("<u1"),
    TensorType.Int8: np.dtype("<i1"),
    TensorType.Uint16: np.dtype("<u2"),
    TensorType.Int16: np.dtype("<i2"),
    TensorType.Uint32: np.dtype("<u4"),
    TensorType.Int32: np.dtype("<i4"),
    TensorType.Uint64: np.dtype("<u8"),
    TensorType.Int64: np.dtype("<i8"),
    TensorType.Float16: np.dtype("<f2"),
    TensorType.Float32: np.dtype("<f4"),
    TensorType.Float64: np.dtype("<f8"),
}

# numpy kind+size -> type, so any byte order of a dtype maps to its GraphPipe type.
_BY_KIND_SIZE = {(dtype.kind, dtype.itemsize): t for t, dtype in NUMERIC_DTYPES.items()}

# Kinds of numpy arrays whose elements travel as `string_val` entries.
STRING_KINDS = frozenset("SUO")


def type_of(array: np.ndarray) -> TensorType:
    """The GraphPipe type of `array`; `TypeError` for dtypes GraphPipe has no type for
    (bool, complex, datetime, structured...)."""
    if array.dtype.kind in STRING_KINDS:
        return TensorType.String
    found = _BY_KIND_SIZE.get((array.dtype.kind, array.dtype.itemsize))
    if found is None:
        raise TypeError(f"GraphPipe has no tensor type for numpy dtype {array.dtype}")
    return found


def type_name(type_id: int) -> str:
    """`Int64` for 8; `unknown type 200` for an id the spec does not define."""
    try:
        return TensorType(type_id).name
    except ValueError:
        return f"unknown type {type_id}"
