"""Big bodies are parsed in the body worker's child processes (`app.routes.body_worker`),
never on the serving process's event loop, with the same answers: a JSON body over
`IN_CHILD_BYTES` on every JSON API, a GraphPipe body over it; small ones where they are
read. Fails if a big body is parsed in the serving process, if the child's errors do not
reach the client as the API's own (413, 400), if a dead child is not replaced, if a
child keeps the memory a big body held, if a child stays in the serving process's
session (its scheduling group) or outlives the server, if one client's big bodies hold
up another's until all of them are parsed, if a client's turn is not its tenant's where
a key names one, or if a big Responses websocket frame is parsed on the event loop."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Hashable
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil
import pytest
from starlette.testclient import TestClient, WebSocketTestSession

from app.config import Settings
from app.errors import InvalidRequest, PayloadTooLarge
from app.main import create_app
from app.objects import AppObjects
from app.protocols.bodies import MAX_JSON_VALUES, parse_json
from app.protocols.graphpipe.decode import InferCall, MetadataCall, decode_request
from app.protocols.graphpipe.reader import Buffer
from app.routes.body_worker import CHILD_NICENESS, IN_CHILD_BYTES, BodyWorker, Pieces
from tests.fake_engine import FakeEngine
from tests.graphpipe_client import read_infer_response
from tests.graphpipe_hostile import shared_string
from tests.waits import until

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def worker() -> AsyncIterator[BodyWorker]:
    made = BodyWorker()
    yield made
    await made.close()


async def test_the_child_answers_the_parsed_value_or_the_parsing_error(
    worker: BodyWorker,
) -> None:
    assert await worker.run("json", b'{"a": [1, "b"]}') == {"a": [1, "b"]}
    with pytest.raises(InvalidRequest, match="not valid JSON"):
        await worker.run("json", b'{"a": ')
    with pytest.raises(PayloadTooLarge, match=f"at most {MAX_JSON_VALUES}"):
        await worker.run("json", b"[" + b"0," * MAX_JSON_VALUES + b"0]")


async def test_a_dead_child_is_replaced(worker: BodyWorker) -> None:
    assert await worker.run("json", b"[1]") == [1]
    child = worker._children[0].process
    assert child is not None and child.pid != os.getpid()
    child.kill()
    child.wait()
    assert await worker.run("json", b"[2]") == [2]
    replaced = worker._children[0].process
    assert replaced is not None and replaced.pid != child.pid


@pytest.mark.skipif(sys.platform != "linux", reason="sessions and autogroups: Linux")
async def test_a_child_runs_in_a_session_of_its_own_at_its_niceness(worker: BodyWorker) -> None:
    # In the serving process's session it shared the serving process's scheduling group:
    # its niceness weighed against the frontend's threads only, not against the engine.
    assert await worker.run("json", b"[1]") == [1]
    child = worker._children[0].process
    assert child is not None
    assert os.getsid(child.pid) == child.pid != os.getsid(0)
    assert os.getpriority(os.PRIO_PROCESS, child.pid) == CHILD_NICENESS
    autogroup = Path(f"/proc/{child.pid}/autogroup")
    if autogroup.exists():  # set before the child serves its first job
        assert autogroup.read_text().split()[-1] == str(CHILD_NICENESS)


# A serving process: a body worker, one job (its child started), the child's pid told.
SERVER = """
import asyncio, time
from app.routes.body_worker import BodyWorker

async def main() -> None:
    worker = BodyWorker()
    await worker.run("json", b"[1]")
    print(worker._children[0].process.pid, flush=True)
    time.sleep(60)

asyncio.run(main())
"""


@pytest.mark.skipif(sys.platform != "linux", reason="sessions: Linux")
async def test_a_child_ends_with_its_server() -> None:
    # Out of the server's session, a signal to the server's process group misses it.
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    child = 0
    try:
        assert server.stdout is not None
        child = int(await asyncio.to_thread(server.stdout.readline))
        assert psutil.pid_exists(child) and os.getsid(child) != os.getsid(server.pid)
        server.kill()
        server.wait()
        await until(lambda: not psutil.pid_exists(child), "the child to end with its server", 10)
    finally:
        server.kill()
        server.wait()
        if child and psutil.pid_exists(child):
            os.kill(child, 9)


async def test_a_body_as_read_reaches_the_child_in_its_pieces(worker: BodyWorker) -> None:
    """The chunks a transport read, written to the child one after another (never
    joined in the serving process), parse as the whole body does, big or small; the
    child's pipes are a MiB wide where the system allows it."""
    body = json.dumps({"messages": [{"role": "user", "content": "x " * IN_CHILD_BYTES}]})
    whole = body.encode()
    cut = [whole[i : i + 65536] for i in range(0, len(whole), 65536)]
    big = Pieces(tuple(cut), len(whole))
    assert len(big) > IN_CHILD_BYTES and len(cut) > 1
    assert await worker.parse("json", big, client=None) == json.loads(body)
    small = Pieces((b'{"a": ', b"[1]}"), 10)
    assert await worker.parse("json", small, client=None) == {"a": [1]}
    child = worker._children[0].process
    assert child is not None and child.stdin is not None
    if sys.platform == "linux":
        import fcntl

        assert fcntl.fcntl(child.stdin.fileno(), fcntl.F_GETPIPE_SZ) == 1 << 20


