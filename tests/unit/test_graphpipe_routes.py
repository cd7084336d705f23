"""GraphPipe routes over the deterministic fake engine: batches, metadata by POST and GET,
LoRA paths, auth, concurrency of a batch, and that a failing prompt or a departing client
closes every generation of the batch. Answers are read with the flatc-generated classes.
The same behaviour on real vLLM is in tests/e2e/test_graphpipe.py."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator, AsyncIterator, MutableMapping
from typing import Any

import httpx
import numpy as np
import pytest

from app.config import Settings
from app.engine.base import GenerationRequest, TokenEvent
from app.errors import EngineError
from app.main import create_app
from tests.fake_engine import FakeEngine
from tests.graphpipe_client import (
    Infer,
    infer_request,
    metadata_request,
    read_infer_response,
    read_metadata_response,
)


class TrackingEngine(FakeEngine):
    """Records how many requests ran at once, and which were closed before finishing."""

    def __init__(self, step_delay: float = 0.0, fail_after: dict[str, int] | None = None):
        super().__init__(step_delay=step_delay)
        self.peak = 0
        self.finished: list[str] = []
        self.closed_early: list[str] = []
        self.fail_after = fail_after or {}  # prompt text -> tokens before an EngineError

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenEvent, None]:
        inner = super().generate(request)
        done = False
        try:
            count = 0
            async for event in inner:
                self.peak = max(self.peak, len(self.running))
                prompt = self.tokenizer.decode(request.prompt_token_ids or ())
                if count == self.fail_after.get(prompt, -1):
                    raise EngineError(f"the engine fell over on {prompt!r}")
                count += 1
                yield event
            done = True
        finally:
            await inner.aclose()
            (self.finished if done else self.closed_early).append(request.request_id)


def strings(*values: str) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = [v.encode() for v in values]
    return array


@pytest.fixture
def engine() -> TrackingEngine:
    return TrackingEngine()


def make_client(engine: FakeEngine, **settings: Any) -> httpx.AsyncClient:
    app = create_app(Settings(model="fake", **settings), engine=engine)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://t")


@pytest.fixture
async def client(engine: TrackingEngine) -> AsyncIterator[httpx.AsyncClient]:
    async with make_client(engine) as c:
        yield c


async def post(client: httpx.AsyncClient, call: Infer, path: str = "/graphpipe") -> Any:
    response = await client.post(path, content=infer_request(call))
    assert response.headers["content-type"] == "application/octet-stream"
    answer = read_infer_response(response.content)
    return response.status_code, answer


async def test_a_batch_of_prompts_gets_one_text_each(client: httpx.AsyncClient) -> None:
    status, answer = await post(
        client, Infer([strings("ab", "xy", "0")], config='{"max_tokens": 3}')
    )
    assert status == 200 and answer.errors == []
    [text] = answer.outputs
    assert text.tolist() == [b"cde", b"z{|", b"123"]


async def test_a_batch_of_ids_with_every_output(
    client: httpx.AsyncClient, engine: TrackingEngine
) -> None:
    ids = np.array([[97, 98], [120, -1]], dtype=np.int32)
    status, answer = await post(
        client,
        Infer(
            [ids],
            input_names=["prompt_ids"],
            output_names=["token_ids", "text", "logprobs"],
            config='{"max_tokens": 2, "temperature": 0}',
        ),
    )
    assert status == 200
    token_ids, text, logprobs = answer.outputs
    assert token_ids.dtype == np.int64 and token_ids.tolist() == [[99, 100], [121, 122]]
    assert text.tolist() == [b"cd", b"yz"]
    assert logprobs.dtype == np.float32 and logprobs.shape == (2, 2)
    assert [list(r.prompt_token_ids or ()) for r in engine.requests] == [[97, 98], [120]]
    assert engine.requests[0].sampling.temperature == 0


async def test_metadata_by_post_and_by_get_agree(client: httpx.AsyncClient) -> None:
    response = await client.post("/graphpipe", content=metadata_request())
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/octet-stream"
    posted = read_metadata_response(response.content)
    got = (await client.get("/graphpipe")).json()
    how_to_call = got.pop("how_to_call")
    assert got == posted
    assert posted["name"] == "fake"
    assert [i["name"] for i in posted["inputs"]] == ["prompt", "prompt_ids"]
    assert [o["name"] for o in posted["outputs"]] == ["text", "token_ids", "logprobs"]
    assert any("POST /graphpipe" in line for line in how_to_call)


async def test_lora_adapter_path(client: httpx.AsyncClient, engine: TrackingEngine) -> None:
    await engine.load_lora("tuned", "/nonexistent/tuned")
    status, answer = await post(
        client, Infer([strings("ab")], config='{"max_tokens": 1}'), "/graphpipe/tuned"
    )
    assert status == 200 and answer.outputs[0].tolist() == [b"c"]
    assert engine.requests[-1].lora_name == "tuned"
    status, _ = await post(client, Infer([strings("ab")]), "/graphpipe/fake")
    assert status == 200 and engine.requests[-1].lora_name is None  # the base model by name
    meta = read_metadata_response(
        (await client.post("/graphpipe/tuned", content=metadata_request())).content
    )
    assert meta["name"] == "tuned"
    assert (await client.get("/graphpipe/tuned")).json()["name"] == "tuned"
    assert any("tuned" in line for line in (await client.get("/graphpipe")).json()["how_to_call"])


async def test_unknown_model_is_404_in_both_shapes(client: httpx.AsyncClient) -> None:
    status, answer = await post(client, Infer([strings("a")]), "/graphpipe/nope")
    assert status == 404
    [(code, message)] = answer.errors
    assert code == 404 and message == "The model `nope` does not exist."
    got = await client.get("/graphpipe/nope")
    assert got.status_code == 404 and got.json()["errors"][0]["code"] == 404


async def test_a_model_name_with_a_newline_is_still_a_graphpipe_answer(
    client: httpx.AsyncClient,
) -> None:
    # Starlette's `path` convertor stops at a newline: the route went unmatched and the
    # app's default (OpenAI JSON) 404 answered, found by schemathesis in CI.
    status, answer = await post(client, Infer([strings("a")]), "/graphpipe/%0Anope")
    assert status == 404
    [(code, message)] = answer.errors
    assert code == 404 and message == "The model `\nnope` does not exist."


async def test_api_key_is_required_and_refused_as_graphpipe_errors(engine: TrackingEngine) -> None:
    async with make_client(engine, api_key="sesame") as c:
        status, answer = await post(c, Infer([strings("a")]))
        assert status == 401 and answer.errors[0][0] == 401
        assert "API key" in answer.errors[0][1]
        metadata = await c.post("/graphpipe", content=metadata_request())
        assert metadata.status_code == 401
        assert read_infer_response(metadata.content).errors[0][0] == 401
        assert (await c.get("/graphpipe")).json()["errors"][0]["code"] == 401
        ok = await c.post(
            "/graphpipe",
            content=infer_request(Infer([strings("a")])),
            headers={"Authorization": "Bearer sesame"},
        )
        assert ok.status_code == 200
    assert len(engine.requests) == 1


async def test_a_batch_runs_concurrently() -> None:
    engine = TrackingEngine(step_delay=0.005)
    async with make_client(engine) as c:
        status, _ = await post(c, Infer([strings("a", "b", "c", "d")], config='{"max_tokens": 5}'))
    assert status == 200
    assert engine.peak == 4
    assert len(engine.finished) == 4


async def test_a_failing_prompt_closes_the_rest_of_its_batch() -> None:
    engine = TrackingEngine(step_delay=0.005, fail_after={"bad": 2})
    async with make_client(engine) as c:
        status, answer = await post(
            c, Infer([strings("good", "bad", "fine")], config='{"max_tokens": 50}')
        )
    assert status == 500
    assert answer.outputs == []
    assert answer.errors == [(500, "the engine fell over on 'bad'")]
    assert sorted(engine.closed_early) == [f"{r.request_id}" for r in engine.requests]
    assert engine.running == set()


async def test_a_prompt_that_cannot_fit_is_refused_before_its_batch_starts() -> None:
    engine = TrackingEngine(step_delay=0.005)  # the fake's context is 512 tokens
    async with make_client(engine) as c:
        status, answer = await post(
            c, Infer([strings("good", "x" * 600)], config='{"max_tokens": 50}')
        )
    assert status == 400
    assert "maximum context length is 512" in answer.errors[0][1]
    assert "prompt[1]" in answer.errors[0][1]
    assert engine.requests == [] and engine.running == set()


async def test_a_client_that_goes_away_aborts_its_batch() -> None:
    engine = TrackingEngine(step_delay=0.01)
    app = create_app(Settings(model="fake"), engine=engine)
    body = infer_request(Infer([strings("a", "b")], config='{"max_tokens": 200}'))
    sent: list[MutableMapping[str, Any]] = []
    calls = 0

    async def receive() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls == 1:
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(0.1)  # a few tokens in, the client hangs up
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/graphpipe",
        "raw_path": b"/graphpipe",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-length", str(len(body)).encode())],
        "server": ("t", 80),
        "client": ("c", 1),
    }
    await asyncio.wait_for(app(scope, receive, send), timeout=5)
    assert len(engine.requests) == 2
    assert sorted(engine.closed_early) == sorted(r.request_id for r in engine.requests)
    assert engine.finished == [] and engine.running == set()


async def test_a_bad_request_beside_a_good_one_does_not_disturb_it() -> None:
    engine = TrackingEngine(step_delay=0.002)
    async with make_client(engine) as c:
        good, bad = await asyncio.gather(
            post(c, Infer([strings("ab")], config='{"max_tokens": 20}')),
            c.post("/graphpipe", content=b"\x00" * 40),
        )
    assert good[0] == 200 and good[1].outputs[0].tolist() == [bytes(range(99, 119))]
    assert bad.status_code == 400 and read_infer_response(bad.content).errors[0][0] == 400


class BuggyEngine(FakeEngine):
    async def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenEvent, None]:
        raise RuntimeError("a bug")
        yield  # pragma: no cover - makes this an async generator


async def test_a_bug_still_answers_a_graphpipe_error(caplog: pytest.LogCaptureFixture) -> None:
    async with make_client(BuggyEngine()) as c:
        status, answer = await post(c, Infer([strings("a")]))
    assert status == 500
    code, message = answer.errors[0]
    # The client gets an id to quote, never the exception; the log has both.
    assert code == 500 and "a bug" not in message and "RuntimeError" not in message
    error_id = re.fullmatch(r"Internal server error \(error id (\w+)\)", message)
    assert error_id is not None
    assert f"internal error {error_id[1]}" in caplog.text and "a bug" in caplog.text
