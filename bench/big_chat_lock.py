"""What one 16 MiB chat body (bench/hostile.py's) still costs the serving process's
interpreter lock once the body worker has parsed it (issue 38): the answer unpickled,
the body validated, the chat templated by the tiny model's real renderer (vLLM's, no
engine started) until the tokenizer refuses it as longer than the context, in this
process and (as a server does) in the render process (app.engine.vllm.render_process:
this process only pickles the prompt and waits). Per step:
its wall time and the longest the lock was held against a thread that wants it every
half millisecond (its lateness). No server, no engine; vLLM's import takes ~20 s:

    PYTHONPATH=$PWD .venv/bin/python bench/big_chat_lock.py [--times 7]
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import harness
import orjson
from vllm.engine.arg_utils import EngineArgs
from vllm.renderers.registry import renderer_from_config

from app.engine.base import ChatMessage, ChatPrompt, TextPart
from app.engine.vllm.render_process import RenderProcess
from app.engine.vllm.tokenizer import HfTokenizer
from app.errors import ContextLengthExceeded
from app.protocols.bodies import validate
from schemas.openai import ChatCompletionRequest

TICK_S = 0.0005
START_S = 180.0


class LockWatch:
    """A thread that sleeps `TICK_S` at a time: how late it wakes is how long another
    thread held the lock (or the CPU) it wanted."""

    def __init__(self) -> None:
        self.late: list[float] = []
        self._stop = threading.Event()
        threading.Thread(target=self._tick, daemon=True).start()

    def _tick(self) -> None:
        while not self._stop.is_set():
            start = time.perf_counter()
            time.sleep(TICK_S)
            self.late.append(time.perf_counter() - start - TICK_S)

    def timed(self, work: Callable[..., Any], *arguments: Any) -> tuple[Any, float, float]:
        """`work(*arguments)`'s value, its wall time and the longest hold seen, in ms."""
        self.late.clear()
        start = time.perf_counter()
        value = work(*arguments)
        wall = time.perf_counter() - start
        return value, wall * 1e3, max(self.late, default=0.0) * 1e3

    def stop(self) -> None:
        self._stop.set()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--times", type=int, default=7)
    args = parser.parse_args()
    config = EngineArgs(model=str(harness.tiny_model()), enforce_eager=True).create_engine_config()
    renderer = renderer_from_config(config)
    max_model_len = config.model_config.max_model_len
    tokenizer = HfTokenizer(renderer.tokenizer, renderer, max_model_len)
    # The same, its big prompts templated in the render process (as a server's are).
    process = RenderProcess(config, max_model_len, niceness=0)
    process.start()
    elsewhere = HfTokenizer(renderer.tokenizer, renderer, max_model_len, process)
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "x " * (8 << 20)}]}
    answer = pickle.dumps(("ok", orjson.loads(orjson.dumps(chat))), pickle.HIGHEST_PROTOCOL)

    def template(text: str, by: HfTokenizer = tokenizer) -> str:
        prompt = ChatPrompt(messages=(ChatMessage(role="user", parts=(TextPart(text),)),))
        try:
            by.apply_chat_template(prompt)
        except ContextLengthExceeded:
            return "refused"
        return "fitted"

    deadline = time.monotonic() + START_S
    while not process.ready():
        if time.monotonic() > deadline:
            raise TimeoutError("the render process did not start")
        time.sleep(0.1)

    watch = LockWatch()
    steps: dict[str, list[tuple[float, float]]] = {
        "unpickle": [],
        "validate": [],
        "template": [],
        "template (render process)": [],
    }
    for _ in range(args.times):
        (_, body), wall, held = watch.timed(pickle.loads, answer)
        steps["unpickle"].append((wall, held))
        _, wall, held = watch.timed(validate, ChatCompletionRequest, body)
        steps["validate"].append((wall, held))
        refused, wall, held = watch.timed(template, body["messages"][0]["content"])
        assert refused == "refused"
        steps["template"].append((wall, held))
        refused, wall, held = watch.timed(template, body["messages"][0]["content"], elsewhere)
        assert refused == "refused"
        steps["template (render process)"].append((wall, held))
    watch.stop()
    process.close()
    for step, figures in steps.items():
        walls, holds = [w for w, _ in figures], [h for _, h in figures]
        print(
            f"{step}: {statistics.median(walls):.1f} ms p50 ({min(walls):.1f}-{max(walls):.1f}),"
            f" the lock held at most {statistics.median(holds):.1f} ms p50 at a time"
        )


if __name__ == "__main__":
    main()
