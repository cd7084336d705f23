"""GraphPipe requests a hostile client writes with flatbuffers' own Builder: offsets that
share one string or one table (legal in flatbuffers, and how a small body decoded to
gigabytes), for the unit tests of the decoding budget, the live probes and the fuzz
corpus's cost dimension."""

from __future__ import annotations

import flatbuffers
import numpy as np

from app.protocols.graphpipe.tensors import TensorType
from fbs.graphpipe import graphpipe_generated as fb
from tests.graphpipe_client import request_of


def _shape(builder: flatbuffers.Builder, dims: list[int]) -> int:
    fb.TensorStartShapeVector(builder, len(dims))
    for dim in reversed(dims):
        builder.PrependInt64(dim)
    return int(builder.EndVector())


def _offsets(builder: flatbuffers.Builder, target: int, count: int) -> int:
    """A vector of `count` offsets, every one to `target`: the bytes
    `PrependUOffsetTRelative` writes one offset at a time, written at once (a million
    offsets took 1.4 s one by one)."""
    start = builder.StartVector(4, count, 4)  # the room made, aligned
    # The k-th offset prepended lands at Offset() start + 4k + 4 and holds its distance to
    # `target`; the vector reads from the last one prepended.
    values = start + 4 - target + 4 * np.arange(count - 1, -1, -1, dtype=np.int64)
    builder.head -= 4 * count
    builder.Bytes[builder.head : builder.head + 4 * count] = values.astype("<u4").tobytes()
    return int(builder.EndVector())


def _infer(builder: flatbuffers.Builder, tensors: int, names: int | None = None) -> bytes:
    fb.InferRequestStart(builder)
    fb.InferRequestAddInputTensors(builder, tensors)
    if names is not None:
        fb.InferRequestAddOutputNames(builder, names)
    return request_of(builder, fb.Req.InferRequest, fb.InferRequestEnd(builder))


def shared_string(references: int, size: int) -> bytes:
    """One String tensor of `references` prompts, every offset to one `size`-byte string
    (the issue's probe: 4,096 x 256 KiB decoded to 1 GiB)."""
    builder = flatbuffers.Builder(size + 8 * references + 1024)
    string = builder.CreateString(b"x" * size)
    strings = _offsets(builder, string, references)
    shape = _shape(builder, [references])
    fb.TensorStart(builder)
    fb.TensorAddType(builder, TensorType.String)
    fb.TensorAddShape(builder, shape)
    fb.TensorAddStringVal(builder, strings)
    tensor = fb.TensorEnd(builder)
    return _infer(builder, _offsets(builder, tensor, 1))


def shared_tensor(references: int) -> bytes:
    """`references` input tensors, every offset to one tensor."""
    builder = flatbuffers.Builder(1024)
    shape = _shape(builder, [4])
    data = builder.CreateByteVector(bytes(4))
    fb.TensorStart(builder)
    fb.TensorAddType(builder, TensorType.Uint8)
    fb.TensorAddShape(builder, shape)
    fb.TensorAddData(builder, data)
    tensor = fb.TensorEnd(builder)
    return _infer(builder, _offsets(builder, tensor, references))


def shared_name(references: int) -> bytes:
    """A valid input, then `references` output names, every offset to one name."""
    builder = flatbuffers.Builder(1024)
    name = builder.CreateString("text")
    names = _offsets(builder, name, references)
    prompt = builder.CreateString("hi")
    strings = _offsets(builder, prompt, 1)
    shape = _shape(builder, [1])
    fb.TensorStart(builder)
    fb.TensorAddType(builder, TensorType.String)
    fb.TensorAddShape(builder, shape)
    fb.TensorAddStringVal(builder, strings)
    tensor = fb.TensorEnd(builder)
    return _infer(builder, _offsets(builder, tensor, 1), names)
