"""The Files and Batch APIs and Message Batches as the unchanged openai and anthropic SDKs
call them, on an app served by uvicorn over the fake engine (the same on real vLLM:
tests/e2e/test_batches.py).

How these fail: an SDK call that cannot parse an answer; a request answered twice, or
not at all, in a batch's output; a line whose body is wrong not in the error file with
the status its endpoint answers; a file that is not JSONL (or names another endpoint)
not failing validation with OpenAI's error codes; a cancel or a window that passes and
leaves a request without its line, or a request running in the engine; a batch request
that keeps an interactive one waiting (the lane does not yield).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import time
import weakref
from collections.abc import AsyncGenerator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final, TypeVar

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.batches.lane import BATCH_PRIORITY, idle_width
from app.batches.requests import BUILDING
from app.config import Settings
from app.engine.base import GenerationRequest, TokenEvent
from app.main import create_app
from app.protocols.openai.batches import Endpoint
from app.protocols.openai.responses.items import Item
from app.sessions import responses as responses_module
from app.sessions.calls import in_prompt_thread
from app.sessions.responses import Responses
from app.tenants import Principal
from schemas.openai_responses import ResponsesRequest
from tests.error_bodies import body_of
from tests.fake_engine import FakeEngine
from tests.uvicorn_thread import uvicorn_in_thread

T = TypeVar("T")
DEADLINE_S = 30.0
CHAT: Final = "/v1/chat/completions"
RESPONSES: Final = "/v1/responses"
JSON = {"content-type": "application/json"}  # what a JSON API takes (else 415)


class HeldEngine(FakeEngine):
    """Holds every request of a prompt with "hold" in it until it is aborted."""

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenEvent, None]:
        if "hold" in (request.prompt_text or "") or _held(request, self.tokenizer):
            self.running.add(request.request_id)
            try:
                await asyncio.Event().wait()
            finally:
                self.running.discard(request.request_id)
        async for event in super().generate(request):
            yield event


def _held(request: GenerationRequest, tokenizer: Any) -> bool:
    ids = request.prompt_token_ids or []
    return "hold" in tokenizer.decode(list(ids))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, HeldEngine]]:
    """One app for the module's tests (each makes batches of its own)."""
    engine = HeldEngine()
    where = tmp_path_factory.mktemp("batches")
    settings = Settings(
        model="fake",
        batch_store=str(where / "batches.sqlite3"),
        responses_store=str(where / "responses.sqlite3"),
        batch_max_running=8,
    )
    with uvicorn_in_thread(create_app(settings, engine=engine), lifespan="on") as port:
        yield f"http://127.0.0.1:{port}", engine


# One TLS context for every client of the module: each would otherwise load the CA
# bundle anew (60-120 ms of CPU, 57 times: most of the module's CPU) for a server on
# plain HTTP.
TLS: Final = ssl.create_default_context()


def _openai(url: str, api_key: str = "unused") -> openai.OpenAI:
    http = openai.DefaultHttpxClient(verify=TLS)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, http_client=http)
    weakref.finalize(client, http.close)  # as the SDK closes a client of its own making
    return client


def _anthropic(url: str, api_key: str = "unused") -> anthropic.Anthropic:
    http = anthropic.DefaultHttpxClient(verify=TLS)
    client = anthropic.Anthropic(base_url=url, api_key=api_key, max_retries=0, http_client=http)
    weakref.finalize(client, http.close)
    return client


def _until(fetch: Callable[[], T], done: Callable[[T], bool], what: str) -> T:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        value = fetch()
        if done(value):
            return value
        assert time.monotonic() < deadline, f"waited {DEADLINE_S:.0f} s for {what}: {value}"
        time.sleep(0.05)


def _metric(url: str, name: str, **labels: str) -> float:
    """A sample of /metrics (the one whose labels include `labels`)."""
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", verify=TLS).text):
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                return sample.value
    raise AssertionError(f"no {name} {labels} on /metrics")


def _line(custom_id: str, body: dict[str, Any], url: str = CHAT) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def _chat(text: str, max_tokens: int = 3) -> dict[str, Any]:
    return {
        "model": "fake",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
    }


def _jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "\n".join(json.dumps(line) for line in lines).encode()


