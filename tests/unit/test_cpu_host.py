"""The CPU host's KV cache and compile cache defaults, and the engine's niceness (no engine
needed: a child process stands for it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from app.engine.cpu_host import (
    DEFAULT_KV_CACHE_BYTES,
    GiB,
    kv_cache_default,
    renice_engine,
    without_aot_compile,
)


def test_a_given_size_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert kv_cache_default({"kv_cache_memory_bytes": GiB}, 100 * GiB) is None


def test_vllms_own_variable_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    assert kv_cache_default({}, 100 * GiB) is None


def test_the_default_is_bounded_by_available_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert kv_cache_default({}, 100 * GiB) == DEFAULT_KV_CACHE_BYTES
    assert kv_cache_default({}, 8 * GiB) == 2 * GiB
    assert kv_cache_default({}, 0) == GiB // 4


def test_vllm_reads_the_compile_cache_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variable set is the one vLLM reads, and it turns the AOT artifacts off (vLLM's
    own default on this torch is on)."""
    import vllm.envs as envs

    # Set, then removed: monkeypatch then restores the variable as it was after the test,
    # whatever `without_aot_compile` wrote.
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE")
    envs.disable_envs_cache()
    assert envs.VLLM_USE_AOT_COMPILE is True
    without_aot_compile()
    assert envs.VLLM_USE_AOT_COMPILE is False


def test_a_chosen_compile_cache_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm.envs as envs

    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    envs.disable_envs_cache()
    without_aot_compile()
    assert envs.VLLM_USE_AOT_COMPILE is True


# A child with a second thread, and a grandchild: as vLLM's engine core and its worker.
_ENGINE = """
import subprocess, sys, threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print("up", flush=True)
time.sleep(60)
"""


def test_every_thread_of_the_engines_processes_is_niced() -> None:
    child = subprocess.Popen([sys.executable, "-c", _ENGINE], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        deadline = time.monotonic() + 10
        while len(psutil.Process(child.pid).children()) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        processes = [psutil.Process(child.pid), *psutil.Process(child.pid).children()]
        threads = [t.id for p in processes for t in p.threads()]
        assert len(threads) >= 3
        assert renice_engine(0) == 0  # off: nothing touched
        assert {os.getpriority(os.PRIO_PROCESS, t) for t in threads} == {0}
        assert renice_engine(10) >= len(threads)
        assert {os.getpriority(os.PRIO_PROCESS, t) for t in threads} == {10}
        assert os.getpriority(os.PRIO_PROCESS, 0) == 0  # this process (the frontend) is not
    finally:
        for process in psutil.Process(child.pid).children(recursive=True):
            process.kill()
        child.kill()
        child.wait()
