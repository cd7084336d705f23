"""numpy arrays, errors and metadata -> GraphPipe flatbuffers.

Server side: `encode_infer_response`, `encode_errors`, `encode_metadata`. Client side
(tests, benchmarks, docs/graphpipe.md's example): `encode_infer_request`,
`encode_metadata_request`. Field slots follow fbs/graphpipe.fbs; unit tests read every
message back with the flatc-generated classes, not with this package's decoder.

Every encoder returns a read-only memoryview of the message (a bytes-like object: HTTP
responses send it as is; `bytes()` copies it). Numeric tensors go out little-endian and
row-major whatever the array's byte order or strides (a copy is made only when they
differ); their bytes are copied once, into the output (see `writer`). String tensors
accept bytes and str elements (str as UTF-8).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from app.protocols.graphpipe.decode import REQ_INFER, REQ_METADATA
from app.protocols.graphpipe.metadata import IOMetadata, ModelMetadata
from app.protocols.graphpipe.tensors import NUMERIC_DTYPES, TensorType, type_of
from app.protocols.graphpipe.writer import I64, U8, Blob, Int64s, Table, Vector, finish


def _element(value: object) -> bytes:
    if isinstance(value, bytes):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise TypeError(f"String tensors hold bytes or str, not {type(value).__name__}")


def tensor(array: np.ndarray) -> Table:
    kind = type_of(array)
    shape = Int64s(array.shape)
    if kind is TensorType.String:
        strings = Vector([_element(value) for value in array.reshape(-1)])
        return Table((U8(kind), shape, None, strings))
    flat = np.ascontiguousarray(array.reshape(-1), dtype=NUMERIC_DTYPES[kind])
    return Table((U8(kind), shape, Blob(flat.view(np.uint8).data), None))


def _strings(values: Iterable[str]) -> Vector | None:
    items = [value.encode() for value in values]
    return Vector(items) if items else None


def encode_infer_response(outputs: Sequence[np.ndarray]) -> memoryview:
    return finish(Table((Vector([tensor(a) for a in outputs]), None)))


def encode_errors(errors: Sequence[tuple[int, str]]) -> memoryview:
    """An `InferResponse` carrying only `errors` (the spec forbids tensors beside them)."""
    items = [Table((I64(code), message.encode())) for code, message in errors]
    return finish(Table((None, Vector(items))))


def _io(item: IOMetadata) -> Table:
    return Table((item.name.encode(), item.description.encode(), Int64s(item.shape), U8(item.type)))


def encode_metadata(metadata: ModelMetadata) -> memoryview:
    return finish(
        Table(
            (
                metadata.name.encode(),
                metadata.version.encode(),
                metadata.server.encode(),
                metadata.description.encode(),
                Vector([_io(i) for i in metadata.inputs]),
                Vector([_io(o) for o in metadata.outputs]),
            )
        )
    )


def encode_infer_request(
    inputs: Sequence[np.ndarray],
    input_names: Sequence[str] = (),
    output_names: Sequence[str] = (),
    config: bytes = b"",
) -> memoryview:
    infer = Table(
        (
            config or None,
            _strings(input_names),
            Vector([tensor(a) for a in inputs]),
            _strings(output_names),
        )
    )
    return finish(Table((U8(REQ_INFER), infer)))


def encode_metadata_request() -> memoryview:
    return finish(Table((U8(REQ_METADATA), Table(()))))
