"""On vLLM's CPU build: with `--pin-frontend`, the frontend keeps off the engine's cores (the
live server, started with it, pinned this process once its engine had started); the
engine's processes run niced (`--engine-niceness`, 10 by default), this one does not, in
a session of their own whose group runs at that niceness too; they stop spinning soon after
their last step (`--engine-spin-ms`)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import psutil
import pytest

from app.engine.cpu_host import engine_cpus
from tests.conftest import LiveServer
from tests.waits import until_sync

pytestmark = pytest.mark.engine


def test_the_frontend_runs_off_the_engine_cores(live_server: LiveServer) -> None:
    machine = frozenset(range(os.cpu_count() or 1))
    bound = engine_cpus(machine)
    if not bound or bound == machine:
        pytest.skip("vLLM bound no proper subset of the cores: nothing to pin")
    for thread in psutil.Process().threads():
        try:
            allowed = frozenset(os.sched_getaffinity(thread.id))
        except OSError:
            continue
        assert not allowed & bound, f"thread {thread.id} may run on engine cores {bound}"


def _engine_processes() -> list[psutil.Process]:
    """vLLM's engine core and workers under this process (at least one)."""
    engine = [
        child
        for child in psutil.Process().children(recursive=True)
        if child.name().startswith("VLLM::")
    ]
    assert engine, "no engine process under this one"
    return engine


def test_the_engine_gives_way_to_the_frontend(live_server: LiveServer) -> None:
    engine = _engine_processes()
    niceness = {os.getpriority(os.PRIO_PROCESS, t.id) for p in engine for t in p.threads()}
    assert niceness == {live_server.app.state.settings.engine_niceness} == {10}
    assert os.getpriority(os.PRIO_PROCESS, 0) == 0


def test_the_engine_runs_in_a_session_of_its_own(live_server: LiveServer) -> None:
    """Its group (where the kernel groups by session) at the engine's niceness, so that
    it gives way to processes of other sessions too (app.engine.cpu_host)."""
    engine = _engine_processes()
    sessions = {os.getsid(process.pid) for process in engine}
    assert len(sessions) == 1 and sessions != {os.getsid(0)}, sessions
    autogroup = Path(f"/proc/{engine[0].pid}/autogroup")
    if autogroup.exists():
        niceness = live_server.app.state.settings.engine_niceness
        assert autogroup.read_text().split()[-1] == str(niceness)


def test_prompts_are_prefilled_whole(live_server: LiveServer) -> None:
    """No chunked prefill on a CPU build unless asked: a seeded prompt prefilled in parts
    kills vLLM's CPU worker (app.engine.cpu_host; the end-to-end case is
    tests/e2e/test_openai_http.py::test_seeded_long_prompts_in_one_batch)."""
    config = live_server.engine._llm.vllm_config
    assert config.scheduler_config.enable_chunked_prefill is False
    assert config.scheduler_config.max_num_batched_tokens >= config.model_config.max_model_len


def test_the_worker_sleeps_soon_after_the_last_step(live_server: LiveServer) -> None:
    """The suite's servers spin 20 ms (`--engine-spin-ms`, tests/conftest.py): from 0.2 s
    after a request's end to 0.4 s, the worker is asleep on its queue's socket, where
    with vLLM's second of spin it would be runnable the whole time (sched_yield in a
    loop), taking a core from the machine's other work."""
    assert live_server.app.state.settings.engine_spin_ms == 20
    workers = [p for p in _engine_processes() if p.name().startswith("VLLM::Worker")]
    assert workers, "no worker process"
    body = {"model": live_server.model, "prompt": "hello", "max_tokens": 4}
    httpx.post(f"{live_server.base_url}/v1/completions", json=body, timeout=60).raise_for_status()
    until_sync(lambda: live_server.engine_requests() == 0, "the engine to hold no request", 30)
    time.sleep(0.2)
    states: list[str] = []
    for _ in range(10):
        states.extend(worker.status() for worker in workers)
        time.sleep(0.02)
    assert psutil.STATUS_RUNNING not in states, states
