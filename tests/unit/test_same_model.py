"""One model lookup, every protocol: a model the server does not serve is refused by each
protocol with the same status and the same words, `vllm serve`'s ("The model `x` does not
exist."), and no name at all is the base model everywhere.

Each protocol is reached where its lookup is made (an HTTP route, a websocket, a core),
over the fake engine. If a protocol went back to a lookup of its own, its message (or, for
an empty name, its refusal) would differ and its case below would fail.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from fastapi import FastAPI
from google.protobuf import text_format
from starlette.testclient import TestClient

from app.config import Settings
from app.errors import ModelNotFound
from app.main import create_app
from app.protocols.evergreen.generate import plan_action
from schemas import evergreen_pb2
from tests.fake_engine import FakeEngine
from tests.graphpipe_client import Infer, infer_request, read_infer_response

MESSAGE = "The model `nope` does not exist."


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    engine = FakeEngine()
    with TestClient(create_app(Settings(model="fake"), engine=engine)) as client:
        yield client


def _openai(path: str, body: dict[str, Any]) -> Callable[[TestClient, str | None], str]:
    def refuse(client: TestClient, model: str | None) -> str:
        answer = client.post(path, json={**body, "model": model})
        if answer.status_code == 200:
            return "ok"
        assert answer.status_code == 404, answer.text
        error = answer.json()["error"]
        assert error["type"] == "not_found_error" and error["param"] == "model"
        return str(error["message"])

    return refuse


def _graphpipe(client: TestClient, model: str | None) -> str:
    prompts = Infer([_strings("ab")], config='{"max_tokens": 1}')
    answer = client.post(f"/graphpipe/{model or ''}", content=infer_request(prompts))
    if answer.status_code == 200:
        return "ok"
    [(code, message)] = read_infer_response(answer.content).errors
    assert answer.status_code == code == 404
    return str(message)


def _strings(*values: str) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = [v.encode() for v in values]
    return array


def _salience(client: TestClient, model: str | None) -> str:
    with client.websocket_connect("/salience/ws") as ws:
        ws.send_json({"id": "o", "method": "OpenSession", "request": {"model": model or ""}})
        answer = ws.receive_json()
    if "response" in answer:
        return "ok"
    assert answer["error"]["code"] == "NOT_FOUND"
    return str(answer["error"]["message"])


def _evergreen(client: TestClient, model: str | None) -> str:
    action = text_format.Parse(
        'name: "GENERATE" inputs { name: "prompt" id: "p" } outputs { name: "response" id: "r" }',
        evergreen_pb2.Action(),
    )
    action.target_spec.id = model or ""
    assert isinstance(client.app, FastAPI)
    engine = client.app.state.objects.engine
    try:
        plan_action(action, engine.info, engine.has_model)
    except ModelNotFound as refused:
        assert refused.grpc_status == "NOT_FOUND" and refused.evergreen_reason == "NOT_FOUND"
        return refused.message
    return "ok"


CHAT = {"messages": [{"role": "user", "content": "a"}], "max_tokens": 1}
PROTOCOLS: dict[str, Callable[[TestClient, str | None], str]] = {
    "completions": _openai("/v1/completions", {"prompt": "a", "max_tokens": 1}),
    "chat": _openai("/v1/chat/completions", CHAT),
    "completions render": _openai("/v1/completions/render", {"prompt": "a", "max_tokens": 1}),
    "chat render": _openai("/v1/chat/completions/render", CHAT),
    "tokenize": _openai("/tokenize", {"prompt": "a"}),
    "detokenize": _openai("/detokenize", {"tokens": [97]}),
    "graphpipe": _graphpipe,
    "salience": _salience,
    "evergreen": _evergreen,
}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_unknown_model_is_refused_with_one_message(client: TestClient, protocol: str) -> None:
    assert PROTOCOLS[protocol](client, "nope") == MESSAGE


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_no_model_and_the_base_models_name_are_the_base_model(
    client: TestClient, protocol: str
) -> None:
    assert PROTOCOLS[protocol](client, None) == "ok"
    assert PROTOCOLS[protocol](client, "fake") == "ok"
