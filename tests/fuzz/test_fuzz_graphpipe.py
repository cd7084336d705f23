"""Fuzz `POST /graphpipe` on the live server (real vLLM) with seeded flatbuffers: valid
requests, requests built field by field with hostile values (tensor types, shapes, data,
strings, names, configs), mismatched unions, and valid buffers bit-flipped or cut short.

Every answer must be a GraphPipe answer read with the flatc-generated classes: on 200 an
`InferResponse` with outputs and no errors (or the `MetadataResponse`), otherwise an
`InferResponse` with exactly one `Error` whose code is the HTTP status, a 4xx or 503:
never another 5xx, never a reset connection.
"""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import numpy as np
import pytest

from fbs.graphpipe import graphpipe_generated as fb
from tests.conftest import LiveServer
from tests.fuzz.corpus import (
    Offence,
    dump,
    hostile,
    mutate_bytes,
    mutate_json,
    rng,
)
from tests.fuzz.harness import run_corpus, verdict
from tests.graphpipe_client import (
    Infer,
    RawTensor,
    infer_request,
    metadata_request,
    request_with_union,
)

pytestmark = pytest.mark.e2e

CONFIGS: list[dict[str, Any]] = [
    {"max_tokens": 4, "temperature": 0},
    {"max_tokens": 3, "logprobs": True},
    {"max_tokens": 2, "top_p": 0.9, "top_k": 5, "seed": 3, "stop": ["\n"]},
]
HOSTILE_SHAPES: tuple[list[int], ...] = (
    [],
    [0],
    [-1],
    [2**62],
    [2**63 - 1],
    [-(2**63)],
    [1] * 40,
    [10_000],
    [1, 10_000],
    [2, 0],
    [3, 2**40],
)
HOSTILE_STRINGS: tuple[bytes, ...] = (
    b"\xed\xa0\x80",
    b"\xff",
    b"\x00",
    b"a\x00b",
    b"",
    b"x" * 100_000,
)


def _prompt(r: random.Random) -> RawTensor:
    return RawTensor.of(np.array([b"def f():", b"import os"][: r.randint(1, 2)], dtype=object))


def _ids(r: random.Random) -> RawTensor:
    rows = np.array([[1, 2, 3], [4, 5, -1]], dtype=r.choice((np.int64, np.int32)))
    return RawTensor.of(rows[: r.randint(1, 2)])


def _hostile_tensor(r: random.Random) -> RawTensor:
    tensor = r.choice((_prompt, _ids))(r)
    part = r.choice(("type", "shape", "data", "strings", "both", "many"))
    if part == "type":
        tensor.type = r.choice((0, 13, 100, 255, 1, 9, 10, 11, 12, 8))
    elif part == "shape":
        tensor.shape = r.choice(HOSTILE_SHAPES)
    elif part == "data":
        tensor.data = r.choice((b"", r.randbytes(r.randint(1, 64)), b"\xff" * 80_000))
    elif part == "strings":
        values = [r.choice(HOSTILE_STRINGS)]
        if r.random() < 0.3:  # 10^4 prompts, one of them not UTF-8
            values = [b"x"] * 9_999 + [b"\xff"]
        tensor.string_val, tensor.shape = values, [len(values)]
    elif part == "both":
        tensor.data, tensor.string_val = b"\x01" * 8, [b"a"]
    else:  # ten thousand token ids in one row: over the context
        tensor = RawTensor.of(np.ones((1, 10_000), dtype=np.int64))
    return tensor


def _config(r: random.Random) -> str | None:
    seed = r.choice(CONFIGS)
    roll = r.random()
    if roll < 0.5:
        return json.dumps(seed)
    if roll < 0.8:
        return dump(mutate_json(seed, r))
    if roll < 0.9:
        return r.choice((None, "", "{", "[]", "null", "1", dump(hostile(r))))
    return dump({"max_tokens": hostile(r)})


