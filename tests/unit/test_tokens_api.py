"""llm-d's token-in/token-out routes on a fake engine: `/inference/v1/generate` streamed
and not (token ids, logprobs in vLLM's shape, usage, prompt ids, text mode), its errors
(vLLM's 400 for a negative id, an unknown sampling field, an image), admission and the
drain, an abort by the client's request id that stops the request, and `/load` and
`/kv_event_sources`. (Against `vllm serve --enable-scale-out` on real vLLM:
bench/tokens_vs_vllm.py.)"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.admission import Tickets
from app.config import Settings
from app.main import create_app
from app.sessions.named import NamedRequests
from tests.fake_engine import FakeEngine
from tests.waits import until_sync

URL = "/inference/v1/generate"


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(step_delay=0.0)


@pytest.fixture
def client(engine: FakeEngine) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(model="fake", grpc_port=0), engine=engine)) as c:
        yield c


def events(text: str) -> list[Any]:
    lines = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data:")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_generate_answers_token_ids_and_usage(client: TestClient) -> None:
    reply = client.post(
        URL,
        json={"request_id": "a", "token_ids": [65, 66], "sampling_params": {"max_tokens": 3},
              "return_token_ids": True},
    )  # fmt: skip
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["request_id"] == "generate-tokens-a" and body["output_mode"] == "tokens"
    assert body["choices"] == [
        {"index": 0, "finish_reason": "length", "stop_reason": None, "token_ids": [67, 68, 69],
         "routed_experts": None, "sampling_mask": None, "weight_versions": None,
         "logprobs": None},
    ]  # fmt: skip
    assert body["usage"]["prompt_tokens"] == 2 and body["usage"]["completion_tokens"] == 3
    assert body["prompt_token_ids"] == [65, 66]


def test_logprobs_lead_with_the_sampled_token(client: TestClient) -> None:
    reply = client.post(
        URL, json={"token_ids": [65], "sampling_params": {"max_tokens": 2, "logprobs": 2}}
    )
    content = reply.json()["choices"][0]["logprobs"]["content"]
    assert [c["token_id"] for c in content] == [66, 67]
    assert [t["token_id"] for t in content[0]["top_logprobs"]] == [66, 67]
    assert content[0]["rank"] == 1


def test_streamed_chunks_then_usage_then_done(client: TestClient) -> None:
    reply = client.post(
        URL,
        json={"token_ids": [65], "sampling_params": {"max_tokens": 3, "stop_token_ids": [67]},
              "stream": True, "stream_options": {"include_usage": True},
              "return_token_ids": True},
    )  # fmt: skip
    chunks = events(reply.text)
    assert chunks[0]["prompt_token_ids"] == [65]
    assert [c["choices"][0]["token_ids"] for c in chunks[:-1]] == [[66], [67]]
    last = chunks[-2]["choices"][0]
    assert (last["finish_reason"], last["stop_reason"]) == ("stop", 67)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 2


def test_text_mode_adds_the_text(client: TestClient) -> None:
    reply = client.post(
        URL, json={"token_ids": [65], "sampling_params": {"max_tokens": 2}, "output_mode": "text"}
    )
    assert reply.json()["choices"][0]["text"] == "BC"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"token_ids": [-1], "sampling_params": {}}, "token_ids"),
        ({"token_ids": [], "sampling_params": {}}, "token_ids"),
        ({"token_ids": [999], "sampling_params": {}}, "token_ids"),
        ({"token_ids": [65], "sampling_params": {"temperature": 9}}, "temperature"),
        ({"token_ids": [65], "sampling_params": {"no_such": 1}}, "no_such"),
        ({"token_ids": [65], "sampling_params": {}, "features": {"mm_hashes": {}}}, "features"),
        # A unit per choice is listed before anything runs: 10**12 of them was a 500.
        ({"token_ids": [65], "sampling_params": {"n": 10**12}}, "sampling_params.n"),
        ({"token_ids": [65], "sampling_params": {"n": 0}}, "sampling_params.n"),
    ],
)
def test_bad_bodies_are_400_in_openais_shape(
    client: TestClient, engine: FakeEngine, body: dict[str, Any], param: str
) -> None:
    reply = client.post(URL, json=body)
    assert reply.status_code == 400, reply.text
    assert param in json.dumps(reply.json()["error"])
    assert engine.requests == []


def test_abort_by_request_id_stops_the_request() -> None:
    engine = FakeEngine(step_delay=0.02)
    app = create_app(Settings(model="fake", grpc_port=0), engine=engine)
    with TestClient(app) as client:
        answers: list[Any] = []

        def run() -> None:
            answers.append(
                client.post(
                    URL,
                    json={"request_id": "long", "token_ids": [65],
                          "sampling_params": {"max_tokens": 400}},
                ).json()
            )  # fmt: skip

        thread = threading.Thread(target=run)
        thread.start()
        deadline = time.monotonic() + 10
        while not engine.running and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (
            client.post("/inference/v1/abort_requests", json={"request_ids": ["long"]}).status_code
            == 200
        )
        thread.join(20)
    choice = answers[0]["choices"][0]
    assert choice["finish_reason"] == "abort" and len(choice["token_ids"]) < 400
    assert len(engine.aborted) == 1


def test_an_abort_reaches_only_its_tenants_requests_and_tells_nothing_of_others() -> None:
    """Names are the client's own (easily guessed): another tenant's abort of the same
    name stops nothing, and its answer is the answer to a name no call holds."""
    engine = FakeEngine(step_delay=0.02)
    keys: dict[str, Any] = {"api_key": "full", "tenant_api_key": ["acme:acme-key", "beta:beta-key"]}
    app = create_app(Settings(model="fake", grpc_port=0, **keys), engine=engine)
    acme, beta, full = ({"Authorization": f"Bearer {k}"} for k in ("acme-key", "beta-key", "full"))
    with TestClient(app) as client:
        answers: list[Any] = []

        def run() -> None:
            body = {"request_id": "long", "token_ids": [65], "sampling_params": {"max_tokens": 400}}
            answers.append(client.post(URL, json=body, headers=acme).json())

        thread = threading.Thread(target=run)
        thread.start()
        until_sync(lambda: bool(engine.running), "acme's request to run")

        def abort(name: str, headers: dict[str, str]) -> tuple[int, bytes, str | None]:
            answer = client.post("/abort_requests", json={"request_ids": [name]}, headers=headers)
            return answer.status_code, answer.content, answer.headers.get("content-type")

        for other in (beta, full):  # full: the default tenant's key, not acme's
            assert abort("long", other) == abort("nobody", other) == (200, b"", None)
        assert engine.aborted == [] and engine.running
        assert abort("long", acme) == (200, b"", None)
        thread.join(20)
    choice = answers[0]["choices"][0]
    assert choice["finish_reason"] == "abort" and len(choice["token_ids"]) < 400
    assert len(engine.aborted) == 1


def test_abort_needs_request_ids(client: TestClient) -> None:
    assert client.post("/abort_requests", json={}).status_code == 400
    assert client.post("/abort_requests", json={"request_ids": ["nobody"]}).status_code == 200


def test_a_draining_server_refuses_with_503(client: TestClient) -> None:
    app: Any = client.app
    app.state.drain.begin()
    reply = client.post(URL, json={"token_ids": [65], "sampling_params": {}})
    assert reply.status_code == 503 and reply.headers["retry-after"]


def test_load_and_kv_event_sources(client: TestClient) -> None:
    assert client.get("/load").json() == {"server_load": 0}
    assert client.get("/kv_event_sources").json() == {}


def test_the_abort_registry_forgets_ended_calls_at_a_cost_shared_by_the_filings() -> None:
    """Calls are held weakly, and the names left with none are swept; with many names
    alive, a sweep comes only once the registry has doubled, not at every filing."""
    named = NamedRequests(FakeEngine())
    held = [Tickets([]) for _ in range(3000)]
    sweeps, seen = 0, named._calls  # held, so a new registry never takes its address
    for i, call in enumerate(held):
        for name, filed in ((f"live{i}", call), (f"ended{i}", Tickets([]))):
            named.add("acme", name, filed)  # the second ended at once: nothing holds it
            if named._calls is not seen:
                sweeps, seen = sweeps + 1, named._calls
    assert sweeps <= 10, sweeps  # every filing past 1024 swept: thousands
    assert {name for _, name in named._calls} >= {f"live{i}" for i in range(3000)}
    assert len(named._calls) < 2 * 3000 + 1024