async def test_a_child_gives_back_what_a_big_body_held(
    worker: BodyWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # glibc's allocator kept what parsing a 16 MiB chat freed: ~45-65 MiB more for good
    # in each child. The serving process's copies are given back later (`trim_soon`).
    soon: list[bool] = []
    monkeypatch.setattr("app.routes.body_worker.trim_soon", lambda: soon.append(True))
    assert await worker.run("json", b"[1]") == [1]
    child = worker._children[0].process
    assert child is not None
    before = psutil.Process(child.pid).memory_info().rss
    body = json.dumps({"messages": [{"role": "user", "content": "x " * (8 << 20)}]}).encode()
    for _ in range(3):
        assert len((await worker.run("json", body))["messages"][0]["content"]) == 16 << 20
    # It gives its memory back once its answer is written: not before the answer is read.
    resident = psutil.Process(child.pid).memory_info
    await until(
        lambda: resident().rss - before < len(body) // 2, "the child to give the bodies back", 10
    )
    assert len(soon) == 4


async def test_one_clients_big_bodies_do_not_hold_up_anothers(worker: BodyWorker) -> None:
    # A client that sends many big bodies at once, then another client's one: the other's
    # is parsed in its turn (at the first child free), not after the whole queue (the one
    # serial worker parsed them in arrival order, so it finished last).
    dense = b"[" + b"0," * (MAX_JSON_VALUES - 2) + b"0]"  # about 10 ms of parsing each
    hostile = [asyncio.create_task(worker.run("json", dense, client="hostile")) for _ in range(8)]
    honest = asyncio.create_task(worker.run("json", b"[1]", client="honest"))
    assert await honest == [1]
    assert not all(task.done() for task in hostile)
    assert [len(value) for value in await asyncio.gather(*hostile)] == [MAX_JSON_VALUES - 1] * 8


def _watched(worker: BodyWorker, turns: list[Hashable]) -> Any:
    """`worker.run`, recording each job's client."""
    run = worker.run

    async def watched(job: str, raw: Any, *, client: Hashable = None, **arguments: Any) -> Any:
        turns.append(client)
        return await run(job, raw, client=client, **arguments)

    return watched


async def test_a_big_bodys_turn_is_its_tenants_where_a_key_names_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two keys of one tenant share its turn, another tenant has its own, whatever
    address they come from; a keyless server's clients are told apart by address."""
    turns: list[Hashable] = []
    # Two tokens: without a bound the fake engine writes the rest of its 1M-token context
    # (100 s of the suite's CPU for four answers nobody reads).
    content = "y" * (IN_CHILD_BYTES + 1)
    body = {"model": "fake", "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    for settings, keys in (
        (Settings(model="fake", tenant_api_key=["acme:a", "acme:b", "other:c"]), "abc"),
        (Settings(model="fake"), "-"),
    ):
        app = create_app(settings, engine=FakeEngine(max_model_len=1 << 20))
        objects: AppObjects = app.state.objects
        monkeypatch.setattr(objects.body_worker, "run", _watched(objects.body_worker, turns))
        transport = httpx.ASGITransport(app=app, client=("10.0.0.7", 1234))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            for key in keys:
                headers = {"authorization": f"Bearer {key}"}
                response = await client.post("/v1/chat/completions", json=body, headers=headers)
                assert response.status_code == 200, response.text
        await objects.body_worker.close()
    assert turns == [
        ("tenant", "acme"),
        ("tenant", "acme"),
        ("tenant", "other"),
        ("peer", "10.0.0.7"),
    ]


@pytest.fixture
async def served() -> AsyncIterator[tuple[httpx.AsyncClient, AppObjects, FakeEngine]]:
    engine = FakeEngine(max_model_len=1 << 20)  # room for a prompt of a big body
    app = create_app(Settings(model="fake"), engine=engine)
    objects: AppObjects = app.state.objects
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        yield client, objects, engine
    await objects.body_worker.close()


def _parsed_here(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the bodies the serving process parses itself."""
    sizes: list[int] = []

    def watched(raw: Any) -> Any:
        sizes.append(len(raw))
        return parse_json(raw)

    monkeypatch.setattr("app.protocols.bodies.parse_json", watched)
    return sizes


async def test_a_big_chat_body_is_parsed_in_the_child_and_answered_as_ever(
    served: tuple[httpx.AsyncClient, AppObjects, FakeEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, objects, engine = served
    here = _parsed_here(monkeypatch)
    text = "y" * (IN_CHILD_BYTES + 1024)
    body = {"model": "fake", "messages": [{"role": "user", "content": text}], "max_tokens": 2}
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert here == []  # not parsed by the serving process
    assert objects.body_worker._children[0].process is not None
    [request] = engine.requests
    assert len(request.prompt_token_ids or ()) > len(text)  # the prompt holds the text
    small = {**body, "messages": [{"role": "user", "content": "hi"}]}
    assert (await client.post("/v1/chat/completions", json=small)).status_code == 200
    assert len(here) == 1  # a small body keeps the fast path


async def test_a_big_bodys_errors_are_the_apis_own(
    served: tuple[httpx.AsyncClient, AppObjects, FakeEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _, engine = served
    here = _parsed_here(monkeypatch)
    broken = b'{"model": "fake", "prompt": "' + b"z" * IN_CHILD_BYTES + b'"'
    headers = {"content-type": "application/json"}
    response = await client.post("/v1/completions", content=broken, headers=headers)
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["error"]["message"]
    dense = json.dumps([{}] * (MAX_JSON_VALUES + 1)).encode()
    assert len(dense) > IN_CHILD_BYTES
    response = await client.post("/v1/messages", content=dense, headers=headers)
    assert response.status_code == 413 and response.json()["type"] == "error"
    assert f"at most {MAX_JSON_VALUES}" in response.json()["error"]["message"]
    assert here == [] and engine.requests == []


async def test_a_big_graphpipe_body_is_decoded_in_the_child(
    served: tuple[httpx.AsyncClient, AppObjects, FakeEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    client, _, engine = served
    decoded_here: list[int] = []

    def watched(buf: Buffer, *, max_bytes: int) -> InferCall | MetadataCall:
        decoded_here.append(len(buf))
        return decode_request(buf, max_bytes=max_bytes)

    monkeypatch.setattr("app.protocols.graphpipe.decode.decode_request", watched)
    aliased = shared_string(4096, IN_CHILD_BYTES)  # 4,096 offsets to one string
    response = await client.post("/graphpipe", content=aliased)
    assert response.status_code == 413
    [(code, text)] = read_infer_response(response.content).errors
    assert code == 413 and "decodes to more than its own" in text
    assert decoded_here == [] and engine.requests == []
    small = shared_string(2, 1024)
    assert (await client.post("/graphpipe", content=small)).status_code == 413
    assert decoded_here == [len(small)]


ANSWERED = ("response.completed", "response.incomplete")  # ended, or out of tokens


def _answered(ws: WebSocketTestSession) -> str:
    """A response's last event's type on the Responses websocket."""
    event: dict[str, Any] = ws.receive_json()
    while event["type"] not in (*ANSWERED, "response.failed", "error"):
        event = ws.receive_json()
    return str(event["type"])


def test_a_big_responses_websocket_frame_is_parsed_in_the_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A frame of up to 16 MiB was parsed on the event loop, as an HTTP body was: watched
    # at orjson itself, whoever calls it in this process.
    parsed: list[int] = []
    loads = orjson.loads

    def watched(raw: Any) -> Any:
        parsed.append(len(raw))
        return loads(raw)

    monkeypatch.setattr(orjson, "loads", watched)
    app = create_app(Settings(model="fake"), engine=FakeEngine(max_model_len=1 << 20))
    create = {"type": "response.create", "model": "fake", "max_output_tokens": 2}
    with TestClient(app) as client, client.websocket_connect("/v1/responses") as ws:
        ws.send_json({**create, "input": "y" * (IN_CHILD_BYTES + 1024)})
        assert _answered(ws) in ANSWERED
        assert parsed == [] or max(parsed) < IN_CHILD_BYTES  # not parsed in this process
        ws.send_json({**create, "input": "hi"})
        assert _answered(ws) in ANSWERED
        assert parsed  # a small frame keeps the fast path
