"""OpenAI routes over the deterministic fake engine: auth, error shapes, in-stream errors,
fan-out of `n`. The same behaviour on real vLLM is in tests/e2e."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.admission import Admission, ProtocolName, Tickets
from app.config import Settings
from app.engine.base import GenerationRequest, SamplingOptions, TokenEvent
from app.errors import EngineError
from app.main import create_app
from app.sessions.generations import run_generations
from tests.fake_engine import FakeEngine
from tests.waits import until


def _tickets(n: int) -> Tickets:
    return Admission(None, None).admit_all(ProtocolName.OPENAI, [1] * n)


def client(engine: FakeEngine, **settings: Any) -> httpx.AsyncClient:
    app = create_app(Settings(model="fake", **settings), engine=engine)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


class FailingEngine(FakeEngine):
    """Fails after its second token, as an engine dying mid-stream would."""

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenEvent, None]:
        inner = super().generate(request)
        try:
            count = 0
            async for event in inner:
                if count == 2:
                    raise EngineError("the engine fell over")
                count += 1
                yield event
        finally:
            await inner.aclose()


async def test_api_key_guards_v1_but_not_health() -> None:
    async with client(FakeEngine(), api_key="sesame") as c:
        response = await c.post("/v1/completions", json={"prompt": "a", "max_tokens": 1})
        assert response.status_code == 401
        assert response.json()["error"]["type"] == "authentication_error"
        wrong = await c.get("/v1/models", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        ok = await c.get("/v1/models", headers={"Authorization": "Bearer sesame"})
        assert ok.status_code == 200 and ok.json()["data"][0]["id"] == "fake"
        assert (await c.get("/health")).status_code == 200


async def test_validation_errors_are_openai_shaped() -> None:
    async with client(FakeEngine()) as c:
        response = await c.post("/v1/chat/completions", json={"messages": "nope"})
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == "messages"
        response = await c.post("/v1/completions", json={"prompt": "a", "n": 0})
        assert response.status_code == 400 and response.json()["error"]["param"] == "n"


async def test_error_after_stream_start_goes_in_band() -> None:
    async with client(FailingEngine()) as c:
        response = await c.post(
            "/v1/completions", json={"prompt": "a", "max_tokens": 10, "stream": True}
        )
    assert response.status_code == 200
    events = [e[len("data: ") :] for e in response.text.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["message"] == "the engine fell over"
    assert len(events) == 4  # two chunks, the error, [DONE]


async def test_n_choices_are_merged_and_accounted() -> None:
    async with client(FakeEngine()) as c:
        response = await c.post("/v1/completions", json={"prompt": "ab", "max_tokens": 3, "n": 3})
    body = response.json()
    assert [c["text"] for c in body["choices"]] == ["cde"] * 3
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 9, "total_tokens": 11}


class FirstFailsEngine(FakeEngine):
    """Request r0 fails after its second token; the others run to their end."""

    def __init__(self) -> None:
        super().__init__(max_model_len=4096, step_delay=0.001)
        self.events: dict[str, list[TokenEvent]] = {f"r{i}": [] for i in range(3)}

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenEvent, None]:
        inner = super().generate(request)
        try:
            async for event in inner:
                if request.request_id == "r0" and len(self.events["r0"]) == 2:
                    raise EngineError("the engine fell over")
                self.events[request.request_id].append(event)
                yield event
        finally:
            await inner.aclose()


# Long enough that a branch left running would not have ended by itself when the call did.
_LONG = SamplingOptions(max_tokens=4000)


async def test_generations_close_every_branch_when_one_fails() -> None:
    engine = FirstFailsEngine()
    requests = [GenerationRequest(f"r{i}", prompt_text="a", sampling=_LONG) for i in range(3)]
    with pytest.raises(EngineError):
        await run_generations(engine, requests, _tickets(len(requests)), lambda i, e: None)
    assert engine.running == set()
    assert all(len(events) < _LONG.max_tokens for events in engine.events.values())


async def test_generations_close_every_branch_when_cancelled() -> None:
    engine = FakeEngine(max_model_len=4096, step_delay=0.001)
    requests = [GenerationRequest(f"r{i}", prompt_text="a", sampling=_LONG) for i in range(2)]
    received: list[int] = []
    call = asyncio.ensure_future(
        run_generations(engine, requests, _tickets(len(requests)), lambda i, e: received.append(i))
    )
    await until(lambda: {0, 1} <= set(received), "both requests' first events")
    assert engine.running == {"r0", "r1"}
    call.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await call
    assert engine.running == set()
    assert len(received) < 2 * _LONG.max_tokens


async def test_lora_admin_routes(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "adapter_config.json").write_text("{}")
    runtime = {"allow_runtime_lora_updating": True, "lora_root": tmp_path}
    async with client(FakeEngine(), **runtime) as c:
        response = await c.post("/v1/load_lora_adapter", json={"lora_name": "a1", "lora_path": "x"})
        assert response.status_code == 200
        assert [m["id"] for m in (await c.get("/v1/models")).json()["data"]] == ["fake", "a1"]
        missing = await c.post("/v1/unload_lora_adapter", json={"lora_name": "zz"})
        assert missing.status_code == 404
        assert (
            await c.post("/v1/unload_lora_adapter", json={"lora_name": "a1"})
        ).status_code == 200


class BuggyEngine(FakeEngine):
    """A bug of ours in the generate path, raising a built-in ValueError (which the old
    boundary caught and answered as the client's 400)."""

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenEvent, None]:
        inner = super().generate(request)
        try:
            async for event in inner:
                yield event
                raise ValueError("secret detail of a bug")
        finally:
            await inner.aclose()


