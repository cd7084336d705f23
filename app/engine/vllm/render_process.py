"""Big prompts templated in a process of their own, off the serving process's interpreter
lock and prompt turn.

A chat template runs Python and C string work over the whole conversation while it holds
the interpreter lock: a 16 MiB message took 50-68 ms of templating with one ~50 ms hold
(`bench/big_chat_lock.py`), every other client's request waiting, before the tokenizer
refused it as longer than the context. No bound of the raw text can refuse it first (a
template may drop content: Qwen3's drops earlier turns' reasoning), so a prompt whose
text is over `IN_PROCESS_CHARS` is templated here instead: one child process
(`python -m app.engine.vllm.render_child`) with the engine's own renderer, built by
vLLM from the engine's configuration (`renderer_from_config`, as `AsyncLLM` builds its
own), behind the same `HfTokenizer`, so its token ids and its refusals (too long, a
template's error) are exactly those the serving process would have made; the caller's
thread gives the prompt turn up while it waits (`app.engine.turn`).

The process costs what importing vLLM costs (~15 s of CPU, ~540 MiB resident, much of
it the libraries' pages the serving process maps too). It is started beside the engine
(`start`, as the engine's own start begins), in the background, from its own thread (the
child's SIGTERM is tied to that thread: `app.engine.cpu_host.own_session`), in a session
of its own at `NICENESS`, as the body worker's children are: its start takes CPU nobody
else wants, it is there before a hostile client is, and a big prompt costs the server no
memory it did not hold. Until it is ready, and while it starts again after it died, a big
prompt is templated in place, as before. It ends with the serving process (SIGTERM, or
its stdin's end) or `close`. One prompt at a time, in arrival order.
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from app.engine.base import ChatPrompt, TextPart
from app.engine.turn import PROMPT_TURN
from app.errors import SwitchboardError
from app.heap import trim_soon
from app.pipe_child import start_child, stop_child

logger = logging.getLogger(__name__)

# A prompt whose text (its messages' parts, reasoning and call arguments) is longer is
# templated in the render process: ~3 ms of the lock a MiB in place (16 MiB: ~50 ms), and
# past a MiB of text a prompt holds ~250k tokens, past most models' context.
IN_PROCESS_CHARS = 1 << 20
# Its group gives way to every other session on the host: a big prompt is templated with
# what CPU is left over.
NICENESS = 19

CHILD = "app.engine.vllm.render_child"  # the child's module: it imports the tokenizer


def text_chars(prompt: ChatPrompt) -> int:
    """The characters of `prompt`'s text a template may copy."""
    total = 0
    for message in prompt.messages:
        total += len(message.reasoning or "")
        total += sum(len(call.arguments) for call in message.tool_calls)
        total += sum(len(part.text) for part in message.parts if isinstance(part, TextPart))
    return total


def send(stream: IO[bytes], value: object) -> None:
    """`value` pickled straight into `stream`: in frames, each written with the
    interpreter's lock let go (a 16 MiB prompt pickled whole first held it ~17 ms,
    written as it is pickled ~3 ms at a time)."""
    pickle.dump(value, stream, protocol=pickle.HIGHEST_PROTOCOL)
    stream.flush()


def received(stream: IO[bytes]) -> Any:
    """The next value in `stream`; EOFError when the pipe ended."""
    try:
        return pickle.load(stream)
    except pickle.UnpicklingError as exc:  # cut off mid-value
        raise EOFError("the pipe ended") from exc


class RenderProcess:
    """The serving process's end: `render(prompt)` from a prompt thread."""

    def __init__(self, config: Any, max_model_len: int, niceness: int = NICENESS) -> None:
        self._given_up = False  # it could not start: templated in place from then on
        try:  # vLLM's VllmConfig as it is now (the engine's start goes on changing it)
            self._config = pickle.dumps(config, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # a configuration vLLM's own processes could not take
            logger.warning("the render process cannot start (%r): big prompts in place", exc)
            self._config, self._given_up = b"", True
        self._max_model_len = max_model_len
        self._niceness = niceness
        # The one thread that starts the child (it must outlive it) and talks to it.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="render-process")
        self._process: subprocess.Popen[bytes] | None = None
        self._ready = threading.Event()
        self._starting = threading.Lock()  # one start at a time

    def ready(self) -> bool:
        return self._ready.is_set()

    def render(self, prompt: ChatPrompt) -> list[int] | None:
        """`prompt`'s token ids from the render process, or the `SwitchboardError` it
        refused the prompt with, raised; None when the process is not ready (starting
        now, in the background) or died: the caller templates in place."""
        if not self._ready.is_set():
            self.start()  # again, were it gone
            return None
        try:
            with PROMPT_TURN.given_up():
                kind, value = self._thread.submit(self._call, prompt).result()
        finally:
            trim_soon()  # the prompt's pickled copies here, given back (`app.heap`)
        if kind == "ok":
            return [int(t) for t in value]
        if kind == "error":
            raise value
        if kind == "failed":  # a bug of ours in the child: withheld from the client
            raise SwitchboardError.withholding("The prompt could not be rendered", value)
        return None  # "died": in place

    def start(self) -> None:
        """Start the process in the background (unless started, or starting)."""
        if self._given_up or not self._starting.acquire(blocking=False):
            return
        if self._ready.is_set():
            self._starting.release()
            return
        try:
            self._thread.submit(self._start)
        except RuntimeError:  # closed
            self._starting.release()

    def _start(self) -> None:
        try:
            process = start_child(CHILD, str(os.getpid()), str(self._niceness))
            assert process.stdin is not None and process.stdout is not None
            try:
                send(process.stdin, (self._config, self._max_model_len))
                kind, value = received(process.stdout)
            except Exception as exc:  # the child gone
                kind, value = "failed", repr(exc)
            if kind != "ready":
                logger.warning("the render process did not start (%s): big prompts in place", value)
                self._given_up = True
                stop_child(process)
                return
            self._process = process
            self._ready.set()
            logger.info("the render process is ready (pid %s)", process.pid)
        finally:
            self._starting.release()

    def _call(self, prompt: ChatPrompt) -> tuple[str, Any]:
        process = self._process
        if process is None:
            return "died", None
        assert process.stdin is not None and process.stdout is not None
        try:
            send(process.stdin, prompt)
            answer: tuple[str, Any] = received(process.stdout)
            return answer
        except (OSError, EOFError) as exc:  # the child died (its memory, a signal)
            logger.warning("the render process ended (%r): started again on the next", exc)
            self._ready.clear()
            self._process = None
            stop_child(process)
            return "died", None

    def close(self) -> None:
        self._ready.clear()

        def stop() -> None:
            process, self._process = self._process, None
            if process is not None:
                stop_child(process)

        # After a start under way (vLLM's import: seconds), without waiting for it.
        self._thread.submit(stop)
        self._thread.shutdown(wait=False)
