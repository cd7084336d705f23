"""The corpora's cost dimension: per protocol, requests whose size, aliasing, nesting or
counts are hostile, against the live server (real vLLM). Each must be answered in its
protocol's shape within `ANSWER_S` and grow the server (this process: the live server
runs in it) by less than `GROWTH_BOUND`: generous bounds that a correct server always
meets and the issue's probes broke by orders of magnitude (a 272 KiB GraphPipe body grew
it by 2 GiB, a 64 MiB JSON body by 12.8 GB over 114 s). Then, as every corpus, the
server is healthy and idle (`verdict`).

The inputs are a fixed list (each one a function of nothing), not seeded mutations: the
cost of an input is its shape, and each shape is here once per protocol."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import numpy as np
import psutil
import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from tests import grpc_bytes
from tests.conftest import LiveServer
from tests.fuzz.corpus import Offence
from tests.fuzz.harness import verdict
from tests.graphpipe_client import Infer, infer_request, read_infer_response
from tests.graphpipe_hostile import shared_string, shared_tensor

pytestmark = pytest.mark.e2e

ANSWER_S = 60.0
GROWTH_BOUND = 512 << 20
MIB = 1 << 20
USER = [{"role": "user", "content": "hi"}]


def _rss() -> int:
    return int(psutil.Process().memory_info().rss)


@dataclass(frozen=True)
class Hostile:
    """One hostile input: `send(live)` sends it and says why its answer left the
    protocol's shape (None: in shape)."""

    name: str
    send: Callable[[LiveServer], Awaitable[str | None]]


async def _post(
    live: LiveServer,
    path: str,
    body: bytes,
    expect: set[int],
    content_type: str = "application/json",
) -> str | None:
    async with httpx.AsyncClient(base_url=live.base_url, timeout=ANSWER_S) as client:
        response = await client.post(path, content=body, headers={"content-type": content_type})
    if response.status_code not in expect:
        return f"status {response.status_code}: {response.text[:200]!r}"
    if path.startswith("/graphpipe"):
        errors = read_infer_response(response.content).errors
        return None if response.status_code == 200 or errors else "no InferResponse error"
    body_json = response.json()
    error = body_json.get("error") if isinstance(body_json, dict) else None
    if response.status_code != 200 and not (isinstance(error, dict) and "message" in error):
        return f"not the API's error shape: {response.text[:200]!r}"
    return None


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


def _chat(live: LiveServer, **extra: Any) -> bytes:
    return _json({"model": live.model, "messages": USER, "max_tokens": 1, **extra})


def http(name: str, path: str, body: Callable[[LiveServer], bytes], *expect: int) -> Hostile:
    async def send(live: LiveServer) -> str | None:
        return await _post(live, path, body(live), set(expect))

    return Hostile(name, send)


def graphpipe(name: str, body: Callable[[], bytes], *expect: int) -> Hostile:
    async def send(live: LiveServer) -> str | None:
        return await _post(live, "/graphpipe", body(), set(expect), "application/octet-stream")

    return Hostile(name, send)


def _prompt_ids(rows: int, width: int) -> bytes:
    return infer_request(Infer([np.ones((rows, width), dtype=np.int64)]))


def _strings(count: int) -> bytes:
    prompts = np.empty(count, dtype=object)
    prompts[:] = [b"a"] * count
    return infer_request(Infer([prompts]))


async def _socket(
    live: LiveServer, path: str, frame: str | bytes, enough: Callable[[str | bytes], bool]
) -> list[str | bytes]:
    """What the server sends after `frame`, up to the first answer that is `enough`, its
    close, or 30 s of silence."""
    answers: list[str | bytes] = []
    ws = await websockets.connect(live.ws_url + path, max_size=None)
    try:
        with contextlib.suppress(ConnectionClosed):
            await ws.send(frame)
        with contextlib.suppress(ConnectionClosed, TimeoutError):
            while not answers or not enough(answers[-1]):
                answers.append(await asyncio.wait_for(ws.recv(), 30))
    finally:
        with contextlib.suppress(Exception):
            await ws.close()
    return answers


def salience_ws(name: str, frame: Callable[[], str | bytes], code: str) -> Hostile:
    async def send(live: LiveServer) -> str | None:
        answers = await _socket(
            live, "/salience/ws", frame(), lambda a: isinstance(a, str) and '"error"' in a
        )
        errors = [json.loads(a)["error"]["code"] for a in answers if isinstance(a, str)]
        return None if code in errors else f"no {code} error: {answers[:2]!r}"

    return Hostile(name, send)


def evergreen_ws(name: str, frame: Callable[[], str | bytes]) -> Hostile:
    async def send(live: LiveServer) -> str | None:
        answers = await _socket(
            live, "/evergreen/ws", frame(), lambda a: isinstance(a, str) and '"ABORT"' in a
        )
        aborts = [a for a in answers if isinstance(a, str) and '"ABORT"' in a]
        return None if aborts else f"no ABORT: {answers[:2]!r}"

    return Hostile(name, send)


async def _oversized_grpc(live: LiveServer) -> str | None:
    """65 MiB of a Generate (its bytes: the server refuses them by their size, unread)."""
    request = b"\0" * (65 * MIB)
    async with grpc.aio.insecure_channel(
        live.grpc_target, options=[("grpc.max_send_message_length", -1)]
    ) as channel:
        call = grpc_bytes.unary_stream(channel, "/salience.v1.Salience/Generate")
        try:
            async for _ in call(request):
                pass
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            return None if code == grpc.StatusCode.RESOURCE_EXHAUSTED else f"status {code}"
    return "no error"


