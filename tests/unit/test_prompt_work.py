"""What one request's prompt work may cost the others, over the fake engine and the tiny
model's real tokenizer: every path that builds a prompt is admitted (the render routes,
/tokenize, /detokenize, count_tokens, the Responses API's `generate: false`) and builds
it in the prompt thread, never on the event loop; a text that cannot fit the context is
refused before it is tokenized; a conversation's messages and tools and a constraint's
spec are bounded; and a client's priority is clamped (nothing more urgent than 0 by
default), so admission cannot be bypassed by it and the engine runs what was admitted."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

from app.admission import LANE_PRIORITY, Admission, ProtocolName, clamp_priority
from app.config import Settings
from app.engine.base import ChatPrompt, GenerationRequest
from app.engine.constraints import MAX_SPEC_BYTES
from app.engine.vllm.tokenizer import HfTokenizer
from app.errors import ContextLengthExceeded
from app.main import create_app
from app.protocols.conversation.plan import MAX_MESSAGES, MAX_TOOLS
from app.routes.deps import get_objects
from app.telemetry.record import RequestRecord
from app.tenants import DEFAULT_TENANT, Limits, Principal, Role
from schemas.openai_responses import ResponsesRequest
from tests.conftest import tiny_model_path
from tests.fake_engine import FakeEngine, FakeTokenizer

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


class ThreadWatchingTokenizer(FakeTokenizer):
    """The fake's tokenizer, recording the thread of every encode, decode and render."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.threads.append(threading.current_thread().name)
        return super().encode(text, add_special_tokens)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        self.threads.append(threading.current_thread().name)
        return super().decode(token_ids, skip_special_tokens)

    def apply_chat_template(self, prompt: ChatPrompt) -> list[int]:
        self.threads.append(threading.current_thread().name)
        return super().apply_chat_template(prompt)


class ThreadWatchingEngine(FakeEngine):
    def __init__(self) -> None:
        super().__init__()
        self._tokenizer = self.watched = ThreadWatchingTokenizer()

    @property
    def threads(self) -> list[str]:
        return self.watched.threads


def _client(app: Any) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://t", timeout=30)


# (path, body) of every route that builds a prompt and runs nothing.
PROMPT_ONLY = [
    ("/v1/completions/render", {"model": "fake", "prompt": "hi", "max_tokens": 2}),
    ("/v1/chat/completions/render", CHAT),
    ("/tokenize", {"model": "fake", "prompt": "hi"}),
    ("/tokenize", {"model": "fake", "messages": CHAT["messages"]}),
    ("/detokenize", {"model": "fake", "tokens": [104, 105]}),
    ("/v1/messages/count_tokens", CHAT),
]


@pytest.mark.parametrize(("path", "body"), PROMPT_ONLY)
async def test_prompt_only_work_runs_in_the_prompt_thread(path: str, body: dict[str, Any]) -> None:
    engine = ThreadWatchingEngine()
    async with _client(create_app(Settings(model="fake"), engine=engine)) as client:
        response = await client.post(path, json=body)
    assert response.status_code == 200, response.text
    assert engine.threads and all(name.startswith("prompt") for name in engine.threads), (
        engine.threads
    )


@pytest.mark.parametrize(("path", "body"), PROMPT_ONLY)
async def test_prompt_only_work_is_admitted(path: str, body: dict[str, Any]) -> None:
    engine = ThreadWatchingEngine()
    app = create_app(Settings(model="fake", max_queued_requests=1), engine=engine)
    admission: Admission = app.state.admission
    held = admission.admit(ProtocolName.OPENAI)  # the queue is at its bound
    async with _client(app) as client:
        refused = await client.post(path, json=body)
        held.release()
        admitted = await client.post(path, json=body)
    assert refused.status_code in (503, 529), refused.text  # Anthropic's overloaded is 529
    assert "retry-after" in refused.headers
    assert admitted.status_code == 200, admitted.text
    assert admission.in_flight == 0 and admission.queued_tokens == 0


async def test_a_responses_websocket_style_generate_false_is_admitted() -> None:
    engine = FakeEngine()
    app = create_app(Settings(model="fake", max_queued_requests=1), engine=engine)
    responses = get_objects(app).responses
    body = ResponsesRequest.model_validate({"model": "fake", "input": "hi", "store": False})
    admission: Admission = app.state.admission
    record = RequestRecord("test", name="test")
    caller = Principal(DEFAULT_TENANT, Role.FULL, Limits(), DEFAULT_TENANT)
    call = await responses.start(caller, body, record, generate=False)
    assert admission.in_flight == 1  # its prompt work holds a place until it completes
    call.tickets.release()
    await responses.close()


@pytest.fixture(scope="module")
def hf_tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(Path(tiny_model_path()))