def _ended(client: openai.OpenAI, batch_id: str) -> Any:
    return _until(
        lambda: client.batches.retrieve(batch_id),
        lambda b: b.status in ("completed", "failed", "expired", "cancelled"),
        f"batch {batch_id} to end",
    )


def _lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    text = client.files.content(file_id).text  # JSONL: lines end with "\n" alone
    return [json.loads(line) for line in text.split("\n") if line]


def _completion(i: int) -> dict[str, Any]:
    return {"model": "fake", "prompt": f"text {i}", "max_tokens": 3}


def _response(i: int) -> dict[str, Any]:
    return {"model": "fake", "input": f"resp {i}", "max_output_tokens": 3}


BODIES: dict[Endpoint, Callable[[int], dict[str, Any]]] = {
    CHAT: lambda i: _chat(f"chat {i}"),
    "/v1/completions": _completion,
    "/v1/responses": _response,
}
OBJECTS = {
    CHAT: "chat.completion",
    "/v1/completions": "text_completion",
    "/v1/responses": "response",
}


@pytest.mark.parametrize("endpoint", list(BODIES))
def test_a_batch_answers_every_request_once(
    served: tuple[str, HeldEngine], endpoint: Endpoint
) -> None:
    url, _ = served
    client = _openai(url)
    count = 40
    lines = [_line(f"req-{i}", BODIES[endpoint](i), endpoint) for i in range(count)]
    lines.insert(7, _line("bad-body", {**BODIES[endpoint](0), "temperature": "hot"}, endpoint))
    lines.insert(9, _line("bad-model", {**BODIES[endpoint](0), "model": "nope"}, endpoint))
    upload = client.files.create(file=("input.jsonl", _jsonl(lines)), purpose="batch")
    assert (upload.purpose, upload.bytes, upload.status) == (
        "batch",
        len(_jsonl(lines)),
        "processed",
    )
    created = client.batches.create(
        input_file_id=upload.id,
        endpoint=endpoint,
        completion_window="24h",
        metadata={"job": "nightly"},
    )
    assert created.status == "validating" and created.metadata == {"job": "nightly"}
    batch = _ended(client, created.id)
    assert batch.status == "completed", batch
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed) == (count + 2, count)
    assert batch.request_counts.failed == 2
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at
    out, errors = _lines(client, batch.output_file_id), _lines(client, batch.error_file_id)
    assert [o["custom_id"] for o in out] == [f"req-{i}" for i in range(count)]
    assert {o["response"]["body"]["object"] for o in out} == {OBJECTS[endpoint]}
    assert all(o["response"]["status_code"] == 200 and o["error"] is None for o in out)
    assert [(e["custom_id"], e["response"]["status_code"]) for e in errors] == [
        ("bad-body", 400),
        ("bad-model", 404),
    ]
    assert errors[0]["response"]["body"]["error"]["param"] == "temperature"
    assert batch.usage is not None and batch.usage.output_tokens == 3 * count
    assert _metric(url, "switchboard_batch_results_total", outcome="succeeded") >= count
    assert _metric(url, "switchboard_admitted_total", protocol="batch") >= count
    assert _metric(url, "switchboard_batch_requests", state="running") == 0
    output = client.files.retrieve(batch.output_file_id or "")
    assert output.purpose == "batch_output"
    assert output.bytes == len(client.files.content(output.id).content)


