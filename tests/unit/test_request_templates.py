"""A request's own chat template (`chat_template`, or `chat_template_kwargs.chat_template`)
is Jinja the server would run: refused with vLLM's message and status on every API that
renders a conversation unless the operator trusts request templates
(`--trust-request-chat-template`, `EngineInfo.trust_request_chat_template`), over the
fake engine; nothing is rendered or run for a refused request. The same refusal on real
vLLM's renderer is in tests/e2e/test_exposed.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
import pytest

from app.config import Settings
from app.engine.base import ChatPrompt
from app.main import create_app
from app.protocols.conversation.plan import UNTRUSTED_TEMPLATE
from tests.fake_engine import FakeEngine, FakeTokenizer

TEMPLATE = "{% for m in messages %}EVIL{{ m.content }}{% endfor %}"
MESSAGES = [{"role": "user", "content": "hi"}]


class RenderWatchingTokenizer(FakeTokenizer):
    """The fake's tokenizer, recording every prompt it templates."""

    def __init__(self) -> None:
        self.rendered: list[ChatPrompt] = []

    def apply_chat_template(self, prompt: ChatPrompt) -> list[int]:
        self.rendered.append(prompt)
        return super().apply_chat_template(prompt)


class RenderWatchingEngine(FakeEngine):
    """The fake engine, recording every prompt its tokenizer templates."""

    def __init__(self, trust: bool = False) -> None:
        super().__init__()
        self._info = replace(self._info, trust_request_chat_template=trust)
        self._tokenizer = self.watched = RenderWatchingTokenizer()

    @property
    def rendered(self) -> list[ChatPrompt]:
        return self.watched.rendered


def bodies() -> list[tuple[str, dict[str, Any]]]:
    """(path, body) of every route that renders a conversation, each bringing a template
    in every field that can carry one."""
    chat = {"model": "fake", "messages": MESSAGES, "max_tokens": 2}
    kwargs = {"chat_template_kwargs": {"chat_template": TEMPLATE}}
    top = {"chat_template": TEMPLATE}
    return [
        ("/v1/chat/completions", {**chat, **kwargs}),
        ("/v1/chat/completions", {**chat, **top}),
        ("/v1/chat/completions/render", {**chat, **kwargs}),
        ("/v1/chat/completions/render", {**chat, **top}),
        ("/tokenize", {"model": "fake", "messages": MESSAGES, **kwargs}),
        ("/tokenize", {"model": "fake", "messages": MESSAGES, **top}),
        ("/v1/responses", {"model": "fake", "input": "hi", "store": False, **kwargs}),
    ]


@pytest.fixture
async def served() -> AsyncIterator[tuple[httpx.AsyncClient, RenderWatchingEngine]]:
    engine = RenderWatchingEngine()
    app = create_app(Settings(model="fake"), engine=engine)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        yield client, engine


@pytest.mark.parametrize(("path", "body"), bodies())
async def test_a_request_template_is_refused_as_vllm_refuses_it(
    served: tuple[httpx.AsyncClient, RenderWatchingEngine], path: str, body: dict[str, Any]
) -> None:
    client, engine = served
    response = await client.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["message"] == UNTRUSTED_TEMPLATE
    assert error["type"] == "invalid_request_error"
    assert engine.rendered == [] and engine.requests == []


async def test_a_trusting_server_hands_the_template_to_the_renderer() -> None:
    engine = RenderWatchingEngine(trust=True)
    app = create_app(Settings(model="fake", trust_request_chat_template=True), engine=engine)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        for path, body in bodies():
            response = await client.post(path, json=body)
            assert response.status_code == 200, (path, response.text)
    assert [p.template_kwargs["chat_template"] for p in engine.rendered] == [TEMPLATE] * len(
        bodies()
    )


async def test_other_template_kwargs_are_not_a_template(
    served: tuple[httpx.AsyncClient, RenderWatchingEngine],
) -> None:
    client, engine = served
    body = {"model": "fake", "messages": MESSAGES, "max_tokens": 2}
    response = await client.post(
        "/v1/chat/completions",
        json={**body, "chat_template_kwargs": {"enable_thinking": False, "chat_template": None}},
    )
    assert response.status_code == 200, response.text
    assert engine.rendered[0].template_kwargs == {"enable_thinking": False, "chat_template": None}
