"""Raw HTTP against the live server: SSE framing, disconnects (tests/aborts.py), /metrics,
small routes."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httpx
import pytest

from tests.aborts import WORKERS, AbortWatch, Workload
from tests.conftest import LiveServer

pytestmark = pytest.mark.e2e


def _metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
    assert match, f"{name} missing from /metrics"
    return float(match.group(1))


def test_sse_framing(live_server: LiveServer) -> None:
    body = {
        "model": live_server.model,
        "prompt": "def f():",
        "max_tokens": 5,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", f"{live_server.base_url}/v1/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events), raw
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]) == 1
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5


def _long_call(live: Any, workload: Workload, chat: bool, stream: bool) -> tuple[str, Any]:
    """The abort workload in one call: its prompts as a batch, or chat's `n` copies of
    its first message (under `ignore_eos`, at least as long; see tests/aborts.py), sampled:
    vLLM refuses `n` > 1 greedy."""
    common = {
        "model": live.model,
        "max_tokens": workload.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }
    if chat:
        message = {"role": "user", "content": workload.texts[0]}
        body = {**common, "messages": [message], "n": WORKERS, "temperature": 1.0, "seed": 0}
        return "/v1/chat/completions", body
    return "/v1/completions", {**common, "prompt": [list(p) for p in workload.prompts]}


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_a_client_that_disconnects_aborts_its_requests(
    live_server: LiveServer, abort_workload: Workload, chat: bool, stream: bool
) -> None:
    path, body = _long_call(live_server, abort_workload, chat, stream)
    async with httpx.AsyncClient(base_url=live_server.base_url, timeout=120) as client:
        watch = await AbortWatch.start(live_server.engine, abort_workload)
        if stream:
            async with client.stream("POST", path, json=body) as response:
                assert response.status_code == 200
                lines = response.aiter_lines()  # held: dropping it would close the stream
                assert (await anext(lines)).startswith("data: ")
                await watch.all_in_engine()
            # Leaving the block closed the connection mid-stream.
        else:
            call = asyncio.create_task(client.post(path, json=body))
            await watch.all_in_engine()
            assert not call.done()
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
    await watch.idle()


def test_metrics_for_the_endpoint_picker(live_server: LiveServer) -> None:
    httpx.post(
        f"{live_server.base_url}/v1/completions",
        json={"model": live_server.model, "prompt": "a", "max_tokens": 2},
    ).raise_for_status()
    response = httpx.get(f"{live_server.base_url}/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running"):
        assert _metric(text, name) >= 0
    usage = _metric(text, "vllm:kv_cache_usage_perc")
    assert _metric(text, "vllm:gpu_cache_usage_perc") == usage
    lora = re.search(r"^vllm:lora_requests_info\{([^}]*)\} (\S+)$", text, re.MULTILINE)
    assert lora, "vllm:lora_requests_info missing"
    labels = dict(re.findall(r'(\w+)="([^"]*)"', lora.group(1)))
    assert labels["max_lora"] == "2"
    assert {"running_lora_adapters", "waiting_lora_adapters"} <= labels.keys()
    assert float(lora.group(2)) > 1e9  # a timestamp
    assert "http_requests_total" in text or "http_request_duration" in text


def test_lora_shows_in_running_adapters(live_server: LiveServer) -> None:
    body = {
        "model": live_server.lora,
        "prompt": "x",
        "max_tokens": 400,
        "stream": True,
        "ignore_eos": True,
    }
    seen = set()
    with httpx.stream("POST", f"{live_server.base_url}/v1/completions", json=body) as response:
        lines = (line for line in response.iter_lines() if line)
        for _ in range(5):
            next(lines)
        text = httpx.get(f"{live_server.base_url}/metrics").text
        for line in text.splitlines():
            if line.startswith("vllm:lora_requests_info{"):
                found = re.search(r'running_lora_adapters="([^"]*)"', line)
                assert found, line
                seen.add(found.group(1))
    assert any(live_server.lora in s for s in seen), seen
    assert live_server.wait_idle() == 0


def test_error_shapes(live_server: LiveServer) -> None:
    url = f"{live_server.base_url}/v1/completions"
    response = httpx.post(url, json={"model": live_server.model, "max_tokens": 2})
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == "prompt"
    response = httpx.post(url, content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400 and "error" in response.json()
    response = httpx.post(url, json={"model": "nope", "prompt": "a"})
    assert response.status_code == 404 and response.json()["error"]["type"] == "not_found_error"
    # A streaming request that is invalid fails before the stream: a 400, not an SSE body.
    response = httpx.post(
        url, json={"model": live_server.model, "prompt": "a " * 2000, "stream": True}
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"


def test_small_routes(live_server: LiveServer) -> None:
    base = live_server.base_url
    assert httpx.get(f"{base}/health").status_code == 200
    version = httpx.get(f"{base}/version").json()
    assert version["engine"].startswith("vllm 0.32")
    tokens = httpx.post(f"{base}/tokenize", json={"prompt": "import sys"}).json()
    assert tokens["count"] == len(tokens["tokens"]) > 0
    assert tokens["max_model_len"] == 1024
    text = httpx.post(f"{base}/detokenize", json={"tokens": tokens["tokens"]}).json()
    assert text["prompt"] == "import sys"
    chat = httpx.post(
        f"{base}/tokenize",
        json={"messages": [{"role": "user", "content": "hi"}], "return_token_strs": True},
    ).json()
    assert "".join(chat["token_strs"]).startswith("<|im_start|>user\nhi<|im_end|>")
    bad = httpx.post(f"{base}/detokenize", json={"tokens": [10**7]})
    assert bad.status_code == 400


def test_seeded_long_prompts_in_one_batch(live_server: LiveServer) -> None:
    """Seeded requests whose prompts fill more than one engine step all complete and the
    engine lives on. With chunked prefill, a step's last prompt was prefilled in part and
    vLLM's CPU worker died rewinding its seeded generator (this killed the engine of a CI
    run: every later test failed)."""
    vocab = live_server.engine.info.vocab_size
    length = live_server.engine.info.max_model_len - 100

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=live_server.base_url, timeout=120) as client:
            calls = [
                client.post(
                    "/v1/completions",
                    json={
                        "model": live_server.model,
                        # Distinct prompts: the prefix cache must not shorten any prefill.
                        "prompt": [(7 + i * 31 + j * 13) % vocab for j in range(length)],
                        "max_tokens": 2,
                        "seed": i,
                    },
                )
                for i in range(6)
            ]
            return list(await asyncio.gather(*calls))

    responses = asyncio.run(run())
    assert [r.status_code for r in responses] == [200] * 6, responses[0].text
    live_server.call(live_server.engine.check_health())  # raises once the engine is dead
