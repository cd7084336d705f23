"""A GraphPipe client built only on the flatc-generated classes (fbs/graphpipe) and
flatbuffers' own Builder: what a client that knows nothing but the spec would write.

Tests use it to build requests (well formed, or deliberately inconsistent: each tensor is
given field by field, so shape, type, data and string_val need not agree) and to read the
server's answers, so that a bug in `app.protocols.graphpipe` cannot hide behind a round
trip through itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import flatbuffers
import numpy as np

from app.protocols.graphpipe.tensors import NUMERIC_DTYPES, TensorType
from fbs.graphpipe import graphpipe_generated as fb


@dataclass
class RawTensor:
    """A Tensor table, field by field; None leaves a field out."""

    type: int
    shape: Sequence[int] | None = None
    data: bytes | None = None
    string_val: Sequence[bytes] | None = None

    @classmethod
    def of(cls, array: np.ndarray) -> RawTensor:
        if array.dtype.kind in "OSU":
            strings = [s.encode() if isinstance(s, str) else bytes(s) for s in array.reshape(-1)]
            return cls(TensorType.String, array.shape, None, strings)
        kind = next(
            t
            for t, d in NUMERIC_DTYPES.items()
            if (d.kind, d.itemsize) == (array.dtype.kind, array.dtype.itemsize)
        )
        return cls(kind, array.shape, np.ascontiguousarray(array, NUMERIC_DTYPES[kind]).tobytes())


@dataclass
class Infer:
    tensors: Sequence[RawTensor | np.ndarray] = ()
    # bytes as well: a hostile client's names need not be UTF-8.
    input_names: Sequence[bytes | str] | None = None
    output_names: Sequence[bytes | str] | None = None
    config: str | None = None


def _strings(builder: flatbuffers.Builder, values: Sequence[bytes | str]) -> int:
    offsets = [builder.CreateString(v) for v in values]
    builder.StartVector(4, len(offsets), 4)
    for offset in reversed(offsets):
        builder.PrependUOffsetTRelative(offset)
    return int(builder.EndVector())


def _tensor(builder: flatbuffers.Builder, tensor: RawTensor) -> int:
    shape = data = strings = None
    if tensor.shape is not None:
        fb.TensorStartShapeVector(builder, len(tensor.shape))
        for dim in reversed(tensor.shape):
            builder.PrependInt64(dim)
        shape = builder.EndVector()
    if tensor.data is not None:
        data = builder.CreateByteVector(tensor.data)
    if tensor.string_val is not None:
        strings = _strings(builder, tensor.string_val)
    fb.TensorStart(builder)
    fb.TensorAddType(builder, tensor.type)
    if shape is not None:
        fb.TensorAddShape(builder, shape)
    if data is not None:
        fb.TensorAddData(builder, data)
    if strings is not None:
        fb.TensorAddStringVal(builder, strings)
    return int(fb.TensorEnd(builder))


def infer_request(call: Infer) -> bytes:
    builder = flatbuffers.Builder(1024)
    raw = [t if isinstance(t, RawTensor) else RawTensor.of(t) for t in call.tensors]
    tensors = [_tensor(builder, t) for t in raw]
    fb.InferRequestStartInputTensorsVector(builder, len(tensors))
    for offset in reversed(tensors):
        builder.PrependUOffsetTRelative(offset)
    tensor_vector = builder.EndVector()
    inputs = _strings(builder, call.input_names) if call.input_names is not None else None
    outputs = _strings(builder, call.output_names) if call.output_names is not None else None
    config = builder.CreateString(call.config) if call.config is not None else None
    fb.InferRequestStart(builder)
    if config is not None:
        fb.InferRequestAddConfig(builder, config)
    if inputs is not None:
        fb.InferRequestAddInputNames(builder, inputs)
    fb.InferRequestAddInputTensors(builder, tensor_vector)
    if outputs is not None:
        fb.InferRequestAddOutputNames(builder, outputs)
    body = fb.InferRequestEnd(builder)
    return request_of(builder, fb.Req.InferRequest, body)


def metadata_request() -> bytes:
    builder = flatbuffers.Builder(64)
    fb.MetadataRequestStart(builder)
    return request_of(builder, fb.Req.MetadataRequest, fb.MetadataRequestEnd(builder))


def request_of(builder: flatbuffers.Builder, kind: int, body: int | None) -> bytes:
    """The `Request` of union type `kind` holding `body`, finished."""
    fb.RequestStart(builder)
    fb.RequestAddReqType(builder, kind)
    if body is not None:
        fb.RequestAddReq(builder, body)
    builder.Finish(fb.RequestEnd(builder))
    return bytes(builder.Output())


def request_with_union(kind: int, body: str | None) -> bytes:
    """A Request whose union says `kind` and holds `body` ("infer", "metadata" or None)."""
    builder = flatbuffers.Builder(64)
    offset = None
    if body == "infer":
        fb.InferRequestStart(builder)
        offset = fb.InferRequestEnd(builder)
    elif body == "metadata":
        fb.MetadataRequestStart(builder)
        offset = fb.MetadataRequestEnd(builder)
    return request_of(builder, kind, offset)


def read_tensor(tensor: fb.Tensor) -> np.ndarray:
    shape = [int(d) for d in tensor.ShapeAsNumpy()] if not tensor.ShapeIsNone() else []
    if tensor.Type() == TensorType.String:
        values = [tensor.StringVal(i) for i in range(tensor.StringValLength())]
        array = np.empty(len(values), dtype=object)
        array[:] = values
        return array.reshape(shape)
    dtype = NUMERIC_DTYPES[TensorType(tensor.Type())]
    data = tensor.DataAsNumpy() if not tensor.DataIsNone() else np.empty(0, np.uint8)
    return np.frombuffer(data.tobytes(), dtype=dtype).reshape(shape)


@dataclass
class InferAnswer:
    outputs: list[np.ndarray]
    errors: list[tuple[int, str]]


def read_infer_response(body: bytes | memoryview) -> InferAnswer:
    response = fb.InferResponse.GetRootAs(body, 0)
    outputs = [
        read_tensor(response.OutputTensors(i)) for i in range(response.OutputTensorsLength())
    ]
    errors = [
        (int(response.Errors(i).Code()), response.Errors(i).Message().decode())
        for i in range(response.ErrorsLength())
    ]
    return InferAnswer(outputs, errors)


def read_metadata_response(body: bytes | memoryview) -> dict[str, Any]:
    """The MetadataResponse as the JSON form `GET` answers (type by name)."""
    meta = fb.MetadataResponse.GetRootAs(body, 0)

    def io(item: fb.IOMetadata) -> dict[str, Any]:
        return {
            "name": item.Name().decode(),
            "description": item.Description().decode(),
            "shape": [int(d) for d in item.ShapeAsNumpy()],
            "type": TensorType(item.Type()).name,
        }

    return {
        "name": meta.Name().decode(),
        "version": meta.Version().decode(),
        "server": meta.Server().decode(),
        "description": meta.Description().decode(),
        "inputs": [io(meta.Inputs(i)) for i in range(meta.InputsLength())],
        "outputs": [io(meta.Outputs(i)) for i in range(meta.OutputsLength())],
    }
