"""Every HTTP answer in its protocol's shape, over the fake engine: FastAPI's and
Starlette's own errors (unknown path, wrong method, unparsable bodies on every JSON route),
error text holding lone surrogates, a bug of ours before the first byte (answered, and the
connection kept), and /openapi.json describing every route and what it answers. The same
hostile bodies against real vLLM are in tests/e2e/test_http_shapes.py."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import numpy as np
import pytest
from pydantic import BaseModel

from app.config import Settings
from app.errors import EngineError, InvalidRequest
from app.main import create_app
from app.protocols.openai.errors import error_body
from app.routes.apis.graphpipe import graphpipe_error
from app.routes.apis.openai import openai_error
from app.routes.http.errors import api_router
from app.routes.http.json import dump_json
from app.wire_text import well_formed
from schemas.openai_replies import (
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CompletionChunk,
    DetokenizeResponse,
    ErrorResponse,
    ModelList,
    TokenizeResponse,
    VersionResponse,
)
from tests.fake_engine import FakeEngine, FakeTokenizer
from tests.graphpipe_client import Infer, infer_request, read_infer_response
from tests.uvicorn_thread import uvicorn_in_thread

JSON_ROUTES = [
    "/v1/completions",
    "/v1/chat/completions",
    "/tokenize",
    "/detokenize",
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
]
# Bodies FastAPI's own parsing answered with {"detail": ...} on the typed routes, or that
# a hand parser must refuse: none may escape the OpenAI shape on any JSON route.
GARBAGE: list[tuple[str, bytes, str]] = [
    ("truncated", b'{"model": "fake", "pro', "application/json"),
    ("invalid utf-8", b'{"model": "\xff\xfe"}', "application/json"),
    ("lone surrogate", b'{"model": "\\ud800"}', "application/json"),
    ("empty", b"", "application/json"),
    ("not an object", b"[1, 2, 3]", "application/json"),
    ("null", b"null", "application/json"),
    ("NaN", b'{"temperature": NaN}', "application/json"),
    ("huge number", b'{"max_tokens": 1e400}', "application/json"),
    ("deep nesting", b"[" * 100_000 + b"]" * 100_000, "application/json"),
    ("form", b"a=b&c=d", "application/x-www-form-urlencoded"),
    ("multipart", b"--x\r\n\r\n--x--", "multipart/form-data; boundary=x"),
    ("binary", bytes(range(256)), "application/octet-stream"),
]


def client(engine: Any = None, **settings: Any) -> httpx.AsyncClient:
    app = create_app(Settings(model="fake", **settings), engine=engine or FakeEngine())
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://t")


def assert_openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    ErrorResponse.model_validate(body)
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


def assert_graphpipe_error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.content
    assert response.headers["content-type"] == "application/octet-stream"
    answer = read_infer_response(response.content)
    assert answer.outputs == [] and len(answer.errors) == 1
    code, message = answer.errors[0]
    assert code == status
    return message


@pytest.mark.parametrize("path", JSON_ROUTES)
@pytest.mark.parametrize(("name", "body", "content_type"), GARBAGE, ids=[g[0] for g in GARBAGE])
async def test_garbage_bodies_get_openai_errors(
    path: str, name: str, body: bytes, content_type: str
) -> None:
    async with client() as c:
        response = await c.post(path, content=body, headers={"content-type": content_type})
    # A body not declared JSON is refused as such (415) before it is read.
    error = assert_openai_error(response, 400 if content_type == "application/json" else 415)
    assert error["type"] == "invalid_request_error"
    assert "There was an error parsing the body" not in error["message"]


async def test_unknown_path_and_wrong_method_are_openai_errors() -> None:
    async with client() as c:
        missing = await c.post("/v1/nope", json={})
        wrong = await c.delete("/v1/models")
        wrong_put = await c.put("/v1/chat/completions", json={})
    assert assert_openai_error(missing, 404)["type"] == "not_found_error"
    error = assert_openai_error(wrong, 405)
    assert error["code"] == "method_not_allowed" and "DELETE /v1/models" in error["message"]
    assert wrong.headers["allow"] == "GET"
    assert_openai_error(wrong_put, 405)


async def test_framework_errors_on_graphpipe_paths_are_infer_responses() -> None:
    async with client() as c:
        wrong = await c.put("/graphpipe", content=b"x")
        wrong_model = await c.delete("/graphpipe/some-adapter")
    assert "PUT /graphpipe" in assert_graphpipe_error(wrong, 405)
    assert_graphpipe_error(wrong_model, 405)
    assert "POST" in wrong.headers["allow"]


async def test_fastapi_validation_errors_are_in_the_routers_shape() -> None:
    # Every shipped route parses its body by hand; a typed parameter added later must
    # still fail in shape, in the shape of the API whose router it joins (nothing picks
    # the shape by path): one route on OpenAI's responder, one on GraphPipe's.
    app = create_app(Settings(model="fake"), engine=FakeEngine())
    openai_routes = api_router(openai_error)
    graphpipe_routes = api_router(graphpipe_error)

    @openai_routes.put("/v1/typed/{n}")
    @graphpipe_routes.put("/graphpipe/typed/{n}")
    async def typed(n: int) -> dict[str, int]:
        return {"n": n}

    # Ahead of the shipped routes: `/graphpipe/{model:path}` would take the path first.
    app.router.routes[:0] = [*openai_routes.routes, *graphpipe_routes.routes]

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        assert (await c.put("/v1/typed/3")).json() == {"n": 3}
        error = assert_openai_error(await c.put("/v1/typed/x"), 400)
        assert error["param"] == "n" and error["type"] == "invalid_request_error"
        assert "n:" in assert_graphpipe_error(await c.put("/graphpipe/typed/x"), 400)


async def test_lone_surrogates_in_error_text_still_render() -> None:
    # stdlib json (GraphPipe's config parser) decodes "\ud800" into a lone surrogate,
    # which the error quotes: the message must still encode, as a 400, not a 500.
    config = '{"\\ud800": 1}'
    async with client() as c:
        call = Infer([np.array([b"ab"], dtype=object)], config=config)
        response = await c.post("/graphpipe", content=infer_request(call))
    assert "\ufffd" in assert_graphpipe_error(response, 400)

    error = InvalidRequest("bad \ud800 value", param="x\udfff")
    assert error.message == "bad \ufffd value" and error.param == "x\ufffd"
    assert json.loads(dump_json(error_body(error)))["error"]["message"] == "bad \ufffd value"


def test_dump_json_repairs_any_string_and_keeps_the_rest() -> None:
    content = {"a\ud800": ["\udfff", ("\ud83d\ude00", 1.5, None)], "ok": "é"}
    assert json.loads(dump_json(content)) == {
        "a\ufffd": ["\ufffd", ["\U0001f600", 1.5, None]],
        "ok": "é",
    }
    assert well_formed("plain") == "plain"


class SurrogateEngine(FakeEngine):
    """Fails mid-stream with a message quoting a lone surrogate."""

    async def generate(self, request: Any) -> Any:
        inner = super().generate(request)
        try:
            async for event in inner:
                yield event
                raise EngineError("it broke on \ud800")
        finally:
            await inner.aclose()


async def test_surrogate_in_stream_error_renders_in_band() -> None:
    async with client(SurrogateEngine()) as c:
        streamed = await c.post(
            "/v1/completions", json={"prompt": "a", "max_tokens": 5, "stream": True}
        )
        plain = await c.post("/v1/completions", json={"prompt": "a", "max_tokens": 5})
    events = [e[len("data: ") :] for e in streamed.text.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["message"] == "it broke on \ufffd"
    assert assert_openai_error(plain, 500)["message"] == "it broke on \ufffd"


class BuggyTokenizer(FakeTokenizer):
    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        raise RuntimeError("a bug of ours")


class BuggyEngine(FakeEngine):
    def __init__(self) -> None:
        super().__init__()
        self._tokenizer = BuggyTokenizer()


async def test_a_bug_before_the_first_byte_is_an_internal_error_in_shape() -> None:
    async with client(BuggyEngine()) as c:
        response = await c.post("/detokenize", json={"tokens": [1, 2]})
    error = assert_openai_error(response, 500)
    assert error["code"] == "internal_error" and "a bug of ours" not in error["message"]
    assert "error id" in error["message"]

    # No engine at all: the dependency fails, on an OpenAI path and on a GraphPipe one.
    app = create_app(Settings(model="fake"))  # lifespan not run: app.state has no engine
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        assert_openai_error(await c.get("/v1/models"), 500)
        assert_graphpipe_error(await c.post("/graphpipe", content=b"x"), 500)


@pytest.fixture(scope="module")
def buggy_server() -> Iterator[int]:
    """uvicorn over the buggy fake engine, on a real socket (keep-alive is the point)."""
    with uvicorn_in_thread(create_app(Settings(model="fake"), engine=BuggyEngine())) as port:
        yield port


def test_the_connection_survives_a_bug(buggy_server: int) -> None:
    # Starlette's own last resort re-raises after its 500 and uvicorn then closes the
    # connection: the next request on it was reset. Two requests, one connection.
    with httpx.Client(base_url=f"http://127.0.0.1:{buggy_server}") as c:
        failed = c.post("/detokenize", json={"tokens": [1]})
        assert_openai_error(failed, 500)
        assert failed.headers.get("connection") != "close"
        ok = c.get("/v1/models")
        assert ok.status_code == 200
    with socket.create_connection(("127.0.0.1", buggy_server), timeout=10) as sock:
        body = b'{"tokens": [1]}'
        request = (
            b"POST /detokenize HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        # Pipelined: the second request is already on the wire when the first one fails.
        sock.sendall(request + b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        received = b""
        while received.count(b"HTTP/1.1 ") < 2 or not received.endswith(b"\r\n\r\n"):
            chunk = sock.recv(65536)
            assert chunk, f"connection closed after {received!r}"
            received += chunk
    assert received.startswith(b"HTTP/1.1 500 ")
    assert b"HTTP/1.1 200 " in received


async def test_success_bodies_match_their_documented_models() -> None:
    async with client() as c:
        completion = await c.post("/v1/completions", json={"prompt": "ab", "max_tokens": 2})
        completion_lp = await c.post(
            "/v1/completions", json={"prompt": "ab", "max_tokens": 2, "logprobs": 2, "echo": True}
        )
        chat = await c.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "a"}], "max_tokens": 2},
        )
        chat_lp = await c.post(
            "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "a"}],
                "max_tokens": 2,
                "logprobs": True,
                "top_logprobs": 2,
            },
        )
        streams = [
            (
                CompletionChunk,
                await c.post(
                    "/v1/completions",
                    json={
                        "prompt": "ab",
                        "max_tokens": 2,
                        "stream": True,
                        "stream_options": {"include_usage": True},
                    },
                ),
            ),
            (
                ChatCompletionChunk,
                await c.post(
                    "/v1/chat/completions",
                    json={
                        "messages": [{"role": "user", "content": "a"}],
                        "max_tokens": 2,
                        "stream": True,
                        "logprobs": True,
                        "stream_options": {"include_usage": True},
                    },
                ),
            ),
        ]
        documented: list[tuple[type[BaseModel], httpx.Response]] = [
            (Completion, completion),
            (Completion, completion_lp),
            (ChatCompletion, chat),
            (ChatCompletion, chat_lp),
            (ModelList, await c.get("/v1/models")),
            (TokenizeResponse, await c.post("/tokenize", json={"prompt": "ab"})),
            (
                TokenizeResponse,
                await c.post(
                    "/tokenize",
                    json={
                        "messages": [{"role": "user", "content": "a"}],
                        "return_token_strs": True,
                    },
                ),
            ),
            (DetokenizeResponse, await c.post("/detokenize", json={"tokens": [97, 98]})),
            (VersionResponse, await c.get("/version")),
        ]
    for model, response in documented:
        assert response.status_code == 200, response.text
        model.model_validate(response.json(), strict=True)
    for chunk_model, response in streams:
        events = [e[len("data: ") :] for e in response.text.split("\n\n") if e]
        assert events[-1] == "[DONE]"
        for event in events[:-1]:
            chunk_model.model_validate(json.loads(event), strict=True)


def _resolve(document: dict[str, Any], node: Any) -> None:
    """Every `$ref` in `node` points at a schema the document has."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if ref is not None:
            assert ref.startswith("#/components/schemas/"), ref
            assert ref.rsplit("/", 1)[1] in document["components"]["schemas"], ref
        assert "$defs" not in node
        for value in node.values():
            _resolve(document, value)
    elif isinstance(node, list):
        for value in node:
            _resolve(document, value)


