"""`engine_session` (app.engine.cpu_host), the general plugin that moves vLLM's engine core
into a session of its own, on real processes and no engine: a "server" process announces
it and starts a child that runs the plugin, as vLLM starts its engine core. The child
leaves the server's session and process group, its threads and its group (autogroup)
take the announced niceness, and it gets SIGTERM when the server is killed outright (a child
left in a session of its own would otherwise live on: the group's SIGKILL misses it)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from app.engine.cpu_host import SESSION_ENV, engine_session, engine_session_announced
from tests.waits import until

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="sessions and prctl: Linux")

# The child: the plugin as vLLM's engine core runs it, a thread started after it (as the
# core's own threads are), then a wait it should not finish.
CHILD = (
    "from app.engine.cpu_host import engine_session; engine_session(); import threading, time; "
    "threading.Thread(target=time.sleep, args=(60,), daemon=True).start(); time.sleep(60)"
)
# The server: the announcement, the child started under it, its pid told, then a wait.
SERVER = f"""
import subprocess, sys, time
from app.engine.cpu_host import engine_session_announced
with engine_session_announced(7):
    child = subprocess.Popen([sys.executable, "-c", {CHILD!r}])
print(child.pid, flush=True)
time.sleep(60)
"""
ROOT = Path(__file__).resolve().parents[2]


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    asyncio.run(until(condition, what, timeout=10))


def test_the_engine_core_takes_a_session_of_its_own_and_ends_with_its_server() -> None:
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        child = int(server.stdout.readline())
        _wait_for(lambda: os.getsid(child) == child, "the child's session of its own")
        assert os.getsid(child) != os.getsid(server.pid)
        assert os.getpgid(child) == child
        _wait_for(lambda: len(psutil.Process(child).threads()) == 2, "the child's thread")
        threads = psutil.Process(child).threads()
        assert {os.getpriority(os.PRIO_PROCESS, t.id) for t in threads} == {7}
        autogroup = Path(f"/proc/{child}/autogroup")
        if autogroup.exists():  # written just after the session is taken: waited for too
            _wait_for(lambda: autogroup.read_text().split()[-1] == "7", "the group's niceness")
        server.kill()  # SIGKILL to the server alone: nothing else reaches the child
        server.wait()
        _wait_for(lambda: not psutil.pid_exists(child), "the child to end with its server")
    finally:
        server.kill()
        if "child" in locals() and psutil.pid_exists(child):
            os.kill(child, signal.SIGKILL)


def test_any_other_process_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    # The server itself sees its own announcement; without one, nothing at all.
    session, niceness = os.getsid(0), os.getpriority(os.PRIO_PROCESS, 0)
    monkeypatch.setenv(SESSION_ENV, f"{os.getpid()} 10")
    engine_session()
    monkeypatch.delenv(SESSION_ENV)
    engine_session()
    assert (os.getsid(0), os.getpriority(os.PRIO_PROCESS, 0)) == (session, niceness)


def test_the_announcement_lasts_while_the_engine_starts_only() -> None:
    with engine_session_announced(10):
        assert os.environ[SESSION_ENV] == f"{os.getpid()} 10"
    assert SESSION_ENV not in os.environ
    with engine_session_announced(0):  # no niceness asked: no session either
        assert SESSION_ENV not in os.environ


def test_a_refused_group_niceness_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without CAP_SYS_ADMIN the kernel refuses a second autogroup write within a tenth of a
    # second host-wide (EAGAIN): two engines starting together must both get their niceness.
    from app.engine import cpu_host

    written: list[str] = []

    def write_text(path: Path, text: str) -> int:
        if not written:
            written.append("refused")
            raise BlockingIOError(11, "Resource temporarily unavailable")
        written.append(text)
        return len(text)

    monkeypatch.setattr(Path, "write_text", write_text)
    assert cpu_host._nice_autogroup("7")
    assert written == ["refused", "7"]
