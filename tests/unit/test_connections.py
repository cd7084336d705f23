"""What a connection may hold before it has made a request, on the uvicorn `switchboard
serve` runs (`app.cli.uvicorn_config`) over the fake engine: heads that trickle or never
come are answered 408 and closed within `--header-timeout-s` (the issue's probe: 64
connections that sent half a head were all still open 70 s later), heads too large are
431, connections past `--max-connections` are answered 503 with Retry-After at once,
and honest clients are served throughout."""

from __future__ import annotations

import json
import socket
import time
from contextlib import AbstractContextManager

import httpx
import pytest

from app.routes.http.connections import MAX_HEAD_BYTES, MAX_HEADERS
from tests.fake_engine import FakeEngine
from tests.uvicorn_thread import served_as_switchboard

HALF_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: applic"
DEADLINE_S = 20.0  # a broken server holds the sockets for ever


def served(**settings: object) -> AbstractContextManager[int]:
    """The port of the fake engine's app, served as `switchboard serve` serves it."""
    return served_as_switchboard(FakeEngine(), **settings)


def answer_of(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (or the deadline)."""
    sock.settimeout(DEADLINE_S)
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except TimeoutError:
        raise AssertionError(f"the server kept the connection {DEADLINE_S} s") from None
    return received


def status_and_body(answer: bytes) -> tuple[int, dict[str, object]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=DEADLINE_S)


def honest(port: int) -> int:
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    return httpx.post(url, json=body, timeout=DEADLINE_S).status_code


def test_64_half_heads_are_answered_408_and_closed_while_honest_clients_are_served() -> None:
    with served(header_timeout_s=0.5) as port:
        sockets = [connect(port) for _ in range(64)]
        for sock in sockets:
            sock.sendall(HALF_HEAD)
        assert honest(port) == 200
        answers = [answer_of(sock) for sock in sockets]
        for sock in sockets:
            sock.close()
        silent = connect(port)  # a connection that never sends a byte
        assert status_and_body(answer_of(silent))[0] == 408
        silent.close()
        assert honest(port) == 200
    for answer in answers:
        status, body = status_and_body(answer)
        assert status == 408 and b"connection: close" in answer
        error = body["error"]
        assert isinstance(error, dict) and "did not arrive within 0.5 s" in error["message"]


def test_a_head_that_arrives_in_parts_within_the_timeout_is_served() -> None:
    with served(header_timeout_s=5) as port:
        sock = connect(port)
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        time.sleep(0.2)
        sock.sendall(b"Host: t\r\nConnection: close\r\n\r\n")
        assert answer_of(sock).startswith(b"HTTP/1.1 200")
        sock.close()


def test_the_next_head_on_a_kept_alive_connection_has_the_same_timeout() -> None:
    with served(header_timeout_s=0.5) as port:
        sock = connect(port)
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n" + b"GET /health HT")
        answer = answer_of(sock)
        sock.close()
    assert answer.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 408" in answer


@pytest.mark.parametrize(
    ("head", "message"),
    [
        (b"Host: t\r\nX-Big: " + b"a" * MAX_HEAD_BYTES + b"\r\n", f"over {MAX_HEAD_BYTES} bytes"),
        (b"".join(b"X-%d: a\r\n" % i for i in range(MAX_HEADERS + 1)), f"than {MAX_HEADERS}"),
    ],
)
def test_a_head_too_large_is_431(head: bytes, message: str) -> None:
    with served() as port:
        sock = connect(port)
        sock.sendall(b"GET /health HTTP/1.1\r\n" + head + b"\r\n")
        status, body = status_and_body(answer_of(sock))
        sock.close()
        assert honest(port) == 200
    error = body["error"]
    assert status == 431 and isinstance(error, dict) and message in error["message"]


def test_connections_past_the_cap_are_refused_503_at_once() -> None:
    with served(max_connections=4, header_timeout_s=30) as port:
        held = [connect(port) for _ in range(4)]
        time.sleep(0.2)  # the server has taken them
        refused = connect(port)
        answer = answer_of(refused)
        refused.close()
        status, body = status_and_body(answer)
        assert status == 503 and b"retry-after: 1" in answer
        error = body["error"]
        assert isinstance(error, dict) and "limit of 4 connections" in error["message"]
        held.pop().close()
        time.sleep(0.2)  # the server has seen it go
        assert honest(port) == 200
        for sock in held:
            sock.close()