def test_files_are_listed_read_and_deleted(served: tuple[str, HeldEngine]) -> None:
    url, _ = served
    client = _openai(url)
    made = [
        client.files.create(file=(f"f{i}.jsonl", b'{"a": %d}\n' % i), purpose="batch")
        for i in range(5)
    ]
    listed = [f.id for f in client.files.list(limit=2)]  # the SDK walks every page
    assert listed[:5] == [f.id for f in reversed(made)]
    ascending = [f.id for f in client.files.list(order="asc", limit=3)]
    assert ascending[-5:] == [f.id for f in made]
    assert client.files.content(made[2].id).content == b'{"a": 2}\n'
    assert client.files.delete(made[2].id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(made[2].id)
    with pytest.raises(openai.BadRequestError) as purpose:
        client.files.create(file=("x.jsonl", b"{}"), purpose="fine-tune")
    assert body_of(purpose.value)["param"] == "purpose"
    expiring = client.files.create(
        file=("e.jsonl", b"{}"),
        purpose="batch",
        expires_after={"anchor": "created_at", "seconds": 3600},
    )
    assert expiring.expires_at == expiring.created_at + 3600


def test_an_upload_past_the_bound_is_refused(tmp_path: Path) -> None:
    settings = Settings(
        model="fake", batch_store=str(tmp_path / "b.sqlite3"), batch_max_input_bytes=1000
    )
    with uvicorn_in_thread(create_app(settings, engine=FakeEngine()), lifespan="on") as port:
        client = _openai(f"http://127.0.0.1:{port}")
        with pytest.raises(openai.APIStatusError) as refused:
            client.files.create(file=("big.jsonl", b"x" * 5000), purpose="batch")
        assert refused.value.status_code == 413
        assert list(client.files.list()) == []


@pytest.mark.parametrize(
    ("content", "codes"),
    [
        (b"", ["empty_file"]),
        (_jsonl([_line("a", {})]) + b"\nnot json", ["invalid_json_line"]),
        (_jsonl([_line("a", _chat("x")), _line("b", _chat("y"), "/v1/completions")]),
         ["url_mismatch"]),
        (_jsonl([_line("a", _chat("x")), _line("a", _chat("y"))]), ["duplicate_custom_id"]),
        (_jsonl([{"custom_id": "a", "method": "GET", "url": CHAT, "body": {}}]),
         ["invalid_request"]),
    ],
    ids=["empty", "json", "url", "duplicate", "method"],
)  # fmt: skip
def test_a_file_that_is_not_right_fails_validation(
    served: tuple[str, HeldEngine], content: bytes, codes: list[str]
) -> None:
    url, _ = served
    client = _openai(url)
    upload = client.files.create(file=("bad.jsonl", content), purpose="batch")
    created = client.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h")
    batch = _ended(client, created.id)
    assert batch.status == "failed" and batch.failed_at
    assert batch.errors is not None and batch.errors.data is not None
    assert [e.code for e in batch.errors.data] == codes
    assert batch.output_file_id is None and batch.error_file_id is None


def test_create_is_refused_in_openais_shape(served: tuple[str, HeldEngine]) -> None:
    url, _ = served
    client = _openai(url)
    upload = client.files.create(
        file=("in.jsonl", _jsonl([_line("a", _chat("x"))])), purpose="batch"
    )
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-nope", endpoint=CHAT, completion_window="24h")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"endpoint": "/v1/embeddings"}, "endpoint"),
        ({"completion_window": "2 days"}, "completion_window"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ]
    for change, param in cases:
        body = {"input_file_id": upload.id, "endpoint": CHAT, "completion_window": "24h"}
        body.update(change)
        answer = httpx.post(f"{url}/v1/batches", verify=TLS, json=body)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == param


def test_cancel_answers_every_request_and_leaves_nothing_running(
    served: tuple[str, HeldEngine],
) -> None:
    url, engine = served
    client = _openai(url)
    lines = [_line(f"r{i}", _chat("hold" if i % 2 else f"quick {i}", 2)) for i in range(20)]
    upload = client.files.create(file=("in.jsonl", _jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h")
    _until(lambda: len(engine.running), lambda n: n > 0, "held requests in the engine")
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    ended = _ended(client, batch.id)
    assert ended.status == "cancelled" and ended.cancelled_at
    out, errors = _lines(client, ended.output_file_id), _lines(client, ended.error_file_id)
    assert sorted(o["custom_id"] for o in out + errors) == sorted(f"r{i}" for i in range(20))
    assert all(o["custom_id"] in {f"r{i}" for i in range(0, 20, 2)} for o in out)
    cancelled = [e for e in errors if e["error"] is not None]
    assert {e["error"]["code"] for e in cancelled} == {"batch_cancelled"}
    assert {e["custom_id"] for e in cancelled} >= {f"r{i}" for i in range(1, 20, 2)}
    assert engine.running == set()
    with pytest.raises(openai.BadRequestError):  # an ended batch is not cancelled again
        client.batches.cancel(_finished(client).id)


def _finished(client: openai.OpenAI) -> Any:
    upload = client.files.create(
        file=("in.jsonl", _jsonl([_line("a", _chat("x"))])), purpose="batch"
    )
    batch = client.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h")
    return _ended(client, batch.id)


def test_what_is_unfinished_when_the_window_passes_expires(served: tuple[str, HeldEngine]) -> None:
    url, engine = served
    client = _openai(url)
    lines = [_line(f"r{i}", _chat("hold" if i == 3 else f"q{i}", 2)) for i in range(6)]
    upload = client.files.create(file=("in.jsonl", _jsonl(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id,
        endpoint=CHAT,
        completion_window="2s",  # type: ignore[arg-type]  # the SDK knows 24h only
    )
    assert batch.expires_at == batch.created_at + 2
    ended = _ended(client, batch.id)
    assert ended.status == "expired" and ended.expired_at
    errors = _lines(client, ended.error_file_id)
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [("r3", "batch_expired")]
    assert len(_lines(client, ended.output_file_id)) == 5
    assert engine.running == set()


def test_batches_are_listed_newest_first(served: tuple[str, HeldEngine]) -> None:
    url, _ = served
    client = _openai(url)
    upload = client.files.create(
        file=("in.jsonl", _jsonl([_line("a", _chat("x"))])), purpose="batch"
    )
    made = [
        client.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h").id
        for _ in range(3)
    ]
    assert [b.id for b in client.batches.list(limit=2)][:3] == made[::-1]
    first = client.batches.list(limit=1)
    assert first.has_more and [b.id for b in first.data] == [made[2]]


def _message(text: str) -> Any:  # the SDK's MessageCreateParamsNonStreaming
    return {"model": "fake", "max_tokens": 3, "messages": [{"role": "user", "content": text}]}


def test_message_batches_as_the_anthropic_sdk_calls_them(served: tuple[str, HeldEngine]) -> None:
    url, _ = served
    client = _anthropic(url)
    requests: list[Any] = [{"custom_id": f"m{i}", "params": _message(f"hi {i}")} for i in range(12)]
    requests.append({"custom_id": "bad", "params": {"model": "fake", "messages": []}})
    created = client.messages.batches.create(requests=requests)
    assert created.processing_status == "in_progress" and created.results_url is None
    assert created.request_counts.processing == 13
    ended = _until(
        lambda: client.messages.batches.retrieve(created.id),
        lambda b: b.processing_status == "ended",
        "the message batch to end",
    )
    counts = ended.request_counts
    assert (counts.succeeded, counts.errored, counts.processing) == (12, 1, 0)
    assert ended.results_url is not None and ended.ended_at is not None
    results = {r.custom_id: r.result for r in client.messages.batches.results(created.id)}
    assert sorted(results) == sorted(r["custom_id"] for r in requests)
    assert all(results[f"m{i}"].type == "succeeded" for i in range(12))
    bad = results["bad"]
    assert bad.type == "errored" and bad.error.error.type == "invalid_request_error"
    listed = [b.id for b in client.messages.batches.list()]
    assert listed[0] == created.id
    assert client.messages.batches.delete(created.id).type == "message_batch_deleted"
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(created.id)


def test_a_message_batch_is_cancelled_and_listed_both_ways(
    served: tuple[str, HeldEngine],
) -> None:
    url, engine = served
    client = _anthropic(url)
    made = [
        client.messages.batches.create(
            requests=[{"custom_id": "only", "params": _message("hold" if i == 2 else "hi")}]
        )
        for i in range(3)
    ]
    _until(lambda: len(engine.running), lambda n: n > 0, "the held request in the engine")
    with pytest.raises(anthropic.BadRequestError):  # not ended: not deleted
        client.messages.batches.delete(made[2].id)
    cancelling = client.messages.batches.cancel(made[2].id)
    assert cancelling.processing_status in ("canceling", "ended")
    assert cancelling.cancel_initiated_at is not None
    ended = _until(
        lambda: client.messages.batches.retrieve(made[2].id),
        lambda b: b.processing_status == "ended",
        "the cancelled batch to end",
    )
    assert ended.request_counts.canceled == 1
    assert [r.result.type for r in client.messages.batches.results(made[2].id)] == ["canceled"]
    newest = client.messages.batches.list(limit=1)
    assert [b.id for b in newest.data] == [made[2].id] and newest.has_more
    older = client.messages.batches.list(limit=5, after_id=made[2].id)
    assert [b.id for b in older.data] == [made[1].id, made[0].id]
    newer = client.messages.batches.list(limit=5, before_id=made[0].id)
    assert [b.id for b in newer.data] == [made[2].id, made[1].id]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"requests": []}, "requests"),
        ({"requests": [{"custom_id": "a b", "params": {}}]}, "requests.0.custom_id"),
        ({"requests": [{"custom_id": "a", "params": {}}, {"custom_id": "a", "params": {}}]},
         "requests.1.custom_id"),
        ({"requests": [{"custom_id": "a", "params": "x"}]}, "requests.0.params"),
        ({"nothing": 1}, "requests"),
    ],
    ids=["none", "custom_id", "twice", "params", "missing"],
)  # fmt: skip
def test_message_batches_refuse_what_anthropic_refuses_at_creation(
    served: tuple[str, HeldEngine], body: dict[str, Any], param: str
) -> None:
    url, _ = served
    answer = httpx.post(f"{url}/v1/messages/batches", verify=TLS, json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["type"] == "error"
    assert param in answer.json()["error"]["message"]
    garbage = httpx.post(f"{url}/v1/messages/batches", verify=TLS, content=b"{nope", headers=JSON)
    assert garbage.status_code == 400


@pytest.mark.parametrize(
    "value",
    [b"NaN", b"1e999999", b'"\\ud800"', b"123456789012345678901234567890", b"[" * 100_000],
    ids=["nan", "infinite", "surrogate", "huge-int", "deep"],
)
def test_message_batches_refuse_what_json_bodies_refuse(
    served: tuple[str, HeldEngine], value: bytes
) -> None:
    """Read request by request by the stdlib's decoder, a body is held to orjson's rules
    (every other JSON body's parser): a 400, never a 500."""
    url, _ = served
    body = b'{"requests": [{"custom_id": "a", "params": {"x": ' + value + b"}}]}"
    answer = httpx.post(f"{url}/v1/messages/batches", verify=TLS, content=body, headers=JSON)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["type"] == "invalid_request_error"


class WatchedEngine(FakeEngine):
    """Steps every request slowly, and notes how many batch requests were running at each
    step of an interactive one."""

    def __init__(self) -> None:
        super().__init__(step_delay=0.004)
        self.beside: list[int] = []  # batch requests running, at each interactive token
        self.at_start: list[int] = []  # ... as each interactive request reached the engine
        self.batch: set[str] = set()

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenEvent, None]:
        batch = request.priority == BATCH_PRIORITY
        if batch:
            self.batch.add(request.request_id)
        else:
            self.at_start.append(len(self.batch))
        try:
            async for event in super().generate(request):
                if not batch:
                    self.beside.append(len(self.batch))
                yield event
        finally:
            self.batch.discard(request.request_id)


@contextmanager
def _lane_at_its_width(
    tmp_path: Path, engine: WatchedEngine, busy_running: int
) -> Iterator[tuple[openai.OpenAI, str]]:
    """A server on `engine` whose lane runs at most 6, busy `busy_running`, running a batch
    of 30 chats of 60 tokens, its 6 in the engine: its client and the batch's id."""
    settings = Settings(
        model="fake",
        batch_store=str(tmp_path / "b.sqlite3"),
        batch_max_running=6,
        batch_busy_running=busy_running,
    )
    with uvicorn_in_thread(create_app(settings, engine=engine), lifespan="on") as port:
        client = _openai(f"http://127.0.0.1:{port}")
        lines = [_line(f"r{i}", _chat(f"batch {i}", 60)) for i in range(30)]
        upload = client.files.create(file=("in.jsonl", _jsonl(lines)), purpose="batch")
        batch = client.batches.create(
            input_file_id=upload.id, endpoint=CHAT, completion_window="24h"
        )
        _until(lambda: len(engine.batch), lambda n: n == 6, "the lane at its width")
        yield client, batch.id


def test_the_lane_yields_to_interactive_requests(tmp_path: Path) -> None:
    engine = WatchedEngine()
    with _lane_at_its_width(tmp_path, engine, busy_running=0) as (client, batch_id):
        interactive = client.chat.completions.create(**_chat("interactive", 120))
        assert interactive.usage is not None and interactive.usage.completion_tokens == 120
        # The batch's requests left the engine as it was admitted, before it reached the
        # engine, and stayed out.
        assert engine.at_start == [0]
        assert engine.beside == [0] * 120, engine.beside
        engine.step_delay = 0  # the yield is proved: the rest of the batch at once
        ended = _ended(client, batch_id)
        # The ones taken off ran again: each answered once all the same.
        ran = [r for r in engine.requests if r.priority == BATCH_PRIORITY]
        assert len(ran) >= 30 + 6
        out = _lines(client, ended.output_file_id)
        assert sorted(o["custom_id"] for o in out) == sorted(f"r{i}" for i in range(30))
        assert ended.error_file_id is None


class LeavingWatched(WatchedEngine):
    """Notes, too, the batch requests that left the engine before their end."""

    def __init__(self) -> None:
        super().__init__()
        self.left: list[str] = []

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenEvent, None]:
        ended = False
        try:
            async for event in super().generate(request):
                ended = event.finish_reason is not None
                yield event
        finally:
            if not ended and request.priority == BATCH_PRIORITY:
                self.left.append(request.request_id)


