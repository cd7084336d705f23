"""The Responses API's sans-IO pieces and its runner on the deterministic fake engine:
input items in normal form and as neutral messages, the stream's events against the
whole answer, a stored response replayed, truncation, and background runs under a drain.
The same on real vLLM through real clients: tests/e2e/test_responses_*.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from app.admission import Admission
from app.drain import Drain
from app.engine.base import FinishReason, TokenEvent
from app.engine.models import ServedModel
from app.errors import ContextLengthExceeded, InvalidRequest
from app.protocols.openai.responses.compaction import SUMMARY_REQUEST, compacted, summary_call
from app.protocols.openai.responses.events import replay
from app.protocols.openai.responses.exchange import ResponsesExchange
from app.protocols.openai.responses.items import SUMMARY_HEAD, messages, read_input
from app.protocols.openai.responses.record import StoredResponse
from app.sessions.responses import Responses
from app.store.sqlite import SqliteStore
from app.telemetry.record import RequestRecord
from schemas.openai_responses import CompactRequest, ResponsesRequest
from tests.fake_engine import FakeEngine
from tests.open_responses import event_errors, schema_errors
from tests.principals import ANYONE


def _exchange(
    engine: FakeEngine, context: list[Any] | None = None, **body: Any
) -> ResponsesExchange:
    request = ResponsesRequest.model_validate({"input": "hi", "max_output_tokens": 4, **body})
    return ResponsesExchange(
        request,
        engine.info,
        engine.tokenizer,
        response_id="resp_1",
        created_at=1,
        served=ServedModel("fake", None),
        context=context or [],
        input_items=read_input(request.input),
        clock=lambda: 7.9,
    )


USAGE = {
    "input_tokens": 1,
    "output_tokens": 1,
    "total_tokens": 2,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens_details": {"reasoning_tokens": 0},
}


def _in_spec(events: list[Any]) -> None:
    """Every event, and every response it carries, as the Open Responses spec's schemas
    require them (tests/open_responses.py)."""
    for _, body in events:
        assert event_errors(body) == [], body


def _events(texts: list[str], finish: FinishReason = "length") -> list[TokenEvent]:
    out = []
    for i, text in enumerate(texts):
        last = i == len(texts) - 1
        out.append(
            TokenEvent(
                token_ids=[ord(text[0])] if text else [],
                text=text,
                finish_reason=finish if last else None,
                prompt_token_ids=[1, 2, 3] if i == 0 else None,
                num_cached_tokens=2 if i == 0 else 0,
            )
        )
    return out


def test_read_input_normal_form_and_errors() -> None:
    items = read_input(
        [
            {"role": "user", "content": "a"},
            {
                "type": "message",
                "role": "assistant",
                "content": "b",
                "id": "msg_given",
                "phase": "final_answer",
            },
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "r"},
        ]
    )
    assert items[1]["phase"] == "final_answer" and "phase" not in items[0]
    assert [i["type"] for i in items] == ["message"] * 2 + ["function_call", "function_call_output"]
    assert items[0]["content"] == [{"type": "input_text", "text": "a"}]
    assert items[1]["id"] == "msg_given" and items[1]["content"][0]["type"] == "output_text"
    assert items[2]["id"].startswith("fc_") and items[3]["id"].startswith("fco_")
    cases: list[tuple[Any, str]] = [
        ([{"role": "user"}], "input.0.content"),
        (
            [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}],
            "input.0.arguments",
        ),
        ([{"role": "user", "content": [{"type": "input_audio"}]}], "input.0.content.0.type"),
        ([{"type": "item_reference", "id": "x"}], "input.0.type"),
        ([{"role": "user", "content": "a", "phase": "commentary"}], "input.0.phase"),
        ([{"role": "assistant", "content": "a", "phase": "draft"}], "input.0.phase"),
        ([7], "input.0"),
    ]
    for bad, param in cases:
        with pytest.raises(InvalidRequest) as raised:
            read_input(bad)
        assert raised.value.param == param


def test_a_compacted_window_keeps_the_user_messages_and_reads_back_its_summary() -> None:
    conversation = read_input(
        [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "answer"},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "r"},
            {"role": "user", "content": "second"},
        ]
    )
    answer = {
        "output": [
            {"type": "message", "content": [{"type": "output_text", "text": "S\u00e9 \ud800"}]}
        ],
        "usage": {"input_tokens": 1},
    }
    window = compacted(conversation, answer, created_at=5)
    assert schema_errors("CompactResource", {**window, "usage": USAGE}) == []
    assert [item["type"] for item in window["output"]] == ["message", "message", "compaction"]
    assert window["output"][:2] == [conversation[0], conversation[4]]
    assert window["usage"] == answer["usage"] and window["created_at"] == 5
    # Given back with a new question, the summary is the assistant's turn before it.
    again = read_input([*window["output"], {"role": "user", "content": "third"}])
    chat = messages(again, FakeEngine().info, lambda i: f"input.{i}")
    assert [m.role for m in chat] == ["user", "user", "assistant", "user"]
    assert chat[2].text() == SUMMARY_HEAD + "S\u00e9 \ud800"
    forged = {"type": "compaction", "encrypted_content": "gAAAAB-someone-else's"}
    with pytest.raises(InvalidRequest) as raised:
        read_input([forged])
    assert raised.value.param == "input.0.encrypted_content"


def test_a_compaction_is_a_responses_call_that_asks_for_a_summary_last() -> None:
    call = summary_call(
        CompactRequest.model_validate(
            {
                "model": "m",
                "input": "hi",
                "instructions": "be brief",
                "previous_response_id": "r",
                "max_output_tokens": 9,
            }
        )
    )
    assert call.input == [
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "message", "role": "user", "content": SUMMARY_REQUEST},
    ]
    assert (call.instructions, call.previous_response_id) == ("be brief", "r")
    assert (call.truncation, call.store, call.stream) == ("auto", False, False)
    assert call.max_output_tokens == 9


def test_an_output_answers_a_call_before_it() -> None:
    engine = FakeEngine()
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "c1", "output": "r"}
    _exchange(engine, input=[call, output])  # answered
    _exchange(engine, read_input([call]), input=[output])  # a stored call, answered now
    for given, param in (
        ([output], "input.0.call_id"),
        ([output, call], "input.0.call_id"),
        ([call, {**output, "call_id": "c2"}], "input.1.call_id"),
    ):
        with pytest.raises(InvalidRequest) as raised:
            _exchange(engine, input=given)
        assert raised.value.param == param


def test_an_assistant_turn_holds_its_text_reasoning_and_calls() -> None:
    items = read_input(
        [
            {"role": "user", "content": "q"},
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "think"}]},
            {"role": "assistant", "content": "let me look"},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x": 1}'},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
            {"type": "function_call_output", "call_id": "c2", "output": "two"},
            {"role": "user", "content": "thanks"},
        ]
    )
    chat = messages(items, FakeEngine().info, lambda i: f"input.{i}")
    assert [m.role for m in chat] == ["user", "assistant", "tool", "tool", "user"]
    turn = chat[1]
    assert turn.text() == "let me look" and turn.reasoning == "think"
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [
        ("c1", "f", '{"x": 1}'),
        ("c2", "g", "{}"),
    ]
    assert (chat[2].tool_call_id, chat[2].text()) == ("c1", "one")


def test_the_stream_adds_up_to_the_whole_answer() -> None:
    engine = FakeEngine()
    streamed = _exchange(engine)
    events = streamed.opening()
    for event in _events(["a", "b", "c", "d"]):
        events += streamed.events(0, event)
    events += streamed.closing()
    kinds = [name for name, _ in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 4,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [body["sequence_number"] for _, body in events] == list(range(len(events)))
    _in_spec(events)
    final = events[-1][1]["response"]
    assert final["status"] == "incomplete" and final["completed_at"] is None
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    (item,) = final["output"]
    assert {body.get("item_id", item["id"]) for _, body in events[3:-1]} == {item["id"]}
    assert item["content"][0]["text"] == "abcd" and item["status"] == "incomplete"
    assert final["usage"]["input_tokens"] == 3
    assert final["usage"]["input_tokens_details"] == {"cached_tokens": 2}
    whole = _exchange(engine)
    for event in _events(["a", "b", "c", "d"]):
        whole.feed(0, event)
    answer = whole.result()
    assert answer["status"] == "incomplete"
    assert answer["output"][0]["content"] == item["content"]
    assert answer["usage"] == final["usage"]


def test_an_empty_answer_is_one_empty_message_streamed_or_not() -> None:
    engine = FakeEngine()
    streamed = _exchange(engine)
    events = [e for event in _events([""], "stop") for e in streamed.events(0, event)]
    events += streamed.closing()
    final = events[-1][1]["response"]
    assert events[-1][0] == "response.completed"
    assert final["completed_at"] == 7  # the clock's, in whole seconds
    assert [i["content"][0]["text"] for i in final["output"]] == [""]
    whole = _exchange(engine)
    whole.feed(0, _events([""], "stop")[0])
    answer = whole.result()
    assert schema_errors("ResponseResource", answer) == []
    assert [i["content"][0]["text"] for i in answer["output"]] == [""]


def test_a_stored_response_replays_as_its_stream_did() -> None:
    exchange = _exchange(FakeEngine())
    live = exchange.opening()
    for event in _events(["x", "y"], "stop"):
        live += exchange.events(0, event)
    live += exchange.closing()
    final = live[-1][1]["response"]
    replayed = replay(final)
    # The same events, the text in one delta instead of one per token.
    collapse = [name for i, (name, _) in enumerate(live) if name != live[i - 1][0] or i == 0]
    assert [name for name, _ in replayed] == collapse
    assert [body["sequence_number"] for _, body in replayed] == list(range(len(replayed)))
    _in_spec(replayed)
    assert replayed[-1][1]["response"] == final
    record = StoredResponse(final, list(exchange.input_items), [])
    assert StoredResponse.decode(record.encode()) == record
    assert StoredResponse.decode(b"not a record") is None


def test_failure_ends_the_stream_in_its_shape() -> None:
    exchange = _exchange(FakeEngine())
    exchange.opening()
    exchange.events(0, _events(["a", "b"])[0])
    error, failed = exchange.failure(ContextLengthExceeded("too long", param="input"))
    _in_spec([error, failed])
    assert error[0] == "error" and error[1]["param"] == "input"
    assert error[1]["error"] == {
        "type": "invalid_request_error",
        "code": "400",
        "message": "too long",
        "param": "input",
    }
    assert failed[0] == "response.failed"
    response = failed[1]["response"]
    assert response["status"] == "failed"
    assert response["error"]["code"] == "invalid_prompt"
    assert response["output"][0]["status"] == "incomplete"


def test_truncation_auto_drops_the_oldest_turns() -> None:
    engine = FakeEngine(max_model_len=120)
    long_turns: list[Any] = []
    for i in range(6):
        long_turns += [
            {"role": "user", "content": f"question {i} " * 2},
            {"role": "assistant", "content": f"answer {i} " * 2},
        ]
    context = read_input(long_turns)
    with pytest.raises(ContextLengthExceeded):
        _exchange(engine, context, max_output_tokens=8)
    exchange = _exchange(
        engine, context, max_output_tokens=8, truncation="auto", instructions="sys"
    )
    prompt_ids = exchange.requests[0].prompt_token_ids
    assert prompt_ids is not None
    prompt = "".join(chr(t) for t in prompt_ids)
    assert prompt.startswith("[system]sys")  # instructions are never dropped
    assert "question 0" not in prompt and prompt.rstrip().endswith("[user]hi\n[assistant]")
    assert len(prompt_ids) + 8 <= 120


class SlowStore(SqliteStore):
    """Writes that take a while, as a remote store's may: a goodbye that does not wait
    for them is seen."""

    async def put(
        self,
        tenant: str,
        key: str,
        data: bytes,
        *,
        quota: int = 0,
        unless_cancelled: bool = False,
    ) -> bool:
        await asyncio.sleep(0.2)
        return await super().put(tenant, key, data, quota=quota, unless_cancelled=unless_cancelled)


async def test_a_drain_cuts_background_runs_and_waits_for_their_records(tmp_path: Path) -> None:
    """Fails if the drain's goodbye returns before the cut run has written its record
    (the record would still say in_progress), or if the run is not cut at all."""
    engine = FakeEngine(step_delay=0.01)
    admission = Admission(None, None)
    drain = Drain(admission, timeout_s=0.0)
    store = SlowStore(tmp_path / "r.sqlite3", ttl_s=60, max_bytes=1 << 20)
    responses = Responses(engine, admission, store, drain)
    body = ResponsesRequest.model_validate(
        {"input": "long", "max_output_tokens": 400, "background": True}
    )
    call = await responses.start(ANYONE, body, RequestRecord("test", name="test"))
    queued = await responses.runs.start(ANYONE, call)
    while not engine.running:
        await asyncio.sleep(0.01)
    await drain.run(engine.abort)
    record = StoredResponse.decode(await store.get(ANYONE.tenant, queued["id"]) or b"")
    assert record is not None and record.status == "failed"
    assert "shutting down" in record.response["error"]["message"]
    assert not engine.running
    await responses.close()
