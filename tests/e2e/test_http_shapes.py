"""Hostile HTTP requests against the live server (real vLLM), all on ONE kept-alive
connection: each is answered with a 4xx in its protocol's shape (OpenAI error body, or a
GraphPipe InferResponse error on /graphpipe), the connection is never closed or reset,
and the server serves a real request on it afterwards with the engine left idle."""

from __future__ import annotations

import json
import socket
from typing import Any

import h11
import numpy as np
import orjson
import pytest

from tests.conftest import LiveServer
from tests.graphpipe_client import Infer, infer_request, read_infer_response

pytestmark = pytest.mark.e2e

_CHAT = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2'


def _chat(extra: bytes) -> bytes:
    return _CHAT + b", " + extra + b"}"


JSON = "application/json"
# (method, path, body, content type, expected status)
HOSTILE: list[tuple[str, str, bytes, str, int]] = [
    ("POST", "/v1/chat/completions", b"[" * 100_000 + b"]" * 100_000, JSON, 400),
    ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "cont', JSON, 400),
    (
        "POST",
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": "\xff"}]}',
        JSON,
        400,
    ),
    ("POST", "/v1/chat/completions", _chat(b'"model": "\\ud800"'), JSON, 400),
    ("POST", "/v1/chat/completions", _chat(b'"temperature": NaN'), JSON, 400),
    ("POST", "/v1/chat/completions", _chat(b'"max_tokens": 1e400'), JSON, 400),
    ("POST", "/v1/chat/completions", _chat(b'"seed": ' + b"9" * 400), JSON, 400),
    ("POST", "/v1/chat/completions", _chat(b'"n": 1000000'), JSON, 400),
    ("POST", "/v1/chat/completions", _chat(b'"temperature": "hot"'), JSON, 400),
    ("POST", "/v1/chat/completions", _chat(b'"stop": {"a": 1}'), JSON, 400),
    ("POST", "/v1/chat/completions", _chat(b'"stream_options": 5'), JSON, 400),
    ("POST", "/v1/chat/completions", _chat(b'"stop_token_ids": [9223372036854775807]'), JSON, 400),
    ("POST", "/v1/chat/completions", b'{"messages": 5}', JSON, 400),
    (
        "POST",
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": [{"type": "x"}]}]}',
        JSON,
        400,
    ),
    ("POST", "/v1/chat/completions", b'{"messages": []}', JSON, 400),
    ("POST", "/v1/chat/completions", b"null", JSON, 400),
    ("POST", "/v1/chat/completions", b"", JSON, 400),
    # Bodies not declared JSON: 415, before they are read.
    ("POST", "/v1/chat/completions", b"a=b", "application/x-www-form-urlencoded", 415),
    ("POST", "/v1/chat/completions", bytes(range(256)) * 64, "application/octet-stream", 415),
    ("POST", "/v1/completions", b'{"prompt": [[-1]], "max_tokens": 1}', JSON, 400),
    ("POST", "/v1/completions", b'{"prompt": "a", "max_tokens": 1, "n": "x"}', JSON, 400),
    # The typed routes answered FastAPI's {"detail": ...}, or a 500 on a lone surrogate.
    ("POST", "/detokenize", b'{"model": "\\ud800", "tokens": [1]}', JSON, 400),
    ("POST", "/detokenize", b'{"tokens": [1]', JSON, 400),
    ("POST", "/detokenize", b'{"tokens": "\xff"}', JSON, 400),
    ("POST", "/tokenize", b'{"prompt": "\\udfff"}', JSON, 400),
    ("POST", "/v1/load_lora_adapter", b"\xff\xfe", JSON, 400),
    ("POST", "/v1/load_lora_adapter", b'{"lora_name": "\\ud800", "lora_path": "/x"}', JSON, 400),
    ("POST", "/v1/unload_lora_adapter", b"[]", JSON, 400),
    ("POST", "/v1/nowhere", b"{}", JSON, 404),
    ("DELETE", "/v1/chat/completions", b"", JSON, 405),
    # GraphPipe's paths answer InferResponse errors, framework errors included.
    ("POST", "/graphpipe", bytes(range(256)), "application/octet-stream", 400),
    ("POST", "/graphpipe", b"", "application/octet-stream", 400),
    ("PUT", "/graphpipe", b"x", "application/octet-stream", 405),
    ("DELETE", "/graphpipe/tiny-lora", b"", "application/octet-stream", 405),
]


