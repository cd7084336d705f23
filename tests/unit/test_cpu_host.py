"""The CPU host's KV cache and compile cache defaults, and the engine's niceness (no engine
needed: a child process stands for it)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import time
from typing import Any

import psutil
import pytest

from app.engine.cpu_host import (
    DEFAULT_KV_CACHE_BYTES,
    ENGINE_TITLE,
    GiB,
    engine_cpus,
    engine_spin,
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


# Two threads each: a child that stands for the frontend, its child for vLLM's engine.
_TWO_THREADS = "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start()"
_FRONTEND = f"""
import subprocess, sys, time
{_TWO_THREADS}
subprocess.Popen([sys.executable, "-c", {_TWO_THREADS!r}])
print("up", flush=True)
"""


def test_every_thread_of_the_engines_processes_is_niced() -> None:
    child = subprocess.Popen([sys.executable, "-c", _FRONTEND], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        # Only the tree under the frontend given is touched (not the test session's other
        # children, such as a redis-server fixture).
        frontend = psutil.Process(child.pid)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            processes = frontend.children()
            threads = [t.id for p in processes for t in p.threads()]
            if len(threads) == 2:
                break
            time.sleep(0.05)
        assert len(processes) == 1 and len(threads) == 2
        assert renice_engine(0, frontend) == 0  # off: nothing touched
        assert {os.getpriority(os.PRIO_PROCESS, t) for t in threads} == {0}
        assert renice_engine(10, frontend) == len(threads)
        assert {os.getpriority(os.PRIO_PROCESS, t) for t in threads} == {10}
        frontend_threads = {t.id for t in frontend.threads()}
        assert {os.getpriority(os.PRIO_PROCESS, t) for t in frontend_threads} == {0}
    finally:
        for process in psutil.Process(child.pid).children(recursive=True):
            process.kill()
        child.kill()
        child.wait()


_BOUND = """
import os, sys, time
import setproctitle
setproctitle.setproctitle(sys.argv[1])
os.sched_setaffinity(0, {int(sys.argv[2])})
print("up", flush=True)
time.sleep(60)
"""
# A frontend that starts an engine bound to one core and another child bound to another,
# then says so: only its own tree is read (the test session's other children, such as the
# fleet's replicas starting beside the unit tests, have engines of their own).
_FRONTEND_OF_TWO = f"""
import subprocess, sys, time
children = [
    subprocess.Popen([sys.executable, "-c", {_BOUND!r}, title, core], stdout=subprocess.PIPE)
    for title, core in zip(sys.argv[1::2], sys.argv[2::2])
]
for child in children:
    assert child.stdout.readline() == b"up\\n"
print("up", flush=True)
time.sleep(60)
"""


def test_only_the_engines_cores_are_the_engines() -> None:
    """A child of the frontend that is no engine (the body worker, started by a pinned
    thread, so bound to the frontend's core) is not taken for one: counted, the engine's
    cores were every core, and the frontend was left unpinned."""
    machine = frozenset(os.sched_getaffinity(0))
    if len(machine) < 2:
        pytest.skip("one core: nothing is bound to a proper subset of it")
    engine_core, other_core = sorted(machine)[:2]
    arguments = [f"{ENGINE_TITLE}Worker", str(engine_core), "worker", str(other_core)]
    frontend = subprocess.Popen(
        [sys.executable, "-c", _FRONTEND_OF_TWO, *arguments], stdout=subprocess.PIPE
    )
    try:
        assert frontend.stdout is not None and frontend.stdout.readline() == b"up\n"
        assert engine_cpus(machine, psutil.Process(frontend.pid)) == {engine_core}
    finally:
        for process in psutil.Process(frontend.pid).children(recursive=True):
            process.kill()
        frontend.kill()
        frontend.wait()


def test_the_engine_spin_is_what_was_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A queue made after `engine_spin` busy-waits that long, where vLLM's would for a
    second: its default, read without opening a queue's sockets (the engine's own
    processes: tests/engine/test_cpu_host.py)."""
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    def spin() -> Any:
        return inspect.signature(SpinCondition).parameters["busy_loop_s"].default

    # Put back what engine_spin changes, for the tests that follow in this process.
    monkeypatch.setattr(SpinCondition.__init__, "__defaults__", SpinCondition.__init__.__defaults__)
    assert spin() == 1
    assert engine_spin(0.02)
    assert spin() == 0.02
