"""GraphPipe against the live server with real vLLM on the tiny model: metadata by POST and
GET, batches of prompts and of token ids (checked against the OpenAI routes on the same
engine), the LoRA path, a bad request beside a good one, a client that disconnects
(tests/aborts.py), and GraphPipe's own reference Python client (oracle's `graphpipe`
package) when its venv exists. Requests are built and answers read with the
flatc-generated classes only."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.aborts import AbortWatch, Workload
from tests.conftest import LiveServer
from tests.graphpipe_client import (
    Infer,
    InferAnswer,
    RawTensor,
    infer_request,
    metadata_request,
    read_infer_response,
    read_metadata_response,
)

pytestmark = pytest.mark.e2e

PROMPTS = ["def add(a, b):", "import os", "class Stack:\n    def push(self, item):"]
GREEDY = {"max_tokens": 8, "temperature": 0}
REFERENCE_PYTHON = Path(
    os.environ.get(
        "GRAPHPIPE_REFERENCE_PYTHON",
        Path(__file__).resolve().parents[2] / ".venv-graphpipe-ref" / "bin" / "python",
    )
)


def strings(values: list[str]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = [v.encode() for v in values]
    return array


def post(url: str, call: Infer, timeout: float = 120) -> tuple[int, InferAnswer]:
    response = httpx.post(url, content=infer_request(call), timeout=timeout)
    assert response.headers["content-type"] == "application/octet-stream"
    return response.status_code, read_infer_response(response.content)


def completions(live: Any, model: str, prompts: list[str]) -> list[str]:
    body = {"model": model, "prompt": prompts, **GREEDY}
    response = httpx.post(f"{live.base_url}/v1/completions", json=body, timeout=120)
    response.raise_for_status()
    return [c["text"] for c in sorted(response.json()["choices"], key=lambda c: c["index"])]


def test_metadata_by_post_and_get(live_server: LiveServer) -> None:
    url = f"{live_server.base_url}/graphpipe"
    posted = httpx.post(url, content=metadata_request(), timeout=30)
    assert posted.status_code == 200
    assert posted.headers["content-type"] == "application/octet-stream"
    meta = read_metadata_response(posted.content)
    got = httpx.get(url, timeout=30).json()
    assert got.pop("how_to_call")
    assert got == meta
    assert meta["name"] == live_server.model and meta["server"] == "switchboard"
    assert [(i["name"], i["type"], i["shape"]) for i in meta["inputs"]] == [
        ("prompt", "String", [-1]),
        ("prompt_ids", "Int64", [-1, -1]),
    ]
    assert [(o["name"], o["type"], o["shape"]) for o in meta["outputs"]] == [
        ("text", "String", [-1]),
        ("token_ids", "Int64", [-1, -1]),
        ("logprobs", "Float32", [-1, -1]),
    ]


def test_a_batch_of_prompts_matches_the_openai_route(live_server: LiveServer) -> None:
    status, answer = post(
        f"{live_server.base_url}/graphpipe",
        Infer(
            [strings(PROMPTS)],
            output_names=["text", "token_ids", "logprobs"],
            config=json.dumps(GREEDY),
        ),
    )
    assert status == 200, answer.errors
    text, token_ids, logprobs = answer.outputs
    assert [t.decode() for t in text] == completions(live_server, live_server.model, PROMPTS)
    assert token_ids.dtype == np.int64 and token_ids.shape[0] == len(PROMPTS)
    assert logprobs.dtype == np.float32 and logprobs.shape == token_ids.shape
    for ids, lps in zip(token_ids, logprobs, strict=True):
        real = ids != -1
        assert real.sum() >= 1
        assert all(lp <= 0 for lp in lps[real]) and all(math.isnan(lp) for lp in lps[~real])
    assert live_server.wait_idle() == 0


def test_a_batch_of_ids_generates_what_the_same_text_does(live_server: LiveServer) -> None:
    rows = []
    for prompt in PROMPTS:
        response = httpx.post(
            f"{live_server.base_url}/tokenize",
            json={"model": live_server.model, "prompt": prompt},
            timeout=30,
        )
        rows.append(response.json()["tokens"])
    width = max(len(r) for r in rows)
    ids = np.array([r + [-1] * (width - len(r)) for r in rows], dtype=np.int32)
    url = f"{live_server.base_url}/graphpipe"
    config = json.dumps(GREEDY)
    by_ids = post(url, Infer([ids], ["prompt_ids"], ["token_ids", "text"], config))[1]
    by_text = post(url, Infer([strings(PROMPTS)], ["prompt"], ["token_ids", "text"], config))[1]
    assert by_ids.errors == []
    assert by_ids.outputs[0].tolist() == by_text.outputs[0].tolist()
    assert by_ids.outputs[1].tolist() == by_text.outputs[1].tolist()


def test_the_lora_path_generates_with_the_adapter(live_server: LiveServer) -> None:
    url = f"{live_server.base_url}/graphpipe/{live_server.lora}"
    status, answer = post(url, Infer([strings(PROMPTS[:2])], config=json.dumps(GREEDY)))
    assert status == 200, answer.errors
    assert [t.decode() for t in answer.outputs[0]] == completions(
        live_server, live_server.lora, PROMPTS[:2]
    )
    meta = read_metadata_response(httpx.post(url, content=metadata_request(), timeout=30).content)
    assert meta["name"] == live_server.lora
    assert httpx.get(url, timeout=30).json()["name"] == live_server.lora
    status, answer = post(f"{live_server.base_url}/graphpipe/no-such-adapter", Infer())
    assert status == 404 and answer.errors[0][0] == 404


BAD_REQUESTS = [
    b"\x00" * 7,
    b"\xff" * 64,
    infer_request(Infer([RawTensor(10, [2, 3], bytes(20))])),
    infer_request(Infer([RawTensor(13, [1], b"x")])),
    infer_request(Infer([strings(["a"])], config='{"temperature": -1}')),
    infer_request(Infer([np.array([[1, -1, 2]])])),
]


def test_bad_requests_beside_a_good_one_do_not_disturb_it(live_server: LiveServer) -> None:
    url = f"{live_server.base_url}/graphpipe"
    good = Infer(
        [strings(PROMPTS)],
        output_names=["token_ids"],
        config=json.dumps({"max_tokens": 64, "temperature": 0.8, "seed": 11}),
    )
    alone = post(url, good)[1]
    with ThreadPoolExecutor(len(BAD_REQUESTS) + 1) as pool:
        beside = pool.submit(post, url, good)
        bad = list(pool.map(lambda body: httpx.post(url, content=body, timeout=60), BAD_REQUESTS))
        together = beside.result()[1]
    assert together.errors == []
    assert together.outputs[0].tolist() == alone.outputs[0].tolist()
    for response in bad:
        assert response.status_code == 400
        [(code, message)] = read_infer_response(response.content).errors
        assert code == 400 and message
    assert live_server.wait_idle() == 0


async def test_a_client_that_disconnects_aborts_its_batch(
    live_server: LiveServer, abort_workload: Workload
) -> None:
    prompts = abort_workload.prompts
    width = max(len(p) for p in prompts)
    ids = np.array([list(p) + [-1] * (width - len(p)) for p in prompts], dtype=np.int64)
    config = json.dumps({"max_tokens": abort_workload.max_tokens, "temperature": 0})
    body = infer_request(Infer([ids], ["prompt_ids"], ["token_ids"], config))
    async with httpx.AsyncClient(timeout=120) as client:
        watch = await AbortWatch.start(live_server.engine, abort_workload)
        call = asyncio.create_task(client.post(f"{live_server.base_url}/graphpipe", content=body))
        await watch.all_in_engine()
        assert not call.done()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    await watch.idle()


def test_graphpipes_reference_client(live_server: LiveServer) -> None:
    """oracle's own client (graphpipe 1.0.4 in a separate venv: it pins an old flatbuffers)
    asks for the metadata and sends a batch of prompts."""
    assert REFERENCE_PYTHON.exists(), "scripts/setup makes .venv-graphpipe-ref"
    script = """
import json, sys
import numpy as np
from graphpipe import remote
url = sys.argv[1]
[texts] = remote.execute_multi(
    url, [np.array([p.encode() for p in json.loads(sys.argv[2])])], ["prompt"], ["text"],
    config=sys.argv[3],
)
print(json.dumps({
    "inputs": remote.get_input_names(url),
    "outputs": remote.get_output_names(url),
    "texts": [t.decode() for t in texts.tolist()],
}))
"""
    url = f"{live_server.base_url}/graphpipe"
    done = subprocess.run(
        [str(REFERENCE_PYTHON), "-c", script, url, json.dumps(PROMPTS), json.dumps(GREEDY)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result = json.loads(done.stdout)
    assert result["inputs"] == ["prompt", "prompt_ids"]
    assert result["outputs"] == ["text", "token_ids", "logprobs"]
    assert result["texts"] == completions(live_server, live_server.model, PROMPTS)
