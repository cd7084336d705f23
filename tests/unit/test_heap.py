"""The memory a big request held is given back (`app.heap`): `trim` returns a heap's free
pages to the system, `trim_soon` trims once for every big request that ends within
`TRIM_AFTER_S`, and the render process's answer to a big prompt asks for one. Fails if
`trim` gives nothing back (glibc's allocator keeps what Python frees), if `trim_soon`
trims per request or never, if a rendered prompt's copies are not trimmed after, or if
a thread's big blocks stay in its heap once the mmap threshold is fixed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from app import heap
from app.engine.base import ChatMessage, ChatPrompt, TextPart
from app.engine.vllm import render_process
from app.engine.vllm.render_process import RenderProcess
from app.errors import InvalidRequest
from tests.waits import until

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_trim_gives_back_what_was_freed_inside_the_heap() -> None:
    # Blocks under glibc's mmap threshold come from the heap; the last one stays alive,
    # so the freed ones below it are inside the heap, not at its top, and free alone
    # returns none of them.
    blocks = [bytearray(100 << 10) for _ in range(400)]  # ~40 MiB
    for block in blocks:
        block[::4096] = b"x" * len(block[::4096])  # touched: resident
    kept = blocks[-1]
    del blocks
    process = psutil.Process()
    before = process.memory_info().rss
    assert heap.trim()
    assert before - process.memory_info().rss > 20 * MIB
    assert kept


async def test_trim_soon_trims_once_for_the_requests_that_end_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trims: list[int] = []

    def counted(pad: int) -> int:
        trims.append(pad)
        return 1

    monkeypatch.setattr(heap, "_MALLOC_TRIM", counted)
    monkeypatch.setattr(heap, "TRIM_AFTER_S", 0.2)
    for _ in range(10):
        heap.trim_soon()
    await until(lambda: len(trims) == 1, "the trim")
    await until(lambda: not heap._pending.locked(), "the trim to be over")
    heap.trim_soon()
    await until(lambda: len(trims) == 2, "a later request's own trim")
    assert trims == [0, 0]


def test_a_prompt_rendered_by_the_render_process_is_trimmed_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The serving process's own copies of a big prompt (its pickled frames) are given
    # back once the render process has answered, whatever it answered.
    soon: list[bool] = []
    monkeypatch.setattr(render_process, "trim_soon", lambda: soon.append(True))
    process = RenderProcess(config=None, max_model_len=1024)
    answers = iter([("ok", [1, 2]), ("error", InvalidRequest("no"))])
    monkeypatch.setattr(process, "_call", lambda prompt: next(answers))
    process._ready.set()
    prompt = ChatPrompt(messages=(ChatMessage(role="user", parts=(TextPart("hi"),)),))
    try:
        assert process.render(prompt) == [1, 2]
        with pytest.raises(InvalidRequest):
            process.render(prompt)
    finally:
        process._ready.clear()
        process.close()
    assert soon == [True, True]


# A thread frees a 16 MiB block (glibc then raises its mmap threshold to 16 MiB), then
# blocks of 12 to 4 MiB, each followed by a small block it keeps: they came from the
# thread's own heap, whose top `malloc_trim` does not shrink. Prints the MiB kept.
THREAD_HEAP = """
import sys, threading
from app import heap
if sys.argv[1] == "fixed":
    heap.fix_mmap_threshold()

def resident() -> int:
    return int(open("/proc/self/statm").read().split()[1]) * 4096 >> 20

def work() -> None:
    block = b"x" * (16 << 20)
    del block
    for size in (12, 8, 6, 4):
        block = b"x" * (size << 20)
        kept.append(b"y" * 1000)
        del block

kept: list[bytes] = []
before = resident()
thread = threading.Thread(target=work)
thread.start()
thread.join()
heap.trim()
print(resident() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_threads_big_blocks_are_returned_once_the_threshold_is_fixed() -> None:
    def kept(how: str) -> int:
        run = [sys.executable, "-c", THREAD_HEAP, how]
        return int(subprocess.run(run, cwd=ROOT, capture_output=True, check=True).stdout)

    assert kept("fixed") < 4
    assert kept("default") >= 8  # glibc's own way: what the fix is for