OVER_FRAME = "x" * (16 * MIB + 1)
HOSTILE: dict[str, list[Hostile]] = {
    "openai": [
        http("a 64 MiB body", "/v1/chat/completions", lambda live: b" " * (64 * MIB), 413),
        http(
            "a million JSON values",
            "/v1/chat/completions",
            lambda live: _chat(live, stop=[""] * 1_000_000),
            413,
        ),
        http("nesting 200k deep", "/v1/completions", lambda live: b"[" * 200_000, 400),
        http(
            "10,001 messages",
            "/v1/chat/completions",
            lambda live: _json({"model": live.model, "messages": USER * 10_001}),
            400,
        ),
        http(
            "24 MiB of one message",
            "/v1/chat/completions",
            lambda live: _json(
                {"model": live.model, "messages": [{"role": "user", "content": "x " * (12 * MIB)}]}
            ),
            400,
        ),
        http(
            "a 200 KiB regex",
            "/v1/chat/completions",
            lambda live: _chat(live, structured_outputs={"regex": "(a|b)" * 40_000}),
            400,
        ),
        http(
            "a request's own template looping 4M times",
            "/v1/chat/completions/render",
            lambda live: _chat(
                live,
                chat_template="{% for i in range(2000) %}{% for j in range(2000) %}{% endfor %}"
                "{% endfor %}",
            ),
            400,
        ),
        http(
            "/tokenize of 24 MiB",
            "/tokenize",
            lambda live: _json({"model": live.model, "prompt": "x " * (12 * MIB)}),
            400,
        ),
        http(
            "n of 100,000",
            "/v1/completions",
            lambda live: _json({"model": live.model, "prompt": "a", "max_tokens": 1, "n": 100_000}),
            400,
            503,
        ),
        http(
            "a priority ever more urgent",
            "/v1/completions",
            lambda live: _json(
                {"model": live.model, "prompt": "a", "max_tokens": 1, "priority": -(10**9)}
            ),
            200,
        ),
    ],
    "anthropic": [
        http("a 64 MiB body", "/v1/messages", lambda live: b" " * (64 * MIB), 413),
        http(
            "10,001 messages",
            "/v1/messages",
            lambda live: _json({"model": live.model, "max_tokens": 1, "messages": USER * 10_001}),
            400,
        ),
        http(
            "count_tokens of 24 MiB",
            "/v1/messages/count_tokens",
            lambda live: _json(
                {"model": live.model, "messages": [{"role": "user", "content": "x " * (12 * MIB)}]}
            ),
            400,
        ),
    ],
    "responses": [
        http(
            "300k input items",
            "/v1/responses",
            lambda live: _json(
                {"model": live.model, "input": [{"role": "user", "content": "a"}] * 300_000}
            ),
            413,
        ),
        http("a 64 MiB body", "/v1/responses", lambda live: b" " * (64 * MIB), 413),
    ],
    "graphpipe": [
        graphpipe("a string shared by 4,096 offsets", lambda: shared_string(4096, 256 * 1024), 413),
        graphpipe("a tensor shared by a million offsets", lambda: shared_tensor(1_000_000), 400),
        graphpipe("65,537 prompts", lambda: _strings(65_537), 400),
        graphpipe("a 4M-token row", lambda: _prompt_ids(1, 4 * MIB), 400),
        graphpipe("a body over 64 MiB", lambda: b"\0" * (64 * MIB + 1), 413),
    ],
    "salience websocket": [
        salience_ws("a 16 MiB + 1 frame", lambda: OVER_FRAME, "RESOURCE_EXHAUSTED"),
        salience_ws(
            "a million tokens to append",
            lambda: json.dumps(
                {
                    "id": "c",
                    "method": "Generate",
                    "request": {"sessionId": "none", "appendTokens": [1] * 1_000_000},
                }
            ),
            "NOT_FOUND",
        ),
    ],
    "evergreen websocket": [
        evergreen_ws("a 16 MiB + 1 frame", lambda: OVER_FRAME),
    ],
    "grpc": [Hostile("a 65 MiB Generate", _oversized_grpc)],
}


@pytest.mark.parametrize("protocol", list(HOSTILE))
async def test_hostile_costs_are_answered_quickly_in_shape(
    live_server: LiveServer, protocol: str
) -> None:
    offences: list[Offence] = []
    for index, hostile in enumerate(HOSTILE[protocol]):
        before, started = _rss(), time.monotonic()
        try:
            reason = await asyncio.wait_for(hostile.send(live_server), ANSWER_S)
        except Exception as exc:  # the harness must name the input, whatever happened
            reason = f"failed: {exc!r}"
        took, grew = time.monotonic() - started, _rss() - before
        if reason is None and took > ANSWER_S:
            reason = f"answered in {took:.1f} s"
        if reason is None and grew > GROWTH_BOUND:
            reason = f"the server grew by {grew >> 20} MiB"
        if reason is not None:
            offences.append(Offence(index, hostile.name, reason))
    verdict(live_server, f"{protocol} (cost)", offences, total=len(HOSTILE[protocol]))