def test_the_lane_keeps_its_oldest_running_as_it_narrows(tmp_path: Path) -> None:
    """Past the busy width the newest leave and the oldest stay, however many interactive
    requests are admitted while the others unwind (two at once here: `n` = 2). Counted
    twice, the leaving would take the oldest too, to start others from nothing."""
    engine = LeavingWatched()
    with _lane_at_its_width(tmp_path, engine, busy_running=2) as (client, batch_id):
        first = {r.request_id for r in engine.requests if r.priority == BATCH_PRIORITY}
        interactive = client.chat.completions.create(**_chat("interactive", 20), n=2)
        assert len(interactive.choices) == 2
        assert len(first & set(engine.left)) == 4, engine.left
        engine.step_delay = 0
        ended = _ended(client, batch_id)
        out = _lines(client, ended.output_file_id)
        assert sorted(o["custom_id"] for o in out) == sorted(f"r{i}" for i in range(30))


def test_the_lane_builds_two_batch_prompts_at_a_time(
    served: tuple[str, HeldEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prompt thread is the interactive requests' too: the lane widening (8 here)
    queues no more than `BUILDING` batch builds ahead of the next interactive one."""
    url, _ = served
    building, most = 0, 0

    async def watched(build: Callable[[], T]) -> T:
        nonlocal building, most
        building += 1
        most = max(most, building)
        try:
            await asyncio.sleep(0.01)  # a slow build: the lane's starts pile up behind it
            return await in_prompt_thread(build)
        finally:
            building -= 1

    # Every batch build passes the lane's gate (`CallLane.built`); no interactive call
    # runs here to be counted with them.
    monkeypatch.setattr(responses_module, "in_prompt_thread", watched)
    client = _openai(url)
    lines = [_line(f"b{i}", _chat(f"built {i}")) for i in range(16)]
    upload = client.files.create(file=("in.jsonl", _jsonl(lines)), purpose="batch")
    created = client.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h")
    batch = _ended(client, created.id)
    assert batch.status == "completed" and batch.request_counts is not None
    assert batch.request_counts.completed == 16
    assert most == BUILDING


def test_a_responses_line_reading_its_conversation_holds_no_build_place(
    served: tuple[str, HeldEngine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Responses request reads the conversation it continues (the store's I/O) before
    its prompt is built: `BUILDING` requests stuck in that read keep none of the lane's
    build places, and the batch's other requests are built and answered meanwhile."""
    url, _ = served
    released = threading.Event()
    reading = 0
    context = Responses._context

    async def slow(
        self: Responses, principal: Principal, body: ResponsesRequest, kept: Any
    ) -> list[Item]:
        nonlocal reading
        if "stuck" in str(body.input):
            reading += 1
            while not released.is_set():  # the app's loop is uvicorn's thread's
                await asyncio.sleep(0.01)
        return await context(self, principal, body, kept)

    monkeypatch.setattr(Responses, "_context", slow)
    client = _openai(url)
    stuck = [_line(f"s{i}", _response(i) | {"input": "stuck"}, RESPONSES) for i in range(BUILDING)]
    free = [_line(f"f{i}", _response(i), RESPONSES) for i in range(4)]
    upload = client.files.create(file=("in.jsonl", _jsonl(stuck + free)), purpose="batch")
    created = client.batches.create(
        input_file_id=upload.id, endpoint=RESPONSES, completion_window="24h"
    )
    try:
        counted = _until(
            lambda: client.batches.retrieve(created.id).request_counts,
            lambda counts: counts is not None and counts.completed == len(free),
            "the requests not stuck answered while the stuck ones read",
        )
        assert counted is not None and reading == BUILDING
    finally:
        released.set()
    batch = _ended(client, created.id)
    assert batch.status == "completed" and batch.request_counts is not None
    assert batch.request_counts.completed == BUILDING + len(free)


def test_the_idle_lane_holds_the_engines_running_window_and_half_again() -> None:
    # The engine's running batch full and half as many again waiting for its places.
    assert idle_width(0, 128) == 192
    assert idle_width(0, 0) == 64  # an engine that does not say
    assert idle_width(40, 128) == 40  # --batch-max-running wins


def _app(store: Path, engine: FakeEngine, **settings: Any) -> Any:
    return create_app(Settings(model="fake", batch_store=str(store), **settings), engine=engine)


def test_a_batch_resumes_where_a_stopped_server_left_it(tmp_path: Path) -> None:
    """A server that stops gives its chunks back (their leases would hold them for two
    minutes); the next one on the store (here the same server restarted) answers what
    was left at once, every request once."""
    store = tmp_path / "b.sqlite3"
    held = HeldEngine()
    lease = {"batch_lease_s": 120.0}
    with uvicorn_in_thread(_app(store, held, batch_max_running=4, **lease), lifespan="on") as port:
        client = _openai(f"http://127.0.0.1:{port}")
        lines = [_line(f"r{i}", _chat(f"hold {i}" if i >= 10 else f"quick {i}")) for i in range(40)]
        upload = client.files.create(file=("in.jsonl", _jsonl(lines)), purpose="batch")
        batch = client.batches.create(
            input_file_id=upload.id, endpoint=CHAT, completion_window="24h"
        )
        _until(lambda: len(held.running), lambda n: n == 4, "held requests in the engine")
        answered = client.batches.retrieve(batch.id).request_counts
        assert answered is not None and answered.completed == 10
    assert held.running == set()  # its shutdown took them off the engine
    with uvicorn_in_thread(_app(store, FakeEngine(), **lease), lifespan="on") as port:
        client = _openai(f"http://127.0.0.1:{port}")
        ended = _ended(client, batch.id)
        assert ended.status == "completed"
        out = _lines(client, ended.output_file_id)
        assert sorted(o["custom_id"] for o in out) == sorted(f"r{i}" for i in range(40))


def test_two_servers_on_one_store_answer_every_request_once(tmp_path: Path) -> None:
    store = tmp_path / "b.sqlite3"
    engines = [FakeEngine(step_delay=0.002), FakeEngine(step_delay=0.002)]
    with (
        uvicorn_in_thread(_app(store, engines[0], batch_max_running=4), lifespan="on") as one,
        uvicorn_in_thread(_app(store, engines[1], batch_max_running=4), lifespan="on") as two,
    ):
        first, second = _openai(f"http://127.0.0.1:{one}"), _openai(f"http://127.0.0.1:{two}")
        lines = [_line(f"r{i}", _chat(f"q {i}", 20)) for i in range(200)]
        upload = first.files.create(file=("in.jsonl", _jsonl(lines)), purpose="batch")
        batch = first.batches.create(
            input_file_id=upload.id, endpoint=CHAT, completion_window="24h"
        )
        ended = _ended(second, batch.id)  # the other server answers it too
        out = _lines(second, ended.output_file_id)
        assert sorted(o["custom_id"] for o in out) == sorted(f"r{i}" for i in range(200))
        ran = [len([r for r in e.requests if r.priority == BATCH_PRIORITY]) for e in engines]
        assert all(ran), ran  # both servers took part


def test_a_tenant_sees_none_of_anothers_files_or_batches(tmp_path: Path) -> None:
    """Owned by the key's tenant: another tenant's id is not found, never forbidden, and
    lists hold only the caller's."""
    keys = {"tenant_api_key": ["acme:key-a", "other:key-b"]}
    with uvicorn_in_thread(
        _app(tmp_path / "b.sqlite3", FakeEngine(), **keys), lifespan="on"
    ) as port:
        url = f"http://127.0.0.1:{port}"
        acme = _openai(url, "key-a")
        other = _openai(url, "key-b")
        upload = acme.files.create(
            file=("in.jsonl", _jsonl([_line("a", _chat("x"))])), purpose="batch"
        )
        batch = acme.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h")
        for call in (
            lambda: other.files.retrieve(upload.id),
            lambda: other.files.content(upload.id),
            lambda: other.files.delete(upload.id),
            lambda: other.batches.retrieve(batch.id),
            lambda: other.batches.cancel(batch.id),
            lambda: other.batches.create(
                input_file_id=upload.id, endpoint=CHAT, completion_window="24h"
            ),
        ):
            with pytest.raises(openai.NotFoundError):
                call()
        assert list(other.files.list()) == [] and list(other.batches.list()) == []
        assert [b.id for b in acme.batches.list()] == [batch.id]
        mine = _anthropic(url, "key-a")
        theirs = _anthropic(url, "key-b")
        made = mine.messages.batches.create(requests=[{"custom_id": "m", "params": _message("hi")}])
        with pytest.raises(anthropic.NotFoundError):
            theirs.messages.batches.retrieve(made.id)
        assert theirs.messages.batches.list().data == []


def test_a_batchs_requests_run_as_its_tenant(tmp_path: Path) -> None:
    """A batch's request is its tenant's call: a Responses request it holds is stored as
    that tenant's (read back, and continued from, by its key; not found by another's),
    as the same request sent with that key would be. Fails if a batch's requests run as
    anyone else (the default tenant)."""
    keys = {"tenant_api_key": ["acme:key-a", "other:key-b"], "api_key": "key-full"}
    store = {"responses_store": str(tmp_path / "r.sqlite3")}
    app = _app(tmp_path / "b.sqlite3", FakeEngine(), **keys, **store)
    with uvicorn_in_thread(app, lifespan="on") as port:
        url = f"http://127.0.0.1:{port}"
        acme, other, full = (_openai(url, key) for key in ("key-a", "key-b", "key-full"))
        line = _line("r", {**_response(0), "store": True}, "/v1/responses")
        upload = acme.files.create(file=("in.jsonl", _jsonl([line])), purpose="batch")
        batch = _ended(
            acme,
            acme.batches.create(
                input_file_id=upload.id, endpoint="/v1/responses", completion_window="24h"
            ).id,
        )
        assert batch.status == "completed", batch
        [out] = _lines(acme, batch.output_file_id)
        response_id = out["response"]["body"]["id"]
        assert acme.responses.retrieve(response_id).id == response_id
        for stranger in (other, full):
            with pytest.raises(openai.NotFoundError):
                stranger.responses.retrieve(response_id)


def test_a_tenants_uploads_are_bounded_by_its_quota(tmp_path: Path) -> None:
    """`--tenant-limits acme:uploaded_bytes=N`: acme's uploads past N are refused (429
    `store_full`, leaving nothing), another tenant's still fit, and deleting a file gives
    acme its room back. Fails if uploads are bounded only by the store's total."""
    keys = {
        "tenant_api_key": ["acme:key-a", "other:key-b"],
        "tenant_limits": ["acme:uploaded_bytes=3000"],
        "batch_store_max_bytes": 100_000,
    }
    with uvicorn_in_thread(
        _app(tmp_path / "b.sqlite3", FakeEngine(), **keys), lifespan="on"
    ) as port:
        url = f"http://127.0.0.1:{port}"
        acme = _openai(url, "key-a")
        other = _openai(url, "key-b")
        content = _jsonl([_line(f"r{i}", _chat("x" * 40)) for i in range(8)])
        assert 1500 < len(content) <= 3000, len(content)  # one fits, two do not
        first = acme.files.create(file=("a.jsonl", content), purpose="batch")
        with pytest.raises(openai.RateLimitError) as refused:
            acme.files.create(file=("b.jsonl", content), purpose="batch")
        assert refused.value.code == "store_full"
        assert [f.id for f in acme.files.list()] == [first.id]
        for name in ("c.jsonl", "d.jsonl", "e.jsonl"):
            other.files.create(file=(name, content), purpose="batch")
        acme.files.delete(first.id)
        acme.files.create(file=("b.jsonl", content), purpose="batch")
