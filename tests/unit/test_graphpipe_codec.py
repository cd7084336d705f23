"""The GraphPipe codec: numpy <-> flatbuffer for every tensor type, checked three ways:
our encoder -> our decoder, our encoder -> the flatc-generated classes, and a request
built with flatbuffers' own Builder -> our decoder. Property-based (hypothesis)."""

from __future__ import annotations

from typing import Literal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from app.protocols.graphpipe.decode import InferCall, MetadataCall, decode_request
from app.protocols.graphpipe.encode import (
    encode_errors,
    encode_infer_request,
    encode_infer_response,
    encode_metadata,
    encode_metadata_request,
)
from app.protocols.graphpipe.metadata import IOMetadata, ModelMetadata
from app.protocols.graphpipe.tensors import NUMERIC_DTYPES, TensorType, type_of
from app.protocols.graphpipe.writer import BLOB_ALIGN
from tests.graphpipe_client import (
    Infer,
    infer_request,
    metadata_request,
    read_infer_response,
    read_metadata_response,
)

LIMIT = 1 << 30
shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)

# The wire is little-endian whatever the array is.
BYTE_ORDERS: list[Literal["<", ">"]] = ["<", ">"]


@st.composite
def numeric_arrays(draw: st.DrawFn, kind: TensorType | None = None) -> np.ndarray:
    kind = kind or draw(st.sampled_from(sorted(NUMERIC_DTYPES)))
    order = draw(st.sampled_from(BYTE_ORDERS))
    array = draw(hnp.arrays(NUMERIC_DTYPES[kind].newbyteorder(order), shapes))
    if array.ndim >= 2 and draw(st.booleans()):
        array = array.T  # not C-contiguous
    return array


@st.composite
def string_arrays(draw: st.DrawFn) -> np.ndarray:
    shape = draw(shapes)
    size = int(np.prod(shape))
    elements = st.binary(max_size=20) | st.text(max_size=10)
    array = np.empty(size, dtype=object)
    array[:] = draw(st.lists(elements, min_size=size, max_size=size))
    return array.reshape(shape)


arrays = numeric_arrays() | string_arrays()


def expected(array: np.ndarray) -> np.ndarray:
    """What the wire carries: little-endian numbers, strings as bytes."""
    if type_of(array) is TensorType.String:
        out = np.empty(array.size, dtype=object)
        out[:] = [v.encode() if isinstance(v, str) else v for v in array.reshape(-1)]
        return out.reshape(array.shape)
    return array.astype(NUMERIC_DTYPES[type_of(array)])


def assert_same(got: np.ndarray, array: np.ndarray) -> None:
    want = expected(array)
    assert got.shape == want.shape
    assert got.dtype == want.dtype
    if want.dtype == object:
        assert got.tolist() == want.tolist()
    else:  # bytes, so NaNs and -0.0 compare exactly
        assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("kind", [t for t in TensorType if t is not TensorType.Null])
def test_every_type_round_trips(kind: TensorType) -> None:
    @settings(max_examples=40, deadline=None)
    @given(numeric_arrays(kind) if kind is not TensorType.String else string_arrays())
    def check(array: np.ndarray) -> None:
        call = decode_request(encode_infer_request([array]), max_bytes=LIMIT)
        assert isinstance(call, InferCall)
        assert_same(call.inputs[0], array)
        # ...and the flatc-generated reader sees the same tensor in our response.
        assert_same(read_infer_response(encode_infer_response([array])).outputs[0], array)

    check()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(arrays, max_size=4),
    st.lists(st.text(max_size=8), max_size=3),
    st.lists(st.text(max_size=8), max_size=3),
    st.text(max_size=30),
)
def test_requests_built_by_flatbuffers_builder_decode(
    tensors: list[np.ndarray], input_names: list[str], output_names: list[str], config: str
) -> None:
    buffer = infer_request(Infer(tensors, input_names, output_names, config))
    call = decode_request(buffer, max_bytes=LIMIT)
    assert isinstance(call, InferCall)
    assert call.input_names == tuple(input_names)
    assert call.output_names == tuple(output_names)
    assert call.config == config.encode()
    assert len(call.inputs) == len(tensors)
    for got, array in zip(call.inputs, tensors, strict=True):
        assert_same(got, array)


@settings(max_examples=40, deadline=None)
@given(st.lists(arrays, min_size=1, max_size=4))
def test_our_requests_round_trip_with_names_and_config(tensors: list[np.ndarray]) -> None:
    names = [f"in{i}" for i in range(len(tensors))]
    buffer = encode_infer_request(tensors, names, ["out"], b'{"max_tokens": 3}')
    call = decode_request(buffer, max_bytes=LIMIT)
    assert isinstance(call, InferCall)
    assert call.input_names == tuple(names) and call.output_names == ("out",)
    assert call.config == b'{"max_tokens": 3}'
    for got, array in zip(call.inputs, tensors, strict=True):
        assert_same(got, array)


def test_numeric_tensors_are_zero_copy_aligned_read_only_views() -> None:
    array = np.arange(1000, dtype=np.float64).reshape(10, 100)
    buffer = encode_infer_request([array])
    call = decode_request(buffer, max_bytes=LIMIT)
    assert isinstance(call, InferCall)
    got = call.inputs[0]
    assert np.shares_memory(got, np.frombuffer(buffer, np.uint8))
    assert not got.flags.writeable
    # The writer aligns payloads from the buffer's start, so any dtype views them aligned.
    assert bytes(buffer).index(array.tobytes()) % BLOB_ALIGN == 0
    assert got.flags.aligned and got.ctypes.data % BLOB_ALIGN == 0
    assert np.array_equal(got, array)


def test_metadata_request_decodes_from_either_encoder() -> None:
    assert decode_request(metadata_request(), max_bytes=LIMIT) == MetadataCall()
    assert decode_request(encode_metadata_request(), max_bytes=LIMIT) == MetadataCall()


def test_error_response_is_read_by_generated_classes() -> None:
    answer = read_infer_response(encode_errors([(400, "bad shape"), (429, "é too big")]))
    assert answer.errors == [(400, "bad shape"), (429, "é too big")]
    assert answer.outputs == []  # the spec: data in only one of output_tensors and errors


def test_metadata_response_is_read_by_generated_classes() -> None:
    meta = ModelMetadata(
        name="m",
        version="1",
        server="s",
        description="d",
        inputs=(IOMetadata("prompt", "p", (-1,), TensorType.String),),
        outputs=(
            IOMetadata("token_ids", "t", (-1, -1), TensorType.Int64),
            IOMetadata("logprobs", "", (-1, -1), TensorType.Float32),
        ),
    )
    assert read_metadata_response(encode_metadata(meta)) == meta.to_json()


def test_unsupported_numpy_dtypes_are_refused_by_the_encoder() -> None:
    with pytest.raises(TypeError, match="bool"):
        encode_infer_response([np.array([True])])
    with pytest.raises(TypeError, match="String tensors hold bytes or str"):
        encode_infer_response([np.array([1, "a"], dtype=object)])
