"""Issue 38's probes against the live server (real vLLM and its renderer), one hostile
client at a time: each is answered quickly in its protocol's shape, the server's memory
stays flat, and an honest chat is served after it. (The same bounds in detail, and the
connection-level probes, are unit tests over the fake engine: tests/unit/test_bodies.py,
test_graphpipe_cost.py, test_request_templates.py, test_prompt_work.py,
test_connections.py, test_stream_backlog.py.)"""

from __future__ import annotations

import json
import socket

import httpx
import psutil
import pytest
import websockets

from app.protocols.conversation.plan import UNTRUSTED_TEMPLATE
from tests.conftest import LiveServer
from tests.graphpipe_client import read_infer_response
from tests.graphpipe_hostile import shared_string

pytestmark = pytest.mark.e2e

# Generous: a correct server stays within tens of MiB; the probes grew it by gigabytes.
GROWTH_BOUND = 256 << 20
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _rss() -> int:
    """The live server's memory: it runs in this process (tests/conftest.py)."""
    return int(psutil.Process().memory_info().rss)


def _honest_chat(live: LiveServer) -> None:
    response = httpx.post(
        f"{live.base_url}/v1/chat/completions", json={"model": live.model, **CHAT}, timeout=120
    )
    assert response.status_code == 200, response.text


def test_a_graphpipe_string_shared_by_4096_offsets_is_413(live_server: LiveServer) -> None:
    before = _rss()
    body = shared_string(4096, 256 * 1024)  # 272 KiB on the wire; 1 GiB decoded before
    response = httpx.post(f"{live_server.base_url}/graphpipe", content=body, timeout=60)
    assert response.status_code == 413
    [(code, message)] = read_infer_response(response.content).errors
    assert code == 413 and "decodes to more than its own" in message
    assert _rss() - before < GROWTH_BOUND
    _honest_chat(live_server)


def test_a_64_mib_json_body_is_413_before_it_is_read(live_server: LiveServer) -> None:
    """Declared 64 MiB, and only its head sent: answered at once, nothing read."""
    before = _rss()
    host, port = live_server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n{" % (64 << 20)
        )
        answer = b""
        while b"bytes" not in answer:  # the head, then the body: both before any read
            chunk = sock.recv(65536)
            assert chunk, f"closed after {answer!r}"
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"over this server's limit of 33554432 bytes" in answer
    assert _rss() - before < GROWTH_BOUND
    _honest_chat(live_server)


def test_a_request_chat_template_is_refused_and_never_rendered(live_server: LiveServer) -> None:
    template = "{% for m in messages %}EVIL-TEMPLATE{{ m.content }}{% endfor %}"
    for extra in (
        {"chat_template_kwargs": {"chat_template": template}},
        {"chat_template": template},
    ):
        response = httpx.post(
            f"{live_server.base_url}/v1/chat/completions/render",
            json={"model": live_server.model, **CHAT, **extra},
            timeout=60,
        )
        assert response.status_code == 400, response.text
        assert response.json()["error"]["message"] == UNTRUSTED_TEMPLATE
        assert "EVIL-TEMPLATE" not in response.text


def test_a_text_plain_json_chat_from_a_page_never_runs(live_server: LiveServer) -> None:
    """What any web page may send without a CORS preflight: refused for its Origin (403),
    and for its type even without one (415)."""
    body = json.dumps({"model": live_server.model, **CHAT})
    for content_type in ("text/plain", "text/plain;charset=UTF-8"):
        for origin, status in (("http://evil.example", 403), (None, 415)):
            headers = {"content-type": content_type}
            if origin is not None:
                headers["origin"] = origin
            response = httpx.post(
                f"{live_server.base_url}/v1/chat/completions",
                content=body,
                headers=headers,
                timeout=60,
            )
            assert response.status_code == status, response.text
            assert "message" in response.json()["error"]
    assert live_server.wait_idle() == 0


async def test_an_upgrade_from_a_foreign_page_is_refused(live_server: LiveServer) -> None:
    """Cross-site websocket hijacking: the upgrade was accepted (101)."""
    for path in ("/salience/ws", "/evergreen/ws", "/v1/responses"):
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            async with websockets.connect(
                live_server.ws_url + path, additional_headers={"Origin": "http://evil.example"}
            ):
                pass
        assert refused.value.response.status_code == 403
        async with websockets.connect(
            live_server.ws_url + path, additional_headers={"Origin": live_server.base_url}
        ):
            pass  # the playground's own page


def test_tokenize_of_a_16_mib_prompt_is_refused_before_tokenizing(live_server: LiveServer) -> None:
    """Tokenized on the event loop before: an honest chat beside it waited 15.8 s."""
    response = httpx.post(
        f"{live_server.base_url}/tokenize",
        json={"model": live_server.model, "prompt": "x " * (8 << 20)},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    assert "maximum context length is 1024 tokens" in response.json()["error"]["message"]
    _honest_chat(live_server)