def _graphpipe_surrogate_config() -> bytes:
    """GraphPipe's config is parsed by stdlib json, which decodes a lone surrogate; the
    error quoting it failed to encode and the request died as a 500."""
    prompt = np.array([b"def f():"], dtype=object)
    return bytes(infer_request(Infer([prompt], config='{"\\ud800": 1}')))


HOSTILE.append(
    ("POST", "/graphpipe", _graphpipe_surrogate_config(), "application/octet-stream", 400)
)


class Connection:
    """One HTTP/1.1 connection, kept alive; fails the test if the server closes it."""

    def __init__(self, base_url: str) -> None:
        host, port = base_url.removeprefix("http://").split(":")
        self.host = host
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        self.h11 = h11.Connection(our_role=h11.CLIENT)

    def request(
        self, method: str, path: str, body: bytes = b"", content_type: str = JSON
    ) -> tuple[int, dict[str, str], bytes]:
        headers = [("host", self.host), ("content-length", str(len(body)))]
        if body or method in ("POST", "PUT"):
            headers.append(("content-type", content_type))
        out = self.h11.send(h11.Request(method=method, target=path, headers=headers))
        out += self.h11.send(h11.Data(data=body)) if body else b""
        out += self.h11.send(h11.EndOfMessage())
        self.sock.sendall(out)
        status, answer_headers, chunks = 0, {}, []
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                data = self.sock.recv(65536)  # a reset raises here
                assert data, f"{method} {path}: the server closed the connection"
                self.h11.receive_data(data)
            elif isinstance(event, h11.Response):
                status = event.status_code
                answer_headers = {k.decode(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
        assert self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE
        self.h11.start_next_cycle()  # raises unless both sides keep the connection alive
        return status, answer_headers, b"".join(chunks)

    def close(self) -> None:
        self.sock.close()


def _in_shape(path: str, status: int, headers: dict[str, str], body: bytes) -> Any:
    if path == "/graphpipe" or path.startswith("/graphpipe/"):
        assert headers["content-type"] == "application/octet-stream"
        answer = read_infer_response(body)
        assert answer.outputs == [] and len(answer.errors) == 1
        assert answer.errors[0][0] == status
        return answer.errors[0][1]
    assert headers["content-type"] == "application/json"
    error = orjson.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and isinstance(error["type"], str)
    return error


def test_hostile_requests_are_answered_in_shape_on_one_connection(live_server: LiveServer) -> None:
    connection = Connection(live_server.base_url)
    try:
        for method, path, body, content_type, expected in HOSTILE:
            status, headers, answer = connection.request(method, path, body, content_type)
            label = f"{method} {path} {body[:60]!r}"
            assert status == expected, f"{label}: {status} {answer[:300]!r}"
            _in_shape(path, status, headers, answer)
        status, _, answer = connection.request(
            "POST", "/v1/chat/completions", _chat(b'"model": "' + live_server.model.encode() + b'"')
        )
        assert status == 200, answer
        assert orjson.loads(answer)["object"] == "chat.completion"
    finally:
        connection.close()
    assert live_server.wait_idle() == 0


ODD_VALUES: list[Any] = [{"a": [1]}, [None], -(2**64), 1e308, "\u0000"]


def test_an_odd_value_in_every_field_is_answered_in_shape(live_server: LiveServer) -> None:
    """Each field of the completions and chat bodies given each odd value in turn: a
    valid answer or a 4xx in shape, never a 5xx or a dropped connection."""
    from schemas.openai import ChatCompletionRequest, CompletionRequest

    bases: dict[str, tuple[Any, dict[str, Any]]] = {
        "/v1/completions": (CompletionRequest, {"prompt": "def f():"}),
        "/v1/chat/completions": (
            ChatCompletionRequest,
            {"messages": [{"role": "user", "content": "hi"}]},
        ),
    }
    connection = Connection(live_server.base_url)
    statuses = []
    try:
        for path, (model, base) in bases.items():
            for field in model.model_fields:
                for value in ODD_VALUES:
                    body: dict[str, Any] = {
                        "model": live_server.model,
                        **base,
                        "max_tokens": 2,
                        field: value,
                    }
                    status, headers, answer = connection.request(
                        "POST", path, json.dumps(body).encode()
                    )
                    statuses.append(status)
                    label = f"{path} {field}={value!r}: {status} {answer[:300]!r}"
                    assert status == 200 or 400 <= status < 500, label
                    if status >= 400:
                        _in_shape(path, status, headers, answer)
    finally:
        connection.close()
    assert 200 in statuses  # the base bodies are valid: the odd value is what is refused
    assert live_server.wait_idle() == 0
