"""A reasoning model's text read back, held to `vllm serve`: with `--reasoning-parser
deepseek_r1`, the chat core (fed crafted text as engine events) and vLLM's own
`OpenAIServingChat` (fed the same text as `RequestOutput`s) must give the same
`reasoning` and `content`, whole and streamed one token at a time, with and without
tools in the request.

No engine runs. The tiny model's tokenizer has no `<think>` tokens, so the tokenizer used
here is a copy with both added as special tokens (vLLM's parsers find them by id); the
texts are cut at that tokenizer's tokens, as an engine would stream them.

It fails if the parser planned for a conversation stops reading reasoning (no parser
without tools, or a reasoning parser not passed to vLLM's unified parser), or if Chat
stops writing it where vLLM writes it (`message.reasoning`, `delta.reasoning`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from app.engine.base import TokenEvent
from app.engine.models import ServedModel
from app.protocols.openai.chat import ChatExchange
from schemas.openai import ChatCompletionRequest
from tests.conftest import tiny_model_path
from tests.fake_engine import FakeEngine, vllm_tool_support
from tests.vllm_chat import full_answer, serving_chat, stream_chunks

PARSER = "deepseek_r1"
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
TEXTS = {
    "reasoning then an answer": "<think>Two and two.</think>It is four.",
    "reasoning never closed": "<think>Still thinking about it",
    "an answer with no reasoning tags": "Just an answer.",
    "reasoning then a call": (
        '<think>Use f.</think><tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    ),
}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny tokenizer with `<think>` and `</think>` added, saved and loaded back as
    vLLM loads a tokenizer (vLLM caches what it reads of a tokenizer when it loads it)."""
    from transformers import AutoTokenizer
    from vllm.tokenizers import get_tokenizer

    thinking = AutoTokenizer.from_pretrained(str(tiny_model_path()))
    thinking.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    path = tmp_path_factory.mktemp("thinking-tokenizer")
    thinking.save_pretrained(path)
    return get_tokenizer(str(path))


@pytest.fixture(scope="module")
def switchboard(tokenizer: Any) -> Any:
    support = vllm_tool_support(tokenizer, str(tiny_model_path()), reasoning_parser=PARSER)
    return replace(FakeEngine().info, tools=support)


@pytest.fixture(scope="module")
def vllm_serve(tokenizer: Any) -> Any:
    return serving_chat(tokenizer, str(tiny_model_path()), reasoning_parser=PARSER)


def _body(tools: bool, stream: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "2+2?"}], "stream": stream}
    if tools:
        body["tools"] = TOOLS
    return body


def _pieces(tokenizer: Any, text: str) -> list[tuple[list[int], str]]:
    """The text as an engine streams it: one token, and its text, at a time."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    pieces, seen = [], ""
    for i in range(len(ids)):
        upto = tokenizer.decode(ids[: i + 1], skip_special_tokens=False)
        pieces.append(([ids[i]], upto[len(seen) :]))
        seen = upto
    assert seen == text
    return pieces


def _ours(info: Any, tokenizer: Any, text: str, tools: bool, stream: bool) -> dict[str, str]:
    exchange = ChatExchange(
        ChatCompletionRequest.model_validate(_body(tools, stream)),
        info,
        FakeEngine().tokenizer,
        response_id="chatcmpl-1",
        created=1,
        served=ServedModel("tiny", None),
    )
    pieces = _pieces(tokenizer, text)
    events = [
        TokenEvent(
            token_ids=ids,
            text=piece,
            finish_reason="stop" if i == len(pieces) - 1 else None,
            prompt_token_ids=[1] if i == 0 else None,
        )
        for i, (ids, piece) in enumerate(pieces)
    ]
    if not stream:
        for event in events:
            exchange.feed(0, event)
        return _message(exchange.response()["choices"][0]["message"])
    chunks = [chunk for event in events for chunk in exchange.chunks(0, event)]
    return _joined(chunk["choices"][0]["delta"] for chunk in chunks if chunk["choices"])


def _theirs(serving: Any, tokenizer: Any, text: str, tools: bool, stream: bool) -> dict[str, str]:
    pieces = _pieces(tokenizer, text)
    if not stream:
        whole = [([t for ids, _ in pieces for t in ids], text)]
        answer = full_answer(serving, tokenizer, _body(tools, stream), whole)
        return _message(answer["choices"][0]["message"])
    chunks = stream_chunks(serving, tokenizer, _body(tools, stream), pieces)
    return _joined(chunk["choices"][0]["delta"] for chunk in chunks if chunk["choices"])


def _message(message: dict[str, Any]) -> dict[str, str]:
    return {"reasoning": message.get("reasoning") or "", "content": message.get("content") or ""}


def _joined(deltas: Any) -> dict[str, str]:
    out = {"reasoning": "", "content": ""}
    for delta in deltas:
        out["reasoning"] += delta.get("reasoning") or ""
        out["content"] += delta.get("content") or ""
    return out


@pytest.mark.parametrize("tools", [False, True], ids=["no tools", "tools"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("name", list(TEXTS))
def test_reasoning_as_vllm_serve_reads_it(
    name: str, stream: bool, tools: bool, switchboard: Any, vllm_serve: Any, tokenizer: Any
) -> None:
    text = TEXTS[name]
    ours = _ours(switchboard, tokenizer, text, tools, stream)
    assert ours == _theirs(vllm_serve, tokenizer, text, tools, stream)
    if name == "reasoning then an answer":
        assert ours == {"reasoning": "Two and two.", "content": "It is four."}
