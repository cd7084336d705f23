"""Big bodies are parsed in the body worker's child process (`app.routes.body_worker`),
never on the serving process's event loop, with the same answers: a JSON body over
`IN_CHILD_BYTES` on every JSON API, a GraphPipe body over it; small ones where they are
read. Fails if a big body is parsed in the serving process, if the child's errors do not
reach the client as the API's own (413, 400), or if a dead child is not replaced."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.config import Settings
from app.errors import InvalidRequest, PayloadTooLarge
from app.main import create_app
from app.objects import AppObjects
from app.protocols.bodies import MAX_JSON_VALUES, parse_json
from app.protocols.graphpipe.decode import InferCall, MetadataCall, decode_request
from app.protocols.graphpipe.reader import Buffer
from app.routes.body_worker import IN_CHILD_BYTES, BodyWorker
from tests.fake_engine import FakeEngine
from tests.graphpipe_client import read_infer_response
from tests.graphpipe_hostile import shared_string


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
    child = worker._child
    assert child is not None and child.pid != os.getpid()
    child.kill()
    child.wait()
    assert await worker.run("json", b"[2]") == [2]
    assert worker._child is not None and worker._child.pid != child.pid


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

    monkeypatch.setattr("app.routes.http.bodies.parse_json", watched)
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
    assert objects.body_worker._child is not None
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

    monkeypatch.setattr("app.routes.apis.graphpipe.decode_request", watched)
    aliased = shared_string(4096, IN_CHILD_BYTES)  # 4,096 offsets to one string
    response = await client.post("/graphpipe", content=aliased)
    assert response.status_code == 413
    [(code, text)] = read_infer_response(response.content).errors
    assert code == 413 and "decodes to more than its own" in text
    assert decoded_here == [] and engine.requests == []
    small = shared_string(2, 1024)
    assert (await client.post("/graphpipe", content=small)).status_code == 413
    assert decoded_here == [len(small)]
