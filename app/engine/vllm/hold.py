"""The server holds its engine: vLLM's processes end when the server says, not before.

vLLM's engine core and its workers stop at the first SIGTERM or SIGINT they receive. A
signal meant for the server reaches them too when it goes to the whole process group (a
terminal's Ctrl-C, `kill -TERM -- -PGID`) or to every process of a service (systemd's
default `KillMode=control-group`): the engine then stopped under the server's drain, and
every stream ended with "The engine is not running", where the same signal to the server
alone drained cleanly. (On a CPU build the engine core by default runs in a session and
process group of its own, app/engine/cpu_host.py, out of a group signal's reach; a
service's signal to every process still reaches it.)

So while the server holds its engine, the engine's processes ignore those two signals:
the server drains, then stops its engine itself (`EngineHold.release`, then vLLM's own
shutdown, whose SIGTERM they obey). The hold is an abstract Unix socket the server binds
(`EngineHold`) and the engine's processes test for (`held`); the kernel frees it when
the server exits, however it exits, so an engine whose server died obeys signals again.

The engine's processes learn of the hold from the environment they are started with (set
only while they start: `EngineHold.announced`) and take it on in `install`, which vLLM
calls in each of them as a general plugin (the `vllm.general_plugins` entry point in
pyproject.toml), after it set its own handlers.
Invariants: only a process that descends from the holding server and is not that server
changes anything (the plugin also loads in the server, and in any other vLLM process
that finds this package installed, such as a benchmark's `vllm serve`); a process whose
handler is not vLLM's callable one is left alone.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import psutil

from app.engine.announce import announced

logger = logging.getLogger(__name__)

# Set by the server before it starts its engine: "<server pid> <hold name>".
ENV = "SWITCHBOARD_ENGINE_HOLD"
SIGNALS = (signal.SIGTERM, signal.SIGINT)
_count = itertools.count()  # a process may hold several engines (the test suite does)


class EngineHold:
    """Held from construction (before the engine starts) until `release`."""

    def __init__(self) -> None:
        self.name = f"switchboard-engine-hold-{os.getpid()}-{next(_count)}"
        self._socket: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.bind("\0" + self.name)

    @contextmanager
    def announced(self) -> Iterator[None]:
        """The hold in the environment while the engine's processes start, and only
        then: a process the server starts later (a test's `vllm serve`, a tool) is no
        engine of this hold, and must not inherit it."""
        with announced(ENV, f"{os.getpid()} {self.name}"):
            yield

    def release(self) -> None:
        """Let the engine's processes obey signals again (idempotent)."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def held(name: str) -> bool:
    """Whether a server still holds `name`: its socket's name is taken."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.bind("\0" + name)
        except OSError:
            return True
    return False


def install() -> None:
    """vLLM's general plugin: in an engine process started under a hold, SIGTERM and
    SIGINT do what vLLM's handlers do only once the server has let go."""
    value = os.environ.get(ENV, "")
    pid, _, name = value.partition(" ")
    if (
        not name
        or multiprocessing.parent_process() is None  # the server itself, or unrelated
        or threading.current_thread() is not threading.main_thread()
        or int(pid) not in {parent.pid for parent in psutil.Process().parents()}
    ):
        return
    for sig in SIGNALS:
        obey = signal.getsignal(sig)
        if callable(obey):
            signal.signal(sig, _while_held(name, obey))


Handler = Callable[[int, FrameType | None], Any]


def _while_held(name: str, obey: Handler) -> Handler:
    def handler(signum: int, frame: FrameType | None) -> Any:
        if held(name):
            logger.info(
                "%s ignored: the server holds its engine, and stops it once drained",
                signal.Signals(signum).name,
            )
            return None
        return obey(signum, frame)

    return handler