async def test_openapi_documents_every_route_body_and_answer() -> None:
    async with client() as c:
        document = (await c.get("/openapi.json")).json()
    _resolve(document, document)
    paths = document["paths"]
    json_body = {
        "/v1/completions": "CompletionRequest",
        "/v1/chat/completions": "ChatCompletionRequest",
        "/v1/responses": "ResponsesRequest",
        "/detokenize": "DetokenizeRequest",
        "/v1/load_lora_adapter": "LoadLoraRequest",
        "/v1/unload_lora_adapter": "UnloadLoraRequest",
    }
    for path, model in json_body.items():
        schema = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert schema == {"$ref": f"#/components/schemas/{model}"}
    tokenize = paths["/tokenize"]["post"]["requestBody"]["content"]["application/json"]
    assert len(tokenize["schema"]["anyOf"]) == 2
    for path in ("/graphpipe", "/graphpipe/{model}"):
        body = paths[path]["post"]["requestBody"]["content"]
        assert body == {
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
        }
        for status in ("200", "4XX", "5XX"):
            assert "application/octet-stream" in paths[path]["post"]["responses"][status]["content"]
    for path, operations in paths.items():
        for method, operation in operations.items():
            responses = operation["responses"]
            if "text/html" in responses.get("200", {}).get("content", {}):
                continue  # a page for browsers, not an API
            assert "422" not in responses, (method, path)  # we answer 400, never 422
            assert {"200", "4XX", "5XX"} <= set(responses), (method, path)
            if method == "post" and not path.endswith("/cancel"):  # cancel takes no body
                assert operation["requestBody"]["required"], path
    chat_ok = paths["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    assert chat_ok["application/json"]["schema"] == {"$ref": "#/components/schemas/ChatCompletion"}
    assert "text/event-stream" in chat_ok
    error = paths["/v1/completions"]["post"]["responses"]["4XX"]["content"]["application/json"]
    assert error["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
