"""`tool_choice: auto` on crafted model text: what an OpenAI SDK user meets, held to what
`vllm serve` answers for the same text. No engine runs: the chat core is fed the text as
engine events, and vLLM's own serving layer (`OpenAIServingChat`'s full and stream
generators, with the same `--tool-call-parser hermes --enable-auto-tool-choice`) is fed
the same text as `RequestOutput`s. Both sides' streams go through the OpenAI SDK's stream
accumulator (`ChatCompletionStreamState`), as a client's `client.chat.completions.stream`
would.

Each text is streamed cut at every boundary (two deltas), and one character at a time:
cuts fall inside `<tool_call>` tags, inside JSON strings and inside escapes.

What vLLM's hermes parser does, and so what both servers do (never re-implemented here):
- Non-streamed arguments are `json.dumps(arguments, ensure_ascii=False)`; streamed ones
  are the model's own text between `"arguments":` and the closing brace. The two agree as
  JSON (compared parsed), not always as text (`\\u00e9` streams as written).
- JSON that does not parse inside the tags (or has no name) degrades to content when
  not streamed; while streaming the parser has already sent the call's name and argument
  text by then (or, with no name, holds everything back). Such texts are compared per
  mode with `vllm serve`, not across modes. Never an error in either mode.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionToolParam

from app.engine.base import TokenEvent
from app.engine.models import ServedModel
from app.protocols.openai.chat import ChatExchange
from schemas.openai import ChatCompletionRequest
from tests.conftest import tiny_model_path
from tests.fake_engine import FakeEngine, vllm_tool_support
from tests.vllm_chat import full_answer, serving_chat, stream_chunks

WEATHER: dict[str, object] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
}
TOOLS: list[ChatCompletionToolParam] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "plan", "parameters": {"type": "object"}}},
]
MESSAGES = [{"role": "user", "content": "What is the weather in Oslo?"}]


def call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


@dataclass(frozen=True)
class Case:
    text: str
    content: str | None  # non-streamed message.content
    calls: list[tuple[str, Any]]  # non-streamed (name, parsed arguments)
    parallel: bool | None = None
    modes_agree: bool = True  # streamed == non-streamed (False: vLLM's parser differs)


OSLO = call("get_weather", '{"city": "Oslo", "unit": "c"}')
LIMA = call("get_weather", '{"city": "Lima", "unit": "f"}')
NESTED = {"steps": [{"a": [1, 2.5, {"b": None}]}, []], "meta": {"x": {"y": True}}, "n": -3}
TRICKY = {"city": 'Zürich "old" town \\ ☃ 北京 \U0001f600', "unit": "c"}

CASES = {
    "one call": Case(OSLO, None, [("get_weather", {"city": "Oslo", "unit": "c"})]),
    "text before a call": Case(
        "Let me look. " + OSLO, "Let me look. ", [("get_weather", {"city": "Oslo", "unit": "c"})]
    ),
    "two calls": Case(
        OSLO + "\n" + LIMA,
        None,
        [
            ("get_weather", {"city": "Oslo", "unit": "c"}),
            ("get_weather", {"city": "Lima", "unit": "f"}),
        ],
    ),
    "three calls, two tools": Case(
        OSLO + call("plan", json.dumps(NESTED)) + LIMA,
        None,
        [
            ("get_weather", {"city": "Oslo", "unit": "c"}),
            ("plan", NESTED),
            ("get_weather", {"city": "Lima", "unit": "f"}),
        ],
    ),
    "two calls, parallel_tool_calls false": Case(
        "Sure. " + OSLO + LIMA,
        "Sure. ",
        [("get_weather", {"city": "Oslo", "unit": "c"})],
        parallel=False,
    ),
    "one call, parallel_tool_calls false": Case(
        OSLO, None, [("get_weather", {"city": "Oslo", "unit": "c"})], parallel=False
    ),
    "unicode and escaped quotes": Case(
        call("get_weather", json.dumps(TRICKY, ensure_ascii=False)),
        None,
        [("get_weather", TRICKY)],
    ),
    "unicode escapes as written": Case(
        call("get_weather", '{"city": "Z\\u00fcrich \\"x\\"", "unit": "c"}'),
        None,
        [("get_weather", {"city": 'Zürich "x"', "unit": "c"})],
    ),
    "nested objects and arrays": Case(call("plan", json.dumps(NESTED)), None, [("plan", NESTED)]),
    "an unknown function name": Case(
        call("launch_rockets", '{"count": 3}'), None, [("launch_rockets", {"count": 3})]
    ),
    "no call at all": Case("It is 21 degrees in Oslo.", "It is 21 degrees in Oslo.", []),
    "a lone < and a tag-like word": Case(
        "a < b, and tool_call is a word", "a < b, and tool_call is a word", []
    ),
    "complete JSON, closing tag cut off": Case(
        'Ok <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}',
        "Ok ",
        [("get_weather", {"city": "Oslo"})],
    ),
    "unterminated tag at the end of the stream": Case(
        'Ok <tool_call>\n{"name": "get_weather", "arguments": {"city": "Os',
        'Ok <tool_call>\n{"name": "get_weather", "arguments": {"city": "Os',
        [],
        modes_agree=False,
    ),
    "malformed JSON inside the tags": Case(
        '<tool_call>\n{"name": "get_weather", "arguments": {city: Oslo}}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {city: Oslo}}\n</tool_call>',
        [],
        modes_agree=False,
    ),
    "a call without a name": Case(
        '<tool_call>\n{"arguments": {"city": "Oslo"}}\n</tool_call>',
        '<tool_call>\n{"arguments": {"city": "Oslo"}}\n</tool_call>',
        [],
        modes_agree=False,  # streamed, the parser waits for a name and sends nothing
    ),
}


# -- the two servers ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from vllm.tokenizers import get_tokenizer

    return get_tokenizer(str(tiny_model_path()))


@pytest.fixture(scope="module")
def switchboard(tokenizer: Any) -> Any:
    """The chat core with Switchboard's vLLM tool support (what `VllmEngine` builds for
    `--tool-call-parser hermes --enable-auto-tool-choice`), over the fake engine's info."""
    return replace(FakeEngine().info, tools=vllm_tool_support(tokenizer, str(tiny_model_path())))


