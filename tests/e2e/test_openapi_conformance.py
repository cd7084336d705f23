"""Schemathesis against the live server's own /openapi.json (real vLLM): for every HTTP
operation, requests generated from the documented schema, valid and invalid, must be
answered without a 5xx (503 allowed: the engine is down), with a documented status and
content type, and a body that matches the documented schema (OpenAI error bodies,
GraphPipe flatbuffers, completions and chunks).

Bounded: a fixed seed (derandomized), a few examples per operation, and generations cut
to a couple of tokens, so the whole run adds seconds, not minutes, to the suite.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app.config import Settings
from app.main import create_app
from tests.conftest import LiveServer
from tests.fake_engine import FakeEngine

pytestmark = pytest.mark.e2e

MAX_TOKENS = 2
EXAMPLES = 25  # per operation and generation mode
CHECKS = [status_code_conformance, content_type_conformance, response_schema_conformance]


def _cases() -> list[tuple[str, str, GenerationMode]]:
    """(METHOD, path, mode) for every documented operation, read from the app's own
    document (the live server serves the same one; this only names the test cases).
    Invalid input is generated for JSON bodies (any bytes are a GraphPipe body, any string
    a path parameter)."""
    document = create_app(Settings(model="fake"), engine=FakeEngine()).openapi()
    cases = []
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            cases.append((method.upper(), path, GenerationMode.POSITIVE))
            if "application/json" in operation.get("requestBody", {}).get("content", {}):
                cases.append((method.upper(), path, GenerationMode.NEGATIVE))
    return cases


@pytest.fixture(scope="module")
def http() -> Iterator[requests.Session]:
    with requests.Session() as session:
        yield session


@pytest.fixture(scope="module")
def api_schema(live_server: LiveServer) -> Any:
    schema = schemathesis.openapi.from_url(f"{live_server.base_url}/openapi.json")
    schema.config.update(base_url=live_server.base_url)
    return schema


def _bounded(body: Any, lora: str) -> Any:
    """The generated body with its generation cut short (a schema-valid max_tokens can ask
    for the whole context, `n` for 128 choices); everything else as generated."""
    if not isinstance(body, dict):
        return body
    body = dict(body)
    if "lora_name" in body:
        if body["lora_name"] == lora:  # never unload the adapter other tests use
            body["lora_name"] = f"not-{lora}"
        return body
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        if not isinstance(body.get(key), int) or body[key] > MAX_TOKENS:
            body[key] = MAX_TOKENS
    if isinstance(body.get("n"), int) and body["n"] > 2:
        body["n"] = 2
    if isinstance(body.get("prompt"), list):
        body["prompt"] = body["prompt"][:4]
    return body


def _bounded_request(request: Any) -> Any:
    """A Message Batch's request with its generation cut short, as `_bounded`."""
    if isinstance(request, dict) and isinstance(request.get("params"), dict):
        params = request["params"]
        if not isinstance(params.get("max_tokens"), int) or params["max_tokens"] > MAX_TOKENS:
            return {**request, "params": {**params, "max_tokens": MAX_TOKENS}}
    return request


def _bounded_tokens(body: Any) -> Any:
    """llm-d's /inference/v1/generate body with its generation cut short: its limits
    are in `sampling_params` (vLLM's names), and its prompt is token ids."""
    if not isinstance(body, dict) or not isinstance(body.get("sampling_params"), dict):
        return body
    params = dict(body["sampling_params"])
    if not isinstance(params.get("max_tokens"), int) or params["max_tokens"] > MAX_TOKENS:
        params["max_tokens"] = MAX_TOKENS
    if isinstance(params.get("n"), int) and params["n"] > 2:
        params["n"] = 2
    body = dict(body, sampling_params=params)
    if isinstance(body.get("token_ids"), list):
        body["token_ids"] = body["token_ids"][:64]
    return body


@pytest.mark.parametrize(("method", "path", "mode"), _cases())
def test_every_answer_is_documented(
    api_schema: Any,
    live_server: LiveServer,
    http: requests.Session,
    method: str,
    path: str,
    mode: GenerationMode,
) -> None:
    operation = api_schema[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def answer(case: Any) -> None:
        if path in (
            "/v1/completions",
            "/v1/chat/completions",
            "/v1/messages",
            "/v1/responses",
            "/v1/responses/compact",
            "/v1/unload_lora_adapter",
        ):
            case.body = _bounded(case.body, live_server.lora)
        if path == "/v1/messages/batches" and isinstance(case.body, dict):
            requests = case.body.get("requests")
            if isinstance(requests, list):  # each a /v1/messages body, run in the background
                case.body = {**case.body, "requests": [_bounded_request(r) for r in requests[:4]]}
        if path == "/inference/v1/generate":
            case.body = _bounded_tokens(case.body)
        response = case.call(session=http, timeout=120)
        assert response.status_code < 500 or response.status_code == 503, (
            f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:500]}"
        )
        case.validate_response(response, checks=CHECKS)

    answer()


def test_the_engine_is_idle_afterwards(live_server: LiveServer) -> None:
    assert live_server.wait_idle() == 0
    assert requests.get(f"{live_server.base_url}/health", timeout=30).status_code == 200
