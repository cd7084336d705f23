"""The response store across processes and restarts, on real vLLM.

Two Switchboard replicas share one real redis-server (started here on a free loopback
port): replica A is an app on the live server's engine, served on its own port; replica B
is a separate `switchboard serve` process with its own engine (the live engine stays idle
meanwhile). A conversation stored on A is continued on B; background responses running
on B are cancelled through A (the cancel flag in the store, read by the owner). Then a
store that cannot be reached fails only the calls that need it, and the SQLite store
keeps its responses across an app's restart.

How these fail: B cannot see A's record (404), or renders a different prompt than the
chat route does for the whole conversation; a cancel through A leaves B's runs going (B's
records end `incomplete` with every token, B's engine stays busy); a down store breaks
`store: false` calls, or answers something other than 503 `store_unavailable`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT, LiveServer, free_port, tiny_model_path
from tests.redis_server import redis_server
from tests.replicas import app_on_live_engine

pytestmark = pytest.mark.e2e

START_TIMEOUT_S = 600.0
DEADLINE_S = 60.0
LONG = 960  # tokens: the tiny model's context less the prompt


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield url


@pytest.fixture(scope="module")
def replica_b(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`switchboard serve` in a process of its own, on the shared store."""
    port = free_port()
    log = tmp_path_factory.mktemp("replica-b") / "serve.log"
    command = [
        sys.executable, "-m", "app.cli", "serve",
        "--model", str(tiny_model_path()),
        "--served-model-name", "tiny",
        "--port", str(port),
        "--grpc-port", "0",
        "--dtype", "float32",
        "--max-model-len", "1024",
        "--responses-store", redis_url,
    ]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert process.poll() is None, f"serve exited: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "serve did not become ready in time"
            try:
                if httpx.get(f"{base}/ready", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        warm = {"model": "tiny", "input": "warm up", "max_output_tokens": 2, "store": False}
        httpx.post(f"{base}/v1/responses", json=warm, timeout=300).raise_for_status()
        yield base
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(30)


def _tokens(base: str, messages: list[dict[str, Any]]) -> int:
    answer = httpx.post(f"{base}/tokenize", json={"model": "tiny", "messages": messages})
    return int(answer.json()["count"])


def test_a_conversation_continues_on_another_replica(
    live_server: LiveServer, redis_url: str, replica_b: str
) -> None:
    with app_on_live_engine(live_server, responses_store=redis_url) as replica_a:
        first = httpx.post(
            f"{replica_a}/v1/responses",
            json={"model": "tiny", "input": "one", "max_output_tokens": 5, "temperature": 0},
            timeout=120,
        ).json()
        second = httpx.post(
            f"{replica_b}/v1/responses",
            json={
                "model": "tiny",
                "input": "two",
                "previous_response_id": first["id"],
                "max_output_tokens": 5,
            },
            timeout=120,
        )
        assert second.status_code == 200, second.text
        text = first["output"][0]["content"][0]["text"]
        messages = [
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": text},
            {"role": "user", "content": "two"},
        ]
        assert second.json()["usage"]["input_tokens"] == _tokens(replica_a, messages)
        # Each replica reads what the other stored.
        assert httpx.get(f"{replica_b}/v1/responses/{first['id']}").json() == first
        second_id = second.json()["id"]
        assert httpx.get(f"{replica_a}/v1/responses/{second_id}").json() == second.json()
        items = httpx.get(f"{replica_a}/v1/responses/{second_id}/input_items").json()
        assert [i["content"][0]["text"] for i in items["data"]] == ["two"]
        assert httpx.delete(f"{replica_a}/v1/responses/{second_id}").status_code == 200
        assert httpx.get(f"{replica_b}/v1/responses/{second_id}").status_code == 404


def test_cancel_on_one_replica_aborts_the_run_on_another(
    live_server: LiveServer, redis_url: str, replica_b: str
) -> None:
    runs = 24  # x LONG tokens: several seconds of B's engine
    body = {
        "model": "tiny",
        "max_output_tokens": LONG,
        "temperature": 0,
        "ignore_eos": True,
        "background": True,
    }
    ids = [
        httpx.post(f"{replica_b}/v1/responses", json={**body, "input": f"story {i}"}).json()["id"]
        for i in range(runs)
    ]
    with app_on_live_engine(live_server, responses_store=redis_url) as replica_a:
        deadline = time.monotonic() + DEADLINE_S
        while httpx.get(f"{replica_a}/v1/responses/{ids[-1]}").json()["status"] == "queued":
            assert time.monotonic() < deadline, "B never started its runs"
            time.sleep(0.05)

        async def cancel_all() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=replica_a, timeout=60) as client:
                return await asyncio.gather(
                    *(client.post(f"/v1/responses/{i}/cancel") for i in ids)
                )

        cancelled = asyncio.run(cancel_all())
    for answer in cancelled:
        response = answer.json()
        assert response["status"] == "cancelled", response
        assert response["usage"]["output_tokens"] < LONG
    deadline = time.monotonic() + DEADLINE_S
    while _engine_requests(replica_b):
        assert time.monotonic() < deadline, "B's engine still runs the cancelled responses"
        time.sleep(0.1)


def _engine_requests(base: str) -> float:
    total = 0.0
    for line in httpx.get(f"{base}/metrics").text.splitlines():
        if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_store_that_is_down_fails_only_the_calls_that_need_it(live_server: LiveServer) -> None:
    down = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    with app_on_live_engine(live_server, responses_store=down) as replica:
        base = {"model": "tiny", "input": "x", "max_output_tokens": 3}
        unstored = httpx.post(f"{replica}/v1/responses", json={**base, "store": False}, timeout=60)
        assert unstored.status_code == 200 and unstored.json()["status"] in (
            "completed",
            "incomplete",
        )
        for answer in (
            httpx.post(f"{replica}/v1/responses", json=base, timeout=60),
            httpx.post(
                f"{replica}/v1/responses",
                json={**base, "previous_response_id": "resp_x"},
                timeout=60,
            ),
            httpx.get(f"{replica}/v1/responses/resp_x"),
            httpx.post(f"{replica}/v1/responses", json={**base, "background": True}, timeout=60),
        ):
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"]["code"] == "store_unavailable"
        streamed = httpx.post(f"{replica}/v1/responses", json={**base, "stream": True}, timeout=60)
        events = [line for line in streamed.text.splitlines() if line.startswith("event: ")]
        assert events[-2:] == ["event: error", "event: response.failed"], events
        assert "store_unavailable" in streamed.text
    assert live_server.wait_idle() == 0


def test_sqlite_keeps_responses_across_a_restart(live_server: LiveServer, tmp_path: Path) -> None:
    store = str(tmp_path / "state" / "responses.sqlite3")
    with app_on_live_engine(live_server, responses_store=store) as before:
        first = httpx.post(
            f"{before}/v1/responses",
            json={"model": "tiny", "input": "remember me", "max_output_tokens": 4},
            timeout=60,
        ).json()
    with app_on_live_engine(live_server, responses_store=store) as after:
        assert httpx.get(f"{after}/v1/responses/{first['id']}").json() == first
        follow_up = httpx.post(
            f"{after}/v1/responses",
            json={
                "model": "tiny",
                "input": "and now?",
                "previous_response_id": first["id"],
                "max_output_tokens": 4,
            },
            timeout=60,
        )
        assert follow_up.status_code == 200, follow_up.text