@pytest.fixture(scope="module")
def vllm_serve(tokenizer: Any) -> Any:
    return serving_chat(tokenizer, str(tiny_model_path()))


def _body(case: Case, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": MESSAGES,
        "tools": TOOLS,
        "tool_choice": "auto",
        "stream": stream,
    }
    if case.parallel is not None:
        body["parallel_tool_calls"] = case.parallel
    return body


def _exchange(info: Any, case: Case, stream: bool) -> ChatExchange:
    return ChatExchange(
        ChatCompletionRequest.model_validate(_body(case, stream)),
        info,
        FakeEngine().tokenizer,
        response_id="chatcmpl-1",
        created=1,
        served=ServedModel("tiny", None),
    )


def _ours_full(info: Any, case: Case) -> dict[str, Any]:
    exchange = _exchange(info, case, False)
    exchange.feed(
        0, TokenEvent(token_ids=[7], text=case.text, finish_reason="stop", prompt_token_ids=[1])
    )
    return exchange.response()


def _ours_stream(info: Any, case: Case, deltas: list[str]) -> list[dict[str, Any]]:
    exchange = _exchange(info, case, True)
    chunks = []
    for i, delta in enumerate(deltas):
        last = i == len(deltas) - 1
        event = TokenEvent(
            token_ids=[7 + i],
            text=delta,
            finish_reason="stop" if last else None,
            prompt_token_ids=[1] if i == 0 else None,
        )
        chunks.extend(exchange.chunks(0, event))
    return chunks


def _vllm_full(serving: Any, tokenizer: Any, case: Case) -> dict[str, Any]:
    return full_answer(serving, tokenizer, _body(case, False), [([7], case.text)])


def _vllm_stream(
    serving: Any, tokenizer: Any, case: Case, deltas: list[str]
) -> list[dict[str, Any]]:
    pieces = [([7 + i], delta) for i, delta in enumerate(deltas)]
    return stream_chunks(serving, tokenizer, _body(case, True), pieces)


# -- what a client sees ---------------------------------------------------------------


def _accumulate(chunks: list[dict[str, Any]]) -> ChatCompletion:
    """The SDK's stream accumulator over the chunks, after the SDK-level rules of
    `delta.tool_calls`: per index, the id and name come once, with its first piece."""
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState(input_tools=TOOLS)
    started: set[int] = set()
    for chunk in chunks:
        parsed = ChatCompletionChunk.model_validate(chunk)
        for choice in parsed.choices:
            for piece in choice.delta.tool_calls or ():
                if piece.index not in started:
                    assert piece.id and piece.function and piece.function.name, chunk
                    assert piece.index == len(started), chunk  # indexes in order, from 0
                    started.add(piece.index)
                else:
                    assert piece.id is None, chunk
                    assert piece.function is None or piece.function.name is None, chunk
        list(state.handle_chunk(parsed))
    return state.get_final_completion()


def _seen(message: Any) -> tuple[str, list[tuple[str, Any]]]:
    """(content, [(name, arguments parsed if they parse, else as text)])."""
    calls = []
    for tool_call in message.tool_calls or ():
        try:
            arguments = json.loads(tool_call.function.arguments)
        except ValueError:
            arguments = tool_call.function.arguments
        calls.append((tool_call.function.name, arguments))
    return message.content or "", calls


def _full_seen(body: dict[str, Any]) -> tuple[tuple[str, list[tuple[str, Any]]], str]:
    choice = ChatCompletion.model_validate(body).choices[0]
    ids = [c.id for c in choice.message.tool_calls or ()]
    assert all(ids) and len(set(ids)) == len(ids)
    return _seen(choice.message), choice.finish_reason


def _stream_seen(chunks: list[dict[str, Any]]) -> tuple[tuple[str, list[tuple[str, Any]]], str]:
    choice = _accumulate(chunks).choices[0]
    return _seen(choice.message), choice.finish_reason


def _cuts(text: str) -> Iterator[list[str]]:
    yield [text]
    for k in range(1, len(text)):
        yield [text[:k], text[k:]]
    yield list(text)


@pytest.mark.parametrize("name", list(CASES))
def test_not_streamed_as_vllm_serve_answers(
    name: str, switchboard: Any, vllm_serve: Any, tokenizer: Any
) -> None:
    case = CASES[name]
    ours, finish = _full_seen(_ours_full(switchboard, case))
    assert ours == (case.content or "", case.calls)
    assert finish == ("tool_calls" if case.calls else "stop")
    assert (ours, finish) == _full_seen(_vllm_full(vllm_serve, tokenizer, case))


@pytest.mark.parametrize("name", list(CASES))
def test_streamed_at_every_cut_as_vllm_serve_streams_it(
    name: str, switchboard: Any, vllm_serve: Any, tokenizer: Any
) -> None:
    case = CASES[name]
    expected = _full_seen(_ours_full(switchboard, case))
    for deltas in _cuts(case.text):
        ours = _stream_seen(_ours_stream(switchboard, case, deltas))
        assert ours == _stream_seen(_vllm_stream(vllm_serve, tokenizer, case, deltas)), deltas
        if case.modes_agree:
            assert ours == expected, deltas