def test_a_text_that_cannot_fit_is_refused_before_it_is_tokenized(hf_tokenizer: Any) -> None:
    calls: list[int] = []
    encode = hf_tokenizer.encode

    class Counting:
        def get_vocab(self) -> dict[str, int]:
            return dict(hf_tokenizer.get_vocab())

        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            calls.append(len(text))
            return list(encode(text, add_special_tokens=add_special_tokens))

    tokenizer = HfTokenizer(Counting(), None, max_model_len=64)
    longest = max(len(t.encode()) for t in hf_tokenizer.get_vocab())
    fits = "a" * (64 * longest)
    assert tokenizer.encode(fits) and calls == [len(fits)]
    with pytest.raises(ContextLengthExceeded, match="maximum context length is 64 tokens"):
        tokenizer.encode("a" * (64 * longest + 1))
    with pytest.raises(ContextLengthExceeded):
        tokenizer.encode("x" * (16 << 20))  # the probe: 16 MiB took 15 s
    assert calls == [len(fits)]  # neither was tokenized


def test_no_text_the_tokenizer_would_fit_is_refused(hf_tokenizer: Any) -> None:
    # The bound's premise: no token spells more bytes than the vocabulary's longest
    # entry, so a text over the context times that length holds more tokens than fit.
    tokenizer = HfTokenizer(hf_tokenizer, None, max_model_len=64)
    longest = max(len(t.encode()) for t in hf_tokenizer.get_vocab())
    for text in ("    " * 1000, "def main():\n" * 500, "é" * 3000, "\u00a0" * 3000):
        count = len(hf_tokenizer.encode(text, add_special_tokens=False))
        assert count >= len(text.encode()) / longest
    assert tokenizer.encode("hi")


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with _client(create_app(Settings(model="fake"), engine=FakeEngine())) as c:
        yield c


async def test_messages_tools_and_specs_are_bounded(client: httpx.AsyncClient) -> None:
    many = [{"role": "user", "content": "a"}] * (MAX_MESSAGES + 1)
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    regex = {"structured_outputs": {"regex": "a" * (MAX_SPEC_BYTES + 1)}}
    cases = [
        ({**CHAT, "messages": many}, f"at most {MAX_MESSAGES}"),
        ({**CHAT, "tools": [tool] * (MAX_TOOLS + 1)}, f"at most {MAX_TOOLS}"),
        ({**CHAT, **regex}, f"at most {MAX_SPEC_BYTES}"),
    ]
    for body, message in cases:
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 400, response.text
        assert message in response.json()["error"]["message"]
    under = {**CHAT, "messages": [{"role": "user", "content": "a"}] * 20}
    assert (await client.post("/v1/chat/completions", json=under)).status_code == 200


def test_priority_is_clamped_to_the_ceiling() -> None:
    assert clamp_priority(-100) == 0
    assert clamp_priority(5) == 5
    assert clamp_priority(-100, ceiling=-10) == -10  # a key allowed more urgency
    assert clamp_priority(1 << 40) == LANE_PRIORITY - 1  # never the batch lane's


async def test_a_more_urgent_priority_neither_bypasses_admission_nor_reaches_the_engine() -> None:
    engine = FakeEngine(step_delay=0.05)
    app = create_app(Settings(model="fake", max_queued_requests=1), engine=engine)
    admission: Admission = app.state.admission
    held = admission.admit(ProtocolName.OPENAI)  # one queued at the default priority: the bound
    async with _client(app) as client:
        body = {"model": "fake", "prompt": "hi", "max_tokens": 1}
        urgent = await client.post("/v1/completions", json={**body, "priority": -1000})
        assert urgent.status_code == 503, urgent.text  # measured as the default's
        held.release()
        ran = await client.post("/v1/completions", json={**body, "priority": -1000})
        assert ran.status_code == 200, ran.text
        patient = await client.post("/v1/completions", json={**body, "priority": 7})
        assert patient.status_code == 200, patient.text
    assert [r.priority for r in engine.requests] == [0, 7]


def test_the_engine_runs_a_request_at_its_tickets_priority() -> None:
    admission = Admission(None, None)
    ticket = admission.admit(ProtocolName.SALIENCE, priority=-50)
    assert ticket.priority == 0
    request = GenerationRequest("r", prompt_token_ids=[1], priority=-50)
    assert ticket.start(request).priority == 0
    ticket.release()
    # Every road admits as its principal (Salience, Evergreen, SMG's Generate included):
    # the ceiling is the principal's own.
    allowed = Principal("acme", Role.TENANT, Limits(priority=-5), "acme")
    with admission.admit(ProtocolName.SALIENCE, priority=-50, principal=allowed) as urgent:
        assert urgent.priority == -5


async def test_a_keys_ceiling_is_what_its_requests_run_at() -> None:
    engine = FakeEngine()
    settings = Settings(
        model="fake",
        tenant_api_key=["acme:acme-key", "other:other-key"],
        tenant_limits=["acme:priority=-5"],
    )
    async with _client(create_app(settings, engine=engine)) as client:
        body = {"model": "fake", "prompt": "hi", "max_tokens": 1, "priority": -100}
        for key in ("acme-key", "other-key"):
            headers = {"authorization": f"Bearer {key}"}
            response = await client.post("/v1/completions", json=body, headers=headers)
            assert response.status_code == 200, response.text
    assert [r.priority for r in engine.requests] == [-5, 0]
