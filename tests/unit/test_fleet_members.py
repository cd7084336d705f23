"""How a fleet's processes are placed (app/fleet/members.py): on the machine's CPUs, never
those of the thread that starts them (in the suite, that thread is pinned to one core by
the live server's `--pin-frontend`, and the fleet it started put every replica's engine
on the core left, where a restarted replica starved); each in a process group of its
own, in the fleet's session (one autogroup, where the engines' niceness counts); their
frontends unpinned, since pinning keeps a frontend off its own engine's cores only."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app.fleet.fleet import Fleet
from app.fleet.members import Member, Replica, machine_cpus

MULTICORE = pytest.mark.skipif(
    len(machine_cpus()) < 2, reason="a pinned caller needs a machine of two CPUs or more"
)


@dataclass
class Sleeper(Member):
    def command(self) -> list[str]:
        return [sys.executable, "-c", "import time; time.sleep(60)"]

    def ready(self) -> bool:
        return True


def _pinned(work: Callable[[], Any]) -> Any:
    """`work()` in a thread pinned to one CPU, as a frontend thread of a pinned server is."""
    done: list[Any] = []

    def run() -> None:
        os.sched_setaffinity(0, {min(machine_cpus())})
        done.append(work())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return done[0]


@MULTICORE
def test_a_member_started_by_a_pinned_thread_runs_on_every_cpu(tmp_path: Path) -> None:
    member = Sleeper("sleeper", tmp_path)
    _pinned(member.start)
    try:
        assert member.process is not None
        assert os.sched_getaffinity(member.process.pid) == machine_cpus()
    finally:
        member.kill()


@MULTICORE
def test_replicas_are_bound_to_distinct_cores_whatever_the_caller_is_pinned_to(
    tmp_path: Path,
) -> None:
    fleet = _pinned(lambda: Fleet(workdir=tmp_path, serve_args=[], count=2))
    cores = [replica.cpu_core for replica in fleet.replicas]
    assert cores == sorted(machine_cpus())[:2]


def test_replicas_sharing_a_host_leave_their_frontends_unpinned(tmp_path: Path) -> None:
    fleet = Fleet(workdir=tmp_path, serve_args=[], count=2)
    for replica in fleet.replicas:
        command = replica.command()
        at = command.index("--pin-frontend")
        assert command[at + 1] == "false"


def test_a_member_has_a_process_group_of_its_own_in_the_fleets_session(tmp_path: Path) -> None:
    member = Sleeper("sleeper", tmp_path)
    member.start()
    try:
        assert member.process is not None
        pid = member.process.pid
        assert os.getpgid(pid) == pid != os.getpgid(0)
        assert os.getsid(pid) == os.getsid(0)
    finally:
        member.kill()


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_a_restart_may_change_a_replicas_drain_and_only_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The suite's replicas drain for serve's 25 s; the roll brings one back with the
    drain test's 4 s (tests/fleet_setup.py)."""
    fleet = Fleet(workdir=tmp_path, serve_args=[], count=2, drain_timeout_s=25.0)
    started: list[list[str]] = []
    monkeypatch.setattr(Replica, "stop", lambda self, timeout_s, group=False: 0)
    monkeypatch.setattr(Replica, "start", lambda self: started.append(self.command()))
    monkeypatch.setattr(Replica, "wait_ready", lambda self, *args: None)
    assert _flag(fleet.replica(0).command(), "--drain-timeout-s") == "25.0"
    fleet.restart(0, group=True, drain_timeout_s=4.0)
    assert [_flag(command, "--drain-timeout-s") for command in started] == ["4.0"]
    assert _flag(fleet.replica(1).command(), "--drain-timeout-s") == "25.0"
