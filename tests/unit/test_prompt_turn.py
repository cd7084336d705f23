"""The prompt turn (app.engine.turn) and the prompt threads that take it
(app.sessions.calls.in_prompt_thread): one build at a time, first come first served, and
a build that waits on another process (a big prompt in the render process) gives the turn
up meanwhile, so the builds behind it go on; and the tokenizer's rule of which prompt
goes to the render process (over the real tokenizer, a stand-in process)."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from typing import Any

import pytest
from transformers import AutoTokenizer

from app.engine.base import ChatMessage, ChatPrompt, TextPart
from app.engine.turn import PROMPT_TURN, Turn
from app.engine.vllm import tokenizer as tokenizer_module
from app.engine.vllm.render_process import IN_PROCESS_CHARS, text_chars
from app.engine.vllm.tokenizer import HfTokenizer
from app.sessions.calls import PROMPT_THREADS, in_prompt_thread
from tests.conftest import tiny_model_path
from tests.waits import until

DEADLINE_S = 30.0


async def test_a_build_waiting_on_another_process_leaves_the_turn_to_the_others() -> None:
    """With one prompt thread (or a turn kept while waiting) the second build could
    only run once the first's wait ended: it never would here."""
    waiting, release = threading.Event(), threading.Event()

    def big() -> str:
        with PROMPT_TURN.given_up():
            waiting.set()
            assert release.wait(DEADLINE_S)
        return "big"

    first = asyncio.ensure_future(in_prompt_thread(big))
    await until(waiting.is_set, "the big build to wait", DEADLINE_S)
    assert await asyncio.wait_for(in_prompt_thread(lambda: "small"), DEADLINE_S) == "small"
    assert not first.done()
    release.set()
    assert await first == "big"


async def test_builds_never_overlap_and_keep_their_order() -> None:
    inside: list[int] = []
    order: list[int] = []
    overlaps: list[int] = []

    def build(index: int) -> int:
        if inside:
            overlaps.append(index)
        inside.append(index)
        time.sleep(0.001)  # lets another thread run, were it allowed in
        order.append(index)
        inside.remove(index)
        return index

    builds = [in_prompt_thread(functools.partial(build, i)) for i in range(4 * PROMPT_THREADS)]
    assert await asyncio.gather(*builds) == list(range(4 * PROMPT_THREADS))
    assert overlaps == []
    assert order == sorted(order)


def test_giving_up_a_turn_not_held_changes_nothing() -> None:
    turn = Turn()
    with turn.given_up():  # not held: no-op
        pass
    entered = threading.Event()

    def other() -> None:
        with turn:
            entered.set()

    with turn:
        thread = threading.Thread(target=other)
        thread.start()
        assert not entered.wait(0.05)  # still ours
        with turn.given_up():
            assert entered.wait(DEADLINE_S)  # theirs meanwhile
    thread.join(DEADLINE_S)
    assert not thread.is_alive()


class StandIn:
    """A render process that answers a fixed token list, or None (not ready yet)."""

    def __init__(self, answer: list[int] | None) -> None:
        self.answer = answer
        self.prompts: list[ChatPrompt] = []

    def render(self, prompt: ChatPrompt) -> list[int] | None:
        self.prompts.append(prompt)
        return self.answer


@pytest.fixture(scope="module")
def hf_tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(str(tiny_model_path()))


class NoRenderer:
    def render_messages(self, *args: object) -> Any:
        raise AssertionError("templated in this process")


def _prompt(chars: int) -> ChatPrompt:
    return ChatPrompt(messages=(ChatMessage(role="user", parts=(TextPart("x" * chars),)),))


def test_only_a_prompt_over_the_bound_goes_to_the_render_process(hf_tokenizer: Any) -> None:
    process = StandIn([1, 2, 3])
    tokenizer = HfTokenizer(hf_tokenizer, NoRenderer(), 1 << 20, process)  # type: ignore[arg-type]  # a stand-in
    big = _prompt(IN_PROCESS_CHARS + 1)
    assert text_chars(big) == IN_PROCESS_CHARS + 1
    assert tokenizer.apply_chat_template(big) == [1, 2, 3]
    assert process.prompts == [big]
    with pytest.raises(AssertionError, match="templated in this process"):
        tokenizer.apply_chat_template(_prompt(IN_PROCESS_CHARS))


def test_a_big_prompt_is_templated_in_place_until_the_process_is_ready(
    hf_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    process = StandIn(None)
    tokenizer = HfTokenizer(hf_tokenizer, NoRenderer(), 1 << 20, process)  # type: ignore[arg-type]  # a stand-in
    monkeypatch.setattr(tokenizer_module, "IN_PROCESS_CHARS", 10)
    with pytest.raises(AssertionError, match="templated in this process"):
        tokenizer.apply_chat_template(_prompt(11))
    assert len(process.prompts) == 1