def _internal_error_id(error: dict[str, object]) -> str:
    """The id of an InternalError body; the exception's text must not be in it."""
    assert error["type"] == "server_error" and error["code"] == "internal_error"
    message = str(error["message"])
    assert "secret" not in message and "ValueError" not in message
    found = re.fullmatch(r"Internal server error \(error id (\w+)\)", message)
    assert found is not None, message
    return found[1]


async def test_a_bug_in_the_generate_path_is_an_internal_error_with_an_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = BuggyEngine()
    async with client(engine) as c:
        response = await c.post("/v1/completions", json={"prompt": "a", "max_tokens": 3})
        assert response.status_code == 500
        error_id = _internal_error_id(response.json()["error"])
        assert f"internal error {error_id}" in caplog.text
        assert "secret detail of a bug" in caplog.text  # the log has what the client has not
        body = {"messages": [{"role": "user", "content": "a"}], "max_tokens": 3, "stream": True}
        streamed = await c.post("/v1/chat/completions", json=body)
        assert streamed.status_code == 200
        events = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        _internal_error_id(json.loads(events[-2])["error"])
    assert engine.running == set()


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize(
    ("extra", "param"),
    [
        # vLLM's SamplingParams: "n must be 1 when using greedy sampling".
        ({"n": 2, "temperature": 0}, "n"),
        ({"n": 3, "temperature": 0, "seed": 1, "stream": True}, "n"),
        # vLLM's request models: "Stream options can only be defined when `stream=True`".
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream_options": {"include_usage": False}, "stream": False}, "stream_options"),
    ],
)
async def test_combinations_vllm_serve_refuses_are_400_naming_the_param(
    path: str, extra: dict[str, object], param: str
) -> None:
    body: dict[str, object] = {"max_tokens": 2, **extra}
    if path.endswith("chat/completions"):
        body["messages"] = [{"role": "user", "content": "a"}]
    else:
        body["prompt"] = "ab"
    async with client(FakeEngine()) as c:
        for route in (path, f"{path}/render"):
            response = await c.post(route, json=body)
            assert response.status_code == 400, (route, response.text)
            assert response.json()["error"]["param"] == param


async def test_the_same_options_pass_where_vllm_serve_takes_them() -> None:
    async with client(FakeEngine()) as c:
        for body in (
            {"prompt": "ab", "max_tokens": 2, "n": 2, "temperature": 0.5},
            {"prompt": "ab", "max_tokens": 2, "n": 1, "temperature": 0},
            {"prompt": "ab", "max_tokens": 2, "stream_options": {}},  # empty: vLLM takes it
        ):
            response = await c.post("/v1/completions", json=body)
            assert response.status_code == 200, (body, response.text)