def _names(r: random.Random, valid: list[str]) -> list[bytes | str] | None:
    names: tuple[list[bytes | str] | None, ...] = (
        None,
        [*valid],
        [],
        ["nope"],
        [b"\xff"],
        [b"\xed\xa0\x80"],
        [""],
        ["\x00"],
        [*valid, *valid],
        ["text"] * 10_000,
    )
    return r.choice(names)


def field_input(r: random.Random) -> bytes:
    tensors = [r.choice((_prompt, _ids))(r) if r.random() < 0.4 else _hostile_tensor(r)]
    if r.random() < 0.1:
        tensors = r.choice(([], tensors * 2, tensors * 300))
    call = Infer(
        tensors=tensors,
        input_names=_names(r, ["prompt"]),
        output_names=_names(r, ["text", "token_ids", "logprobs"]),
        config=_config(r),
    )
    return infer_request(call)


def valid_request(r: random.Random) -> bytes:
    choice = r.randrange(4)
    if choice == 0:
        return metadata_request()
    if choice == 1:
        return infer_request(Infer([_prompt(r)], config=json.dumps(CONFIGS[0])))
    if choice == 2:
        return infer_request(
            Infer(
                [_ids(r)],
                input_names=["prompt_ids"],
                output_names=["text", "token_ids", "logprobs"],
                config=json.dumps(CONFIGS[1]),
            )
        )
    return infer_request(Infer([_prompt(r)], config=json.dumps(CONFIGS[2])))


def make_input(index: int) -> bytes:
    r = rng("graphpipe", index)
    roll = r.random()
    if roll < 0.05:
        return valid_request(r)
    if roll < 0.5:
        return field_input(r)
    if roll < 0.6:
        kind = r.choice((0, 1, 2, 3, 200, 255))
        return request_with_union(kind, r.choice(("infer", "metadata", None)))
    return mutate_bytes(valid_request(r), r)


def judge(response: httpx.Response) -> str | None:
    """Why the answer is not GraphPipe's success or error shape, or None."""
    status, body = response.status_code, response.content
    if response.headers.get("content-type") != "application/octet-stream":
        return f"status {status}, content-type {response.headers.get('content-type')!r}"
    try:
        answer = fb.InferResponse.GetRootAs(body, 0)
        errors = [
            (answer.Errors(i).Code(), answer.Errors(i).Message().decode())
            for i in range(answer.ErrorsLength())
        ]
        outputs = answer.OutputTensorsLength()
    except Exception as exc:  # not an InferResponse at all
        errors, outputs = [], -1
        not_infer = repr(exc)
    else:
        not_infer = ""
    if status == 200:
        if not errors and outputs > 0:
            return None
        try:
            meta = fb.MetadataResponse.GetRootAs(body, 0)
            if meta.Server() == b"switchboard" and meta.Name():
                return None
        except Exception:
            pass
        return "200 but neither outputs without errors nor the metadata"
    if not (400 <= status < 500 or status == 503):
        return f"status {status}"
    if not_infer:
        return f"status {status}, not an InferResponse: {not_infer}"
    if len(errors) != 1 or outputs != 0:
        return f"status {status} with {len(errors)} errors and {outputs} outputs"
    if errors[0][0] != status:
        return f"status {status} but error code {errors[0][0]}"
    return None


async def test_graphpipe_corpus(live_server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=live_server.base_url, timeout=60) as client:

        async def probe(index: int) -> Offence | None:
            body = make_input(index)
            headers = {"content-type": "application/octet-stream"}
            try:
                response = await client.post("/graphpipe", content=body, headers=headers)
            except httpx.TransportError as exc:  # reset, closed, timed out
                return Offence(index, body, f"transport error: {exc!r}")
            reason = judge(response)
            if reason is None:
                return None
            return Offence(index, body, f"{reason}: {response.content[:300]!r}")

        offences = await run_corpus(probe)
    verdict(live_server, "GraphPipe", offences)


def test_corpus_is_seeded() -> None:
    assert make_input(42) == make_input(42)
    assert len({make_input(i) for i in range(50)}) > 40
