"""Which web pages may drive the server, over the fake engine on the uvicorn `switchboard
serve` runs: a websocket upgrade or a request that changes something from a foreign page
is refused (the issue's probe: an upgrade to /salience/ws with `Origin:
http://evil.example` was accepted, cross-site websocket hijacking), the server's own page
(the playground) and the `--allowed-origins` are served, with CORS for the latter as
`vllm serve` answers it, and clients that send no Origin are never affected."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
import websockets
from websockets.exceptions import InvalidStatus

from app.config import Settings
from app.main import create_app
from tests.fake_engine import FakeEngine
from tests.uvicorn_thread import served_as_switchboard

EVIL = "http://evil.example"
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
SOCKETS = ("/salience/ws", "/evergreen/ws", "/v1/responses")


async def _upgrade(port: int, path: str, origin: str | None) -> bool:
    """Whether the upgrade is accepted; a refusal must be an HTTP 403."""
    headers = {} if origin is None else {"Origin": origin}
    try:
        async with websockets.connect(f"ws://127.0.0.1:{port}{path}", additional_headers=headers):
            return True
    except InvalidStatus as refused:
        assert refused.response.status_code == 403
        return False


@pytest.mark.parametrize("path", SOCKETS)
async def test_an_upgrade_from_a_foreign_page_is_refused(path: str) -> None:
    with served_as_switchboard(FakeEngine()) as port:
        assert not await _upgrade(port, path, EVIL)
        assert not await _upgrade(port, path, "null")  # a sandboxed page or a file
        assert not await _upgrade(port, path, f"http://127.0.0.1:{port + 1}")  # another port
        assert await _upgrade(port, path, f"http://127.0.0.1:{port}")  # the playground's page
        assert await _upgrade(port, path, None)  # no browser: any client


async def test_allowed_origins_may_upgrade_and_star_allows_every_page() -> None:
    with served_as_switchboard(FakeEngine(), allowed_origins=["http://ok.example"]) as port:
        assert await _upgrade(port, "/salience/ws", "http://ok.example")
        assert not await _upgrade(port, "/salience/ws", EVIL)
    with served_as_switchboard(FakeEngine(), allowed_origins=['["*"]']) as port:
        assert await _upgrade(port, "/salience/ws", EVIL)


@pytest.fixture
async def client() -> AsyncIterator[tuple[httpx.AsyncClient, FakeEngine]]:
    engine = FakeEngine()
    app = create_app(Settings(model="fake", allowed_origins=["http://ok.example"]), engine=engine)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        yield c, engine


async def test_a_request_that_changes_something_from_a_foreign_page_is_403(
    client: tuple[httpx.AsyncClient, FakeEngine],
) -> None:
    http, engine = client
    refused = await http.post("/v1/chat/completions", json=CHAT, headers={"origin": EVIL})
    assert refused.status_code == 403
    error = refused.json()["error"]
    assert error["type"] == "permission_error" and EVIL in error["message"]
    # A GraphPipe body a page may send as text/plain without a preflight: refused too.
    graphpipe = await http.post(
        "/graphpipe", content=b"\0" * 64, headers={"origin": EVIL, "content-type": "text/plain"}
    )
    assert graphpipe.status_code == 403
    assert engine.requests == []
    for origin in ("http://t", "http://ok.example", None):  # its own page, allowed, no page
        headers = {} if origin is None else {"origin": origin}
        served = await http.post("/v1/chat/completions", json=CHAT, headers=headers)
        assert served.status_code == 200, (origin, served.text)
    # Reads pass: CORS decides whether a page may read the answer.
    assert (await http.get("/v1/models", headers={"origin": EVIL})).status_code == 200


async def test_cors_as_vllm_serve_answers_it(client: tuple[httpx.AsyncClient, FakeEngine]) -> None:
    http, _ = client
    preflight = {
        "origin": "http://ok.example",
        "access-control-request-method": "POST",
        "access-control-request-headers": "content-type, authorization",
    }
    allowed = await http.options("/v1/chat/completions", headers=preflight)
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == "http://ok.example"
    foreign = await http.options("/v1/chat/completions", headers={**preflight, "origin": EVIL})
    assert "access-control-allow-origin" not in foreign.headers
    read = await http.get("/v1/models", headers={"origin": "http://ok.example"})
    assert read.headers["access-control-allow-origin"] == "http://ok.example"


async def test_no_cors_headers_without_allowed_origins() -> None:
    app = create_app(Settings(model="fake"), engine=FakeEngine())
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        read = await http.get("/v1/models", headers={"origin": EVIL})
    assert read.status_code == 200 and "access-control-allow-origin" not in read.headers


def test_vllms_json_list_spelling_is_taken() -> None:
    settings = Settings(model="fake", allowed_origins=['["http://a.example", "http://b.example"]'])
    assert settings.allowed_origins == ["http://a.example", "http://b.example"]
    commas = Settings(model="fake", allowed_origins=["http://a.example,http://b.example"])
    assert commas.allowed_origins == ["http://a.example", "http://b.example"]
    assert json.dumps(Settings(model="fake").allowed_methods) == '["*"]'
