"""What a request body may be, on every route that reads one, over the fake engine: within
the route's byte limit (413 in the API's shape, before the body is read past it, whether
its length is declared or it arrives chunked), declared JSON on a JSON API (415: what a
web page sends without asking, `text/plain`, a form or no type at all, never runs), and
holding at most `MAX_JSON_VALUES` JSON values (413 before it is parsed)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.routing import APIRoute

from app.config import Settings
from app.main import create_app
from app.protocols.bodies import MAX_JSON_VALUES, json_values_bound
from tests.fake_engine import FakeEngine
from tests.graphpipe_client import Infer, infer_request, read_infer_response

LIMIT = 4096
_APP = create_app(Settings(model="fake"), engine=FakeEngine())
# Every route that reads a JSON body: every POST but GraphPipe's (a flatbuffer, its own
# limit), a file upload (multipart, its own limit: tests/unit/test_batches_api.py), the
# cancels and the unknown-path catch-alls (they read no body: nothing of one is ever
# held).
JSON_POSTS = sorted(
    re.sub(r"\{[^}]*\}", "x", route.path)
    for route in _APP.routes
    if isinstance(route, APIRoute)
    and route.include_in_schema
    and "POST" in route.methods
    and not route.path.startswith("/graphpipe")
    and not route.path.endswith("/cancel")
    and route.path != "/v1/files"
)
ANTHROPIC = ("/v1/messages", "/v1/messages/count_tokens", "/v1/messages/batches")
# A Message Batch's body is bounded as a batch input file is, not as a JSON API's.
LIMITS = {"/v1/messages/batches": Settings(model="fake").batch_max_input_bytes}


def test_every_json_api_route_is_listed() -> None:
    # The list above is read from the app: a route added later is covered by itself.
    assert {"/v1/chat/completions", "/v1/responses", "/v1/messages", "/tokenize"} <= set(JSON_POSTS)
    assert len(JSON_POSTS) >= 14


@pytest.fixture
async def client() -> AsyncIterator[tuple[httpx.AsyncClient, FakeEngine]]:
    engine = FakeEngine()
    app = create_app(Settings(model="fake", max_request_body_bytes=LIMIT), engine=engine)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        yield c, engine


def error_of(path: str, response: httpx.Response, status: int) -> dict[str, Any]:
    """The error in the shape of the API `path` belongs to: Anthropic's or OpenAI's."""
    assert response.status_code == status, response.text
    body = response.json()
    if path in ANTHROPIC:
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
        return dict(body["error"])
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


@pytest.mark.parametrize("path", JSON_POSTS)
async def test_a_declared_length_over_the_limit_is_413_before_any_of_it_is_read(
    path: str,
) -> None:
    app = create_app(Settings(model="fake", max_request_body_bytes=LIMIT), engine=FakeEngine())
    received = 0
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal received
        received += 1
        return {"type": "http.request", "body": b"{" * 1024, "more_body": True}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(1 << 40).encode()),
        ],
        "http_version": "1.1",
        "scheme": "http",
        "server": ("t", 80),
        "client": ("c", 1),
        "root_path": "",
        "app": app,
    }
    await app(scope, receive, send)
    assert received == 0
    assert sent[0]["status"] == 413
    response = httpx.Response(413, content=b"".join(m.get("body", b"") for m in sent[1:]))
    error = error_of(path, response, 413)
    limit = LIMITS.get(path, LIMIT)
    assert f"{1 << 40} bytes is over this server's limit of {limit} bytes" in error["message"]
    kind = "request_too_large" if path in ANTHROPIC else "invalid_request_error"
    assert error["type"] == kind


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/responses"])
async def test_a_chunked_body_is_refused_once_it_passes_the_limit(
    client: tuple[httpx.AsyncClient, FakeEngine], path: str
) -> None:
    http, engine = client
    pulled = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal pulled
        for _ in range(1000):  # 1 MiB in all, were it all read
            pulled += 1
            yield b" " * 1024

    response = await http.post(path, content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in response.request.headers
    error = error_of(path, response, 413)
    assert "at least" in error["message"] and f"limit of {LIMIT} bytes" in error["message"]
    assert engine.requests == []


@pytest.mark.parametrize("path", JSON_POSTS)
@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        None,
    ],
)
async def test_a_body_not_declared_json_is_415_and_never_runs(
    client: tuple[httpx.AsyncClient, FakeEngine], path: str, content_type: str | None
) -> None:
    http, engine = client
    body = b'{"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
    # No type at all: what a web page's Blob body sends (httpx adds none to raw content).
    headers = {} if content_type is None else {"content-type": content_type}
    response = await http.post(path, content=body, headers=headers)
    assert response.request.headers.get("content-type") == content_type
    error = error_of(path, response, 415)
    assert "application/json" in error["message"]
    assert error["type"] == "invalid_request_error"
    assert engine.requests == []


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON",
        "application/vnd.x+json",
    ],
)
async def test_json_declared_any_way_is_taken(
    client: tuple[httpx.AsyncClient, FakeEngine], content_type: str
) -> None:
    http, _ = client
    body = b'{"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
    response = await http.post(
        "/v1/chat/completions", content=body, headers={"content-type": content_type}
    )
    assert response.status_code == 200, response.text


async def test_a_body_of_too_many_json_values_is_413_before_it_is_parsed() -> None:
    engine = FakeEngine()
    app = create_app(Settings(model="fake"), engine=engine)  # the default body limit
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    dense = b"[" + b"{}," * MAX_JSON_VALUES + b"{}]"  # 768 KiB: a million objects
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as big:
        for path in ("/v1/chat/completions", "/v1/messages"):
            response = await big.post(
                path, content=dense, headers={"content-type": "application/json"}
            )
            error = error_of(path, response, 413)
            assert f"at most {MAX_JSON_VALUES}" in error["message"]
    assert engine.requests == []


def test_the_value_count_is_an_upper_bound() -> None:
    assert json_values_bound(b"{}") == 2
    assert json_values_bound(b'{"a": [1, 2, {"b": 3}]}') >= 6
    assert json_values_bound('{"s": "a,b"}') == 3  # inside a string too: it errs high
    assert json_values_bound(memoryview(b"[1,2]")) == 3


async def test_graphpipe_bodies_over_its_own_limit_are_413_infer_responses() -> None:
    app = create_app(Settings(model="fake", graphpipe_max_request_bytes=LIMIT), engine=FakeEngine())
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    tensor = np.empty(1, dtype=object)
    tensor[:] = [b"x" * 8192]
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        response = await http.post("/graphpipe", content=infer_request(Infer([tensor])))
    assert response.status_code == 413
    [(code, text)] = read_infer_response(response.content).errors
    assert code == 413 and f"limit of {LIMIT} bytes" in text
