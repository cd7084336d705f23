"""The Messages core without an engine: the translation of every block kind onto the
neutral conversation, and the stream read back by the anthropic SDK's own accumulator.

Crafted model text (hermes tool calls, as the tiny model's template writes them) is fed
to `MessagesExchange` as engine events, streamed cut at every boundary and whole; the SDK's
`accumulate_event` builds its message from the stream's events, which must be the
non-streamed message: text, each call's id, name and input (the `input_json_delta`
fragments joined), stop reason and usage. A stream whose fragments did not join, whose
blocks were opened or indexed wrongly, or whose stop reason differed fails here.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message

from app.engine.base import ChatMessage, FinishReason, ImagePart, TextPart, TokenEvent
from app.engine.models import ServedModel
from app.engine.tools import NamedTool, ParsedDelta, ParsedOutput, ToolCall, ToolCallDelta
from app.errors import InvalidRequest, Overloaded, ShuttingDown
from app.protocols.anthropic.errors import error_body, error_kind
from app.protocols.anthropic.exchange import MessagesExchange
from app.protocols.anthropic.messages import conversation
from app.protocols.bodies import validate
from app.protocols.conversation.plan import plan_conversation
from schemas.anthropic import AnthropicMessagesRequest
from tests.conftest import tiny_model_path
from tests.fake_engine import FakeEngine, vllm_tool_support

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS = [
    {"name": "get_weather", "input_schema": WEATHER},
    {"name": "plan", "description": "Plans.", "input_schema": {"type": "object"}},
]


def call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


OSLO = call("get_weather", '{"city": "Oslo"}')
NESTED = {"steps": [{"a": [1, 2.5, {"b": None}]}, []], "note": 'Zürich "x" \\ ☃ \U0001f600'}
TEXTS = {
    "plain text": "It is 21 degrees in Oslo.",
    "one call": OSLO,
    "text, then a call": "Let me look. " + OSLO,
    "two calls, two tools": OSLO + "\n" + call("plan", json.dumps(NESTED, ensure_ascii=False)),
    "a call with empty arguments": call("plan", "{}"),
}


@pytest.fixture(scope="module")
def info() -> Any:
    """The fake engine's info with Switchboard's vLLM tool support (hermes, auto), on the
    tiny model's tokenizer: what `switchboard serve --tool-call-parser hermes
    --enable-auto-tool-choice` plans and parses with."""
    from vllm.tokenizers import get_tokenizer

    tokenizer = get_tokenizer(str(tiny_model_path()))
    support = vllm_tool_support(tokenizer, str(tiny_model_path()))
    return replace(FakeEngine().info, tools=support)


def _body(**fields: Any) -> AnthropicMessagesRequest:
    body = {
        "model": "fake",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "What is the weather in Oslo?"}],
        **fields,
    }
    return validate(AnthropicMessagesRequest, body)


def _exchange(info: Any, **fields: Any) -> MessagesExchange:
    return MessagesExchange(
        _body(**fields),
        info,
        FakeEngine().tokenizer,
        message_id="msg_1",
        served=ServedModel("fake", None),
    )


def _events(
    deltas: list[str], finish: FinishReason = "stop", stop: str | None = None
) -> list[TokenEvent]:
    return [
        TokenEvent(
            token_ids=[7 + i],
            text=delta,
            finish_reason=finish if i == len(deltas) - 1 else None,
            stop_reason=stop if i == len(deltas) - 1 else None,
            prompt_token_ids=[1, 2, 3] if i == 0 else None,
            num_cached_tokens=1 if i == 0 else 0,
        )
        for i, delta in enumerate(deltas)
    ]


def _whole(exchange: MessagesExchange, events: list[TokenEvent]) -> dict[str, Any]:
    for event in events:
        exchange.feed(0, event)
    return exchange.result()


def _stream(
    exchange: MessagesExchange, events: list[TokenEvent]
) -> list[tuple[str, dict[str, Any]]]:
    out = list(exchange.opening())
    for event in events:
        out.extend(exchange.events(0, event))
    out.extend(exchange.closing())
    return [(name or "", dict(body)) for name, body in out]


def _accumulated(stream: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The SDK's message from the stream (pings skipped, as the SDK skips them)."""
    snapshot = None
    buffers: dict[int, bytes] = {}
    for name, body in stream:
        assert body["type"] == name
        if name != "ping":
            snapshot = accumulate_event(
                event=json.loads(json.dumps(body)), current_snapshot=snapshot, json_bufs=buffers
            )
    assert snapshot is not None
    return Message.model_validate(snapshot.to_dict()).model_dump(exclude_none=True)


def _cuts(text: str) -> list[list[str]]:
    """The text in two deltas at every cut, and one character at a time."""
    return [[text[:i], text[i:]] for i in range(1, len(text))] + [list(text)]


@pytest.mark.parametrize("name", list(TEXTS))
def test_the_sdk_builds_the_whole_message_from_the_stream(info: Any, name: str) -> None:
    text = TEXTS[name]
    for deltas in _cuts(text):
        whole = Message.model_validate(_whole(_exchange(info, tools=TOOLS), _events(deltas)))
        expected = whole.model_dump(exclude_none=True)
        got = _accumulated(_stream(_exchange(info, tools=TOOLS), _events(deltas)))
        for block, want in zip(got["content"], expected["content"], strict=False):
            if block["type"] == "tool_use":
                assert block["id"]
                block["id"] = want["id"]  # ids are fresh per parse
        assert got == expected, deltas
        if name != "plain text":
            assert whole.stop_reason == "tool_use"
            assert whole.content[-1].type == "tool_use"


def test_the_stream_frames_blocks_in_order(info: Any) -> None:
    """message_start, ping, then per block start / deltas / stop with increasing indexes,
    then message_delta and message_stop; a call opens its own block."""
    stream = _stream(_exchange(info, tools=TOOLS), _events(["Let me look. ", OSLO]))
    names = [name for name, _ in stream]
    assert names[:2] == ["message_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    starts = [body for name, body in stream if name == "content_block_start"]
    assert [s["index"] for s in starts] == [0, 1]
    assert [s["content_block"]["type"] for s in starts] == ["text", "tool_use"]
    assert starts[1]["content_block"]["input"] == {}
    stops = [body["index"] for name, body in stream if name == "content_block_stop"]
    assert stops == [0, 1]
    # Each block's stop comes after its own deltas and before the next block's start.
    order = [(name, body.get("index")) for name, body in stream if name.startswith("content_block")]
    assert order.index(("content_block_stop", 0)) < order.index(("content_block_start", 1))
    usage = stream[0][1]["message"]["usage"]
    assert usage == {
        "input_tokens": 2,
        "output_tokens": 1,
        "cache_read_input_tokens": 1,
        "cache_creation_input_tokens": 0,
    }


@pytest.mark.parametrize(
    ("finish", "stop", "reason", "sequence"),
    [
        ("length", None, "max_tokens", None),
        ("stop", None, "end_turn", None),
        ("stop", 0, "end_turn", None),  # a stop token (EOS) is the end of the turn
        ("stop", "\n\n", "stop_sequence", "\n\n"),
    ],
)
def test_stop_reasons(
    info: Any, finish: FinishReason, stop: Any, reason: str, sequence: Any
) -> None:
    events = _events(["a", "b"], finish, stop)
    whole = _whole(_exchange(info), events)
    assert (whole["stop_reason"], whole["stop_sequence"]) == (reason, sequence)
    delta = _stream(_exchange(info), events)[-2][1]["delta"]
    assert delta == {"stop_reason": reason, "stop_sequence": sequence}


def test_an_empty_answer_has_one_empty_text_block(info: Any) -> None:
    events = _events([""])
    whole = _whole(_exchange(info), events)
    assert whole["content"] == [{"type": "text", "text": ""}]
    assert _accumulated(_stream(_exchange(info), events))["content"] == whole["content"]


class _Thinker:
    """A parser as a reasoning parser reads: the text before `|` is reasoning."""

    def __init__(self) -> None:
        self._seen = ""

    def parse(self, text: str, token_ids: Any) -> ParsedOutput:
        reasoning, _, content = text.partition("|")
        return ParsedOutput(content or None, (), reasoning or None)

    def feed(
        self, text: str, token_ids: Any, *, prompt_token_ids: Any, finished: bool
    ) -> ParsedDelta:
        before = "|" in self._seen
        self._seen += text
        if before:
            return ParsedDelta(text or None, ())
        reasoning, _, content = text.partition("|")
        return ParsedDelta(content or None, (), reasoning or None)


def test_reasoning_is_a_thinking_block(info: Any) -> None:
    exchange = _exchange(info)
    exchange._output = replace(exchange._output, parser=_Thinker())
    stream = _stream(exchange, _events(["I think", " hard|", "Hi", " there"]))
    whole_exchange = _exchange(info)
    whole_exchange._output = replace(whole_exchange._output, parser=_Thinker())
    whole = _whole(whole_exchange, _events(["I think", " hard|", "Hi", " there"]))
    assert whole["content"] == [
        {"type": "thinking", "thinking": "I think hard", "signature": ""},
        {"type": "text", "text": "Hi there"},
    ]
    assert _accumulated(stream)["content"] == whole["content"]
    deltas = [body["delta"]["type"] for name, body in stream if name == "content_block_delta"]
    assert deltas == ["thinking_delta", "thinking_delta", "text_delta", "text_delta"]


def test_every_block_kind_becomes_the_neutral_conversation() -> None:
    """System blocks (billing header left out), an inline system message, a user turn of
    text and tool results (in order), an assistant turn of text, calls and thinking."""
    body = _body(
        system=[
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=1.2.3;"},
            {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Use tools."},
        ],
        messages=[
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Need a tool.", "signature": "s"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "Looking."},
                    {
                        "type": "tool_use",
                        "id": "t1",
                        "name": "get_weather",
                        "input": {"city": "Oslo"},
                    },
                    {"type": "tool_use", "id": "t2", "name": "plan", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "12 C"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "t2",
                        "is_error": True,
                        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    },
                    {"type": "text", "text": "Thanks."},
                ],
            },
            {"role": "system", "content": "Be kind."},
        ],
        tools=TOOLS,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        stop_sequences=["END"],
        top_k=5,
        thinking={"type": "disabled"},
    )
    call = conversation(body, FakeEngine().info, request_id="r", lora_name=None)
    assert list(call.messages) == [
        ChatMessage("system", (TextPart("Be brief."), TextPart("Use tools."))),
        ChatMessage("user", (TextPart("Weather?"),)),
        ChatMessage(
            "assistant",
            (TextPart("Looking."),),
            tool_calls=(
                ToolCall("t1", "get_weather", '{"city": "Oslo"}'),
                ToolCall("t2", "plan", "{}"),
            ),
            reasoning="Need a tool.",
        ),
        ChatMessage("tool", (TextPart("12 C"),), tool_call_id="t1"),
        ChatMessage("tool", (TextPart("a"), TextPart("b")), tool_call_id="t2"),
        ChatMessage("user", (TextPart("Thanks."),)),
        ChatMessage("system", (TextPart("Be kind."),)),
    ]
    assert call.tool_choice == "required" and call.parallel_tool_calls is False
    assert all(tool.strict for tool in call.tools)  # forced: the input matches its schema
    assert call.sampling.stop == ("END",) and call.sampling.top_k == 5
    assert call.sampling.temperature == 1.0 and call.max_tokens == 64
    assert call.template_kwargs == {"enable_thinking": False}
    assert call.add_generation_prompt and not call.continue_final_message


def test_tool_choices_and_prefill() -> None:
    info = FakeEngine().info
    named = conversation(
        _body(tools=TOOLS, tool_choice={"type": "tool", "name": "plan"}),
        info,
        request_id="r",
        lora_name=None,
    )
    assert named.tool_choice == NamedTool("plan") and named.parallel_tool_calls is None
    auto = conversation(_body(tools=TOOLS), info, request_id="r", lora_name=None)
    assert auto.tool_choice is None and all(t.strict is None for t in auto.tools)
    prefill = _body(
        messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "def"}]
    )
    call = conversation(prefill, info, request_id="r", lora_name=None)
    assert call.continue_final_message and not call.add_generation_prompt


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
                }
            ],
            "messages.0.content.0",
        ),
        (
            [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}],
            "messages.0.content.0",
        ),
        (
            [{"role": "user", "content": [{"type": "thinking", "thinking": "x"}]}],
            "messages.0.content.0",
        ),
        (
            [
                {"role": "user", "content": "a"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
                },
            ],
            "messages.1",
        ),
        (
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}
                    ],
                }
            ],
            "messages.0.content.0.source.url",
        ),
    ],
)
def test_misplaced_blocks_are_refused_naming_the_block(messages: list[Any], param: str) -> None:
    info = FakeEngine().info
    with pytest.raises(InvalidRequest) as refused:
        conversation(_body(messages=messages), info, request_id="r", lora_name=None)
    assert refused.value.param == param


def test_a_body_refused_by_type_names_the_field_not_the_union() -> None:
    with pytest.raises(InvalidRequest) as refused:
        _body(messages=[{"role": "user", "content": [{"type": "text"}]}])
    assert refused.value.param == "messages.0.content.0.text"
    assert refused.value.message == "messages.0.content.0.text: Field required"
    with pytest.raises(InvalidRequest) as server_tool:
        _body(tools=[{"type": "web_search_20250305", "name": "web_search"}])
    assert (server_tool.value.param or "").startswith("tools.0")


def test_images_need_a_vision_model() -> None:
    data = "aGVsbG8="
    body = _body(
        messages=[
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": data},
                    }
                ],
            }
        ]
    )
    with pytest.raises(InvalidRequest) as refused:
        conversation(body, FakeEngine().info, request_id="r", lora_name=None)
    assert refused.value.param == "messages.0.content.0.source"


def test_the_billing_header_leaves_the_prompt_alone() -> None:
    """Claude Code's per-request billing header does not reach the template, so two
    turns that differ only there render the same prompt (and share the prefix cache)."""
    engine = FakeEngine()

    def ids(header: str) -> list[int]:
        body = _body(system=[{"type": "text", "text": header}, {"type": "text", "text": "Hi."}])
        call = conversation(body, engine.info, request_id="r", lora_name=None)
        return list(plan_conversation(call, engine.info, engine.tokenizer).prompt_token_ids)

    assert ids("x-anthropic-billing-header: cc_version=1.0.1;") == ids(
        "x-anthropic-billing-header: cc_version=1.0.2;"
    )
    assert ids("an instruction") != ids("another one")


def test_error_types_and_statuses() -> None:
    assert error_kind(Overloaded("full", retry_after_s=1)) == ("overloaded_error", 529)
    assert error_kind(ShuttingDown("bye", retry_after_s=1)) == ("overloaded_error", 503)
    assert error_kind(InvalidRequest("x")) == ("invalid_request_error", 400)
    assert error_body(InvalidRequest("bad")) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "bad"},
    }


def test_images_are_parts_of_their_turn() -> None:
    """An image in a user turn and in a tool result stays where the client put it."""
    from tests.fake_engine import FakeEngine as Engine

    seen: list[Any] = []

    from app.engine.base import DecodedImage, VisionInfo

    def read(data: bytes, mime: str, max_pixels: int | None = None) -> DecodedImage:
        seen.append(mime)
        return DecodedImage(pixels=None, digest=mime, pad_tokens=1)

    info = replace(Engine().info, vision=VisionInfo(250, 251, 252, 4, read))
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "aGk="},
    }
    body = _body(
        messages=[
            {"role": "user", "content": [image, {"type": "text", "text": "Look."}]},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t", "content": [image]}],
            },
        ]
    )
    call = conversation(body, info, request_id="r", lora_name=None)
    kinds = [[type(p).__name__ for p in m.parts] for m in call.messages]
    assert kinds == [["ImagePart", "TextPart"], [], ["ImagePart"]]
    assert isinstance(call.messages[2].parts[0], ImagePart) and seen == ["image/png", "image/png"]
    assert call.messages[2].tool_call_id == "t"


def test_tool_call_deltas_open_one_block_per_call(info: Any) -> None:
    """A call's last piece handed on after the next call's first, in one delta, still
    lands in its own block."""
    exchange = _exchange(info)

    class Script:
        def __init__(self) -> None:
            self.steps = [
                (ToolCallDelta(0, "a", "f", '{"x": '),),
                (ToolCallDelta(1, "b", "g", "{}"), ToolCallDelta(0, arguments="1}")),
            ]

        def feed(self, *args: Any, **kwargs: Any) -> ParsedDelta:
            return ParsedDelta(None, self.steps.pop(0))

        def parse(self, *args: Any) -> ParsedOutput:
            raise AssertionError("not streamed")

    exchange._output = replace(exchange._output, parser=Script())
    got = _accumulated(_stream(exchange, _events(["p", "q"])))
    assert [(b["id"], b["input"]) for b in got["content"]] == [("a", {"x": 1}), ("b", {})]
    assert got["stop_reason"] == "tool_use"
