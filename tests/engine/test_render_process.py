"""The render process (app.engine.vllm.render_process) on the live server's engine
configuration, vLLM's real renderer in it: a big prompt is templated there, never in the
serving process, and its answer is the serving process's own: the same token ids, the
same refusals (too long for the context, a template's error) in the same words; and
what a big prompt held there is given back once it is answered.

The live server's own (started with its engine, at niceness 19, long before these
tests run): another would be vLLM's import again, ~15 s of CPU."""

from __future__ import annotations

from typing import Any

import httpx
import psutil
import pytest

from app.engine.base import ChatMessage, ChatPrompt, TextPart
from app.engine.tools import ToolCall
from app.engine.vllm.render_process import IN_PROCESS_CHARS, RenderProcess
from app.engine.vllm.tokenizer import HfTokenizer
from app.errors import ContextLengthExceeded, InvalidRequest
from tests.conftest import LiveServer
from tests.waits import until_sync

pytestmark = pytest.mark.engine

START_S = 180.0


class CountingRenderer:
    """The live renderer, counting what this process templates."""

    def __init__(self, renderer: Any) -> None:
        self.renderer = renderer
        self.calls = 0

    def render_messages(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.renderer.render_messages(*args, **kwargs)


@pytest.fixture(scope="module")
def process(live_server: LiveServer) -> RenderProcess:
    started = live_server.engine.tokenizer._render_process
    assert isinstance(started, RenderProcess)  # the default: --render-process
    return started


def _ready(process: RenderProcess) -> RenderProcess:
    process.render(ChatPrompt(messages=(ChatMessage(role="user", parts=(TextPart("hi"),)),)))
    until_sync(process.ready, "the render process to start", START_S)
    return process


CONVERSATION = ChatPrompt(
    messages=(
        ChatMessage(role="system", parts=(TextPart("Be brief."),)),
        ChatMessage(role="user", parts=(TextPart("weather in Paris?"),)),
        ChatMessage(
            role="assistant",
            tool_calls=(ToolCall("call-1", "get_weather", '{"city": "Paris"}'),),
        ),
        ChatMessage(role="tool", parts=(TextPart("sunny"),), tool_call_id="call-1"),
    ),
    tools=({"type": "function", "function": {"name": "get_weather", "parameters": {}}},),
)


def test_the_render_process_answers_what_this_process_would(
    live_server: LiveServer, process: RenderProcess
) -> None:
    here = live_server.engine.tokenizer
    assert _ready(process).render(CONVERSATION) == here.apply_chat_template(CONVERSATION)
    refusing = ChatPrompt(
        messages=CONVERSATION.messages,
        template_kwargs={"chat_template": "{{ raise_exception('not this one') }}"},
    )
    with pytest.raises(InvalidRequest) as in_place:
        here.apply_chat_template(refusing)
    with pytest.raises(InvalidRequest) as there:
        process.render(refusing)
    assert there.value.message == in_place.value.message


def test_a_big_prompt_is_refused_by_the_render_process_not_templated_here(
    live_server: LiveServer, process: RenderProcess
) -> None:
    """Without the render process this process's renderer templates the 16 MiB: the
    counter sees it."""
    engine = live_server.engine
    renderer = CountingRenderer(engine._llm.renderer)
    tokenizer = HfTokenizer(
        engine._llm.get_tokenizer(), renderer, engine.info.max_model_len, _ready(process)
    )
    text = "x " * (8 << 20)
    assert len(text) > IN_PROCESS_CHARS
    big = ChatPrompt(messages=(ChatMessage(role="user", parts=(TextPart(text),)),))
    with pytest.raises(ContextLengthExceeded) as there:
        tokenizer.apply_chat_template(big)
    assert renderer.calls == 0
    in_place = HfTokenizer(engine._llm.get_tokenizer(), renderer, engine.info.max_model_len)
    with pytest.raises(ContextLengthExceeded) as here:
        in_place.apply_chat_template(big)
    assert renderer.calls == 1
    assert there.value.message == here.value.message


def test_the_render_process_gives_back_what_a_big_prompt_held(process: RenderProcess) -> None:
    """glibc's allocator kept what templating a 16 MiB chat freed: the render process
    stayed ~65-80 MiB larger after the first (`app.heap`)."""
    ready = _ready(process)
    child = ready._process
    assert child is not None
    ready.render(CONVERSATION)
    before = psutil.Process(child.pid).memory_info().rss
    text = "x " * (8 << 20)
    big = ChatPrompt(messages=(ChatMessage(role="user", parts=(TextPart(text),)),))
    for _ in range(3):
        with pytest.raises(ContextLengthExceeded):
            ready.render(big)
    # It gives its memory back once its answer is written: not before the answer is read.
    resident = psutil.Process(child.pid).memory_info
    until_sync(lambda: resident().rss - before < len(text) // 2, "the prompts given back", 60)


def test_a_big_chat_on_the_live_server_is_refused_by_the_render_process(
    live_server: LiveServer, process: RenderProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 16 MiB chat through HTTP (the body worker, the prompt turn given up while it
    waits) is refused in OpenAI's shape by the render process, and the serving process's
    renderer never templated it."""
    tokenizer = live_server.engine.tokenizer
    assert tokenizer._render_process is _ready(process)
    renderer = CountingRenderer(tokenizer._renderer)
    monkeypatch.setattr(tokenizer, "_renderer", renderer)
    body = {"model": live_server.model, "messages": [{"role": "user", "content": "x " * (8 << 20)}]}
    answer = httpx.post(f"{live_server.base_url}/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "context_length_exceeded"
    assert renderer.calls == 0
    chat = {**body, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(f"{live_server.base_url}/v1/chat/completions", json=chat).status_code == 200
    assert renderer.calls == 1


def test_a_server_without_it_templates_big_prompts_in_place(vl_server: LiveServer) -> None:
    """`--render-process false` (the image server's): no child, and a big chat is still
    refused in OpenAI's shape, templated in the serving process."""
    assert vl_server.engine.tokenizer._render_process is None
    text = "x " * (IN_PROCESS_CHARS // 2 + 1)
    body = {"model": vl_server.model, "messages": [{"role": "user", "content": text}]}
    answer = httpx.post(f"{vl_server.base_url}/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "context_length_exceeded"
