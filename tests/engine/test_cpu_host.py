"""The frontend keeps off the engine's cores on vLLM's CPU build (the live server pinned
this process once its engine had started)."""

from __future__ import annotations

import os

import psutil
import pytest

from app.engine.cpu_host import engine_cpus

pytestmark = pytest.mark.engine


def test_the_frontend_runs_off_the_engine_cores(live_server) -> None:  # type: ignore[no-untyped-def]
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
